//! Cross-entropy from logits: a fused CPU op (log-softmax, pick, mean; backward
//! `(softmax - onehot) / n`) and a composition of candle ops for other devices.

use super::{cpu_slice, unsupported, with_cpu_slice, Float};
use candle_core::backend::BackendStorage as _;
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor, D};

struct CrossEntropy;

fn targets_vec(s: &CpuStorage, l: &Layout) -> Result<Vec<usize>> {
    Ok(match s.dtype() {
        DType::U32 => cpu_slice::<u32>(s, l, "cross_entropy")?
            .iter()
            .map(|&t| t as usize)
            .collect(),
        DType::I64 => cpu_slice::<i64>(s, l, "cross_entropy")?
            .iter()
            .map(|&t| t as usize)
            .collect(),
        DType::U8 => cpu_slice::<u8>(s, l, "cross_entropy")?
            .iter()
            .map(|&t| t as usize)
            .collect(),
        dt => return Err(unsupported("cross_entropy targets", dt)),
    })
}

fn check_targets(t: &[usize], classes: usize) -> Result<()> {
    if let Some(bad) = t.iter().find(|&&v| v >= classes) {
        candle_core::bail!("cross_entropy: target {bad} is not below the number of classes {classes}")
    }
    Ok(())
}

fn fwd_kernel<T: Float>(x: &[T], t: &[usize], c: usize) -> T {
    let mut total = 0f64;
    for (row, &k) in x.chunks(c).zip(t) {
        let max = row.iter().copied().fold(T::neg_infinity(), num_traits::Float::max);
        let lse = row.iter().map(|&v| (v - max).exp()).sum::<T>().ln() + max;
        total += num_traits::ToPrimitive::to_f64(&(lse - row[k])).unwrap_or(f64::NAN);
    }
    T::from(total / t.len() as f64).unwrap()
}

fn bwd_kernel<T: Float>(x: &[T], t: &[usize], c: usize, g: T) -> Vec<T> {
    let scale = g / T::from(t.len()).unwrap();
    let mut dx = vec![T::zero(); x.len()];
    for ((row, drow), &k) in x.chunks(c).zip(dx.chunks_mut(c)).zip(t) {
        let max = row.iter().copied().fold(T::neg_infinity(), num_traits::Float::max);
        let sum = row.iter().map(|&v| (v - max).exp()).sum::<T>();
        for (d, &v) in drow.iter_mut().zip(row) {
            *d = (v - max).exp() / sum * scale;
        }
        drow[k] -= scale;
    }
    dx
}

impl CustomOp2 for CrossEntropy {
    fn name(&self) -> &'static str {
        "fpt-cross-entropy"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, c) = l1.shape().dims2()?;
        let t = targets_vec(s2, l2)?;
        check_targets(&t, c)?;
        let out = match s1.dtype() {
            DType::F32 => CpuStorage::F32(vec![fwd_kernel(cpu_slice::<f32>(s1, l1, "cross_entropy")?, &t, c)]),
            DType::F64 => CpuStorage::F64(vec![fwd_kernel(cpu_slice::<f64>(s1, l1, "cross_entropy")?, &t, c)]),
            dt => return Err(unsupported("cross_entropy", dt)),
        };
        Ok((out, Shape::from(())))
    }

    fn bwd(&self, x: &Tensor, targets: &Tensor, _res: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (_, c) = x.dims2()?;
        let t: Vec<usize> = targets
            .to_dtype(DType::U32)?
            .to_vec1::<u32>()?
            .into_iter()
            .map(|v| v as usize)
            .collect();
        let dx = match x.dtype() {
            DType::F32 => {
                let g = g.to_scalar::<f32>()?;
                Tensor::from_vec(
                    with_cpu_slice::<f32, _>(x, "cross_entropy", |xs| Ok(bwd_kernel(xs, &t, c, g)))?,
                    x.shape(),
                    x.device(),
                )?
            }
            DType::F64 => {
                let g = g.to_scalar::<f64>()?;
                Tensor::from_vec(
                    with_cpu_slice::<f64, _>(x, "cross_entropy", |xs| Ok(bwd_kernel(xs, &t, c, g)))?,
                    x.shape(),
                    x.device(),
                )?
            }
            dt => return Err(unsupported("cross_entropy", dt)),
        };
        Ok((Some(dx), None))
    }
}

/// Cross-entropy per row on a GPU (`[n]` losses; their mean is the loss): one warp per row
/// each way, nothing stored between them. A target outside the classes gives NaN (the
/// trainer's non-finite check stops on it; reading the targets back to name it would copy
/// them to the host every step).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct CrossEntropyRows;

impl CustomOp2 for CrossEntropyRows {
    fn name(&self) -> &'static str {
        "fpt-cross-entropy-rows"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("cross_entropy: the per-row op is for GPUs (the CPU's is `CrossEntropy`)")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        lx: &Layout,
        t: &candle_core::CudaStorage,
        lt: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (rows, _) = lx.shape().dims2()?;
        Ok((crate::cuda::ce_fwd((x, lx), (t, lt))?, Shape::from(rows)))
    }

    fn bwd(&self, x: &Tensor, t: &Tensor, _res: &Tensor, g: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dx = x.apply_op3_no_bwd(t, &g.contiguous()?, &CrossEntropyRowsBackward)?;
        Ok((Some(dx), None))
    }
}

/// Its backward: `g_r (softmax(x_r) - onehot(t_r))`; never differentiated.
struct CrossEntropyRowsBackward;

impl candle_core::CustomOp3 for CrossEntropyRowsBackward {
    fn name(&self) -> &'static str {
        "fpt-cross-entropy-rows-backward"
    }

    gpu_only_cpu_fwd3!("cross_entropy: the per-row backward is for GPUs");

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        lx: &Layout,
        t: &candle_core::CudaStorage,
        lt: &Layout,
        g: &candle_core::CudaStorage,
        lg: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((crate::cuda::ce_bwd((x, lx), (t, lt), (g, lg))?, lx.shape().clone()))
    }
}

/// Mean cross-entropy of `logits: [n, classes]` against `targets: [n]` (u32), as PyTorch's
/// `nn.CrossEntropyLoss` with mean reduction. Fused on the CPU and on a GPU (f32 logits, u32
/// targets: per-row kernels, then the mean); its backward stores a gradient for `logits`
/// only.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    if !logits.device().is_cpu() {
        if super::fused_here(logits) && targets.dtype() == DType::U32 {
            let rows = logits
                .contiguous()?
                .apply_op2(&targets.contiguous()?, CrossEntropyRows)?;
            return rows.mean_all();
        }
        return cross_entropy_composed(logits, targets);
    }
    logits.contiguous()?.apply_op2(&targets.contiguous()?, CrossEntropy)
}

/// The same loss composed of stock candle ops (reference; every device).
pub fn cross_entropy_composed(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?; // [n, 1]
    let picked = shifted.gather(&targets.unsqueeze(1)?, 1)?; // [n, 1]
    (lse - picked)?.mean_all()
}

/// Number of rows whose arg-max equals the target.
pub fn correct(logits: &Tensor, targets: &Tensor) -> Result<usize> {
    let pred = logits.argmax(D::Minus1)?;
    Ok(pred.eq(targets)?.to_dtype(DType::U32)?.sum_all()?.to_scalar::<u32>()? as usize)
}

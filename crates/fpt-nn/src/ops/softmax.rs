//! Scaled, masked softmax over the last dimension, fused on CPU.
//!
//! y = softmax(scale * s) over the keys a [`Mask`] leaves visible; the others get
//! probability exactly 0 (as GPT-2's large negative mask gives in f32, and as Longformer's
//! sliding window leaves out). Backward: ds = scale * y * (dy - sum(dy * y)).

use super::{cpu_slice, rows_per_task, unsupported, use_par, with_cpu_slice, Float};
use candle_core::backend::BackendStorage as _;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

/// Which keys each query sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mask {
    /// Every key.
    None,
    /// Keys `0..=i + tk - tq` (GPT-2's causal attention).
    Causal,
    /// Keys with `|j - i| <= w` (Longformer's sliding window, `w` on each side).
    Band(usize),
}

impl Mask {
    /// The mask as fpt's kernels take it: kind (`fpt_ops.h`'s `FPT_MASK_*`) and band width.
    pub(crate) fn kernel_kind(self) -> (i32, usize) {
        match self {
            Mask::None => (0, 0),
            Mask::Causal => (1, 0),
            Mask::Band(w) => (2, w),
        }
    }

    /// The visible keys `lo..hi` of row `r` of a `[.., tq, tk]` tensor.
    pub(crate) fn range(self, r: usize, tq: usize, tk: usize) -> (usize, usize) {
        let i = r % tq;
        match self {
            Mask::None => (0, tk),
            Mask::Causal => (0, (i + 1 + tk.saturating_sub(tq)).min(tk)),
            Mask::Band(w) => (i.saturating_sub(w), (i + w + 1).min(tk)),
        }
    }
}

struct SoftmaxOp {
    scale: f64,
    mask: Mask,
}

pub(crate) fn fwd_kernel<T: Float>(s: &[T], tq: usize, tk: usize, scale: f64, mask: Mask) -> Vec<T> {
    let scale = T::from(scale).unwrap();
    let mut y = vec![T::zero(); s.len()];
    let rows = rows_per_task(tk);
    let body = |(ci, (yc, sc)): (usize, (&mut [T], &[T]))| {
        for (ri, (yr, sr)) in yc.chunks_mut(tk).zip(sc.chunks(tk)).enumerate() {
            let (lo, hi) = mask.range(ci * rows + ri, tq, tk);
            let mut max = T::neg_infinity();
            for &v in &sr[lo..hi] {
                max = num_traits::Float::max(max, v * scale);
            }
            let mut sum = T::zero();
            for j in lo..hi {
                let e = (sr[j] * scale - max).exp();
                yr[j] = e;
                sum += e;
            }
            let inv = T::one() / sum;
            for v in &mut yr[lo..hi] {
                *v *= inv;
            }
        }
    };
    if use_par(s.len()) {
        y.par_chunks_mut(tk * rows)
            .zip(s.par_chunks(tk * rows))
            .enumerate()
            .for_each(body);
    } else {
        y.chunks_mut(tk * rows)
            .zip(s.chunks(tk * rows))
            .enumerate()
            .for_each(body);
    }
    y
}

fn bwd_kernel<T: Float>(y: &[T], dy: &[T], tq: usize, tk: usize, scale: f64, mask: Mask) -> Vec<T> {
    let scale = T::from(scale).unwrap();
    let mut ds = vec![T::zero(); y.len()];
    let rows = rows_per_task(tk);
    let c = tk * rows;
    type Item<'a, T> = (usize, (&'a mut [T], (&'a [T], &'a [T])));
    let body = |(ci, (dc, (yc, gc))): Item<T>| {
        for (ri, ((dr, yr), gr)) in dc.chunks_mut(tk).zip(yc.chunks(tk)).zip(gc.chunks(tk)).enumerate() {
            let (lo, hi) = mask.range(ci * rows + ri, tq, tk);
            let dot: T = (lo..hi).map(|j| yr[j] * gr[j]).sum();
            for j in lo..hi {
                dr[j] = scale * yr[j] * (gr[j] - dot);
            }
        }
    };
    if use_par(y.len()) {
        ds.par_chunks_mut(c)
            .zip(y.par_chunks(c).zip(dy.par_chunks(c)))
            .enumerate()
            .for_each(body);
    } else {
        ds.chunks_mut(c)
            .zip(y.chunks(c).zip(dy.chunks(c)))
            .enumerate()
            .for_each(body);
    }
    ds
}

fn dims(shape: &Shape) -> Result<(usize, usize)> {
    let d = shape.dims();
    if d.len() < 2 {
        candle_core::bail!("masked_softmax: expected at least 2 dims, got {shape:?}")
    }
    Ok((d[d.len() - 2], d[d.len() - 1]))
}

impl CustomOp1 for SoftmaxOp {
    fn name(&self) -> &'static str {
        "fpt-masked-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (tq, tk) = dims(l.shape())?;
        let out = match s.dtype() {
            DType::F32 => CpuStorage::F32(fwd_kernel(
                cpu_slice::<f32>(s, l, "masked_softmax")?,
                tq,
                tk,
                self.scale,
                self.mask,
            )),
            DType::F64 => CpuStorage::F64(fwd_kernel(
                cpu_slice::<f64>(s, l, "masked_softmax")?,
                tq,
                tk,
                self.scale,
                self.mask,
            )),
            dt => return Err(unsupported("masked_softmax", dt)),
        };
        Ok((out, l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        let (tq, tk) = dims(l.shape())?;
        // Attention's one-pass softmax kernel without its dropout.
        let rs = super::attention_rows::RowSoftmax {
            scale: self.scale,
            mask: self.mask,
            dropout: None,
            block: 1,
        };
        Ok((
            crate::cuda::attn_rows::softmax_drop(s, l, &rs, tq, tk, false)?,
            l.shape().clone(),
        ))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        masked_softmax_backward(res, dy, self.scale, self.mask).map(Some)
    }
}

/// The gradient of [`masked_softmax`]'s input from its output `y` and the output's gradient
/// `dy`: `scale * y * (dy - sum(dy * y))` per row, zero where the mask hides a key. A kernel
/// where [`masked_softmax`] is one op (the CPU's f32/f64, a GPU's f32), composed otherwise.
pub(crate) fn masked_softmax_backward(res: &Tensor, dy: &Tensor, scale: f64, mask: Mask) -> Result<Tensor> {
    if !super::fused_here(res) {
        // Hidden keys have y = 0, so their gradient is 0 without the mask.
        let dot = (dy * res)?.sum_keepdim(D::Minus1)?;
        return (res * dy.broadcast_sub(&dot)?)?.affine(scale, 0.0);
    }
    if !res.device().is_cpu() {
        return res
            .contiguous()?
            .apply_op2_no_bwd(&dy.contiguous()?, &SoftmaxBackward { scale });
    }
    {
        let (tq, tk) = dims(res.shape())?;
        let ds = match res.dtype() {
            DType::F32 => {
                let v = with_cpu_slice::<f32, _>(res, "masked_softmax", |y| {
                    with_cpu_slice::<f32, _>(dy, "masked_softmax", |g| Ok(bwd_kernel(y, g, tq, tk, scale, mask)))
                })?;
                Tensor::from_vec(v, res.shape(), res.device())?
            }
            DType::F64 => {
                let v = with_cpu_slice::<f64, _>(res, "masked_softmax", |y| {
                    with_cpu_slice::<f64, _>(dy, "masked_softmax", |g| Ok(bwd_kernel(y, g, tq, tk, scale, mask)))
                })?;
                Tensor::from_vec(v, res.shape(), res.device())?
            }
            dt => return Err(unsupported("masked_softmax", dt)),
        };
        Ok(ds)
    }
}

/// The softmax's backward on a GPU, `scale * y * (dy - sum(dy * y))` per row (a kernel;
/// the CPU's is [`bwd_kernel`]); itself never differentiated.
struct SoftmaxBackward {
    // Read by the kernel launch, in builds with the `cuda` feature.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    scale: f64,
}

impl candle_core::CustomOp2 for SoftmaxBackward {
    fn name(&self) -> &'static str {
        "fpt-masked-softmax-backward"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("masked_softmax: the backward op is for GPUs (the CPU's is fused in the forward op)")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        y: &candle_core::CudaStorage,
        ly: &Layout,
        dy: &candle_core::CudaStorage,
        ldy: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((
            crate::cuda::softmax_bwd((y, ly), (dy, ldy), self.scale)?,
            ly.shape().clone(),
        ))
    }
}

/// `softmax(scale * s)` over the last dimension of `s: [.., tq, tk]`, each query seeing
/// the keys `mask` leaves visible (the rest get probability 0). One fused op on the CPU
/// (f32, f64) and on a GPU (f32: a kernel each way); composed of candle ops for other
/// dtypes on a GPU.
pub fn masked_softmax(s: &Tensor, scale: f64, mask: Mask) -> Result<Tensor> {
    if !super::fused_here(s) {
        return masked_softmax_composed(s, scale, mask);
    }
    s.contiguous()?.apply_op1(SoftmaxOp { scale, mask })
}

/// The same function composed of stock candle ops (reference; every device).
pub fn masked_softmax_composed(s: &Tensor, scale: f64, mask: Mask) -> Result<Tensor> {
    let (tq, tk) = dims(s.shape())?;
    let mut s = s.affine(scale, 0.0)?;
    if mask != Mask::None {
        let dev = &s.device().clone();
        let hidden = crate::transfer::constant(format!("softmax-hidden:{mask:?}:{tq}x{tk}"), dev, || {
            let hidden: Vec<u8> = (0..tq)
                .flat_map(|i| {
                    let (lo, hi) = mask.range(i, tq, tk);
                    (0..tk).map(move |j| u8::from(j < lo || j >= hi))
                })
                .collect();
            crate::transfer::upload(hidden, (tq, tk), dev)
        })?
        .broadcast_as(s.shape())?;
        let neg = crate::transfer::constant(format!("neg-inf:{:?}", s.dtype()), dev, || {
            crate::transfer::upload(vec![f32::NEG_INFINITY], (), dev)?.to_dtype(s.dtype())
        })?
        .broadcast_as(s.shape())?;
        s = hidden.where_cond(&neg, &s)?;
    }
    let max = s.max_keepdim(D::Minus1)?.detach();
    let e = s.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

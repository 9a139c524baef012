//! One Adam update of a parameter, its moments and its gradient: in place on CPU f32
//! tensors, composed of candle ops elsewhere.
//!
//! The composed update (every device) allocates a tensor per step of the formula, about ten
//! passes over the parameter's memory, each into a fresh allocation. The in-place kernel
//! makes three passes (`m`, `v`, then the parameter), allocates nothing, and rounds exactly
//! as the composed ops do (the same f32 operations in the same order), so both give the same
//! bits.

use super::use_par;
use candle_core::{CpuStorage, DType, Layout, Result, Storage, Tensor, Var};
use rayon::prelude::*;

/// The coefficients of one Adam step (PyTorch's update): `m = b1 m + (1 - b1) g`,
/// `v = b2 v + (1 - b2) g^2`, `p -= step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamCoefs {
    /// First-moment decay `b1`.
    pub beta1: f64,
    /// Second-moment decay `b2`.
    pub beta2: f64,
    /// `lr / (1 - b1^t)`.
    pub step_size: f64,
    /// `1 / sqrt(1 - b2^t)`.
    pub inv_sqrt_bc2: f64,
    /// Added to the denominator.
    pub eps: f64,
}

/// The f32 constants the composed ops use (candle's `affine` converts its f64 factors to
/// the tensor's dtype).
#[derive(Clone, Copy)]
struct F32Coefs {
    b1: f32,
    one_minus_b1: f32,
    b2: f32,
    one_minus_b2: f32,
    inv_sqrt_bc2: f32,
    eps: f32,
    step_size: f32,
}

impl From<&AdamCoefs> for F32Coefs {
    fn from(c: &AdamCoefs) -> Self {
        Self {
            b1: c.beta1 as f32,
            one_minus_b1: (1.0 - c.beta1) as f32,
            b2: c.beta2 as f32,
            one_minus_b2: (1.0 - c.beta2) as f32,
            inv_sqrt_bc2: c.inv_sqrt_bc2 as f32,
            eps: c.eps as f32,
            step_size: c.step_size as f32,
        }
    }
}

/// Updates `p` (a trainable parameter) and its moments `m` and `v` from its gradient `g`,
/// all of one shape. On f32 tensors that each own their storage (contiguous from its
/// start), on the CPU or on a GPU (`kernels/fpt_kernels.cu`), the update is written in
/// place (three passes: `m`, `v`, then `p`); otherwise (other dtypes, views) the composed
/// update runs and `m` and `v` are replaced by new tensors.
pub fn adam_update(p: &Var, m: &mut Tensor, v: &mut Tensor, g: &Tensor, c: &AdamCoefs) -> Result<()> {
    for (what, t) in [("m", &*m), ("v", &*v), ("gradient", g)] {
        if t.shape() != p.shape() {
            candle_core::bail!(
                "adam_update: {what} has shape {:?}, the parameter {:?}",
                t.shape(),
                p.shape()
            );
        }
    }
    let f32_here = |t: &Tensor| t.dtype() == DType::F32 && t.device().same_device(p.device());
    if owns_storage(p.as_tensor()) && owns_storage(m) && owns_storage(v) && f32_here(g) {
        // A strided gradient (a view) is read through a contiguous copy.
        let g = &g.contiguous()?;
        let f = F32Coefs::from(c);
        m.inplace_op2(
            g,
            &MomentOp {
                decay: f.b1,
                rest: f.one_minus_b1,
                square: false,
            },
        )?;
        v.inplace_op2(
            g,
            &MomentOp {
                decay: f.b2,
                rest: f.one_minus_b2,
                square: true,
            },
        )?;
        return p.as_tensor().inplace_op3(m, v, &StepOp { c: f });
    }
    let (m2, v2, p2) = adam_update_composed(p.as_tensor(), m, v, g, c)?;
    p.set(&p2)?;
    *m = m2;
    *v = v2;
    Ok(())
}

/// The composed update (every device): the new `(m, v, p)`.
pub fn adam_update_composed(
    p: &Tensor,
    m: &Tensor,
    v: &Tensor,
    g: &Tensor,
    c: &AdamCoefs,
) -> Result<(Tensor, Tensor, Tensor)> {
    let m = ((m * c.beta1)? + (g * (1.0 - c.beta1))?)?;
    let v = ((v * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
    let denom = ((v.sqrt()? * c.inv_sqrt_bc2)? + c.eps)?;
    let update = (m.div(&denom)? * c.step_size)?;
    let p = p.sub(&update)?;
    Ok((m, v, p))
}

/// A CPU f32 tensor that covers its whole storage, contiguously: writing it in place
/// touches nothing but its own values (a view into a larger buffer, or a broadcast, does
/// not qualify).
/// Whether `t` is f32 and owns all of its storage from offset 0 (so an in-place update
/// writes exactly its elements), on the CPU or (with the `cuda` feature) a GPU.
pub(super) fn owns_storage(t: &Tensor) -> bool {
    if t.dtype() != DType::F32 {
        return false;
    }
    let (s, l) = t.storage_and_layout();
    match (&*s, l.contiguous_offsets()) {
        (Storage::Cpu(CpuStorage::F32(data)), Some((0, end))) => end == data.len(),
        #[cfg(feature = "cuda")]
        (Storage::Cuda(cs), Some((0, end))) => cs.as_cuda_slice::<f32>().is_ok_and(|d| d.len() == end),
        _ => false,
    }
}

/// The contiguous f32 values a storage and layout describe.
fn f32_slice<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    super::cpu_slice::<f32>(s, l, "adam_update")
}

/// The contiguous f32 values a storage and layout describe, for writing.
fn f32_slice_mut<'a>(s: &'a mut CpuStorage, l: &Layout) -> Result<&'a mut [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(d), Some((a, b))) => Ok(&mut d[a..b]),
        _ => candle_core::bail!("adam_update: expected a contiguous f32 tensor"),
    }
}

/// Values per rayon task.
const CHUNK: usize = 1 << 14;

/// `x := decay x + rest g` (or `rest g^2`), with the composed ops' roundings (candle's
/// `affine` computes `x * mul + add`, here with `add = 0`).
pub(super) struct MomentOp {
    pub(super) decay: f32,
    pub(super) rest: f32,
    pub(super) square: bool,
}

impl MomentOp {
    /// The update on the CPU.
    pub(super) fn cpu(&self, s1: &mut CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<()> {
        let x = f32_slice_mut(s1, l1)?;
        let g = f32_slice(s2, l2)?;
        if x.len() != g.len() {
            candle_core::bail!("adam_update: {} moment values for {} gradient values", x.len(), g.len());
        }
        let (decay, rest, square) = (self.decay, self.rest, self.square);
        let body = |(x, g): (&mut [f32], &[f32])| {
            for (x, &g) in x.iter_mut().zip(g) {
                let g = if square { g * g } else { g };
                *x = (*x * decay + 0.0) + (g * rest + 0.0);
            }
        };
        if use_par(x.len()) {
            x.par_chunks_mut(CHUNK).zip(g.par_chunks(CHUNK)).for_each(body);
        } else {
            body((x, g));
        }
        Ok(())
    }
}

impl candle_core::InplaceOp2 for MomentOp {
    fn name(&self) -> &'static str {
        "adam-moment"
    }

    fn cpu_fwd(&self, s1: &mut CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<()> {
        self.cpu(s1, l1, s2, l2)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        _l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<()> {
        crate::cuda::moment(s1, (s2, l2), self.decay, self.rest, self.square, None)
    }
}

/// `p := p - (m / ((sqrt(v) * inv_sqrt_bc2 + 0) * 1 + eps) * step_size + 0)`, the composed
/// ops' roundings.
struct StepOp {
    c: F32Coefs,
}

/// The parameter update on the CPU with `eps`, `inv_sqrt_bc2` and `step_size`.
#[allow(clippy::too_many_arguments)]
pub(super) fn step_cpu(
    s1: &mut CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
    s3: &CpuStorage,
    l3: &Layout,
    eps: f32,
    inv_sqrt_bc2: f32,
    step_size: f32,
) -> Result<()> {
    let p = f32_slice_mut(s1, l1)?;
    let (m, v) = (f32_slice(s2, l2)?, f32_slice(s3, l3)?);
    if m.len() != p.len() || v.len() != p.len() {
        candle_core::bail!(
            "adam_update: moments of {} and {} values for {}",
            m.len(),
            v.len(),
            p.len()
        );
    }
    let body = |((p, m), v): ((&mut [f32], &[f32]), &[f32])| {
        for ((p, &m), &v) in p.iter_mut().zip(m).zip(v) {
            let denom = (v.sqrt() * inv_sqrt_bc2 + 0.0) * 1.0 + eps;
            *p -= (m / denom) * step_size + 0.0;
        }
    };
    if use_par(p.len()) {
        p.par_chunks_mut(CHUNK)
            .zip(m.par_chunks(CHUNK))
            .zip(v.par_chunks(CHUNK))
            .for_each(body);
    } else {
        body(((p, m), v));
    }
    Ok(())
}

impl candle_core::InplaceOp3 for StepOp {
    fn name(&self) -> &'static str {
        "adam-step"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let c = self.c;
        step_cpu(s1, l1, s2, l2, s3, l3, c.eps, c.inv_sqrt_bc2, c.step_size)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        _l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<()> {
        let c = self.c;
        crate::cuda::adam_step(
            s1,
            (s2, l2),
            (s3, l3),
            c.eps,
            crate::cuda::StepCoefs::Args(c.inv_sqrt_bc2, c.step_size),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn bits(t: &Tensor) -> Vec<u32> {
        t.flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .into_iter()
            .map(f32::to_bits)
            .collect()
    }

    /// The in-place update gives the composed update's bits, step after step, for a small
    /// tensor (one thread) and one above the parallel threshold, with zeros of both signs,
    /// tiny and large gradients among the values.
    #[test]
    fn in_place_update_equals_the_composed_ops_bit_for_bit() -> Result<()> {
        let dev = Device::Cpu;
        let n_big = if cfg!(miri) {
            300
        } else {
            super::super::PAR_MIN * 3 + 17
        };
        for n in [7usize, n_big] {
            let mut rng = crate::Rng::new(n as u64);
            let p0: Vec<f32> = (0..n)
                .map(|i| if i % 11 == 0 { -0.0 } else { rng.uniform_f32() - 0.5 })
                .collect();
            let p = Var::from_tensor(&Tensor::from_vec(p0.clone(), n, &dev)?)?;
            let (mut m, mut v) = (p.zeros_like()?, p.zeros_like()?);
            let mut reference = (
                Tensor::zeros(n, DType::F32, &dev)?,
                Tensor::zeros(n, DType::F32, &dev)?,
                Tensor::from_vec(p0, n, &dev)?,
            );
            for t in 1..=4 {
                let g: Vec<f32> = (0..n)
                    .map(|i| match i % 7 {
                        0 => 0.0,
                        1 => -0.0,
                        2 => 1e-30,
                        3 => -3e4,
                        _ => rng.uniform_f32() * 2.0 - 1.0,
                    })
                    .collect();
                let g = Tensor::from_vec(g, n, &dev)?;
                let (bc1, bc2) = (1.0 - 0.9f64.powi(t), 1.0 - 0.999f64.powi(t));
                let c = AdamCoefs {
                    beta1: 0.9,
                    beta2: 0.999,
                    step_size: 1e-3 / bc1,
                    inv_sqrt_bc2: 1.0 / bc2.sqrt(),
                    eps: 1e-8,
                };
                let (m_alias, v_alias) = (m.clone(), v.clone());
                adam_update(&p, &mut m, &mut v, &g, &c)?;
                // Written in place: the tensors sharing the storage see the new values.
                assert_eq!(
                    (bits(&m_alias), bits(&v_alias)),
                    (bits(&m), bits(&v)),
                    "in place, n {n}"
                );
                reference = adam_update_composed(&reference.2, &reference.0, &reference.1, &g, &c)?;
                assert_eq!(bits(&m), bits(&reference.0), "m, n {n}, step {t}");
                assert_eq!(bits(&v), bits(&reference.1), "v, n {n}, step {t}");
                assert_eq!(bits(p.as_tensor()), bits(&reference.2), "p, n {n}, step {t}");
            }
        }
        Ok(())
    }

    /// Moments that are views of a larger buffer are never written in place (they are
    /// replaced), and a gradient of the wrong shape is an error naming it.
    #[test]
    fn views_are_replaced_and_bad_shapes_refused() -> Result<()> {
        let dev = Device::Cpu;
        let p = Var::from_tensor(&Tensor::new(&[1f32, 2.0, 3.0], &dev)?)?;
        let buffer = Tensor::zeros(6, DType::F32, &dev)?;
        let mut m = buffer.narrow(0, 3, 3)?;
        let mut v = p.zeros_like()?;
        let c = AdamCoefs {
            beta1: 0.9,
            beta2: 0.999,
            step_size: 0.1 / 0.1,
            inv_sqrt_bc2: 1.0 / 0.001f64.sqrt(),
            eps: 1e-8,
        };
        adam_update(&p, &mut m, &mut v, &Tensor::new(&[1f32, -1.0, 0.0], &dev)?, &c)?;
        assert_eq!(
            buffer.to_vec1::<f32>()?,
            vec![0.0; 6],
            "the buffer behind the view was written"
        );
        let p_now = p.as_tensor().to_vec1::<f32>()?;
        assert!(
            (p_now[0] - 0.9).abs() < 1e-6 && (p_now[1] - 2.1).abs() < 1e-6 && p_now[2] == 3.0,
            "{p_now:?}"
        );
        // A strided gradient (every other value of a buffer) is read like a contiguous one.
        let (mut m2, mut v2) = (p.zeros_like()?, p.zeros_like()?);
        let strided = Tensor::new(&[[1f32, 9.0], [-1.0, 9.0], [0.0, 9.0]], &dev)?
            .narrow(1, 0, 1)?
            .squeeze(1)?;
        let p2 = Var::from_tensor(&Tensor::new(&[1f32, 2.0, 3.0], &dev)?)?;
        assert!(!strided.is_contiguous());
        adam_update(&p2, &mut m2, &mut v2, &strided, &c)?;
        assert_eq!(p2.as_tensor().to_vec1::<f32>()?, p_now, "strided gradient");
        let err = adam_update(&p, &mut m, &mut v, &Tensor::new(&[1f32, 2.0], &dev)?, &c).unwrap_err();
        assert!(err.to_string().contains("gradient has shape"), "{err}");
        Ok(())
    }
}

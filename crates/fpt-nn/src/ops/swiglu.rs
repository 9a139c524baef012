//! Llama's gated feed-forward activation, `swiglu(g, u) = silu(g) * u`, fused on CPU with a
//! hand-written backward: `du = dy * silu(g)`, `dg = dy * u * silu'(g)`, with
//! `silu(x) = x s`, `silu'(x) = s (1 + x (1 - s))`, `s = 1 / (1 + e^-x)`.
//!
//! Composed of candle ops (`g.silu() * u`), forward stores two `[rows, ffn]` tensors and
//! backward makes several more, each a pass over memory with a scalar `exp` per element;
//! fused, forward is one vectorized pass (the AVX2 + FMA `exp` of [`super::fastmath`] on the
//! AVX2, AVX-512 and bf16 kernel paths, the same formulas in plain loops on the portable one)
//! and backward one more, storing nothing but the inputs.

use super::fastmath::{gelu_fwd, gelu_fwd_and_grad, Silu};
use super::{assume_init, cpu_slice, tracks, uninit, unsupported, use_par, with_cpu_slice, Float};
use crate::kernels::KernelPath;
use candle_core::backend::BackendStorage as _;
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Elements per task (and per scratch buffer): 64 KiB of f32, in cache.
const CHUNK: usize = 16_384;

struct SwiGlu;

/// The silu of `g` (and, with `grad`, its derivative) into the chunk's scratch.
fn silu_into(path: KernelPath, g: &[f32], y: &mut Vec<f32>, d: Option<&mut Vec<f32>>) {
    let n = g.len();
    y.resize(n, 0.0);
    // SAFETY (both casts): f32 is valid as MaybeUninit<f32>, same layout; every slot is
    // initialised already (the resize), so reading them back afterwards is sound whatever
    // the callee writes.
    let ym = unsafe { std::slice::from_raw_parts_mut(y.as_mut_ptr() as *mut MaybeUninit<f32>, n) };
    match d {
        Some(d) => {
            d.resize(n, 0.0);
            // SAFETY: as above.
            let dm = unsafe { std::slice::from_raw_parts_mut(d.as_mut_ptr() as *mut MaybeUninit<f32>, n) };
            gelu_fwd_and_grad::<Silu>(path, ym, dm, g);
        }
        None => gelu_fwd::<Silu>(path, ym, g),
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

fn fwd_f32(g: &[f32], u: &[f32]) -> Vec<f32> {
    let path = KernelPath::active();
    let mut y = uninit::<f32>(g.len());
    type Item<'a> = (&'a mut [MaybeUninit<f32>], (&'a [f32], &'a [f32]));
    let body = |(yc, (gc, uc)): Item| {
        SCRATCH.with_borrow_mut(|(s, _)| {
            silu_into(path, gc, s, None);
            for ((o, &a), &b) in yc.iter_mut().zip(s.iter()).zip(uc) {
                o.write(a * b);
            }
        })
    };
    if use_par(g.len()) {
        y.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
            .for_each(body);
    } else {
        y.chunks_mut(CHUNK)
            .zip(g.chunks(CHUNK).zip(u.chunks(CHUNK)))
            .for_each(body);
    }
    // SAFETY: the chunks cover y, and each writes all of its slots (g, u and y have equal
    // lengths: the op checked the shapes).
    unsafe { assume_init(y) }
}

/// `(dg, du)`.
fn bwd_f32(g: &[f32], u: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let path = KernelPath::active();
    let (mut dg, mut du) = (uninit::<f32>(g.len()), uninit::<f32>(g.len()));
    type Item<'a> = (
        (&'a mut [MaybeUninit<f32>], &'a mut [MaybeUninit<f32>]),
        (&'a [f32], (&'a [f32], &'a [f32])),
    );
    let body = |((dgc, duc), (gc, (uc, dyc))): Item| {
        SCRATCH.with_borrow_mut(|(s, d)| {
            silu_into(path, gc, s, Some(d));
            for i in 0..gc.len() {
                duc[i].write(dyc[i] * s[i]);
                dgc[i].write(dyc[i] * uc[i] * d[i]);
            }
        })
    };
    if use_par(g.len()) {
        dg.par_chunks_mut(CHUNK)
            .zip(du.par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK))))
            .for_each(body);
    } else {
        dg.chunks_mut(CHUNK)
            .zip(du.chunks_mut(CHUNK))
            .zip(g.chunks(CHUNK).zip(u.chunks(CHUNK).zip(dy.chunks(CHUNK))))
            .for_each(body);
    }
    // SAFETY: the chunks cover dg and du, and each writes all of its slots of both (the
    // gradient has the inputs' shape, as candle's backward guarantees).
    unsafe { (assume_init(dg), assume_init(du)) }
}

/// The same in any float type, scalar (f64: the tests' reference precision).
fn silu_exact<T: Float>(x: T) -> (T, T) {
    let s = T::one() / (T::one() + (-x).exp());
    (x * s, s * (T::one() + x * (T::one() - s)))
}

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "fpt-swiglu"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        same_shape(l1, l2)?;
        let out = match s1.dtype() {
            DType::F32 => {
                let (g, u) = (cpu_slice::<f32>(s1, l1, "swiglu")?, cpu_slice::<f32>(s2, l2, "swiglu")?);
                CpuStorage::F32(fwd_f32(g, u))
            }
            DType::F64 => {
                let (g, u) = (cpu_slice::<f64>(s1, l1, "swiglu")?, cpu_slice::<f64>(s2, l2, "swiglu")?);
                CpuStorage::F64(g.iter().zip(u).map(|(&a, &b)| silu_exact(a).0 * b).collect())
            }
            dt => return Err(unsupported("swiglu", dt)),
        };
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        same_shape(l1, l2)?;
        Ok((crate::cuda::swiglu_fwd((s1, l1), (s2, l2))?, l1.shape().clone()))
    }

    fn bwd(&self, g: &Tensor, u: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dev = g.device();
        if !dev.is_cpu() {
            // One kernel writes both gradients, dg then du, into a [2, ..] buffer.
            let both = g
                .contiguous()?
                .apply_op3_no_bwd(&u.contiguous()?, &dy.contiguous()?, &SwiGluBackward)?;
            let (dg, du) = (both.get(0)?, both.get(1)?);
            return Ok((tracks(g).then_some(dg), tracks(u).then_some(du)));
        }
        let (dg, du) = match g.dtype() {
            DType::F32 => {
                let (a, b) = with_cpu_slice::<f32, _>(g, "swiglu", |gs| {
                    with_cpu_slice::<f32, _>(u, "swiglu", |us| {
                        with_cpu_slice::<f32, _>(dy, "swiglu", |dys| Ok(bwd_f32(gs, us, dys)))
                    })
                })?;
                (
                    Tensor::from_vec(a, g.shape(), dev)?,
                    Tensor::from_vec(b, u.shape(), dev)?,
                )
            }
            DType::F64 => {
                let (a, b) = with_cpu_slice::<f64, _>(g, "swiglu", |gs| {
                    with_cpu_slice::<f64, _>(u, "swiglu", |us| {
                        with_cpu_slice::<f64, _>(dy, "swiglu", |dys| {
                            let mut dg = Vec::with_capacity(gs.len());
                            let mut du = Vec::with_capacity(gs.len());
                            for i in 0..gs.len() {
                                let (s, d) = silu_exact(gs[i]);
                                du.push(dys[i] * s);
                                dg.push(dys[i] * us[i] * d);
                            }
                            Ok((dg, du))
                        })
                    })
                })?;
                (
                    Tensor::from_vec(a, g.shape(), dev)?,
                    Tensor::from_vec(b, u.shape(), dev)?,
                )
            }
            dt => return Err(unsupported("swiglu", dt)),
        };
        Ok((tracks(g).then_some(dg), tracks(u).then_some(du)))
    }
}

/// The gate and the up projection must have one shape.
fn same_shape(l1: &Layout, l2: &Layout) -> Result<()> {
    if l1.shape() != l2.shape() {
        return Err(candle_core::Error::Msg(format!(
            "swiglu: gate {:?} and up {:?} differ in shape",
            l1.shape(),
            l2.shape()
        )));
    }
    Ok(())
}

/// SwiGLU's backward on a GPU: `[dg, du]` stacked (one kernel); never differentiated.
struct SwiGluBackward;

impl candle_core::CustomOp3 for SwiGluBackward {
    fn name(&self) -> &'static str {
        "fpt-swiglu-backward"
    }

    gpu_only_cpu_fwd3!("swiglu: the backward op is for GPUs (the CPU's is in the forward op)");

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        g: &candle_core::CudaStorage,
        lg: &Layout,
        u: &candle_core::CudaStorage,
        lu: &Layout,
        dy: &candle_core::CudaStorage,
        ldy: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        same_shape(lg, lu)?;
        same_shape(lg, ldy)?;
        let mut dims = vec![2];
        dims.extend_from_slice(lg.dims());
        Ok((crate::cuda::swiglu_bwd((g, lg), (u, lu), (dy, ldy))?, Shape::from(dims)))
    }
}

/// `silu(gate) * up`, elementwise (equal shapes): Llama's SwiGLU. Fused with a hand-written
/// backward on the CPU (f32, f64) and on a GPU (f32: one kernel each way), composed of
/// candle ops otherwise.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if !super::fused_here(gate) {
        return swiglu_composed(gate, up);
    }
    gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu)
}

/// [`swiglu`] composed of stock candle ops (every device; the reference in tests).
pub fn swiglu_composed(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    gate.silu()? * up
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f32 kernels (their scratch casts included; Miri runs this on the portable path)
    /// against the f64 formulas, over a tail-length slice.
    #[test]
    fn kernels_match_the_f64_formulas() {
        let n = 37;
        let g: Vec<f32> = (0..n).map(|i| (i as f32 - 18.0) * 0.7).collect();
        let u: Vec<f32> = (0..n).map(|i| 1.0 - i as f32 * 0.05).collect();
        let dy: Vec<f32> = (0..n).map(|i| 0.5 + (i % 3) as f32).collect();
        let y = fwd_f32(&g, &u);
        let (dg, du) = bwd_f32(&g, &u, &dy);
        for i in 0..n {
            let (s, d) = silu_exact(g[i] as f64);
            let close = |a: f32, b: f64| (a as f64 - b).abs() <= 1e-5 * (1.0 + b.abs());
            assert!(close(y[i], s * u[i] as f64), "y[{i}]");
            assert!(close(du[i], dy[i] as f64 * s), "du[{i}]");
            assert!(close(dg[i], dy[i] as f64 * u[i] as f64 * d), "dg[{i}]");
        }
    }
}

//! LayerNorm and RMSNorm over the last dimension with fused CPU forwards and backwards.
//!
//! LayerNorm: y = (x - mean) / sqrt(var + eps) * gamma + beta, var biased (PyTorch
//! `nn.LayerNorm`). Backward, with xhat = (x - mean) * rstd and g = dy * gamma:
//! dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dgamma = sum(dy * xhat); dbeta = sum(dy).
//!
//! RMSNorm (T5's and Llama's): y = x * rstd * gamma with rstd = 1 / sqrt(mean(x^2) + eps).
//! Backward, with xhat = x * rstd and g = dy * gamma: dx = rstd * (g - xhat * mean(g * xhat));
//! dgamma = sum(dy * xhat).

use super::{assume_init, cpu_slice, rows_per_task, tracks, uninit, unsupported, use_par, with_cpu_slice, Float};
use candle_core::backend::BackendStorage as _;
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Partial sums a row's reductions keep: a sequential floating-point sum cannot be
/// vectorized (its order is part of its result), eight independent ones can.
const LANES: usize = 8;

/// The 8 partial sums added pairwise: `((0 + 4) + (1 + 5)) + ((2 + 6) + (3 + 7))`.
#[inline(always)]
fn combine<T: Float>(acc: [T; LANES]) -> T {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// `sum(f(v))` over `xs`, in [`LANES`] partial sums added pairwise at the end, the tail last.
#[inline(always)]
fn lane_sum<T: Float>(xs: &[T], f: impl Fn(T) -> T) -> T {
    let mut acc = [T::zero(); LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for j in 0..LANES {
            acc[j] += f(c[j]);
        }
    }
    let mut s = combine(acc);
    for &v in chunks.remainder() {
        s += f(v);
    }
    s
}

/// `sum(a[i] * b[i])`, summed as [`lane_sum`] does.
#[inline(always)]
fn lane_dot<T: Float>(a: &[T], b: &[T]) -> T {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [T::zero(); LANES];
    let split = n / LANES * LANES;
    for (ca, cb) in a[..split].chunks_exact(LANES).zip(b[..split].chunks_exact(LANES)) {
        for j in 0..LANES {
            acc[j] += ca[j] * cb[j];
        }
    }
    let mut s = combine(acc);
    for i in split..n {
        s += a[i] * b[i];
    }
    s
}

struct LayerNormOp {
    eps: f64,
}

pub(super) fn fwd_kernel<T: Float>(x: &[T], g: &[T], b: &[T], eps: f64) -> Vec<T> {
    let d = g.len();
    let mut y = uninit::<T>(x.len());
    let eps = T::from(eps).unwrap();
    let inv_d = T::one() / T::from(d).unwrap();
    let chunk = d * rows_per_task(d);
    let body = |(yc, xc): (&mut [MaybeUninit<T>], &[T])| {
        for (yr, xr) in yc.chunks_mut(d).zip(xc.chunks(d)) {
            let mean = lane_sum(xr, |v| v) * inv_d;
            let var = lane_sum(xr, |v| (v - mean) * (v - mean)) * inv_d;
            let rstd = T::one() / (var + eps).sqrt();
            for i in 0..d {
                yr[i].write((xr[i] - mean) * rstd * g[i] + b[i]);
            }
        }
    };
    if use_par(x.len()) {
        y.par_chunks_mut(chunk).zip(x.par_chunks(chunk)).for_each(body);
    } else {
        y.chunks_mut(chunk).zip(x.chunks(chunk)).for_each(body);
    }
    // SAFETY: the chunks cover y (whole rows) and each writes all of its slots.
    unsafe { assume_init(y) }
}

/// Returns (dx, dgamma, dbeta).
pub(super) fn bwd_kernel<T: Float>(x: &[T], g: &[T], dy: &[T], eps: f64) -> (Vec<T>, Vec<T>, Vec<T>) {
    let d = g.len();
    let eps = T::from(eps).unwrap();
    let inv_d = T::one() / T::from(d).unwrap();
    let mut dx = vec![T::zero(); x.len()];
    let chunk = d * rows_per_task(d);
    let body = |(dxc, (xc, dyc)): (&mut [T], (&[T], &[T]))| {
        let mut dg = vec![T::zero(); d];
        let mut db = vec![T::zero(); d];
        let mut xhat = vec![T::zero(); d];
        let mut gs = vec![T::zero(); d];
        for ((dxr, xr), dyr) in dxc.chunks_mut(d).zip(xc.chunks(d)).zip(dyc.chunks(d)) {
            let mean = lane_sum(xr, |v| v) * inv_d;
            let var = lane_sum(xr, |v| (v - mean) * (v - mean)) * inv_d;
            let rstd = T::one() / (var + eps).sqrt();
            for i in 0..d {
                xhat[i] = (xr[i] - mean) * rstd;
                gs[i] = dyr[i] * g[i];
                dg[i] += dyr[i] * xhat[i];
                db[i] += dyr[i];
            }
            let mg = lane_sum(&gs, |v| v) * inv_d;
            let mgx = lane_dot(&gs, &xhat) * inv_d;
            for i in 0..d {
                dxr[i] = rstd * (gs[i] - mg - xhat[i] * mgx);
            }
        }
        (dg, db)
    };
    let partials: Vec<(Vec<T>, Vec<T>)> = if use_par(x.len()) {
        dx.par_chunks_mut(chunk)
            .zip(x.par_chunks(chunk).zip(dy.par_chunks(chunk)))
            .map(body)
            .collect()
    } else {
        dx.chunks_mut(chunk)
            .zip(x.chunks(chunk).zip(dy.chunks(chunk)))
            .map(body)
            .collect()
    };
    let mut dg = vec![T::zero(); d];
    let mut db = vec![T::zero(); d];
    for (pg, pb) in partials {
        for i in 0..d {
            dg[i] += pg[i];
            db[i] += pb[i];
        }
    }
    (dx, dg, db)
}

impl super::ThreeOperands for LayerNormOp {
    fn name(&self) -> &'static str {
        "fpt-layer-norm"
    }

    fn forward_cpu(&self, [(s1, l1), (s2, l2), (s3, l3)]: [(&CpuStorage, &Layout); 3]) -> Result<(CpuStorage, Shape)> {
        fn run<T: Float>(op: &LayerNormOp, s: [(&CpuStorage, &Layout); 3]) -> Result<CpuStorage> {
            let x = cpu_slice::<T>(s[0].0, s[0].1, "layer_norm")?;
            let g = cpu_slice::<T>(s[1].0, s[1].1, "layer_norm")?;
            let b = cpu_slice::<T>(s[2].0, s[2].1, "layer_norm")?;
            Ok(T::to_cpu_storage_owned(fwd_kernel(x, g, b, op.eps)))
        }
        let args = [(s1, l1), (s2, l2), (s3, l3)];
        let out = match s1.dtype() {
            DType::F32 => run::<f32>(self, args)?,
            DType::F64 => run::<f64>(self, args)?,
            dt => return Err(unsupported("layer_norm", dt)),
        };
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn forward_cuda(
        &self,
        [x, w, b]: [(&candle_core::CudaStorage, &Layout); 3],
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((crate::cuda::norm_fwd(x, w, Some(b), self.eps)?, x.1.shape().clone()))
    }

    fn gradients(&self, [x, g, b]: [&Tensor; 3], _res: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 3]> {
        layer_norm_grads(x, g, dy, self.eps, [tracks(x), tracks(g), tracks(b)])
    }
}

/// [`layer_norm`]'s gradients of `x`, `gamma` and `beta` (`None` where `want` says no) from
/// the output's `dy`, as the fused op's backward computes them.
pub(crate) fn layer_norm_grads(
    x: &Tensor,
    g: &Tensor,
    dy: &Tensor,
    eps: f64,
    want: [bool; 3],
) -> Result<[Option<Tensor>; 3]> {
    if !x.device().is_cpu() {
        let (dx, dg) = device_norm_grads(x, g, dy, eps, true)?;
        let db = if want[2] {
            Some(sum_rows(dy, g.elem_count())?)
        } else {
            None
        };
        return Ok([want[0].then_some(dx), want[1].then_some(dg), db]);
    }
    fn run<T: Float>(eps: f64, x: &Tensor, g: &Tensor, dy: &Tensor) -> Result<(Vec<T>, Vec<T>, Vec<T>)> {
        with_cpu_slice::<T, _>(x, "layer_norm", |xs| {
            with_cpu_slice::<T, _>(g, "layer_norm", |gs| {
                with_cpu_slice::<T, _>(dy, "layer_norm", |dys| Ok(bwd_kernel(xs, gs, dys, eps)))
            })
        })
    }
    let dev = x.device();
    let (dx, dg, db) = match x.dtype() {
        DType::F32 => {
            let (a, b, c) = run::<f32>(eps, x, g, dy)?;
            (
                Tensor::from_vec(a, x.shape(), dev)?,
                Tensor::from_vec(b, g.shape(), dev)?,
                Tensor::from_vec(c, g.shape(), dev)?,
            )
        }
        DType::F64 => {
            let (a, b, c) = run::<f64>(eps, x, g, dy)?;
            (
                Tensor::from_vec(a, x.shape(), dev)?,
                Tensor::from_vec(b, g.shape(), dev)?,
                Tensor::from_vec(c, g.shape(), dev)?,
            )
        }
        dt => return Err(unsupported("layer_norm", dt)),
    };
    Ok([want[0].then_some(dx), want[1].then_some(dg), want[2].then_some(db)])
}

/// `dy` summed over every row of `d` values: `[d]`.
fn sum_rows(dy: &Tensor, d: usize) -> Result<Tensor> {
    dy.reshape(((), d))?.sum(0)
}

/// The norms' gradients on a GPU (one kernel: `dx` and `dy * xhat`, the latter summed over
/// rows for the scale's gradient): `(dx, dgamma)`.
fn device_norm_grads(x: &Tensor, g: &Tensor, dy: &Tensor, eps: f64, centered: bool) -> Result<(Tensor, Tensor)> {
    let both =
        x.contiguous()?
            .apply_op3_no_bwd(&g.contiguous()?, &dy.contiguous()?, &NormBackward { eps, centered })?;
    let dx = both.get(0)?;
    let dg = sum_rows(&both.get(1)?, g.elem_count())?;
    Ok((dx, dg))
}

/// The norms' backward on a GPU: `[dx, dy * xhat]` stacked; never differentiated.
struct NormBackward {
    // Read by the kernel launch, in builds with the `cuda` feature.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    eps: f64,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    centered: bool,
}

impl candle_core::CustomOp3 for NormBackward {
    fn name(&self) -> &'static str {
        "fpt-norm-backward"
    }

    gpu_only_cpu_fwd3!("the norms' backward op is for GPUs (the CPU's is fused in the forward op)");

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        lx: &Layout,
        w: &candle_core::CudaStorage,
        lw: &Layout,
        dy: &candle_core::CudaStorage,
        ldy: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let mut dims = vec![2];
        dims.extend_from_slice(lx.dims());
        Ok((
            crate::cuda::norm_bwd((x, lx), (w, lw), (dy, ldy), self.eps, self.centered)?,
            Shape::from(dims),
        ))
    }
}

/// LayerNorm over the last dimension; `gamma` and `beta` have shape `[d]`. Fused with a
/// hand-written backward on the CPU (f32, f64) and on a GPU (f32: a kernel each way),
/// composed of candle ops otherwise.
pub fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Result<Tensor> {
    if !super::fused_here(x) {
        return layer_norm_composed(x, gamma, beta, eps);
    }
    let x = x.contiguous()?;
    x.apply_op3(
        &gamma.contiguous()?,
        &beta.contiguous()?,
        super::Three(LayerNormOp { eps }),
    )
}

/// LayerNorm composed of stock candle ops (correct gradients on every device; slower).
pub fn layer_norm_composed(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
    let xhat = xc.broadcast_div(&(var + eps)?.sqrt()?)?;
    xhat.broadcast_mul(gamma)?.broadcast_add(beta)
}

struct RmsNormOp {
    eps: f64,
}

fn rms_fwd_kernel<T: Float>(x: &[T], g: &[T], eps: f64) -> Vec<T> {
    let d = g.len();
    let mut y = uninit::<T>(x.len());
    let eps = T::from(eps).unwrap();
    let inv_d = T::one() / T::from(d).unwrap();
    let chunk = d * rows_per_task(d);
    let body = |(yc, xc): (&mut [MaybeUninit<T>], &[T])| {
        for (yr, xr) in yc.chunks_mut(d).zip(xc.chunks(d)) {
            let rstd = T::one() / (lane_sum(xr, |v| v * v) * inv_d + eps).sqrt();
            for i in 0..d {
                yr[i].write(xr[i] * rstd * g[i]);
            }
        }
    };
    if use_par(x.len()) {
        y.par_chunks_mut(chunk).zip(x.par_chunks(chunk)).for_each(body);
    } else {
        y.chunks_mut(chunk).zip(x.chunks(chunk)).for_each(body);
    }
    // SAFETY: the chunks cover y (whole rows) and each writes all of its slots.
    unsafe { assume_init(y) }
}

/// Returns (dx, dgamma).
fn rms_bwd_kernel<T: Float>(x: &[T], g: &[T], dy: &[T], eps: f64) -> (Vec<T>, Vec<T>) {
    let d = g.len();
    let eps = T::from(eps).unwrap();
    let inv_d = T::one() / T::from(d).unwrap();
    let mut dx = vec![T::zero(); x.len()];
    let chunk = d * rows_per_task(d);
    let body = |(dxc, (xc, dyc)): (&mut [T], (&[T], &[T]))| {
        let mut dg = vec![T::zero(); d];
        let mut xhat = vec![T::zero(); d];
        let mut gs = vec![T::zero(); d];
        for ((dxr, xr), dyr) in dxc.chunks_mut(d).zip(xc.chunks(d)).zip(dyc.chunks(d)) {
            let rstd = T::one() / (lane_sum(xr, |v| v * v) * inv_d + eps).sqrt();
            for i in 0..d {
                xhat[i] = xr[i] * rstd;
                gs[i] = dyr[i] * g[i];
                dg[i] += dyr[i] * xhat[i];
            }
            let mgx = lane_dot(&gs, &xhat) * inv_d;
            for i in 0..d {
                dxr[i] = rstd * (gs[i] - xhat[i] * mgx);
            }
        }
        dg
    };
    let partials: Vec<Vec<T>> = if use_par(x.len()) {
        dx.par_chunks_mut(chunk)
            .zip(x.par_chunks(chunk).zip(dy.par_chunks(chunk)))
            .map(body)
            .collect()
    } else {
        dx.chunks_mut(chunk)
            .zip(x.chunks(chunk).zip(dy.chunks(chunk)))
            .map(body)
            .collect()
    };
    let mut dg = vec![T::zero(); d];
    for p in partials {
        for i in 0..d {
            dg[i] += p[i];
        }
    }
    (dx, dg)
}

impl CustomOp2 for RmsNormOp {
    fn name(&self) -> &'static str {
        "fpt-rms-norm"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        fn run<T: Float>(
            op: &RmsNormOp,
            s1: &CpuStorage,
            l1: &Layout,
            s2: &CpuStorage,
            l2: &Layout,
        ) -> Result<CpuStorage> {
            let x = cpu_slice::<T>(s1, l1, "rms_norm")?;
            let g = cpu_slice::<T>(s2, l2, "rms_norm")?;
            Ok(T::to_cpu_storage_owned(rms_fwd_kernel(x, g, op.eps)))
        }
        let out = match s1.dtype() {
            DType::F32 => run::<f32>(self, s1, l1, s2, l2)?,
            DType::F64 => run::<f64>(self, s1, l1, s2, l2)?,
            dt => return Err(unsupported("rms_norm", dt)),
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
        Ok((
            crate::cuda::norm_fwd((s1, l1), (s2, l2), None, self.eps)?,
            l1.shape().clone(),
        ))
    }

    fn bwd(&self, x: &Tensor, g: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        if !x.device().is_cpu() {
            let (dx, dg) = device_norm_grads(x, g, dy, self.eps, false)?;
            return Ok((tracks(x).then_some(dx), tracks(g).then_some(dg)));
        }
        fn run<T: Float>(op: &RmsNormOp, x: &Tensor, g: &Tensor, dy: &Tensor) -> Result<(Vec<T>, Vec<T>)> {
            with_cpu_slice::<T, _>(x, "rms_norm", |xs| {
                with_cpu_slice::<T, _>(g, "rms_norm", |gs| {
                    with_cpu_slice::<T, _>(dy, "rms_norm", |dys| Ok(rms_bwd_kernel(xs, gs, dys, op.eps)))
                })
            })
        }
        let dev = x.device();
        let (dx, dg) = match x.dtype() {
            DType::F32 => {
                let (a, b) = run::<f32>(self, x, g, dy)?;
                (
                    Tensor::from_vec(a, x.shape(), dev)?,
                    Tensor::from_vec(b, g.shape(), dev)?,
                )
            }
            DType::F64 => {
                let (a, b) = run::<f64>(self, x, g, dy)?;
                (
                    Tensor::from_vec(a, x.shape(), dev)?,
                    Tensor::from_vec(b, g.shape(), dev)?,
                )
            }
            dt => return Err(unsupported("rms_norm", dt)),
        };
        Ok((tracks(x).then_some(dx), tracks(g).then_some(dg)))
    }
}

/// RMSNorm over the last dimension (T5's and Llama's norm): `x / sqrt(mean(x^2) + eps) *
/// gamma`, `gamma: [d]`. Fused with a hand-written backward on the CPU (f32, f64) and on a
/// GPU (f32), composed of candle ops otherwise.
pub fn rms_norm(x: &Tensor, gamma: &Tensor, eps: f64) -> Result<Tensor> {
    if !super::fused_here(x) {
        return rms_norm_composed(x, gamma, eps);
    }
    x.contiguous()?.apply_op2(&gamma.contiguous()?, RmsNormOp { eps })
}

/// RMSNorm composed of stock candle ops (correct gradients on every device; slower).
pub fn rms_norm_composed(x: &Tensor, gamma: &Tensor, eps: f64) -> Result<Tensor> {
    let var = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(var + eps)?.sqrt()?)?.broadcast_mul(gamma)
}

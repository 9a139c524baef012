//! GPT-2's `gelu_new` (the tanh approximation of GELU), fused on CPU:
//! y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3);
//! dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh(u).

use super::{cpu_slice, unsupported, use_par, with_cpu_slice, Float};
use candle_core::backend::BackendStorage as _;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

const C: f64 = 0.797_884_560_802_865_4; // sqrt(2/pi)
const A: f64 = 0.044_715;
const CHUNK: usize = 16_384;

#[inline]
fn tanh<T: Float>(u: T) -> T {
    // 1 - 2 / (exp(2u) + 1): exact in the limits (exp overflow gives 1, underflow -1).
    let two = T::one() + T::one();
    T::one() - two / ((two * u).exp() + T::one())
}

fn fwd_kernel<T: Float>(x: &[T]) -> Vec<T> {
    let (c, a, half) = (T::from(C).unwrap(), T::from(A).unwrap(), T::from(0.5).unwrap());
    let mut y = vec![T::zero(); x.len()];
    let body = |(yc, xc): (&mut [T], &[T])| {
        for (yv, &v) in yc.iter_mut().zip(xc) {
            *yv = half * v * (T::one() + tanh(c * (v + a * v * v * v)));
        }
    };
    if use_par(x.len()) {
        y.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).for_each(body);
    } else {
        y.chunks_mut(CHUNK).zip(x.chunks(CHUNK)).for_each(body);
    }
    y
}

fn bwd_kernel<T: Float>(x: &[T], dy: &[T]) -> Vec<T> {
    let (c, a, half) = (T::from(C).unwrap(), T::from(A).unwrap(), T::from(0.5).unwrap());
    let three_a = T::from(3.0 * A).unwrap();
    let mut dx = vec![T::zero(); x.len()];
    let body = |(dc, (xc, gc)): (&mut [T], (&[T], &[T]))| {
        for ((d, &v), &g) in dc.iter_mut().zip(xc).zip(gc) {
            let t = tanh(c * (v + a * v * v * v));
            let dt = (T::one() - t * t) * c * (T::one() + three_a * v * v);
            *d = g * (half * (T::one() + t) + half * v * dt);
        }
    };
    if use_par(x.len()) {
        dx.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
            .for_each(body);
    } else {
        dx.chunks_mut(CHUNK)
            .zip(x.chunks(CHUNK).zip(dy.chunks(CHUNK)))
            .for_each(body);
    }
    dx
}

struct GeluNew;

impl CustomOp1 for GeluNew {
    fn name(&self) -> &'static str {
        "fpt-gelu-new"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = match s.dtype() {
            DType::F32 => CpuStorage::F32(fwd_kernel(cpu_slice::<f32>(s, l, "gelu_new")?)),
            DType::F64 => CpuStorage::F64(fwd_kernel(cpu_slice::<f64>(s, l, "gelu_new")?)),
            dt => return Err(unsupported("gelu_new", dt)),
        };
        Ok((out, l.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let dx = match x.dtype() {
            DType::F32 => {
                let v = with_cpu_slice::<f32, _>(x, "gelu_new", |xs| {
                    with_cpu_slice::<f32, _>(dy, "gelu_new", |g| Ok(bwd_kernel(xs, g)))
                })?;
                Tensor::from_vec(v, x.shape(), x.device())?
            }
            DType::F64 => {
                let v = with_cpu_slice::<f64, _>(x, "gelu_new", |xs| {
                    with_cpu_slice::<f64, _>(dy, "gelu_new", |g| Ok(bwd_kernel(xs, g)))
                })?;
                Tensor::from_vec(v, x.shape(), x.device())?
            }
            dt => return Err(unsupported("gelu_new", dt)),
        };
        Ok(Some(dx))
    }
}

/// `gelu_new` (tanh-approximated GELU, GPT-2's activation). Fused on CPU.
pub fn gelu_new(x: &Tensor) -> Result<Tensor> {
    if !x.device().is_cpu() {
        return gelu_new_composed(x);
    }
    x.contiguous()?.apply_op1(GeluNew)
}

/// `gelu_new` composed of stock candle ops (reference; every device).
pub fn gelu_new_composed(x: &Tensor) -> Result<Tensor> {
    let inner = (x + x.powf(3.0)?.affine(A, 0.0)?)?.affine(C, 0.0)?;
    x.affine(0.5, 0.0)? * (inner.tanh()? + 1.0)?
}

/// Exact GELU (BERT's `gelu`): y = 0.5 x (1 + erf(x / sqrt 2));
/// dy/dx = 0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi).
struct GeluErf;

const INV_SQRT2: f64 = std::f64::consts::FRAC_1_SQRT_2;
const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

fn erf_fwd<T: Float>(x: &[T]) -> Vec<T> {
    let mut y = vec![T::zero(); x.len()];
    let body = |(yc, xc): (&mut [T], &[T])| {
        for (yv, &v) in yc.iter_mut().zip(xc) {
            let vf = num_traits::ToPrimitive::to_f64(&v).unwrap_or(f64::NAN);
            *yv = T::from(0.5 * vf * (1.0 + libm::erf(vf * INV_SQRT2))).unwrap();
        }
    };
    if use_par(x.len()) {
        y.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).for_each(body);
    } else {
        y.chunks_mut(CHUNK).zip(x.chunks(CHUNK)).for_each(body);
    }
    y
}

fn erf_bwd<T: Float>(x: &[T], dy: &[T]) -> Vec<T> {
    let mut dx = vec![T::zero(); x.len()];
    let body = |(dc, (xc, gc)): (&mut [T], (&[T], &[T]))| {
        for ((d, &v), &g) in dc.iter_mut().zip(xc).zip(gc) {
            let vf = num_traits::ToPrimitive::to_f64(&v).unwrap_or(f64::NAN);
            let deriv = 0.5 * (1.0 + libm::erf(vf * INV_SQRT2)) + vf * (-0.5 * vf * vf).exp() * INV_SQRT_2PI;
            *d = g * T::from(deriv).unwrap();
        }
    };
    if use_par(x.len()) {
        dx.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
            .for_each(body);
    } else {
        dx.chunks_mut(CHUNK)
            .zip(x.chunks(CHUNK).zip(dy.chunks(CHUNK)))
            .for_each(body);
    }
    dx
}

impl CustomOp1 for GeluErf {
    fn name(&self) -> &'static str {
        "fpt-gelu-erf"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = match s.dtype() {
            DType::F32 => CpuStorage::F32(erf_fwd(cpu_slice::<f32>(s, l, "gelu_erf")?)),
            DType::F64 => CpuStorage::F64(erf_fwd(cpu_slice::<f64>(s, l, "gelu_erf")?)),
            dt => return Err(unsupported("gelu_erf", dt)),
        };
        Ok((out, l.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let dx = match x.dtype() {
            DType::F32 => {
                let v = with_cpu_slice::<f32, _>(x, "gelu_erf", |xs| {
                    with_cpu_slice::<f32, _>(dy, "gelu_erf", |g| Ok(erf_bwd(xs, g)))
                })?;
                Tensor::from_vec(v, x.shape(), x.device())?
            }
            DType::F64 => {
                let v = with_cpu_slice::<f64, _>(x, "gelu_erf", |xs| {
                    with_cpu_slice::<f64, _>(dy, "gelu_erf", |g| Ok(erf_bwd(xs, g)))
                })?;
                Tensor::from_vec(v, x.shape(), x.device())?
            }
            dt => return Err(unsupported("gelu_erf", dt)),
        };
        Ok(Some(dx))
    }
}

/// Exact (erf) GELU, BERT's `gelu`. Fused on CPU.
pub fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    if !x.device().is_cpu() {
        return gelu_erf_composed(x);
    }
    x.contiguous()?.apply_op1(GeluErf)
}

/// Exact GELU composed of stock candle ops (reference; every device).
pub fn gelu_erf_composed(x: &Tensor) -> Result<Tensor> {
    let e = x.affine(INV_SQRT2, 0.0)?.erf()?;
    x.affine(0.5, 0.0)? * (e + 1.0)?
}

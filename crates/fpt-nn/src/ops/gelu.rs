//! GELU activations, fused on CPU with hand-written derivatives:
//!
//! - `gelu_new` (GPT-2; the tanh approximation): y = 0.5 x (1 + tanh(u)),
//!   u = sqrt(2/pi) (x + 0.044715 x^3); dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi)
//!   (1 + 3 * 0.044715 x^2), t = tanh(u).
//! - `gelu_erf` (BERT's exact GELU): y = 0.5 x (1 + erf(x / sqrt 2));
//!   dy/dx = 0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi).

use super::fastmath::{gelu_fwd_and_grad, Gelu};
use super::{assume_init, cpu_slice, uninit, unsupported, use_par, with_cpu_slice, Float};
use crate::kernels::KernelPath;
use candle_core::backend::BackendStorage as _;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::marker::PhantomData;
use std::mem::MaybeUninit;

const C: f64 = 0.797_884_560_802_865_4; // sqrt(2/pi)
const A: f64 = 0.044_715;
const INV_SQRT2: f64 = std::f64::consts::FRAC_1_SQRT_2;
const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;
const CHUNK: usize = 16_384;

/// An elementwise activation: its value and derivative.
trait Activation: Send + Sync + 'static {
    const NAME: &'static str;
    /// The kernels' name for it (`FPT_GELU_NEW`, `FPT_GELU_ERF` in `kernels/fpt_ops.h`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    const KIND: i32;
    fn f<T: Float>(x: T) -> T;
    fn df<T: Float>(x: T) -> T;
    /// `y = f(x)` over f32 slices (a vectorized version where there is one).
    fn f_f32(_path: KernelPath, y: &mut [MaybeUninit<f32>], x: &[f32]) {
        for (a, &b) in y.iter_mut().zip(x) {
            a.write(Self::f(b));
        }
    }
    /// `dx = dy * f'(x)` over f32 slices.
    fn df_f32(_path: KernelPath, dx: &mut [MaybeUninit<f32>], x: &[f32], dy: &[f32]) {
        for ((d, &v), &g) in dx.iter_mut().zip(x).zip(dy) {
            d.write(g * Self::df(v));
        }
    }
}

#[inline]
fn tanh<T: Float>(u: T) -> T {
    // 1 - 2 / (exp(2u) + 1): exact in the limits (exp overflow gives 1, underflow -1).
    let two = T::one() + T::one();
    T::one() - two / ((two * u).exp() + T::one())
}

struct New;
impl Activation for New {
    const NAME: &'static str = "gelu_new";
    const KIND: i32 = 0;
    #[inline]
    fn f<T: Float>(x: T) -> T {
        let (c, a, half) = (T::from(C).unwrap(), T::from(A).unwrap(), T::from(0.5).unwrap());
        half * x * (T::one() + tanh(c * (x + a * x * x * x)))
    }
    #[inline]
    fn df<T: Float>(x: T) -> T {
        let (c, a, half) = (T::from(C).unwrap(), T::from(A).unwrap(), T::from(0.5).unwrap());
        let t = tanh(c * (x + a * x * x * x));
        let dt = (T::one() - t * t) * c * (T::one() + T::from(3.0 * A).unwrap() * x * x);
        half * (T::one() + t) + half * x * dt
    }
    fn f_f32(path: KernelPath, y: &mut [MaybeUninit<f32>], x: &[f32]) {
        super::fastmath::gelu_fwd::<super::fastmath::GeluNew>(path, y, x);
    }
    fn df_f32(path: KernelPath, dx: &mut [MaybeUninit<f32>], x: &[f32], dy: &[f32]) {
        super::fastmath::gelu_bwd::<super::fastmath::GeluNew>(path, dx, x, dy);
    }
}

struct Erf;
impl Activation for Erf {
    const NAME: &'static str = "gelu_erf";
    const KIND: i32 = 1;
    #[inline]
    fn f<T: Float>(x: T) -> T {
        let v: f64 = num_traits::ToPrimitive::to_f64(&x).unwrap_or(f64::NAN);
        <T as num_traits::NumCast>::from(0.5 * v * (1.0 + libm::erf(v * INV_SQRT2))).unwrap()
    }
    #[inline]
    fn df<T: Float>(x: T) -> T {
        let v: f64 = num_traits::ToPrimitive::to_f64(&x).unwrap_or(f64::NAN);
        <T as num_traits::NumCast>::from(
            0.5 * (1.0 + libm::erf(v * INV_SQRT2)) + v * (-0.5 * v * v).exp() * INV_SQRT_2PI,
        )
        .unwrap()
    }
    fn f_f32(path: KernelPath, y: &mut [MaybeUninit<f32>], x: &[f32]) {
        super::fastmath::gelu_fwd::<super::fastmath::GeluErf>(path, y, x);
    }
    fn df_f32(path: KernelPath, dx: &mut [MaybeUninit<f32>], x: &[f32], dy: &[f32]) {
        super::fastmath::gelu_bwd::<super::fastmath::GeluErf>(path, dx, x, dy);
    }
}

/// `x` as f32 when `T` is f32.
fn f32_ref<T: Float>(x: &[T]) -> Option<&[f32]> {
    // SAFETY: T is f32 (same dtype tag), so the cast is the identity.
    (T::DTYPE == DType::F32).then(|| unsafe { std::slice::from_raw_parts(x.as_ptr() as *const f32, x.len()) })
}

fn f32_mut<T: Float>(x: &mut [MaybeUninit<T>]) -> Option<&mut [MaybeUninit<f32>]> {
    // SAFETY: as above.
    (T::DTYPE == DType::F32)
        .then(|| unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr() as *mut MaybeUninit<f32>, x.len()) })
}

fn fwd_kernel<A: Activation, T: Float>(x: &[T]) -> Vec<T> {
    let path = KernelPath::active();
    let mut y = uninit::<T>(x.len());
    let body = |(yc, xc): (&mut [MaybeUninit<T>], &[T])| {
        if let (Some(yc), Some(xc)) = (f32_mut(yc), f32_ref(xc)) {
            return A::f_f32(path, yc, xc);
        }
        for (yv, &v) in yc.iter_mut().zip(xc) {
            yv.write(A::f(v));
        }
    };
    if use_par(x.len()) {
        y.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).for_each(body);
    } else {
        y.chunks_mut(CHUNK).zip(x.chunks(CHUNK)).for_each(body);
    }
    // SAFETY: the chunks cover y and each writes all of its slots.
    unsafe { assume_init(y) }
}

fn bwd_kernel<A: Activation, T: Float>(x: &[T], dy: &[T]) -> Vec<T> {
    let path = KernelPath::active();
    let mut dx = uninit::<T>(x.len());
    type Item<'a, T> = (&'a mut [MaybeUninit<T>], (&'a [T], &'a [T]));
    let body = |(dc, (xc, gc)): Item<T>| {
        if let (Some(dc), Some(xc), Some(gc)) = (f32_mut(dc), f32_ref(xc), f32_ref(gc)) {
            return A::df_f32(path, dc, xc, gc);
        }
        for ((d, &v), &g) in dc.iter_mut().zip(xc).zip(gc) {
            d.write(g * A::df(v));
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
    // SAFETY: the chunks cover dx and each writes all of its slots.
    unsafe { assume_init(dx) }
}

/// `gelu_new` of contiguous f32 values (the fused op's CPU kernel).
pub(super) fn gelu_new_fwd(x: &[f32]) -> Vec<f32> {
    fwd_kernel::<New, f32>(x)
}

/// The exact (erf) GELU of contiguous f32 values (the fused op's CPU kernel).
pub(super) fn gelu_erf_fwd(x: &[f32]) -> Vec<f32> {
    fwd_kernel::<Erf, f32>(x)
}

/// `(gelu(x), gelu'(x))` of contiguous f32 values in one pass (GELU `G`): what the fused
/// branch keeps for backward is the derivative, so backward is one product by it, with the
/// bits [`bwd_kernel`] would give.
pub(super) fn fwd_and_grad<G: Gelu>(x: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let path = KernelPath::active();
    let (mut y, mut d) = (uninit::<f32>(x.len()), uninit::<f32>(x.len()));
    type Item<'a> = ((&'a mut [MaybeUninit<f32>], &'a mut [MaybeUninit<f32>]), &'a [f32]);
    let body = |((yc, dc), xc): Item| gelu_fwd_and_grad::<G>(path, yc, dc, xc);
    if use_par(x.len()) {
        y.par_chunks_mut(CHUNK)
            .zip(d.par_chunks_mut(CHUNK))
            .zip(x.par_chunks(CHUNK))
            .for_each(body);
    } else {
        y.chunks_mut(CHUNK)
            .zip(d.chunks_mut(CHUNK))
            .zip(x.chunks(CHUNK))
            .for_each(body);
    }
    // SAFETY: the chunks cover y and d, and each call writes all of its slots of both.
    unsafe { (assume_init(y), assume_init(d)) }
}

/// `a * b` elementwise (equal lengths): the backward of a GELU whose derivative was kept.
pub(super) fn times(a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut out = uninit::<f32>(a.len());
    type Item<'a> = ((&'a mut [MaybeUninit<f32>], &'a [f32]), &'a [f32]);
    let body = |((oc, ac), bc): Item| {
        for ((o, &x), &y) in oc.iter_mut().zip(ac).zip(bc) {
            o.write(x * y);
        }
    };
    if use_par(a.len()) {
        out.par_chunks_mut(CHUNK)
            .zip(a.par_chunks(CHUNK))
            .zip(b.par_chunks(CHUNK))
            .for_each(body);
    } else {
        out.chunks_mut(CHUNK)
            .zip(a.chunks(CHUNK))
            .zip(b.chunks(CHUNK))
            .for_each(body);
    }
    // SAFETY: the chunks cover `out` (a and b have its length) and each writes all of its
    // slots.
    unsafe { assume_init(out) }
}

struct ActOp<A>(PhantomData<A>);

impl<A: Activation> CustomOp1 for ActOp<A> {
    fn name(&self) -> &'static str {
        A::NAME
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = match s.dtype() {
            DType::F32 => CpuStorage::F32(fwd_kernel::<A, f32>(cpu_slice::<f32>(s, l, A::NAME)?)),
            DType::F64 => CpuStorage::F64(fwd_kernel::<A, f64>(cpu_slice::<f64>(s, l, A::NAME)?)),
            dt => return Err(unsupported(A::NAME, dt)),
        };
        Ok((out, l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((crate::cuda::gelu_fwd(s, l, A::KIND)?, l.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        if !x.device().is_cpu() {
            let dx = x
                .contiguous()?
                .apply_op2_no_bwd(&dy.contiguous()?, &GeluBackward::<A>(PhantomData))?;
            return Ok(Some(dx));
        }
        fn run<A: Activation, T: Float>(x: &Tensor, dy: &Tensor) -> Result<Tensor> {
            let v = with_cpu_slice::<T, _>(x, A::NAME, |xs| {
                with_cpu_slice::<T, _>(dy, A::NAME, |g| Ok(bwd_kernel::<A, T>(xs, g)))
            })?;
            Tensor::from_vec(v, x.shape(), x.device())
        }
        Ok(Some(match x.dtype() {
            DType::F32 => run::<A, f32>(x, dy)?,
            DType::F64 => run::<A, f64>(x, dy)?,
            dt => return Err(unsupported(A::NAME, dt)),
        }))
    }
}

/// A GELU's backward on a GPU, `dy * gelu'(x)` (a kernel); never differentiated.
struct GeluBackward<A>(PhantomData<A>);

impl<A: Activation> candle_core::CustomOp2 for GeluBackward<A> {
    fn name(&self) -> &'static str {
        "fpt-gelu-backward"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!(
            "{}: the backward op is for GPUs (the CPU's is in the forward op)",
            A::NAME
        )
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        lx: &Layout,
        dy: &candle_core::CudaStorage,
        ldy: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((crate::cuda::gelu_bwd((x, lx), (dy, ldy), A::KIND)?, lx.shape().clone()))
    }
}

/// The input's gradient of [`gelu_new`] (`erf: false`) or [`gelu_erf`] at `x` from the
/// output's `dy`, as the op's own backward computes it (the fused kernels, or the composed
/// ops' backprop where no fused op runs).
pub(crate) fn gelu_grad(erf: bool, x: &Tensor, dy: &Tensor) -> Result<Tensor> {
    if !super::fused_here(x) {
        return match erf {
            true => super::vjp(x, dy, gelu_erf_composed),
            false => super::vjp(x, dy, gelu_new_composed),
        };
    }
    let x = x.contiguous()?;
    let dx = match erf {
        true => ActOp::<Erf>(PhantomData).bwd(&x, &x, dy)?,
        false => ActOp::<New>(PhantomData).bwd(&x, &x, dy)?,
    };
    dx.ok_or_else(|| candle_core::Error::Msg("gelu: the backward computed no gradient".into()))
}

/// `gelu_new` (tanh-approximated GELU, GPT-2's activation). Fused on the CPU and on a GPU
/// (f32), composed of candle ops otherwise.
pub fn gelu_new(x: &Tensor) -> Result<Tensor> {
    if !super::fused_here(x) {
        return gelu_new_composed(x);
    }
    x.contiguous()?.apply_op1(ActOp::<New>(PhantomData))
}

/// `gelu_new` composed of stock candle ops (reference; every device).
pub fn gelu_new_composed(x: &Tensor) -> Result<Tensor> {
    let inner = (x + x.powf(3.0)?.affine(A, 0.0)?)?.affine(C, 0.0)?;
    x.affine(0.5, 0.0)? * (inner.tanh()? + 1.0)?
}

/// Exact (erf) GELU, BERT's `gelu`. Fused on the CPU and on a GPU (f32), composed of
/// candle ops otherwise.
pub fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    if !super::fused_here(x) {
        return gelu_erf_composed(x);
    }
    x.contiguous()?.apply_op1(ActOp::<Erf>(PhantomData))
}

/// Exact GELU composed of stock candle ops (reference; every device).
pub fn gelu_erf_composed(x: &Tensor) -> Result<Tensor> {
    let e = x.affine(INV_SQRT2, 0.0)?.erf()?;
    x.affine(0.5, 0.0)? * (e + 1.0)?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{with_path, KernelPath};

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The one-pass value and derivative the fused branch keeps give the bits of the
    /// separate forward and backward kernels, on every kernel path, below and above the
    /// parallel threshold (chunk edges and the 8-lane tails included).
    #[test]
    fn value_and_kept_derivative_equal_the_separate_kernels() {
        let sizes = if cfg!(miri) { vec![37] } else { vec![37, 3 * CHUNK + 13] };
        for path in KernelPath::available() {
            with_path(path, || {
                for &n in &sizes {
                    let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 2001) as f32 * 0.01 - 10.0).collect();
                    let dy: Vec<f32> = (0..n).map(|i| ((i * 31) % 97) as f32 * 0.02 - 1.0).collect();
                    let (y, d) = fwd_and_grad::<super::super::fastmath::GeluNew>(&x);
                    assert_eq!(
                        bits(&y),
                        bits(&fwd_kernel::<New, f32>(&x)),
                        "{path} gelu_new value, n {n}"
                    );
                    assert_eq!(
                        bits(&times(&dy, &d)),
                        bits(&bwd_kernel::<New, f32>(&x, &dy)),
                        "{path} gelu_new grad, n {n}"
                    );
                    let (y, d) = fwd_and_grad::<super::super::fastmath::GeluErf>(&x);
                    assert_eq!(
                        bits(&y),
                        bits(&fwd_kernel::<Erf, f32>(&x)),
                        "{path} gelu_erf value, n {n}"
                    );
                    assert_eq!(
                        bits(&times(&dy, &d)),
                        bits(&bwd_kernel::<Erf, f32>(&x, &dy)),
                        "{path} gelu_erf grad, n {n}"
                    );
                }
            })
            .expect("an available path runs here");
        }
    }
}

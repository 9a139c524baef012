//! Branch-free `exp` and `tanh` for f32, and GPT-2's and BERT's GELUs over slices in AVX2 +
//! FMA intrinsics on the AVX2 and AVX-512 kernel paths (the caller passes its
//! [`KernelPath`]); plain loops over the same formulas on the portable path.
//!
//! `exp_f32` is the Cephes `expf` scheme: x = n ln 2 + r with |r| <= ln 2 / 2, a degree-6
//! polynomial for e^r, and 2^n put into the exponent bits; relative error about 2e-7 over
//! the clamped range [-87.3, 88.7] (beyond it the result saturates at ~1e-38 or ~3e38, where
//! the callers' results are already exact: tanh = +-1, softmax weights 0).

use crate::kernels::KernelPath;
use std::mem::MaybeUninit;

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// e^x, vectorizable (no calls, no branches).
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    let x = x.clamp(-87.3, 88.7);
    let n = floor_small(x * LOG2E + 0.5);
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    y * pow2_int(n)
}

/// 1.5 * 2^23: adding and subtracting it rounds an f32 of magnitude below 2^22 to an
/// integer, and the sum's low mantissa bits then hold that integer.
const ROUND: f32 = 12_582_912.0;

/// `t.floor()` for |t| < 2^22 without a call or a conversion: `f32::floor` is a `floorf`
/// call on CPUs without SSE4.1's `roundps` (the baseline x86-64 target the portable path is
/// compiled for) and `as i32` a scalar saturating conversion, either of which keeps the
/// loops around it scalar.
#[inline(always)]
fn floor_small(t: f32) -> f32 {
    let r = (t + ROUND) - ROUND;
    if r > t {
        r - 1.0
    } else {
        r
    }
}

/// `2^n` for an integral `n` in [-126, 127] (the exponent bits; 128 gives +inf), with
/// integer adds and a shift only.
#[inline(always)]
fn pow2_int(n: f32) -> f32 {
    let i = (n + ROUND).to_bits().wrapping_sub(ROUND.to_bits());
    f32::from_bits(i.wrapping_add(127) << 23)
}

/// tanh(u) = 1 - 2 / (e^(2u) + 1), vectorizable; exact +-1 in the limits.
#[inline(always)]
pub(crate) fn tanh_f32(u: f32) -> f32 {
    1.0 - 2.0 / (exp_f32(2.0 * u) + 1.0)
}

/// Whether the AVX2 + FMA loops run on `path` (and the CPU has them: a path the CPU lacks
/// is never active, see [`KernelPath::active`]; checked again here, once per call).
#[inline]
fn use_avx2(path: KernelPath) -> bool {
    path.avx2() && path.runs_here()
}

/// `e^x` for 8 lanes: the same scheme as [`exp_f32`] in AVX2 + FMA intrinsics.
///
/// # Safety
/// The CPU must have AVX2 and FMA (callers are compiled with them enabled).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn exp8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // SAFETY: the callers are compiled with AVX2 and FMA enabled.
    unsafe {
        let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3)), _mm256_set1_ps(88.7));
        let n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E), _mm256_set1_ps(0.5)));
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_2e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666_666_5e-1));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
        let y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0));
        let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
        _mm256_mul_ps(y, _mm256_castsi256_ps(e))
    }
}

/// `gelu_new` (and its derivative) for 8 lanes: `(y, dy/dx)`.
///
/// # Safety
/// The CPU must have AVX2 and FMA (callers are compiled with them enabled).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn gelu_new8(x: std::arch::x86_64::__m256) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
    use std::arch::x86_64::*;
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    const A: f32 = 0.044_715;
    // SAFETY: the callers are compiled with AVX2 and FMA enabled.
    unsafe {
        let one = _mm256_set1_ps(1.0);
        let half = _mm256_set1_ps(0.5);
        let x2 = _mm256_mul_ps(x, x);
        let u = _mm256_mul_ps(
            _mm256_set1_ps(C),
            _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(A), x2), x, x),
        );
        // tanh(u) = 1 - 2 / (e^(2u) + 1)
        let e = exp8(_mm256_add_ps(u, u));
        let t = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0), _mm256_add_ps(e, one)));
        let opt = _mm256_add_ps(one, t);
        let y = _mm256_mul_ps(_mm256_mul_ps(half, x), opt);
        let dt = _mm256_mul_ps(
            _mm256_fnmadd_ps(t, t, one),
            _mm256_mul_ps(_mm256_set1_ps(C), _mm256_fmadd_ps(_mm256_set1_ps(3.0 * A), x2, one)),
        );
        let d = _mm256_fmadd_ps(_mm256_mul_ps(half, x), dt, _mm256_mul_ps(half, opt));
        (y, d)
    }
}

/// `gelu_new` and its derivative in f32 (scalar, the vectorizable formulas).
#[inline(always)]
pub(crate) fn gelu_new_scalar(x: f32) -> (f32, f32) {
    const C: f32 = 0.797_884_6;
    const A: f32 = 0.044_715;
    let t = tanh_f32(C * (x + A * x * x * x));
    let y = 0.5 * x * (1.0 + t);
    let dt = (1.0 - t * t) * C * (1.0 + 3.0 * A * x * x);
    (y, 0.5 * (1.0 + t) + 0.5 * x * dt)
}

/// `row := softmax(scale * row)` in place (a non-empty slice): AVX2 + FMA on those paths.
pub(crate) fn softmax_in_place(path: KernelPath, row: &mut [f32], scale: f32) {
    if use_avx2(path) {
        // SAFETY: `use_avx2` checked that the CPU has AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        return unsafe { softmax_avx2(row, scale) };
    }
    softmax_lanes(row, scale)
}

/// [`softmax_in_place`]'s plain-Rust body: maxima and sums kept in [`LANES`] partial lanes
/// (a sequential `f32` reduction cannot be vectorized, an array of partial ones can), so
/// the compiler vectorizes it for whatever SIMD the portable target has (SSE2, NEON).
fn softmax_lanes(row: &mut [f32], scale: f32) {
    let split = row.len() / LANES * LANES;
    let mut mx = [f32::NEG_INFINITY; LANES];
    for c in row[..split].chunks_exact(LANES) {
        for j in 0..LANES {
            mx[j] = mx[j].max(c[j] * scale);
        }
    }
    let max = row[split..]
        .iter()
        .fold(mx.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)), |m, &v| {
            m.max(v * scale)
        });
    let mut sums = [0f32; LANES];
    for c in row[..split].chunks_exact_mut(LANES) {
        for j in 0..LANES {
            let e = exp_f32(c[j] * scale - max);
            c[j] = e;
            sums[j] += e;
        }
    }
    let mut sum: f32 = sums.iter().sum();
    for v in &mut row[split..] {
        let e = exp_f32(*v * scale - max);
        *v = e;
        sum += e;
    }
    let inv = 1.0 / sum;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

/// Partial lanes of the portable reductions (two SSE / NEON registers).
const LANES: usize = 8;

/// [`softmax_in_place`]'s AVX2 body.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_avx2(row: &mut [f32], scale: f32) {
    use std::arch::x86_64::*;
    let n8 = row.len() / 8 * 8;
    let p = row.as_mut_ptr();
    // SAFETY: every vector access covers i..i + 8 <= n8 <= row.len().
    unsafe {
        let sc = _mm256_set1_ps(scale);
        let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
        for i in (0..n8).step_by(8) {
            mv = _mm256_max_ps(mv, _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), sc));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), mv);
        let mut max = lanes.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        for &v in &row[n8..] {
            max = max.max(v * scale);
        }
        let mx = _mm256_set1_ps(max);
        let mut sv = _mm256_setzero_ps();
        for i in (0..n8).step_by(8) {
            let e = exp8(_mm256_fmsub_ps(_mm256_loadu_ps(p.add(i)), sc, mx));
            _mm256_storeu_ps(p.add(i), e);
            sv = _mm256_add_ps(sv, e);
        }
        _mm256_storeu_ps(lanes.as_mut_ptr(), sv);
        let mut sum: f32 = lanes.iter().sum();
        for v in &mut row[n8..] {
            let e = exp_f32(*v * scale - max);
            *v = e;
            sum += e;
        }
        let inv = _mm256_set1_ps(1.0 / sum);
        for i in (0..n8).step_by(8) {
            _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), inv));
        }
        let inv = 1.0 / sum;
        for v in &mut row[n8..] {
            *v *= inv;
        }
    }
}

/// Dropout multipliers: `out[j] = 0` when `hash(key, first + j) / 2^24 < p`, else `keep`
/// (`1 / (1 - p)`), with the 32-bit `lowbias32` hash (C. Wellons) of the key mixed with the
/// counter. Vectorized with AVX2 on those paths; the same values on every path.
pub(crate) fn dropout_multipliers(path: KernelPath, out: &mut [f32], key: u32, first: u32, p: f64) {
    let thr = (p * (1u32 << 24) as f64).round().clamp(0.0, (1u32 << 24) as f64) as i32;
    let keep = (1.0 / (1.0 - p)) as f32;
    if use_avx2(path) {
        // SAFETY: `use_avx2` checked that the CPU has AVX2.
        #[cfg(target_arch = "x86_64")]
        return unsafe { multipliers_avx2(out, key, first, thr, keep) };
    }
    multipliers_body(out, key, first, thr, keep)
}

#[inline(always)]
fn multipliers_body(out: &mut [f32], key: u32, first: u32, thr: i32, keep: f32) {
    for (j, o) in out.iter_mut().enumerate() {
        let mut x = key ^ first.wrapping_add(j as u32).wrapping_mul(0x9E37_79B9);
        x ^= x >> 16;
        x = x.wrapping_mul(0x7feb_352d);
        x ^= x >> 15;
        x = x.wrapping_mul(0x846c_a68b);
        x ^= x >> 16;
        *o = if ((x >> 8) as i32) < thr { 0.0 } else { keep };
    }
}

/// [`multipliers_body`] compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn multipliers_avx2(out: &mut [f32], key: u32, first: u32, thr: i32, keep: f32) {
    multipliers_body(out, key, first, thr, keep)
}

// erfc(a) ~ t P(t) e^(-a^2), t = 1 / (1 + ERF_P a), a >= 0 (Abramowitz & Stegun 7.1.26:
// absolute error <= 1.5e-7; the form PyTorch's vectorized CPU `erf` uses for f32).
const ERF_P: f32 = 0.327_591_1;
const ERF_A: [f32; 5] = [0.254_829_6, -0.284_496_72, 1.421_413_8, -1.453_152, 1.061_405_4];
const INV_SQRT2: f32 = std::f32::consts::FRAC_1_SQRT_2;
const INV_SQRT_2PI: f32 = 0.398_942_3;

/// BERT's exact GELU `0.5 x (1 + erf(x / sqrt 2))` and its derivative in f32 (scalar, the
/// vectorizable formulas): `1 + erf` is taken as `erfc(|z|)` for negative x (no
/// cancellation) and `2 - erfc(z)` otherwise; the derivative reuses `e^(-x^2 / 2)`.
#[inline(always)]
pub(crate) fn gelu_erf_scalar(x: f32) -> (f32, f32) {
    let a = x.abs() * INV_SQRT2;
    let t = 1.0 / (1.0 + ERF_P * a);
    let p = (((ERF_A[4] * t + ERF_A[3]) * t + ERF_A[2]) * t + ERF_A[1]) * t + ERF_A[0];
    // e^(-a^2), 0 where it would underflow (no subnormal results further down).
    let e = if a * a < 87.0 { exp_f32(-a * a) } else { 0.0 };
    let q = p * t * e;
    let onepe = if x < 0.0 { q } else { 2.0 - q };
    (0.5 * x * onepe, 0.5 * onepe + x * e * INV_SQRT_2PI)
}

/// [`gelu_erf_scalar`] for 8 lanes: `(y, dy/dx)`.
///
/// # Safety
/// The CPU must have AVX2 and FMA (callers are compiled with them enabled).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn gelu_erf8(x: std::arch::x86_64::__m256) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
    use std::arch::x86_64::*;
    // SAFETY: the callers are compiled with AVX2 and FMA enabled.
    unsafe {
        let one = _mm256_set1_ps(1.0);
        let half = _mm256_set1_ps(0.5);
        let a = _mm256_mul_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0), x), _mm256_set1_ps(INV_SQRT2));
        let t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(ERF_P), a, one));
        let mut p = _mm256_set1_ps(ERF_A[4]);
        for c in [ERF_A[3], ERF_A[2], ERF_A[1], ERF_A[0]] {
            p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c));
        }
        let a2 = _mm256_mul_ps(a, a);
        let e = _mm256_and_ps(
            exp8(_mm256_sub_ps(_mm256_setzero_ps(), a2)),
            _mm256_cmp_ps::<_CMP_LT_OQ>(a2, _mm256_set1_ps(87.0)),
        );
        let q = _mm256_mul_ps(_mm256_mul_ps(p, t), e);
        let neg = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_setzero_ps());
        let onepe = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(2.0), q), q, neg);
        let y = _mm256_mul_ps(_mm256_mul_ps(half, x), onepe);
        let d = _mm256_fmadd_ps(
            _mm256_mul_ps(x, e),
            _mm256_set1_ps(INV_SQRT_2PI),
            _mm256_mul_ps(half, onepe),
        );
        (y, d)
    }
}

/// SiLU (x * sigmoid(x), Llama's SwiGLU gate) and its derivative in f32 (scalar, the
/// vectorizable formulas): `s = 1 / (1 + e^-x)`, `y = x s`, `dy/dx = s (1 + x (1 - s))`.
#[inline(always)]
pub(crate) fn silu_scalar(x: f32) -> (f32, f32) {
    let s = 1.0 / (1.0 + exp_f32(-x));
    (x * s, s * (1.0 + x * (1.0 - s)))
}

/// [`silu_scalar`] for 8 lanes: `(y, dy/dx)`.
///
/// # Safety
/// The CPU must have AVX2 and FMA (callers are compiled with them enabled).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn silu8(x: std::arch::x86_64::__m256) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
    use std::arch::x86_64::*;
    // SAFETY: the callers are compiled with AVX2 and FMA enabled.
    unsafe {
        let one = _mm256_set1_ps(1.0);
        let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        let s = _mm256_div_ps(one, _mm256_add_ps(one, e));
        let y = _mm256_mul_ps(x, s);
        let d = _mm256_mul_ps(s, _mm256_fmadd_ps(x, _mm256_sub_ps(one, s), one));
        (y, d)
    }
}

/// SiLU, run by the same slice loops as the GELUs.
pub(crate) struct Silu;
impl Gelu for Silu {
    #[inline(always)]
    fn scalar(x: f32) -> (f32, f32) {
        silu_scalar(x)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn lanes8(x: std::arch::x86_64::__m256) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
        // SAFETY: forwarded contract.
        unsafe { silu8(x) }
    }
}

/// An activation as the slice loops below run it (the GELUs, SiLU): value and derivative,
/// scalar and 8 lanes.
pub(crate) trait Gelu {
    /// `(y, dy/dx)` at `x`.
    fn scalar(x: f32) -> (f32, f32);
    /// `(y, dy/dx)` for 8 lanes.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    unsafe fn lanes8(x: std::arch::x86_64::__m256) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256);
}

/// GPT-2's `gelu_new` (tanh approximation).
pub(crate) struct GeluNew;
impl Gelu for GeluNew {
    #[inline(always)]
    fn scalar(x: f32) -> (f32, f32) {
        gelu_new_scalar(x)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn lanes8(x: std::arch::x86_64::__m256) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
        // SAFETY: forwarded contract.
        unsafe { gelu_new8(x) }
    }
}

/// BERT's exact (erf) GELU.
pub(crate) struct GeluErf;
impl Gelu for GeluErf {
    #[inline(always)]
    fn scalar(x: f32) -> (f32, f32) {
        gelu_erf_scalar(x)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn lanes8(x: std::arch::x86_64::__m256) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
        // SAFETY: forwarded contract.
        unsafe { gelu_erf8(x) }
    }
}

/// [`gelu_fwd`]'s AVX2 body: every slot of `y` (up to `x`'s length) is written.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_fwd_avx2<G: Gelu>(y: &mut [MaybeUninit<f32>], x: &[f32]) {
    use std::arch::x86_64::*;
    let n8 = x.len().min(y.len()) / 8 * 8;
    let yp = y.as_mut_ptr() as *mut f32;
    for i in (0..n8).step_by(8) {
        // SAFETY: i + 8 <= len of both slices (raw stores into the output slots); the CPU
        // has AVX2 and FMA (this function's contract).
        unsafe { _mm256_storeu_ps(yp.add(i), G::lanes8(_mm256_loadu_ps(x.as_ptr().add(i))).0) };
    }
    for i in n8..x.len() {
        y[i].write(G::scalar(x[i]).0);
    }
}

/// [`gelu_bwd`]'s AVX2 body.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_bwd_avx2<G: Gelu>(dx: &mut [MaybeUninit<f32>], x: &[f32], dy: &[f32]) {
    use std::arch::x86_64::*;
    let n8 = x.len().min(dx.len()).min(dy.len()) / 8 * 8;
    let dp = dx.as_mut_ptr() as *mut f32;
    for i in (0..n8).step_by(8) {
        // SAFETY: i + 8 <= len of the three slices (raw stores into the output slots); the
        // CPU has AVX2 and FMA (this function's contract).
        unsafe {
            let d = G::lanes8(_mm256_loadu_ps(x.as_ptr().add(i))).1;
            _mm256_storeu_ps(dp.add(i), _mm256_mul_ps(d, _mm256_loadu_ps(dy.as_ptr().add(i))));
        }
    }
    for i in n8..x.len() {
        dx[i].write(dy[i] * G::scalar(x[i]).1);
    }
}

/// [`gelu_fwd_and_grad`]'s AVX2 body: every slot of `y` and `d` (up to `x`'s length) is
/// written.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_fwd_and_grad_avx2<G: Gelu>(y: &mut [MaybeUninit<f32>], d: &mut [MaybeUninit<f32>], x: &[f32]) {
    use std::arch::x86_64::*;
    let n8 = x.len().min(y.len()).min(d.len()) / 8 * 8;
    let (yp, dp) = (y.as_mut_ptr() as *mut f32, d.as_mut_ptr() as *mut f32);
    for i in (0..n8).step_by(8) {
        // SAFETY: i + 8 <= len of the three slices (raw stores into the output slots); the
        // CPU has AVX2 and FMA (this function's contract).
        unsafe {
            let (v, g) = G::lanes8(_mm256_loadu_ps(x.as_ptr().add(i)));
            _mm256_storeu_ps(yp.add(i), v);
            _mm256_storeu_ps(dp.add(i), g);
        }
    }
    for i in n8..x.len() {
        let (v, g) = G::scalar(x[i]);
        y[i].write(v);
        d[i].write(g);
    }
}

/// `y = gelu(x)` and `d = gelu'(x)` over slices in one pass (the values [`gelu_fwd`] and
/// [`gelu_bwd`] compute, bit for bit): AVX2 + FMA on those paths.
pub(crate) fn gelu_fwd_and_grad<G: Gelu>(
    path: KernelPath,
    y: &mut [MaybeUninit<f32>],
    d: &mut [MaybeUninit<f32>],
    x: &[f32],
) {
    if use_avx2(path) {
        // SAFETY: `use_avx2` checked that the CPU has AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        return unsafe { gelu_fwd_and_grad_avx2::<G>(y, d, x) };
    }
    for ((o, g), &v) in y.iter_mut().zip(d.iter_mut()).zip(x) {
        let (a, b) = G::scalar(v);
        o.write(a);
        g.write(b);
    }
}

/// `y = gelu(x)` over slices: AVX2 + FMA on those paths.
pub(crate) fn gelu_fwd<G: Gelu>(path: KernelPath, y: &mut [MaybeUninit<f32>], x: &[f32]) {
    if use_avx2(path) {
        // SAFETY: `use_avx2` checked that the CPU has AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        return unsafe { gelu_fwd_avx2::<G>(y, x) };
    }
    for (o, &v) in y.iter_mut().zip(x) {
        o.write(G::scalar(v).0);
    }
}

/// `dx = dy * gelu'(x)` over slices: AVX2 + FMA on those paths.
pub(crate) fn gelu_bwd<G: Gelu>(path: KernelPath, dx: &mut [MaybeUninit<f32>], x: &[f32], dy: &[f32]) {
    if use_avx2(path) {
        // SAFETY: `use_avx2` checked that the CPU has AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        return unsafe { gelu_bwd_avx2::<G>(dx, x, dy) };
    }
    for ((d, &v), &g) in dx.iter_mut().zip(x).zip(dy) {
        d.write(g * G::scalar(v).1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_and_tanh_match_std() {
        let mut worst_exp = 0f64;
        let mut worst_tanh = 0f64;
        // Miri (`cargo xtask sanitize`) interprets every instruction: coarser steps there.
        let (step, n_mask) = if cfg!(miri) {
            (1.37f32, 4_099)
        } else {
            (0.0137f32, 100_003)
        };
        let mut x = -100.0f32;
        while x < 100.0 {
            let want = (x as f64).exp();
            if (-87.0..88.0).contains(&x) {
                worst_exp = worst_exp.max(((exp_f32(x) as f64) - want).abs() / want);
            }
            worst_tanh = worst_tanh.max(((tanh_f32(x) as f64) - (x as f64).tanh()).abs());
            x += step;
        }
        assert!(worst_exp < 5e-7, "exp relative error {worst_exp}");
        assert!(worst_tanh < 3e-7, "tanh absolute error {worst_tanh}");
        assert_eq!(tanh_f32(1e4), 1.0);
        assert_eq!(tanh_f32(-1e4), -1.0);
        assert!(exp_f32(-1e4) < 1e-37);
        for path in KernelPath::available() {
            // Softmax (vector body and tail) against the plain formula.
            for n in [1usize, 7, 8, 16, 29, 515] {
                // Mostly smooth values, and every 5th far below the maximum (weight 0).
                let xs: Vec<f32> = (0..n)
                    .map(|i| if i % 5 == 3 { -1e4 } else { (i as f32 * 0.7).sin() * 4.0 })
                    .collect();
                let mut got = xs.clone();
                softmax_in_place(path, &mut got, 0.9);
                let m = xs.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v as f64 * 0.9));
                let z: f64 = xs.iter().map(|&v| (v as f64 * 0.9 - m).exp()).sum();
                for (g, &v) in got.iter().zip(&xs) {
                    let want = (v as f64 * 0.9 - m).exp() / z;
                    assert!((*g as f64 - want).abs() < 1e-6, "{path}: n {n}: {g} vs {want}");
                }
            }
            // Dropout multipliers: every path gives the scalar body's values; the rate is p.
            let mut a = vec![0f32; n_mask];
            let mut b = vec![0f32; n_mask];
            dropout_multipliers(path, &mut a, 12345, 7, 0.3);
            multipliers_body(
                &mut b,
                12345,
                7,
                (0.3f64 * (1u32 << 24) as f64).round() as i32,
                (1.0 / 0.7) as f32,
            );
            assert_eq!(a, b, "{path}");
            let dropped = a.iter().filter(|&&v| v == 0.0).count() as f64 / a.len() as f64;
            let tol = if cfg!(miri) { 0.03 } else { 0.005 };
            assert!((dropped - 0.3).abs() < tol, "{path}: {dropped}");
            // The GELU loops (8 lanes and tail) against the f64 formula of gelu_new.
            let xs: Vec<f32> = (0..37).map(|i| i as f32 * 0.3 - 5.0).collect();
            let g: Vec<f32> = (0..37).map(|i| 1.0 + i as f32 * 0.01).collect();
            let (mut y, mut d) = (super::super::uninit::<f32>(37), super::super::uninit::<f32>(37));
            gelu_fwd::<GeluNew>(path, &mut y, &xs);
            gelu_bwd::<GeluNew>(path, &mut d, &xs, &g);
            // SAFETY: both functions write every slot.
            let (y, d) = unsafe { (super::super::assume_init(y), super::super::assume_init(d)) };
            for i in 0..37 {
                let x = xs[i] as f64;
                let c = (2.0 / std::f64::consts::PI).sqrt();
                let t = (c * (x + 0.044715 * x * x * x)).tanh();
                let sy = 0.5 * x * (1.0 + t);
                let sd = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
                let (gy, gd) = (y[i] as f64, d[i] as f64);
                assert!((gy - sy).abs() <= 1e-6 * (1.0 + sy.abs()), "{path} {i}: {gy} vs {sy}");
                let want = g[i] as f64 * sd;
                assert!(
                    (gd - want).abs() <= 2e-6 * (1.0 + want.abs()),
                    "{path} {i}: {gd} vs {want}"
                );
            }
        }
    }

    /// The call-free floor and power of two used by `exp_f32` are exact: integers, halves
    /// and values either side of them, over the whole range `exp_f32` feeds them.
    #[test]
    fn floor_and_pow2_are_exact() {
        let mut t = -130.0f32;
        while t <= 130.0 {
            for v in [t, t + 0.5, t.next_up(), t.next_down(), (t + 0.5).next_down()] {
                assert_eq!(floor_small(v), v.floor(), "floor({v})");
            }
            t += 0.25;
        }
        // The references by exact doublings and halvings (`powi` is not exact everywhere:
        // Miri, for one, adds error to it on purpose).
        let mut up = 1f32;
        let mut down = 1f32;
        for n in 0..=127 {
            assert_eq!(pow2_int(n as f32), up, "2^{n}");
            up *= 2.0;
            if n <= 126 {
                assert_eq!(pow2_int(-(n as f32)), down, "2^-{n}");
                down *= 0.5;
            }
        }
        assert_eq!(pow2_int(128.0), f32::INFINITY);
    }

    /// The f32 erf GELU (8 lanes and scalar) against the f64 formula with libm's erf, and
    /// its derivative against the f64 derivative.
    #[test]
    fn gelu_erf_matches_the_f64_formula() {
        for path in KernelPath::available() {
            check_gelu_erf(path);
        }
    }

    fn check_gelu_erf(path: KernelPath) {
        let n = if cfg!(miri) { 401 } else { 4001 };
        let xs: Vec<f32> = (0..n).map(|i| i as f32 * (20.0 / (n - 1) as f32) - 10.0).collect();
        let ones = vec![1f32; n];
        let (mut y, mut d) = (super::super::uninit::<f32>(n), super::super::uninit::<f32>(n));
        gelu_fwd::<GeluErf>(path, &mut y, &xs);
        gelu_bwd::<GeluErf>(path, &mut d, &xs, &ones);
        // SAFETY: both functions write every slot.
        let (y, d) = unsafe { (super::super::assume_init(y), super::super::assume_init(d)) };
        let (mut worst_y, mut worst_d) = (0f64, 0f64);
        for i in 0..n {
            let v = xs[i] as f64;
            let e = libm::erf(v / 2f64.sqrt());
            let want_y = 0.5 * v * (1.0 + e);
            let want_d = 0.5 * (1.0 + e) + v * (-0.5 * v * v).exp() / (2.0 * std::f64::consts::PI).sqrt();
            worst_y = worst_y.max((y[i] as f64 - want_y).abs());
            worst_d = worst_d.max((d[i] as f64 - want_d).abs());
            let (sy, sd) = gelu_erf_scalar(xs[i]);
            assert!(
                (sy - y[i]).abs() <= 1e-6 * (1.0 + sy.abs()),
                "{}: {sy} vs {}",
                xs[i],
                y[i]
            );
            assert!(
                (sd - d[i]).abs() <= 1e-6 * (1.0 + sd.abs()),
                "{}: {sd} vs {}",
                xs[i],
                d[i]
            );
        }
        assert!(worst_y < 1e-6, "{path}: value error {worst_y}");
        assert!(worst_d < 1e-6, "{path}: derivative error {worst_d}");
        // Exact limits: 0 far left, x far right; never a subnormal value.
        assert_eq!(gelu_erf_scalar(-30.0), (0.0, 0.0));
        assert_eq!(gelu_erf_scalar(30.0), (30.0, 1.0));
        for (i, (&a, &b)) in y.iter().zip(&d).enumerate() {
            for v in [a, b] {
                assert!(v == 0.0 || v.abs() >= f32::MIN_POSITIVE, "{}: subnormal {v}", xs[i]);
            }
        }
    }
}

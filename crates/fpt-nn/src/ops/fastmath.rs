//! Branch-free `exp` and `tanh` for f32 that the compiler vectorizes, and elementwise
//! loops compiled for AVX2 + FMA where the CPU has them (chosen at run time).
//!
//! `exp_f32` is the Cephes `expf` scheme: x = n ln 2 + r with |r| <= ln 2 / 2, a degree-6
//! polynomial for e^r, and 2^n put into the exponent bits; relative error about 2e-7 over
//! the clamped range [-87.3, 88.7] (beyond it the result saturates at ~1e-38 or ~3e38, where
//! the callers' results are already exact: tanh = +-1, softmax weights 0).

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// e^x, vectorizable (no calls, no branches).
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    let x = x.clamp(-87.3, 88.7);
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// tanh(u) = 1 - 2 / (e^(2u) + 1), vectorizable; exact +-1 in the limits.
#[inline(always)]
pub(crate) fn tanh_f32(u: f32) -> f32 {
    1.0 - 2.0 / (exp_f32(2.0 * u) + 1.0)
}

/// Whether the AVX2 + FMA loops can run here.
pub(crate) fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `out[i] = f(x[i])`, vectorized with AVX2 + FMA where available.
#[inline(always)]
pub(crate) fn map1(out: &mut [f32], x: &[f32], f: impl Fn(f32) -> f32 + Copy) {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn wide(out: &mut [f32], x: &[f32], f: impl Fn(f32) -> f32 + Copy) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = f(v);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { wide(out, x, f) };
    }
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f(v);
    }
}

/// `out[i] = f(x[i], y[i])`, vectorized with AVX2 + FMA where available.
#[inline(always)]
pub(crate) fn map2(out: &mut [f32], x: &[f32], y: &[f32], f: impl Fn(f32, f32) -> f32 + Copy) {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn wide(out: &mut [f32], x: &[f32], y: &[f32], f: impl Fn(f32, f32) -> f32 + Copy) {
        for ((o, &a), &b) in out.iter_mut().zip(x).zip(y) {
            *o = f(a, b);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { wide(out, x, y, f) };
    }
    for ((o, &a), &b) in out.iter_mut().zip(x).zip(y) {
        *o = f(a, b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_and_tanh_match_std() {
        let mut worst_exp = 0f64;
        let mut worst_tanh = 0f64;
        let mut x = -100.0f32;
        while x < 100.0 {
            let want = (x as f64).exp();
            if (-87.0..88.0).contains(&x) {
                worst_exp = worst_exp.max(((exp_f32(x) as f64) - want).abs() / want);
            }
            worst_tanh = worst_tanh.max(((tanh_f32(x) as f64) - (x as f64).tanh()).abs());
            x += 0.0137;
        }
        assert!(worst_exp < 5e-7, "exp relative error {worst_exp}");
        assert!(worst_tanh < 3e-7, "tanh absolute error {worst_tanh}");
        assert_eq!(tanh_f32(1e4), 1.0);
        assert_eq!(tanh_f32(-1e4), -1.0);
        assert!(exp_f32(-1e4) < 1e-37);
        let mut out = vec![0f32; 37];
        let xs: Vec<f32> = (0..37).map(|i| i as f32 * 0.3 - 5.0).collect();
        map1(&mut out, &xs, tanh_f32);
        for (o, &v) in out.iter().zip(&xs) {
            assert!((o - v.tanh()).abs() < 3e-7);
        }
        map2(&mut out, &xs, &xs, |a, b| a * b);
        for (o, &v) in out.iter().zip(&xs) {
            assert_eq!(*o, v * v);
        }
    }
}

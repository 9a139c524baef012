//! Products with frozen bf16 weights (`precision: bf16`): bf16 operands, f32 sums.
//!
//! A frozen weight stored in bf16 is multiplied with an f32 activation (the forward's `x`,
//! or the backward's `dy`) as follows on every path: the activation is rounded to bf16
//! ([`round`]: round to nearest even, subnormals to zero, as the processor's own
//! conversion), every product of two bf16 values is exact in f32, and the sums are f32. So
//! every path computes the same number up to the order of its f32 additions:
//! - on the `avx512bf16` path ([`crate::KernelPath::Avx512Bf16`]), fpt's blocked product
//!   (`ops/sgemm.rs`) runs with the weight packed once into panels of bf16 pairs
//!   ([`PackedB::new_bf16`]: two depths per 32-bit slot, half the bytes of f32 panels), the
//!   activation packed into pairs as it is read ([`pack_a_pairs`]), and a 12 x 32
//!   micro-kernel of `vdpbf16ps` ([`kernel`]), which multiplies 32 bf16 pairs per instruction
//!   where an f32 FMA multiplies 16 values;
//! - on every other path (`avx512`, `avx2`, `portable`, and other devices through candle
//!   casts), [`widened_product`] rounds the activation to bf16 values, widens the weight to
//!   f32 for the one product, and runs that path's f32 product.

use super::sgemm::{MatMut, MatRef, MicroKernel, PackedB, Tile, KC_BF16, MR, NC, NR};
use crate::kernels::KernelPath;
use candle_core::Tensor;
use half::bf16;
use rayon::prelude::*;

/// `x` rounded to bf16 (its bits): to nearest, ties to even; subnormal inputs and results
/// become zero of the same sign and NaN stays NaN (quiet), as `vcvtne2ps2bf16` converts.
#[inline]
pub fn round(x: f32) -> bf16 {
    let b = x.to_bits();
    if x.is_nan() {
        return bf16::from_bits(((b >> 16) as u16) | 0x0040);
    }
    if b & 0x7f80_0000 == 0 {
        return bf16::from_bits(((b >> 16) & 0x8000) as u16);
    }
    let r = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    let h = (r >> 16) as u16;
    // Rounding a value just below the smallest normal cannot give a subnormal: the exponent
    // of a normal input stays at least 1.
    bf16::from_bits(h)
}

/// `x` rounded to the nearest bf16 value, as f32 (see [`round`]).
#[inline]
pub fn round_f32(x: f32) -> f32 {
    widen(round(x))
}

/// A bf16 value as f32 (exact).
#[inline]
pub fn widen(x: bf16) -> f32 {
    f32::from_bits((x.to_bits() as u32) << 16)
}

/// The pair `(lo, hi)` as one 32-bit slot: `lo` in the low half (the lower depth), as
/// `vdpbf16ps` reads its operands.
#[inline(always)]
fn pair(lo: bf16, hi: bf16) -> f32 {
    f32::from_bits(lo.to_bits() as u32 | ((hi.to_bits() as u32) << 16))
}

/// The AVX512_BF16 micro-kernel when `path` is `avx512bf16` and the CPU runs it.
/// The bf16-pair panels as the blocked product runs them.
pub(super) static BF16_PANELS: super::sgemm::PanelFormat = super::sgemm::PanelFormat {
    name: "bf16",
    micro_kernel,
    pack_a: pack_a_pairs,
    kc: KC_BF16,
};

pub(super) fn micro_kernel(path: KernelPath) -> Option<MicroKernel> {
    #[cfg(target_arch = "x86_64")]
    if path.bf16() && path.runs_here() {
        return Some(kernel as MicroKernel);
    }
    let _ = path;
    None
}

impl PackedB {
    /// Packs the bf16 `k x n` matrix whose element `(p, j)` is `w[p * rs + j * cs]` into the
    /// product's panels, two depths per slot (an odd depth's last slot padded with zero,
    /// as are columns past `n`).
    ///
    /// # Panics
    /// If the extent reaches past `w`.
    pub(crate) fn new_bf16(w: &[bf16], rs: usize, cs: usize, k: usize, n: usize, threads: usize) -> Self {
        if k > 0 && n > 0 {
            let last = (k - 1) * rs + (n - 1) * cs;
            assert!(
                last < w.len(),
                "bf16 panels: {k} x {n} (strides {rs}, {cs}) reaches element {last} of {}",
                w.len()
            );
        }
        let mut offsets = Vec::new();
        let mut total = 0;
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            for pc in (0..k).step_by(KC_BF16) {
                offsets.push(total);
                total += KC_BF16.min(k - pc).div_ceil(2) * nc.div_ceil(NR) * NR;
            }
        }
        let mut data = vec![0f32; total];
        let zero = bf16::from_bits(0);
        let mut i = 0;
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            for pc in (0..k).step_by(KC_BF16) {
                let kc = KC_BF16.min(k - pc);
                let depth = kc.div_ceil(2);
                let slivers = nc.div_ceil(NR);
                let fill = |(s, out): (usize, &mut [f32])| {
                    let j0 = jc + s * NR;
                    let width = NR.min(jc + nc - j0);
                    for q in 0..depth {
                        let (p0, p1) = (pc + 2 * q, pc + 2 * q + 1);
                        for jj in 0..width {
                            let j = j0 + jj;
                            let lo = w[p0 * rs + j * cs];
                            let hi = if p1 < pc + kc { w[p1 * rs + j * cs] } else { zero };
                            out[q * NR + jj] = pair(lo, hi);
                        }
                    }
                };
                let block = &mut data[offsets[i]..offsets[i] + depth * slivers * NR];
                if threads > 1 && slivers > 1 {
                    block.par_chunks_mut(depth * NR).enumerate().for_each(fill);
                } else {
                    block.chunks_mut(depth * NR).enumerate().for_each(fill);
                }
                i += 1;
            }
        }
        Self {
            k,
            n,
            offsets,
            data,
            format: Some(&BF16_PANELS),
        }
        .counted()
    }
}

/// Packs `a(ic..ic+mc, pc..pc+kc)` rounded to bf16 into `MR`-row slivers of depth pairs,
/// each sliver row after row: row `i`'s `kc / 2` (rounded up) slots (two depths each) side
/// by side, zero-padded (a missing last depth, rows past `mc`). Row by row, a row-major A
/// converts 32 values at a time with no transposition; the micro-kernel broadcasts each
/// slot from its row. Runs only on the `avx512bf16` path (with the micro-kernel).
pub(super) fn pack_a_pairs(dst: &mut Vec<f32>, a: MatRef, ic: usize, mc: usize, pc: usize, kc: usize) {
    let depth = kc.div_ceil(2);
    let slivers = mc.div_ceil(MR);
    let len = slivers * depth * MR;
    if dst.len() < len {
        dst.resize(len, 0.0);
    }
    let zero = bf16::from_bits(0);
    for (s, out) in dst[..len].chunks_mut(depth * MR).enumerate() {
        let i0 = ic + s * MR;
        let h = MR.min(ic + mc - i0);
        out[h * depth..].fill(0.0);
        for (i, row) in out.chunks_mut(depth).enumerate().take(h) {
            if a.cs == 1 {
                // SAFETY: (i0 + i, pc..pc + kc) lies inside a (checked by the product's
                // entry against a's length); with cs == 1 those kc values are adjacent.
                let src =
                    unsafe { std::slice::from_raw_parts(a.ptr.offset((i0 + i) as isize * a.rs + pc as isize), kc) };
                round_pairs(src, row);
            } else {
                for (q, slot) in row.iter_mut().enumerate() {
                    // SAFETY: (i0 + i, pc + 2q [+ 1]) lie inside a (as above).
                    let lo = round(unsafe { a.at(i0 + i, pc + 2 * q) });
                    let hi = if 2 * q + 1 < kc {
                        round(unsafe { a.at(i0 + i, pc + 2 * q + 1) })
                    } else {
                        zero
                    };
                    *slot = pair(lo, hi);
                }
            }
        }
    }
}

/// `src` rounded to bf16 as pairs (`out[q]` holds `src[2q]` and `src[2q + 1]`, a missing
/// last value zero): `vcvtne2ps2bf16` 32 values at a time where the CPU has it (the
/// `avx512bf16` path), [`round`] otherwise; the two agree bit for bit.
fn round_pairs(src: &[f32], out: &mut [f32]) {
    debug_assert_eq!(out.len(), src.len().div_ceil(2));
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if KernelPath::Avx512Bf16.runs_here() {
        // SAFETY: the CPU has AVX-512F and AVX512_BF16 (checked); the function reads and
        // writes inside the slices only.
        done = unsafe { round_pairs_avx512(src, out) };
    }
    let zero = bf16::from_bits(0);
    for q in done / 2..out.len() {
        let lo = round(src[2 * q]);
        let hi = src.get(2 * q + 1).map_or(zero, |&x| round(x));
        out[q] = pair(lo, hi);
    }
}

/// The whole 32-value blocks of [`round_pairs`] with `vcvtne2ps2bf16`; returns how many
/// values of `src` it converted.
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn round_pairs_avx512(src: &[f32], out: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let blocks = src.len() / 32;
    for b in 0..blocks {
        // SAFETY: values 32b..32b + 32 of src and slots 16b..16b + 16 of out exist (out
        // holds src.len() / 2 slots, rounded up).
        unsafe {
            let lo = _mm512_loadu_ps(src.as_ptr().add(32 * b));
            let hi = _mm512_loadu_ps(src.as_ptr().add(32 * b + 16));
            // The low 16 bf16 values of the result come from the second operand.
            let v: __m512bh = _mm512_cvtne2ps_pbh(hi, lo);
            let bits: __m512i = std::mem::transmute::<__m512bh, __m512i>(v);
            _mm512_storeu_si512(out.as_mut_ptr().add(16 * b) as *mut __m512i, bits);
        }
    }
    blocks * 32
}

/// The 12 x 32 micro-kernel over bf16 pairs: `C[..mr, ..nr] (+)= A_sliver^T B_sliver` with
/// `t.kc` depth pairs, one `vdpbf16ps` per row and 16 columns per pair (f32 sums). The A
/// sliver is row after row ([`pack_a_pairs`]: row `i`'s slot `q` at `pa[i * kc + q]`), the
/// B sliver depth after depth (`NR` slots per pair).
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16; `pa` and `pb` hold `kc * MR` and `kc * NR` slots;
/// the tile's rows `..mr` and columns `..nr` at `c` (rows `ldc` apart) are valid for writes
/// (and reads when `acc`); `bias` is null or holds `nr` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel(t: Tile) {
    use std::arch::x86_64::*;
    let mut r = [[_mm512_setzero_ps(); 2]; MR];
    let (mut pa, mut pb, ld) = (t.pa as *const i32, t.pb, t.kc);
    /// One depth pair of the tile: row `i`'s slot at `pa + i * ld`.
    ///
    /// # Safety
    /// `pa + i * ld` (`i < MR`) and `pb..pb + NR` are readable slots; AVX-512F and
    /// AVX512_BF16.
    #[inline(always)]
    unsafe fn step(r: &mut [[__m512; 2]; MR], pa: *const i32, ld: usize, pb: *const f32) {
        // SAFETY: the caller passes pointers inside the packed slivers; the casts between
        // 512-bit vector types reinterpret the same 64 bytes.
        unsafe {
            let b0 = std::mem::transmute::<__m512, __m512bh>(_mm512_loadu_ps(pb));
            let b1 = std::mem::transmute::<__m512, __m512bh>(_mm512_loadu_ps(pb.add(16)));
            for (i, ri) in r.iter_mut().enumerate() {
                let av = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(*pa.add(i * ld)));
                ri[0] = _mm512_dpbf16_ps(ri[0], av, b0);
                ri[1] = _mm512_dpbf16_ps(ri[1], av, b1);
            }
        }
    }
    let mut left = t.kc;
    while left >= 4 {
        // SAFETY: the packed slivers hold kc * MR and kc * NR slots, and 4 of the kc
        // pairs are left.
        unsafe {
            step(&mut r, pa, ld, pb);
            step(&mut r, pa.add(1), ld, pb.add(NR));
            step(&mut r, pa.add(2), ld, pb.add(2 * NR));
            step(&mut r, pa.add(3), ld, pb.add(3 * NR));
            pa = pa.add(4);
            pb = pb.add(4 * NR);
        }
        left -= 4;
    }
    for _ in 0..left {
        // SAFETY: as above.
        unsafe {
            step(&mut r, pa, ld, pb);
            pa = pa.add(1);
            pb = pb.add(NR);
        }
    }
    // SAFETY: the tile's contract is this kernel's (above); AVX-512F is enabled here.
    unsafe { super::sgemm::store_tile(&r, t) }
}

/// `a` with every value rounded to the nearest bf16 value (as f32).
pub(crate) fn rounded(a: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(a.len());
    out.extend(a.iter().map(|&x| round_f32(x)));
    out
}

/// `a W^T (+ bias)` (`transposed: false`; `a` of `n_in` columns) or `a W` (`true`; `a` of
/// `n_out` columns) for the row-major bf16 weight `w: [n_out, n_in]`, on a path without the
/// packed bf16 product: `a` rounded to bf16 values, `w` widened to f32 for this product, the
/// path's f32 product (fpt's micro-kernel, or the `gemm` crate on the portable path).
pub(crate) fn widened_product(
    path: KernelPath,
    a: &[f32],
    w: &[bf16],
    (n_out, n_in): (usize, usize),
    transposed: bool,
    bias: Option<&[f32]>,
) -> candle_core::Result<Vec<f32>> {
    let (k, n) = if transposed { (n_out, n_in) } else { (n_in, n_out) };
    if w.len() != n_out * n_in {
        candle_core::bail!("bf16 product: a weight of {} values for {n_out} x {n_in}", w.len())
    }
    if k == 0 || !a.len().is_multiple_of(k) {
        candle_core::bail!("bf16 product: {} values are not rows of {k}", a.len())
    }
    let m = a.len() / k;
    let a = rounded(a);
    let wf: Vec<f32> = w.iter().map(|&x| widen(x)).collect();
    // W^T: element (p, j) is w[j * n_in + p]; W: element (p, j) is w[p * n_in + j].
    let b = if transposed {
        MatRef::of(&wf, n_in, 1)
    } else {
        MatRef::of(&wf, 1, n_in)
    };
    let mut y = super::uninit::<f32>(m * n);
    // SAFETY: `a` holds m rows of k (checked above), `wf` the n_out x n_in weight (its extent
    // is checked by sgemm against the view), y has m * n slots, none shared with the
    // operands; sgemm in overwrite mode writes every one of them on every path.
    unsafe {
        super::sgemm::sgemm(
            path,
            m,
            n,
            k,
            MatRef::of(&a, k, 1),
            b,
            MatMut::new(y.as_mut_ptr() as *mut f32, n, y.len()),
            false,
            bias,
            crate::num_threads(),
        );
        Ok(super::assume_init(y))
    }
}

/// `t` (f32) stored in bf16: on the CPU rounded by [`round`] (the rounding the kernels apply
/// to activations), elsewhere by the device's own cast (round to nearest even).
pub fn to_bf16(t: &Tensor) -> candle_core::Result<Tensor> {
    if t.dtype() != candle_core::DType::F32 {
        candle_core::bail!("bf16 weights: expected an f32 tensor, got {:?}", t.dtype())
    }
    if !t.device().is_cpu() {
        return t.to_dtype(candle_core::DType::BF16);
    }
    let v: Vec<bf16> = t.flatten_all()?.to_vec1::<f32>()?.into_iter().map(round).collect();
    Tensor::from_vec(v, t.shape(), t.device())
}

#[cfg(test)]
mod tests {
    //! The packing and the widened product on small exact cases (scalar paths: these also
    //! run under Miri, `cargo xtask sanitize`).
    use super::*;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn activations_pack_row_by_row_in_pairs_from_any_layout() {
        let (m, k) = (3, 5);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.37 - 2.0).collect();
        let mut p = Vec::new();
        pack_a_pairs(&mut p, MatRef::of(&a, k, 1), 0, m, 0, k);
        let depth = k.div_ceil(2);
        assert_eq!(p.len(), depth * MR);
        for i in 0..MR {
            for q in 0..depth {
                let slot = p[i * depth + q].to_bits();
                let (lo, hi) = ((slot & 0xffff) as u16, (slot >> 16) as u16);
                if i >= m {
                    assert_eq!(slot, 0, "row {i} past the matrix is zero");
                    continue;
                }
                assert_eq!(lo, round(a[i * k + 2 * q]).to_bits());
                let want_hi = if 2 * q + 1 < k {
                    round(a[i * k + 2 * q + 1]).to_bits()
                } else {
                    0
                };
                assert_eq!(hi, want_hi, "row {i}, pair {q}");
            }
        }
        // The same matrix column-major: the same slots.
        let at: Vec<f32> = (0..m * k).map(|x| a[(x % m) * k + x / m]).collect();
        let mut q = Vec::new();
        pack_a_pairs(&mut q, MatRef::of(&at, 1, m), 0, m, 0, k);
        assert_eq!(bits(&p), bits(&q));
    }

    #[test]
    fn weight_panels_hold_each_pair_once_padded_with_zero() {
        let (k, n) = (5, 3);
        let w: Vec<bf16> = (0..k * n).map(|i| round(1.0 + i as f32 / 8.0)).collect();
        // B(p, j) = w[p * n + j].
        let b = PackedB::new_bf16(&w, n, 1, k, n, 1);
        assert!(b.is_bf16() && b.dims() == (k, n));
        let depth = k.div_ceil(2);
        assert_eq!(b.data.len(), depth * NR);
        for q in 0..depth {
            for j in 0..NR {
                let slot = b.data[q * NR + j].to_bits();
                let want_lo = if j < n { w[2 * q * n + j].to_bits() as u32 } else { 0 };
                let want_hi = if j < n && 2 * q + 1 < k {
                    w[(2 * q + 1) * n + j].to_bits() as u32
                } else {
                    0
                };
                assert_eq!(slot, want_lo | (want_hi << 16), "pair {q}, column {j}");
            }
        }
    }

    #[test]
    fn the_widened_product_is_the_product_of_the_rounded_operands() {
        // Operands whose bf16 products and sums are exact in f32: the result is exact.
        let (m, k, n) = (4, 6, 5);
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.25 - 0.75).collect();
        let w: Vec<bf16> = (0..n * k).map(|i| round((i % 5) as f32 * 0.5 - 1.0)).collect();
        let bias: Vec<f32> = (0..n).map(|j| j as f32).collect();
        let y = widened_product(KernelPath::Portable, &a, &w, (n, k), false, Some(&bias)).unwrap();
        for i in 0..m {
            for j in 0..n {
                let want: f32 = bias[j]
                    + (0..k)
                        .map(|p| round_f32(a[i * k + p]) * widen(w[j * k + p]))
                        .sum::<f32>();
                assert_eq!(y[i * n + j], want, "({i}, {j})");
            }
        }
        // A wrong length is an error, not a read past the buffer.
        assert!(widened_product(KernelPath::Portable, &a[..5], &w, (n, k), false, None).is_err());
        assert!(widened_product(KernelPath::Portable, &a, &w[..3], (n, k), false, None).is_err());
    }
}

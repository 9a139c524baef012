//! A single-precision matrix product with an AVX-512 micro-kernel.
//!
//! The `gemm` crate candle uses reaches only its AVX2 kernels on stable Rust (its AVX-512
//! kernels sit behind a nightly feature): measured on the 2-core AVX-512 machines here, a
//! 1024 x 768 by 768 x 3072 product ran at ~115 GFLOP/s, while the same product in
//! PyTorch (MKL) ran at ~300. This module is a BLIS-style product whose inner kernel is
//! written with the AVX-512 intrinsics that stable Rust has had since 1.89: operands are
//! packed into cache-sized panels (`KC` deep; `MR`-row slivers of A, `NR`-column slivers of
//! B, zero-padded at the edges), a 12 x 32 tile of C is accumulated in 24 registers, and
//! the edges are stored with masked stores. Both cores share one packed B panel and split
//! the rows of A (or, for short A, the slivers of B).
//!
//! The AVX2 path runs the same blocked product and packing with an AVX2 + FMA micro-kernel:
//! the 12 x 32 tile as four 6 x 16 sub-tiles, each accumulated in 12 of the 16 256-bit
//! registers. Measured on a 2-core AMD EPYC it runs about as fast as the `gemm` crate's own
//! AVX2 kernel (115-150 GFLOP/s on both); it is there so that what reads fpt's packed
//! panels (frozen weights packed once, the fused GPT-2 branch, the LSTM's per-step products)
//! runs on CPUs without AVX-512 too.
//!
//! [`sgemm`] runs the `gemm` crate's product instead on the portable path ([`KernelPath`]:
//! CPUs without AVX2 and FMA, or `FPT_KERNELS=portable`), with the same contract: the bias
//! (or, when accumulating, the previous contents of C) is added.

use crate::kernels::KernelPath;
use rayon::prelude::*;
use std::cell::RefCell;

/// Rows of the micro-tile.
pub(super) const MR: usize = 12;
/// Columns of the micro-tile (two 16-lane registers).
pub(super) const NR: usize = 32;
/// Depth of a packed panel. A `KC x NR` sliver of B (96 KiB) stays in L2 with the A block;
/// deep panels keep each C tile in registers over more of the sum (measured here: 768 ran
/// 4-11% faster than 256 on GPT-2 base shapes; 1536 no faster than 768).
pub(super) const KC: usize = 768;
/// Depth of a packed bf16 panel: as many bytes per sliver as [`KC`] f32 values (two bf16
/// depths per 32-bit slot), so each C tile stays in registers over twice the sum.
pub(super) const KC_BF16: usize = 2 * KC;
/// Rows of A packed at a time per thread (`MC x KC` floats stay in L2).
pub(super) const MC: usize = 192;
/// Columns of B packed at a time (`KC x NC` floats, shared by the threads).
pub(super) const NC: usize = 3072;

/// A read-only matrix: element `(i, j)` at `ptr + i * rs + j * cs`, with `len` elements
/// addressable from `ptr` (checked against the extent a product reads).
#[derive(Clone, Copy)]
pub(crate) struct MatRef {
    pub(super) ptr: *const f32,
    pub(super) rs: isize,
    pub(super) cs: isize,
    pub(super) len: usize,
}

// SAFETY: MatRef is only read from, and the callers keep the data alive and unaliased by
// writes for the duration of the product.
unsafe impl Send for MatRef {}
unsafe impl Sync for MatRef {}

impl MatRef {
    /// A matrix view of `len` elements from `ptr` (strides in elements).
    pub(crate) fn new(ptr: *const f32, rs: usize, cs: usize, len: usize) -> Self {
        Self {
            ptr,
            rs: rs as isize,
            cs: cs as isize,
            len,
        }
    }

    /// A matrix view of a slice.
    pub(crate) fn of(s: &[f32], rs: usize, cs: usize) -> Self {
        Self::new(s.as_ptr(), rs, cs, s.len())
    }

    /// Panics unless every element of a `rows x cols` extent lies within `len`: the bound
    /// every unsafe read of the product relies on.
    pub(super) fn check(&self, rows: usize, cols: usize, what: &str) {
        if rows == 0 || cols == 0 {
            return;
        }
        let last = (rows - 1) as isize * self.rs + (cols - 1) as isize * self.cs;
        assert!(
            self.rs >= 0 && self.cs >= 0 && (last as usize) < self.len,
            "sgemm: {what} of {rows} x {cols} (strides {}, {}) reaches element {last} of {}",
            self.rs,
            self.cs,
            self.len
        );
    }

    /// The address of element (0, 0).
    #[inline(always)]
    fn base(&self) -> *const f32 {
        self.ptr
    }

    /// Element `(i, j)`.
    ///
    /// # Safety
    /// `(i, j)` lies in the extent the view was checked for (debug builds assert it is
    /// within `len`).
    #[inline(always)]
    pub(super) unsafe fn at(&self, i: usize, j: usize) -> f32 {
        let o = i as isize * self.rs + j as isize * self.cs;
        debug_assert!(
            o >= 0 && (o as usize) < self.len,
            "sgemm: element ({i}, {j}) out of bounds"
        );
        // SAFETY: the caller stays within the matrix the view was made for (checked at
        // the product's entry with `check`).
        unsafe { *self.ptr.offset(o) }
    }
}

/// The output of a product: row-major rows `ld` apart, with `len` elements writable from
/// `ptr` (checked against the extent the product writes).
#[derive(Clone, Copy)]
pub(crate) struct MatMut {
    ptr: *mut f32,
    ld: usize,
    len: usize,
}

impl MatMut {
    /// `len` writable elements from `ptr`, rows `ld` apart.
    pub(crate) fn new(ptr: *mut f32, ld: usize, len: usize) -> Self {
        Self { ptr, ld, len }
    }

    /// Panics unless rows `0..m` of `n` lie within `len`.
    fn check(&self, m: usize, n: usize) {
        if m == 0 || n == 0 {
            return;
        }
        let end = (m - 1) * self.ld + n;
        assert!(
            n <= self.ld && end <= self.len,
            "sgemm: an output of {m} x {n} with rows {} apart reaches element {end} of {}",
            self.ld,
            self.len
        );
    }
}

#[derive(Clone, Copy)]
struct BiasPtr(*const f32);
// SAFETY: read-only, alive for the product.
unsafe impl Send for BiasPtr {}
unsafe impl Sync for BiasPtr {}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: threads write disjoint tiles of the output.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

thread_local! {
    static PACK_A: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Shared packed-B buffer, reused across calls (one product runs at a time per calling
/// thread; a second concurrent caller gets its own buffer).
static PACK_B: std::sync::Mutex<Vec<Vec<f32>>> = std::sync::Mutex::new(Vec::new());

/// Where the product's B comes from: a matrix packed panel by panel as the product runs, or
/// panels packed once beforehand.
#[derive(Clone, Copy)]
enum BSource<'a> {
    Raw(MatRef),
    Packed(&'a PackedB),
}

/// A `k x n` B packed once into the panels the product reads, in the order it reads them:
/// a frozen weight that every step multiplies by is packed at its first use instead of at
/// every product.
pub(crate) struct PackedB {
    pub(super) k: usize,
    pub(super) n: usize,
    /// Start of panel `i` (depth blocks within column blocks, in product order).
    pub(super) offsets: Vec<usize>,
    /// The panels: f32 values, or for a bf16 B (`bf16`) pairs of bf16 values along the depth,
    /// each pair in one 32-bit slot (its bits; see `ops/bf16.rs`), so half the bytes.
    pub(super) data: Vec<f32>,
    /// The panels' format when not f32 (bf16 pairs, read by the AVX512_BF16 micro-kernel).
    pub(super) format: Option<&'static PanelFormat>,
}

/// A packed-panel format other than f32 values (bf16 pairs, `ops/bf16.rs`): its
/// micro-kernel and how A is packed to meet it. This file runs the blocked product for
/// every format; a format brings its own kernels, so the dependency runs one way (`bf16.rs`
/// builds on this file, this file never names it).
pub(super) struct PanelFormat {
    /// The format's name in messages.
    pub(super) name: &'static str,
    /// Its micro-kernel on a path, if the path has one.
    pub(super) micro_kernel: fn(KernelPath) -> Option<MicroKernel>,
    /// Packs `a(ic..ic+mc, pc..pc+kc)` for the micro-kernel (as [`pack_a`] does for f32).
    pub(super) pack_a: fn(&mut Vec<f32>, MatRef, usize, usize, usize, usize),
    /// Depth of a block of panels (as [`KC`] for f32).
    pub(super) kc: usize,
}

/// Bytes held by every live [`PackedB`] of the process (the frozen weights kept packed).
static PACKED_BYTES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Bytes held by every frozen weight kept packed for fpt's product in this process now.
pub fn packed_bytes() -> usize {
    PACKED_BYTES.load(std::sync::atomic::Ordering::Relaxed)
}

impl PackedB {
    /// Counts a new pack's bytes in [`packed_bytes`] (every constructor ends here).
    pub(super) fn counted(self) -> Self {
        PACKED_BYTES.fetch_add(self.data.len() * 4, std::sync::atomic::Ordering::Relaxed);
        self
    }
}

impl Drop for PackedB {
    fn drop(&mut self) {
        PACKED_BYTES.fetch_sub(self.data.len() * 4, std::sync::atomic::Ordering::Relaxed);
    }
}

impl std::fmt::Debug for PackedB {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedB({} x {}{})",
            self.k,
            self.n,
            self.format.map_or(String::new(), |f| format!(", {}", f.name))
        )
    }
}

impl PackedB {
    /// Packs `b` (`k x n`; its extent is checked against its length).
    pub(crate) fn new(b: MatRef, k: usize, n: usize, threads: usize) -> Self {
        b.check(k, n, "B");
        let mut offsets = Vec::new();
        let mut total = 0;
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            for pc in (0..k).step_by(KC) {
                offsets.push(total);
                total += KC.min(k - pc) * nc.div_ceil(NR) * NR;
            }
        }
        let mut data = vec![0f32; total];
        let mut i = 0;
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            for pc in (0..k).step_by(KC) {
                pack_b(&mut data[offsets[i]..], b, pc, KC.min(k - pc), jc, nc, threads);
                i += 1;
            }
        }
        Self {
            k,
            n,
            offsets,
            data,
            format: None,
        }
        .counted()
    }

    /// `(k, n)`.
    pub(crate) fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    /// Whether the panels hold bf16 pairs (for the AVX512_BF16 micro-kernel).
    pub(crate) fn is_bf16(&self) -> bool {
        self.format.is_some()
    }
}

/// The micro-kernel of a path: `C[..mr, ..nr] (+)= A_sliver^T B_sliver (+ bias)` over `kc`
/// for packed `MR`-row and `NR`-column slivers.
pub(super) type MicroKernel = unsafe fn(Tile);

/// One micro-kernel call: the tile of C at `c` (rows `ldc` apart) of which rows `..mr` and
/// columns `..nr` are written (added to when `acc`), from the packed slivers `pa` and `pb`
/// over depth `kc`, plus `bias` unless it is null (then it holds `nr` values).
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct Tile {
    pub(super) kc: usize,
    pub(super) pa: *const f32,
    pub(super) pb: *const f32,
    pub(super) c: *mut f32,
    pub(super) ldc: usize,
    pub(super) mr: usize,
    pub(super) nr: usize,
    pub(super) acc: bool,
    pub(super) bias: *const f32,
}

impl Tile {
    /// The part of the tile from row `i0` and column `j0` on, at most `mr x nr`: its slivers
    /// offset into the packed ones (rows `MR`, columns `NR` apart per depth step), its bias
    /// values from column `j0`.
    ///
    /// # Safety
    /// `i0 < self.mr` and `j0 < self.nr`, so every pointer stays inside what `self`'s
    /// contract makes valid.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn sub(self, i0: usize, j0: usize, mr: usize, nr: usize) -> Tile {
        // SAFETY: the offsets stay inside the slivers, the tile and the bias (see above).
        unsafe {
            Tile {
                pa: self.pa.add(i0),
                pb: self.pb.add(j0),
                c: self.c.add(i0 * self.ldc + j0),
                mr: (self.mr - i0).min(mr),
                nr: (self.nr - j0).min(nr),
                bias: if self.bias.is_null() {
                    self.bias
                } else {
                    self.bias.add(j0)
                },
                ..self
            }
        }
    }
}

/// fpt's micro-kernel for `path` when the path has one and the CPU runs it (AVX-512F, or
/// AVX2 + FMA); `None` on the portable path (the `gemm` crate's product runs).
fn micro_kernel(path: KernelPath) -> Option<MicroKernel> {
    #[cfg(target_arch = "x86_64")]
    {
        if path.avx512() && path.runs_here() {
            return Some(kernel as MicroKernel);
        }
        if path.own_gemm() && path.runs_here() {
            return Some(kernel_avx2 as MicroKernel);
        }
    }
    let _ = path;
    None
}

/// Whether `path` runs fpt's micro-kernel here (so [`sgemm_prepacked`] may be called).
pub(crate) fn has_micro_kernel(path: KernelPath) -> bool {
    micro_kernel(path).is_some()
}

/// [`sgemm`] (overwriting `c`, with an optional bias) against a [`PackedB`]; only on a
/// path with fpt's micro-kernel (AVX-512 or AVX2) and for `k > 0` (panics otherwise,
/// before touching memory).
///
/// # Safety
/// As [`sgemm`]: `a` and `c` describe live memory (their extents are checked against their
/// lengths), and `c` does not overlap `a` or `b`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm_prepacked(
    path: KernelPath,
    m: usize,
    a: MatRef,
    b: &PackedB,
    c: MatMut,
    bias: Option<&[f32]>,
    threads: usize,
) {
    let (k, n) = b.dims();
    let kern = match b.format {
        Some(f) => (f.micro_kernel)(path),
        None => micro_kernel(path),
    };
    assert!(
        kern.is_some() && k > 0,
        "sgemm_prepacked needs the AVX-512 or AVX2 path, and for bf16 panels the avx512bf16 path (got {path}, {b:?}), and a non-empty depth"
    );
    a.check(m, k, "A");
    c.check(m, n);
    let (c, ldc) = (c.ptr, c.ld);
    let bias = if crate::kernels::fault_drop_bias() { None } else { bias };
    if m == 0 || n == 0 {
        return;
    }
    if let Some(bv) = bias {
        assert!(bv.len() >= n, "sgemm: bias of {} for {n} columns", bv.len());
    }
    #[cfg(target_arch = "x86_64")]
    {
        let bias = bias.map_or(std::ptr::null(), |bv| bv.as_ptr());
        let kern = kern.expect("checked above");
        // SAFETY: forwarded contract; the CPU runs the kernel's instructions (micro_kernel).
        unsafe {
            blocked(
                m,
                n,
                k,
                a,
                BSource::Packed(b),
                OutPtr(c),
                ldc,
                false,
                bias,
                threads,
                kern,
            )
        };
    }
}

/// `a B (+ bias)` for a row-major `a` of `k` columns and a packed `k x n` B (f32 or bf16
/// panels), as a new row-major `m x n` matrix, on the active kernel path (which must run
/// the panels' micro-kernel: `sgemm_prepacked` panics otherwise, before touching memory).
pub(crate) fn product(a: &[f32], b: &PackedB, bias: Option<&[f32]>) -> Vec<f32> {
    let (k, n) = b.dims();
    assert!(
        k > 0 && a.len().is_multiple_of(k),
        "product: {} values are not rows of the panels' depth {k}",
        a.len()
    );
    let m = a.len() / k;
    let mut y = super::uninit::<f32>(m * n);
    // SAFETY: `a` holds m rows of k (checked above), so the view's extent is inside it; y
    // has m * n slots, all written (overwrite mode); sgemm_prepacked checks that the path
    // runs the panels' micro-kernel before touching memory.
    unsafe {
        sgemm_prepacked(
            KernelPath::active(),
            m,
            MatRef::of(a, k, 1),
            b,
            MatMut::new(y.as_mut_ptr() as *mut f32, n, y.len()),
            bias,
            crate::num_threads(),
        );
        super::assume_init(y)
    }
}

/// `c[i * ldc + j] (+)= sum_p a(i, p) * b(p, j)` for an `m x k` matrix `a` and a `k x n`
/// matrix `b`; `accumulate` adds to `c`, otherwise `c` is overwritten (with `bias[j]` added
/// to every row when a bias is given: the linear layer's `x W^T + b` in one pass). Uses up
/// to `threads` rayon workers; `path` picks the kernels (the AVX-512 or AVX2 micro-kernel,
/// else the `gemm` crate).
///
/// The extents are checked against the views' lengths (a panic, before any access, if one
/// reaches past its buffer).
///
/// # Safety
/// `a`, `b` and `c` must describe live memory of at least their stated lengths, `c` must be
/// valid for writes and not overlap `a` or `b`, and no other thread may write what they
/// cover during the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm(
    path: KernelPath,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: MatRef,
    c: MatMut,
    accumulate: bool,
    bias: Option<&[f32]>,
    threads: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    a.check(m, k, "A");
    b.check(k, n, "B");
    c.check(m, n);
    let (c, ldc) = (c.ptr, c.ld);
    let bias = if accumulate || crate::kernels::fault_drop_bias() {
        None
    } else {
        bias
    };
    if let Some(b) = bias {
        assert!(b.len() >= n, "sgemm: bias of {} for {n} columns", b.len());
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(kern) = micro_kernel(path).filter(|_| k > 0) {
        let bias = bias.map_or(std::ptr::null(), |b| b.as_ptr());
        // SAFETY: forwarded contract; the CPU runs the kernel's instructions (micro_kernel).
        unsafe {
            blocked(
                m,
                n,
                k,
                a,
                BSource::Raw(b),
                OutPtr(c),
                ldc,
                accumulate,
                bias,
                threads,
                kern,
            )
        };
        return;
    }
    let mut accumulate = accumulate;
    if !accumulate && (bias.is_some() || k == 0) {
        for i in 0..m {
            // SAFETY: row i of c is valid for n writes.
            let row = unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), n) };
            match bias {
                Some(b) => row.copy_from_slice(&b[..n]),
                None => row.fill(0.0),
            }
        }
        accumulate = true;
    }
    if k == 0 {
        return;
    }
    // SAFETY: forwarded contract.
    unsafe { fallback(m, n, k, a, b, c, ldc, accumulate, threads) }
}

/// `c (+)= a b` through the `gemm` crate. gemm computes `dst := alpha dst + beta lhs rhs`
/// (reading `dst` only when `read_dst`), so accumulating needs `alpha = 1`: with `alpha = 0`
/// the bias rows written first and every accumulated sum would be thrown away.
///
/// # Safety
/// As [`sgemm`].
#[allow(clippy::too_many_arguments)]
unsafe fn fallback(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: MatRef,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    threads: usize,
) {
    let par = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: forwarded contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc as isize,
            accumulate,
            a.ptr,
            a.cs,
            a.rs,
            b.ptr,
            b.cs,
            b.rs,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        )
    }
}

/// Whether the CPU has AVX (the packing's register transposes; checked at run time, since
/// B is also packed for callers that do not run a micro-kernel of their own).
fn avx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Packs `b(pc..pc+kc, jc..jc+nc)` into `NR`-column slivers, `kc x NR` each, zero-padded.
fn pack_b(dst: &mut [f32], b: MatRef, pc: usize, kc: usize, jc: usize, nc: usize, threads: usize) {
    let slivers = nc.div_ceil(NR);
    let fill = |(s, out): (usize, &mut [f32])| {
        let j0 = jc + s * NR;
        let w = NR.min(jc + nc - j0);
        if b.cs == 1 {
            for p in 0..kc {
                let row = &mut out[p * NR..(p + 1) * NR];
                // SAFETY: (pc + p, j0..j0 + w) lie inside b.
                let src =
                    unsafe { std::slice::from_raw_parts(b.ptr.offset((pc + p) as isize * b.rs + j0 as isize), w) };
                row[..w].copy_from_slice(src);
                row[w..].fill(0.0);
            }
        } else if b.rs == 1 && w == NR && kc >= 8 && avx() {
            // Column-major B (a weight W as W^T, attention's K^T), a full sliver: 8 x 8
            // blocks transposed in registers.
            #[cfg(target_arch = "x86_64")]
            // SAFETY: columns j0..j0 + NR and depths pc..pc + kc lie inside b (checked by
            // the callers against b's length); `out` holds kc * NR floats; the CPU has AVX
            // (`avx()`).
            unsafe {
                pack_b_sliver_avx(out, b.ptr.wrapping_offset(j0 as isize * b.cs + pc as isize), b.cs, kc)
            };
        } else {
            if w < NR {
                out.fill(0.0);
            }
            // Blocks of 16 depths: each column's 16 values are one cache line.
            for p0 in (0..kc).step_by(16) {
                let ps = 16.min(kc - p0);
                for j in 0..w {
                    // SAFETY: (pc + p0.., j0 + j) lie inside b.
                    let col = unsafe { b.base().offset((j0 + j) as isize * b.cs + (pc + p0) as isize * b.rs) };
                    for q in 0..ps {
                        // SAFETY: as above.
                        out[(p0 + q) * NR + j] = unsafe { *col.offset(q as isize * b.rs) };
                    }
                }
            }
        }
    };
    let dst = &mut dst[..slivers * kc * NR];
    if threads > 1 && slivers > 1 {
        dst.par_chunks_mut(kc * NR).enumerate().for_each(fill);
    } else {
        dst.chunks_mut(kc * NR).enumerate().for_each(fill);
    }
}

/// Packs `a(ic..ic+mc, pc..pc+kc)` into `MR`-row slivers, `kc x MR` each, zero-padded.
#[cfg(target_arch = "x86_64")]
fn pack_a(dst: &mut Vec<f32>, a: MatRef, ic: usize, mc: usize, pc: usize, kc: usize) {
    let slivers = mc.div_ceil(MR);
    let len = slivers * kc * MR;
    if dst.len() < len {
        dst.resize(len, 0.0);
    }
    for (s, out) in dst[..len].chunks_mut(kc * MR).enumerate() {
        let i0 = ic + s * MR;
        let h = MR.min(ic + mc - i0);
        if h < MR {
            out.fill(0.0);
        }
        if a.cs == 1 && h == MR && kc >= 8 {
            // Row-major A, a full sliver: 8 x 8 and 4 x 8 blocks transposed in registers
            // (the callers run on the AVX2 and AVX-512 paths only).
            // SAFETY: rows i0..i0 + MR and columns pc..pc + kc lie inside a (checked by
            // the callers against a's length); `out` holds kc * MR floats; the CPU has
            // AVX (every path that runs the blocked product has AVX2).
            unsafe { pack_sliver_avx(out, a.ptr.wrapping_offset(i0 as isize * a.rs + pc as isize), a.rs, kc) };
        } else if a.cs == 1 {
            // Row-major A: the sliver's rows side by side, each depth's MR values written
            // together.
            let base = a.ptr.wrapping_offset(i0 as isize * a.rs + pc as isize);
            for (p, o) in out.chunks_exact_mut(MR).enumerate().take(kc) {
                for (i, v) in o.iter_mut().enumerate().take(h) {
                    // SAFETY: (i0 + i, pc + p) lies inside a.
                    *v = unsafe { *base.offset(i as isize * a.rs + p as isize) };
                }
            }
        } else if a.rs == 1 {
            // Column-major A (a transposed operand: attention's backward multiplies by P^T
            // and dS^T): each depth's `h` values lie side by side, one copy per depth
            // instead of `h` strided loads and stores with a bounds check each.
            let base = a.ptr.wrapping_offset(i0 as isize + pc as isize * a.cs);
            for (p, o) in out.chunks_exact_mut(MR).enumerate().take(kc) {
                // SAFETY: (i0..i0 + h, pc + p) lies inside a (checked by the callers
                // against a's length), and with rs == 1 those h values are adjacent.
                let src = unsafe { std::slice::from_raw_parts(base.offset(p as isize * a.cs), h) };
                o[..h].copy_from_slice(src);
            }
        } else {
            for p in 0..kc {
                for i in 0..h {
                    // SAFETY: (i0 + i, pc + p) lies inside a.
                    out[p * MR + i] = unsafe { a.at(i0 + i, pc + p) };
                }
            }
        }
    }
}

/// One full `MR`-row sliver of row-major A (rows `rs` apart from `base`, `kc` deep) into
/// `out` as `kc` groups of `MR` values: columns 0..8 of each depth from an 8 x 8 transpose of
/// rows 0..8 ([`transpose8`]), columns 8..12 from a 4 x 8 transpose of rows 8..12, 8 depths
/// at a time; the last `kc % 8` depths one value at a time. The same values as the scalar
/// loop in [`pack_a`], moved, not computed.
///
/// # Safety
/// The CPU has AVX; `base + i * rs + p` is readable for `i < MR`, `p < kc`; `out` holds at
/// least `kc * MR` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn pack_sliver_avx(out: &mut [f32], base: *const f32, rs: isize, kc: usize) {
    use std::arch::x86_64::*;
    debug_assert!(MR == 12 && out.len() >= kc * MR);
    let o = out.as_mut_ptr();
    let full = kc / 8 * 8;
    for p0 in (0..full).step_by(8) {
        // SAFETY: p0 + 8 <= kc, so each 8-float load stays in its row's kc columns, and
        // each store (8 floats at (p0 + q) * MR, 4 at (p0 + q) * MR + 8) stays inside
        // out's kc * MR floats (this function's contract).
        unsafe {
            transpose8(o, MR, 0, base, rs, p0);
            // Rows 8..12: a 4-float half per depth.
            let row = |i: isize| _mm256_loadu_ps(base.offset(i * rs + p0 as isize));
            let d = |q: usize| o.add((p0 + q) * MR + 8);
            for (q, v) in quad(row(8), row(9), row(10), row(11)).into_iter().enumerate() {
                _mm_storeu_ps(d(q), _mm256_castps256_ps128(v));
                _mm_storeu_ps(d(q + 4), _mm256_extractf128_ps::<1>(v));
            }
        }
    }
    for p in full..kc {
        for i in 0..MR {
            // SAFETY: p < kc and i < MR (this function's contract).
            unsafe { *o.add(p * MR + i) = *base.offset(i as isize * rs + p as isize) };
        }
    }
}

/// One full `NR`-column sliver of column-major B (columns `cs` apart from `base`, each `kc`
/// deep and contiguous) into `out` as `kc` groups of `NR` values: four 8 x 8 transposes
/// ([`transpose8`]) per 8 depths, the last `kc % 8` depths one value at a time. The same
/// values as the scalar loop in [`pack_b`], moved, not computed.
///
/// # Safety
/// The CPU has AVX; `base + j * cs + p` is readable for `j < NR`, `p < kc`; `out` holds at
/// least `kc * NR` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn pack_b_sliver_avx(out: &mut [f32], base: *const f32, cs: isize, kc: usize) {
    debug_assert!(NR.is_multiple_of(8) && out.len() >= kc * NR);
    let o = out.as_mut_ptr();
    let full = kc / 8 * 8;
    for p0 in (0..full).step_by(8) {
        for g in (0..NR).step_by(8) {
            // SAFETY: columns g..g + 8 < NR and depths p0..p0 + 8 <= kc are readable, and
            // the stores at (p0 + q) * NR + g.. (8 floats) stay inside out's kc * NR floats
            // (this function's contract).
            unsafe { transpose8(o, NR, g, base.offset(g as isize * cs), cs, p0) };
        }
    }
    for p in full..kc {
        for j in 0..NR {
            // SAFETY: p < kc and j < NR (this function's contract).
            unsafe { *o.add(p * NR + j) = *base.offset(j as isize * cs + p as isize) };
        }
    }
}

/// An 8 x 8 transpose: `o[(p0 + q) * ld + col + i] = base[i * rs + p0 + q]` for `i, q < 8`.
///
/// # Safety
/// The CPU has AVX; `base + i * rs + p0 + q` is readable and `o + (p0 + q) * ld + col + i`
/// writable for `i, q < 8`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
unsafe fn transpose8(o: *mut f32, ld: usize, col: usize, base: *const f32, rs: isize, p0: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the reads and writes are the ones this function's contract allows.
    unsafe {
        let row = |i: isize| _mm256_loadu_ps(base.offset(i * rs + p0 as isize));
        // Rows 0..4 (u) and 4..8 (w): per 128-bit half, depths q and q + 4.
        let u = quad(row(0), row(1), row(2), row(3));
        let w = quad(row(4), row(5), row(6), row(7));
        let d = |q: usize| o.add((p0 + q) * ld + col);
        for q in 0..4 {
            _mm256_storeu_ps(d(q), _mm256_permute2f128_ps::<0x20>(u[q], w[q]));
            _mm256_storeu_ps(d(q + 4), _mm256_permute2f128_ps::<0x31>(u[q], w[q]));
        }
    }
}

/// Four rows of 8 floats, transposed within each 128-bit half: element `i` of result `q`'s
/// low half is row `i`'s value `q`, of its high half row `i`'s value `q + 4`.
///
/// # Safety
/// The CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
unsafe fn quad(
    r0: std::arch::x86_64::__m256,
    r1: std::arch::x86_64::__m256,
    r2: std::arch::x86_64::__m256,
    r3: std::arch::x86_64::__m256,
) -> [std::arch::x86_64::__m256; 4] {
    use std::arch::x86_64::*;
    let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
    let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
    // Per half: 0x44 takes elements 0, 1 of each operand, 0xEE elements 2, 3 (the callers'
    // `permute2f128` 0x20 then joins two results' low halves, 0x31 their high halves).
    [
        _mm256_shuffle_ps::<0x44>(t0, t2),
        _mm256_shuffle_ps::<0xEE>(t0, t2),
        _mm256_shuffle_ps::<0x44>(t1, t3),
        _mm256_shuffle_ps::<0xEE>(t1, t3),
    ]
}

/// The blocked product on the AVX-512 and AVX2 paths: B packed panel by panel (or read
/// prepacked), A packed per thread, the path's micro-kernel over each tile.
///
/// # Safety
/// The CPU runs `kern`'s instructions; `a`, `b` cover their `m x k` and `k x n` extents and `c` rows
/// `0..m` of `n`, `ldc` apart (checked by the callers, [`sgemm`] and [`sgemm_prepacked`]);
/// `bias` is null or holds `n` values.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn blocked(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: BSource,
    c: OutPtr,
    ldc: usize,
    accumulate: bool,
    bias: *const f32,
    threads: usize,
    kern: MicroKernel,
) {
    let bias = BiasPtr(bias);
    // Small products are not worth waking another thread for.
    let threads = if m * n * k < 1 << 20 { 1 } else { threads.max(1) };
    let mut pb = Vec::new();
    if let BSource::Raw(_) = b {
        pb = PACK_B.lock().map(|mut v| v.pop()).ok().flatten().unwrap_or_default();
        let need = KC * NC.min(n).div_ceil(NR) * NR;
        if pb.len() < need {
            pb.resize(need, 0.0);
        }
    }
    // Panels of another format (bf16 pairs; only ever prepacked): A is packed to meet them.
    let format = match b {
        BSource::Packed(p) => p.format,
        BSource::Raw(_) => None,
    };
    let mut panel_index = 0;
    // Row split when each thread gets a few tiles of rows, else split B's slivers.
    let split_rows = threads > 1 && m >= 4 * MR * threads;
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        // bf16 panels are twice as deep for the same bytes (two depths per slot).
        let kc_block = format.map_or(KC, |f| f.kc);
        for pc in (0..k).step_by(kc_block) {
            let kc = kc_block.min(k - pc);
            let acc = accumulate || pc > 0;
            // The bias goes in with the first depth block.
            let bias = if pc == 0 { bias } else { BiasPtr(std::ptr::null()) };
            let pb: &[f32] = match b {
                BSource::Raw(b) => {
                    pack_b(&mut pb, b, pc, kc, jc, nc, threads);
                    &pb[..]
                }
                BSource::Packed(p) => &p.data[p.offsets[panel_index]..],
            };
            panel_index += 1;
            if split_rows {
                let per = m.div_ceil(threads).div_ceil(MR) * MR;
                (0..threads).into_par_iter().for_each(|t| {
                    let (r0, r1) = (t * per, ((t + 1) * per).min(m));
                    if r0 < r1 {
                        PACK_A.with_borrow_mut(|pa| {
                            // SAFETY: rows r0..r1 of c belong to this task only.
                            unsafe {
                                rows(
                                    pa,
                                    a,
                                    pb,
                                    c,
                                    ldc,
                                    r0,
                                    r1,
                                    pc,
                                    kc,
                                    jc,
                                    nc,
                                    0,
                                    nc.div_ceil(NR),
                                    acc,
                                    bias,
                                    kern,
                                    format,
                                )
                            }
                        });
                    }
                });
            } else if threads > 1 {
                let slivers = nc.div_ceil(NR);
                let per = slivers.div_ceil(threads);
                (0..threads).into_par_iter().for_each(|t| {
                    let (s0, s1) = (t * per, ((t + 1) * per).min(slivers));
                    if s0 < s1 {
                        PACK_A.with_borrow_mut(|pa| {
                            // SAFETY: columns of slivers s0..s1 belong to this task only.
                            unsafe { rows(pa, a, pb, c, ldc, 0, m, pc, kc, jc, nc, s0, s1, acc, bias, kern, format) }
                        });
                    }
                });
            } else {
                PACK_A.with_borrow_mut(|pa| {
                    // SAFETY: a single task writes all of c.
                    unsafe {
                        rows(
                            pa,
                            a,
                            pb,
                            c,
                            ldc,
                            0,
                            m,
                            pc,
                            kc,
                            jc,
                            nc,
                            0,
                            nc.div_ceil(NR),
                            acc,
                            bias,
                            kern,
                            format,
                        )
                    }
                });
            }
        }
    }
    if !pb.is_empty() {
        if let Ok(mut pool) = PACK_B.lock() {
            pool.push(pb);
        }
    }
}

/// Rows `r0..r1` of C against B slivers `s0..s1` of the packed panel.
///
/// # Safety
/// As [`blocked`]; no other task writes rows `r0..r1` x slivers `s0..s1` of `c`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows(
    pa: &mut Vec<f32>,
    a: MatRef,
    pb: &[f32],
    c: OutPtr,
    ldc: usize,
    r0: usize,
    r1: usize,
    pc: usize,
    kc: usize,
    jc: usize,
    nc: usize,
    s0: usize,
    s1: usize,
    acc: bool,
    bias: BiasPtr,
    kern: MicroKernel,
    format: Option<&'static PanelFormat>,
) {
    // Packed depth: `kc` values, or `kc / 2` (rounded up) bf16 pairs.
    let depth = if format.is_some() { kc.div_ceil(2) } else { kc };
    for ic in (r0..r1).step_by(MC) {
        let mc = MC.min(r1 - ic);
        match format {
            Some(f) => (f.pack_a)(pa, a, ic, mc, pc, kc),
            None => pack_a(pa, a, ic, mc, pc, kc),
        }
        for s in s0..s1 {
            let j0 = s * NR;
            let nr = NR.min(nc - j0);
            let bs = &pb[s * depth * NR..(s + 1) * depth * NR];
            for (t, i0) in (0..mc).step_by(MR).enumerate() {
                let mr = MR.min(mc - i0);
                let at = &pa[t * depth * MR..(t + 1) * depth * MR];
                // SAFETY: the tile (ic + i0.., jc + j0..) of mr x nr lies inside c; the CPU
                // runs the kernel's instructions (checked by the caller).
                unsafe {
                    kern(Tile {
                        kc: depth,
                        pa: at.as_ptr(),
                        pb: bs.as_ptr(),
                        c: c.0.add((ic + i0) * ldc + jc + j0),
                        ldc,
                        mr,
                        nr,
                        acc,
                        bias: if bias.0.is_null() { bias.0 } else { bias.0.add(jc + j0) },
                    })
                };
            }
        }
    }
}

/// The 12 x 32 micro-kernel: `C[..mr, ..nr] (+)= A_sliver^T B_sliver` over `kc`.
///
/// # Safety
/// The CPU has AVX-512F; `pa` and `pb` hold `kc * MR` and `kc * NR` floats; rows `..mr`
/// and columns `..nr` of the tile at `c` (rows `ldc` apart) are valid for writes (and reads
/// when `acc`); `bias` is null or holds `nr` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn kernel(t: Tile) {
    use std::arch::x86_64::*;
    let kc = t.kc;
    let mut r = [[_mm512_setzero_ps(); 2]; MR];
    let (mut pa, mut pb) = (t.pa, t.pb);
    /// One depth step of the tile.
    ///
    /// # Safety
    /// `pa` holds `MR` and `pb` `NR` readable floats; AVX-512F.
    #[inline(always)]
    unsafe fn step(r: &mut [[__m512; 2]; MR], pa: *const f32, pb: *const f32) {
        // SAFETY: the caller passes pointers inside the packed slivers.
        unsafe {
            let b0 = _mm512_loadu_ps(pb);
            let b1 = _mm512_loadu_ps(pb.add(16));
            for (i, ri) in r.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*pa.add(i));
                ri[0] = _mm512_fmadd_ps(av, b0, ri[0]);
                ri[1] = _mm512_fmadd_ps(av, b1, ri[1]);
            }
        }
    }
    {
        // Four depth steps per iteration, prefetching the A sliver two iterations ahead.
        let mut left = kc;
        while left >= 4 {
            // SAFETY: the packed slivers hold kc * MR and kc * NR floats; the prefetch
            // address may run past the sliver, which prefetching tolerates.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(pa.wrapping_add(8 * MR) as *const i8);
                step(&mut r, pa, pb);
                step(&mut r, pa.add(MR), pb.add(NR));
                step(&mut r, pa.add(2 * MR), pb.add(2 * NR));
                step(&mut r, pa.add(3 * MR), pb.add(3 * NR));
                pa = pa.add(4 * MR);
                pb = pb.add(4 * NR);
            }
            left -= 4;
        }
        for _ in 0..left {
            // SAFETY: as above.
            unsafe {
                step(&mut r, pa, pb);
                pa = pa.add(MR);
                pb = pb.add(NR);
            }
        }
    }
    // SAFETY: the tile's contract is the kernel's (above); the CPU has AVX-512F.
    unsafe { store_tile(&r, t) }
}

/// Adds the bias (when given) to the 12 x 32 accumulators of a tile and stores rows `..mr`,
/// columns `..nr` (adding what is there when `acc`): the end of every AVX-512 micro-kernel.
///
/// # Safety
/// Rows `..mr` and columns `..nr` of the tile at `t.c` (rows `t.ldc` apart) are valid for
/// writes (and reads when `t.acc`); `t.bias` is null or holds `t.nr` values; the caller is
/// compiled with AVX-512F (inlined into it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn store_tile(r: &[[std::arch::x86_64::__m512; 2]; MR], t: Tile) {
    use std::arch::x86_64::*;
    let (c, ldc, mr, nr, acc, bias) = (t.c, t.ldc, t.mr, t.nr, t.acc, t.bias);
    let mut r = *r;
    // SAFETY: rows ..mr and columns ..nr of the tile lie inside c.
    unsafe {
        if !bias.is_null() {
            let m0: __mmask16 = if nr >= 16 { 0xffff } else { (1u16 << nr) - 1 };
            let m1: __mmask16 = if nr >= 32 {
                0xffff
            } else if nr > 16 {
                (1u16 << (nr - 16)) - 1
            } else {
                0
            };
            let b0 = _mm512_maskz_loadu_ps(m0, bias);
            let b1 = _mm512_maskz_loadu_ps(m1, bias.add(16));
            for ri in r.iter_mut() {
                ri[0] = _mm512_add_ps(ri[0], b0);
                ri[1] = _mm512_add_ps(ri[1], b1);
            }
        }
        if nr == NR {
            for (i, ri) in r.iter().enumerate().take(mr) {
                let row = c.add(i * ldc);
                let (mut v0, mut v1) = (ri[0], ri[1]);
                if acc {
                    v0 = _mm512_add_ps(v0, _mm512_loadu_ps(row));
                    v1 = _mm512_add_ps(v1, _mm512_loadu_ps(row.add(16)));
                }
                _mm512_storeu_ps(row, v0);
                _mm512_storeu_ps(row.add(16), v1);
            }
        } else {
            let m0: __mmask16 = if nr >= 16 { 0xffff } else { (1u16 << nr) - 1 };
            let m1: __mmask16 = if nr >= 32 {
                0xffff
            } else if nr > 16 {
                (1u16 << (nr - 16)) - 1
            } else {
                0
            };
            for (i, ri) in r.iter().enumerate().take(mr) {
                let row = c.add(i * ldc);
                let (mut v0, mut v1) = (ri[0], ri[1]);
                if acc {
                    v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, row));
                    v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, row.add(16)));
                }
                _mm512_mask_storeu_ps(row, m0, v0);
                _mm512_mask_storeu_ps(row.add(16), m1, v1);
            }
        }
    }
}

/// The AVX2 + FMA micro-kernel over the same packed 12 x 32 tile as [`kernel`]: four 6 x 16
/// sub-tiles (rows 0-5 and 6-11 by columns 0-15 and 16-31), each over the whole depth.
///
/// # Safety
/// The CPU has AVX2 and FMA; `pa` and `pb` hold `kc * MR` and `kc * NR` floats; rows `..mr`
/// and columns `..nr` of the tile at `c` (rows `ldc` apart) are valid for writes (and reads
/// when `acc`); `bias` is null or holds `nr` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_avx2(t: Tile) {
    for i0 in [0, AVX2_MR] {
        if i0 >= t.mr {
            break;
        }
        for j0 in [0, AVX2_NR] {
            if j0 >= t.nr {
                break;
            }
            // SAFETY: i0 < mr and j0 < nr, so the sub-tile lies in the tile (see
            // `Tile::sub`); AVX2 + FMA per the caller.
            unsafe { sub_tile_avx2(t.sub(i0, j0, AVX2_MR, AVX2_NR)) };
        }
    }
}

/// Rows of an AVX2 sub-tile.
const AVX2_MR: usize = 6;
/// Columns of an AVX2 sub-tile (two 8-lane registers).
const AVX2_NR: usize = 16;

/// One 6 x 16 sub-tile: `pa` and `pb` point into the packed slivers (rows `MR` and `NR`
/// apart per depth step), the accumulators stay in 12 registers.
///
/// # Safety
/// As [`kernel_avx2`] for a tile of `AVX2_MR x AVX2_NR` whose first `mr` rows and `nr`
/// columns are written; `pa + p * MR + 0..6` and `pb + p * NR + 0..16` are readable for
/// every depth `p < kc` (the packed slivers are zero-padded to whole tiles).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn sub_tile_avx2(t: Tile) {
    use std::arch::x86_64::*;
    let (kc, c, ldc, mr, nr, acc, bias) = (t.kc, t.c, t.ldc, t.mr, t.nr, t.acc, t.bias);
    let mut r = [[_mm256_setzero_ps(); 2]; AVX2_MR];
    let (mut a, mut b) = (t.pa, t.pb);
    for _ in 0..kc {
        // SAFETY: depth step inside the packed slivers (see the function's contract).
        unsafe {
            let b0 = _mm256_loadu_ps(b);
            let b1 = _mm256_loadu_ps(b.add(8));
            for (i, ri) in r.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*a.add(i));
                ri[0] = _mm256_fmadd_ps(av, b0, ri[0]);
                ri[1] = _mm256_fmadd_ps(av, b1, ri[1]);
            }
            a = a.add(MR);
            b = b.add(NR);
        }
    }
    // SAFETY: rows ..mr and columns ..nr of the sub-tile lie inside c; bias holds nr values.
    unsafe {
        if mr == AVX2_MR && nr == AVX2_NR {
            let (b0, b1) = if bias.is_null() {
                (_mm256_setzero_ps(), _mm256_setzero_ps())
            } else {
                (_mm256_loadu_ps(bias), _mm256_loadu_ps(bias.add(8)))
            };
            for (i, ri) in r.iter().enumerate() {
                let row = c.add(i * ldc);
                let (mut v0, mut v1) = (_mm256_add_ps(ri[0], b0), _mm256_add_ps(ri[1], b1));
                if acc {
                    v0 = _mm256_add_ps(v0, _mm256_loadu_ps(row));
                    v1 = _mm256_add_ps(v1, _mm256_loadu_ps(row.add(8)));
                }
                _mm256_storeu_ps(row, v0);
                _mm256_storeu_ps(row.add(8), v1);
            }
        } else {
            // An edge: the sub-tile through a buffer, the valid part copied out.
            let mut buf = [[0f32; AVX2_NR]; AVX2_MR];
            for (ri, out) in r.iter().zip(buf.iter_mut()) {
                _mm256_storeu_ps(out.as_mut_ptr(), ri[0]);
                _mm256_storeu_ps(out.as_mut_ptr().add(8), ri[1]);
            }
            for (i, vals) in buf.iter().enumerate().take(mr) {
                let row = c.add(i * ldc);
                for (j, &v) in vals.iter().enumerate().take(nr) {
                    let mut v = v;
                    if !bias.is_null() {
                        v += *bias.add(j);
                    }
                    if acc {
                        v += *row.add(j);
                    }
                    *row.add(j) = v;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::too_many_arguments)]
    fn naive(
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        ars: usize,
        acs: usize,
        b: &[f32],
        brs: usize,
        bcs: usize,
    ) -> Vec<f64> {
        let mut c = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p| a[i * ars + p * acs] as f64 * b[p * brs + j * bcs] as f64)
                    .sum();
            }
        }
        c
    }

    #[allow(clippy::too_many_arguments)]
    fn check(
        path: KernelPath,
        (m, n, k): (usize, usize, usize),
        a_t: bool,
        b_t: bool,
        accumulate: bool,
        with_bias: bool,
        threads: usize,
    ) {
        let mut rng = crate::Rng::new((m * 131 + n * 17 + k) as u64);
        let a: Vec<f32> = (0..m * k).map(|_| rng.uniform_f32() - 0.5).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.uniform_f32() - 0.5).collect();
        let (ars, acs) = if a_t { (1, m) } else { (k, 1) };
        let (brs, bcs) = if b_t { (1, k) } else { (n, 1) };
        let want = naive(m, n, k, &a, ars, acs, &b, brs, bcs);
        let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.25 - 1.0).collect();
        let ldc = n + 3;
        let mut c: Vec<f32> = (0..m * ldc).map(|i| (i % 7) as f32).collect();
        let before = c.clone();
        // SAFETY: the views cover the vectors; c has m rows of ldc.
        unsafe {
            sgemm(
                path,
                m,
                n,
                k,
                MatRef::of(&a, ars, acs),
                MatRef::of(&b, brs, bcs),
                MatMut::new(c.as_mut_ptr(), ldc, c.len()),
                accumulate,
                with_bias.then_some(&bias[..]),
                threads,
            )
        };
        for i in 0..m {
            for j in 0..ldc {
                let got = c[i * ldc + j] as f64;
                if j >= n {
                    assert_eq!(got, before[i * ldc + j] as f64, "padding ({i}, {j}) was written");
                    continue;
                }
                let w = want[i * n + j]
                    + if accumulate {
                        before[i * ldc + j] as f64
                    } else if with_bias {
                        bias[j] as f64
                    } else {
                        0.0
                    };
                assert!(
                    (got - w).abs() <= 1e-4 * (k as f64).sqrt() * (1.0 + w.abs()),
                    "{path}: {m}x{n}x{k} a_t={a_t} b_t={b_t} acc={accumulate} bias={with_bias} t={threads}: ({i}, {j}) {got} vs {w}"
                );
            }
        }
    }

    /// Every kernel path this CPU runs, against an f64 product: edges, strides (transposed
    /// operands), accumulation into C, the bias, and thread counts. (The `gemm` crate's
    /// paths once dropped both the bias and every accumulation: this caught it.)
    #[test]
    fn matches_the_naive_product_at_edges_strides_and_threads() {
        // Miri (`cargo xtask sanitize`) interprets every instruction: small shapes only.
        let dims: &[(usize, usize, usize)] = if cfg!(miri) {
            &[(1, 1, 1), (13, 5, 7), (3, 5, 0)]
        } else {
            &[
                (1, 1, 1),
                (12, 32, 256),
                (13, 33, 257),
                (5, 70, 3),
                (100, 17, 300),
                (97, 100, 530),
                (200, 3100, 20),
                (30, 50, 1700),
                (3, 5, 0),
            ]
        };
        let threads: &[usize] = if cfg!(miri) { &[1, 2] } else { &[1, 2, 3] };
        for path in KernelPath::available() {
            for &dims in dims {
                for &(a_t, b_t) in &[(false, false), (true, false), (false, true), (true, true)] {
                    for &accumulate in &[false, true] {
                        for &with_bias in &[false, true] {
                            for &threads in threads {
                                check(path, dims, a_t, b_t, accumulate, with_bias, threads);
                            }
                        }
                    }
                }
            }
        }
    }

    /// A inside a wider buffer, as attention's views are: column-major with columns further
    /// apart than its rows (`rs == 1`, `cs > m`: the packing's copy per depth), and with no
    /// unit stride at all (every other value of a row-major or column-major buffer: the
    /// packing's value-at-a-time loop). Against the f64 product, on every path, full and
    /// edge slivers, one and two threads.
    #[test]
    fn a_views_with_wide_or_no_unit_strides_match_the_naive_product() {
        let dims: &[(usize, usize, usize)] = if cfg!(miri) {
            &[(13, 5, 7)]
        } else {
            &[(13, 33, 257), (100, 17, 300), (24, 40, 800)]
        };
        for path in KernelPath::available() {
            for &(m, n, k) in dims {
                // (row stride, column stride, buffer length) of A.
                let layouts = [(1, m + 5, (m + 5) * k), (2 * k, 2, 2 * m * k), (2, 2 * m, 2 * m * k)];
                for (ars, acs, len) in layouts {
                    let mut rng = crate::Rng::new((m * 7 + ars * 3 + acs) as u64);
                    let a: Vec<f32> = (0..len).map(|_| rng.uniform_f32() - 0.5).collect();
                    let b: Vec<f32> = (0..k * n).map(|_| rng.uniform_f32() - 0.5).collect();
                    let want = naive(m, n, k, &a, ars, acs, &b, n, 1);
                    for threads in [1, 2] {
                        let mut c = vec![f32::NAN; m * n];
                        // SAFETY: A's view stays inside `a` (largest offset (m-1) ars + (k-1)
                        // acs < len), B and C cover their vectors.
                        unsafe {
                            sgemm(
                                path,
                                m,
                                n,
                                k,
                                MatRef::of(&a, ars, acs),
                                MatRef::of(&b, n, 1),
                                MatMut::new(c.as_mut_ptr(), n, c.len()),
                                false,
                                None,
                                threads,
                            )
                        };
                        for (idx, (&got, &w)) in c.iter().zip(&want).enumerate() {
                            assert!(
                                (got as f64 - w).abs() <= 1e-4 * (k as f64).sqrt() * (1.0 + w.abs()),
                                "{path}: {m}x{n}x{k} A strides ({ars}, {acs}) t={threads}: ({}, {}) {got} vs {w}",
                                idx / n,
                                idx % n
                            );
                        }
                    }
                }
            }
        }
    }

    /// Views that reach past their buffers are refused before any access.
    #[test]
    fn extents_past_the_buffers_panic_before_any_access() {
        let a = vec![1f32; 6];
        let mut c = vec![0f32; 4];
        for path in KernelPath::available() {
            // A is 2 x 3 (6 elements) but asked for 2 x 4.
            let r = std::panic::catch_unwind(|| {
                let mut c = c.clone();
                // SAFETY: the views describe live buffers; the product must refuse the extent.
                unsafe {
                    sgemm(
                        path,
                        2,
                        2,
                        4,
                        MatRef::of(&a, 3, 1),
                        MatRef::of(&a, 2, 1),
                        MatMut::new(c.as_mut_ptr(), 2, 4),
                        false,
                        None,
                        1,
                    )
                }
            });
            assert!(r.is_err(), "{path}: A past its end");
            // C of 2 x 2 rows 3 apart needs 5 elements, has 4.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // SAFETY: as above.
                unsafe {
                    sgemm(
                        path,
                        2,
                        2,
                        3,
                        MatRef::of(&a, 3, 1),
                        MatRef::of(&a, 2, 1),
                        MatMut::new(c.as_mut_ptr(), 3, 4),
                        false,
                        None,
                        1,
                    )
                }
            }));
            assert!(r.is_err(), "{path}: C past its end");
        }
        // SAFETY: the extents fit.
        unsafe {
            sgemm(
                KernelPath::Portable,
                2,
                2,
                3,
                MatRef::of(&a, 3, 1),
                MatRef::of(&a, 2, 1),
                MatMut::new(c.as_mut_ptr(), 2, 4),
                false,
                None,
                1,
            )
        };
        assert_eq!(c, vec![3.0; 4]);
    }

    #[test]
    fn a_prepacked_b_gives_the_same_product() {
        let paths: Vec<KernelPath> = KernelPath::available().into_iter().filter(|p| p.own_gemm()).collect();
        if paths.is_empty() {
            eprintln!("skipped: neither the AVX2 nor the AVX-512 path runs here");
            return;
        }
        for path in paths {
            prepacked_on(path);
        }
    }

    fn prepacked_on(path: KernelPath) {
        // Two column blocks (n > NC) and two depth blocks (k > KC), transposed B, bias.
        let (m, n, k) = (29, 3100, 800);
        let mut rng = crate::Rng::new(8);
        let a: Vec<f32> = (0..m * k).map(|_| rng.uniform_f32() - 0.5).collect();
        let w: Vec<f32> = (0..n * k).map(|_| rng.uniform_f32() - 0.5).collect();
        let bias: Vec<f32> = (0..n).map(|j| j as f32 * 1e-3).collect();
        let (av, bv) = (MatRef::of(&a, k, 1), MatRef::of(&w, 1, k));
        let packed = PackedB::new(bv, k, n, 2);
        let (mut c1, mut c2) = (vec![0f32; m * n], vec![1f32; m * n]);
        // SAFETY: the views cover the vectors.
        unsafe {
            sgemm(
                path,
                m,
                n,
                k,
                av,
                bv,
                MatMut::new(c1.as_mut_ptr(), n, c1.len()),
                false,
                Some(&bias),
                2,
            );
            sgemm_prepacked(
                path,
                m,
                av,
                &packed,
                MatMut::new(c2.as_mut_ptr(), n, c2.len()),
                Some(&bias),
                2,
            );
        }
        assert_eq!(c1, c2, "{path}");
    }
}

/// Shows that a sanitizer run is live: `cargo xtask sanitize` runs this ignored test under
/// AddressSanitizer and requires it to be reported.
#[cfg(test)]
mod canary {
    #[test]
    #[ignore = "reads past a buffer on purpose; `cargo xtask sanitize` runs it under ASan and expects a report"]
    #[allow(clippy::useless_vec)] // a heap buffer: ASan reports a heap-buffer-overflow
    fn asan_canary_reads_past_a_buffer() {
        let v = vec![1f32; 4];
        let p = std::hint::black_box(v.as_ptr());
        // SAFETY: none; this is the deliberate out-of-bounds read the sanitizer must report
        // (the test is ignored unless `cargo xtask sanitize` asks for it).
        let x = unsafe { std::ptr::read_volatile(p.add(4)) };
        std::hint::black_box(x);
    }
}

//! Fused multi-head self-attention on CPU: `softmax(scale * Q K^T, mask)` with dropout on
//! the probabilities, times `V`, heads merged, in one op per layer.
//!
//! The composed version (split heads, two batched matmuls, softmax, dropout mask, merge
//! heads) copies Q, K and V into head-major layout, stores the `[batch, heads, t, t]`
//! probabilities and a dropout mask of the same size for backward, and its backward
//! re-assembles the gradients of Q, K and V through candle's `narrow`/`cat`. This op reads
//! Q, K and V in place (row stride and column offset per head), runs each (example, head)
//! as one task with products from [`super::sgemm`], and stores nothing but its inputs:
//! backward recomputes the probabilities (as FlashAttention does; attention is ~2% of a
//! GPT-2 base step's FLOPs at 64 tokens) and writes the gradients of Q, K and V straight
//! into one buffer. The dropout mask is drawn from a seed per call, a separate stream per
//! (example, head), so backward regenerates the same mask instead of storing it.
//!
//! Gradients, for P = softmax(S), P' = P * M (M: dropout's 0 or 1/(1-p)), O = P' V:
//! dV = P'^T dO; dP = (dO V^T) * M; dS = scale * P * (dP - rowsum(dP * P)); dQ = dS K;
//! dK = dS^T Q.

use super::sgemm::{sgemm, MatMut, MatRef};
use super::{tracks, unsupported, Mask};
use crate::kernels::KernelPath;
use candle_core::backend::BackendStorage as _;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::cell::RefCell;

/// What a self-attention call computes besides Q, K and V.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionSpec {
    /// Heads; the width of Q, K and V is a multiple of it.
    pub heads: usize,
    /// Multiplies the scores before the softmax.
    pub scale: f64,
    /// Which keys each query sees.
    pub mask: Mask,
    /// Dropout on the probabilities: probability and the seed of its mask (`None`: off).
    pub dropout: Option<(f64, u64)>,
}

/// Fills `out` (`tq * t`) with one head's dropout multipliers: 0 with probability `p`, else
/// `1 / (1 - p)`, from a key of the head's stream hashed with the element index (the same values
/// as [`dropout_mask`]).
fn fill_mask(path: KernelPath, out: &mut [f32], seed: u64, bh: usize, p: f64) {
    super::fastmath::dropout_multipliers(path, out, super::dropout::chunk_key(seed, bh), 0, p);
}

/// The dropout multipliers the fused op applies, as a `[batch, heads, t, t]` tensor (for
/// the composed reference and for tests): a mask of one block per (example, head) matrix,
/// the one [`attention_composed`] draws where the probabilities live.
pub fn dropout_mask(
    batch: usize,
    heads: usize,
    t: usize,
    p: f64,
    seed: u64,
    device: &candle_core::Device,
) -> Result<Tensor> {
    let m = super::dropout::mask_values(batch * heads * t * t, t * t, p, seed);
    crate::transfer::upload(m, (batch, heads, t, t), device)
}

/// Geometry of Q, K and V inside their buffers.
#[derive(Debug, Clone, Copy)]
struct Geom {
    b: usize,
    /// Keys (and rows of Q, K, V).
    t: usize,
    /// Queries: the last `tq` rows (`t` unless only the last positions are read out).
    tq: usize,
    /// Model width (heads * d).
    c: usize,
    heads: usize,
    d: usize,
    /// Row stride of Q, K and V (3c when packed, c when split).
    row: usize,
    /// The kernels, chosen on the calling thread.
    path: KernelPath,
}

/// A read-only buffer: `len` elements from `ptr`.
#[derive(Clone, Copy)]
struct Buf {
    ptr: *const f32,
    len: usize,
}

impl Buf {
    fn of(s: &[f32]) -> Self {
        Self {
            ptr: s.as_ptr(),
            len: s.len(),
        }
    }

    /// The part from element `off` on (empty past the end).
    fn skip(self, off: usize) -> Self {
        Self {
            ptr: self.ptr.wrapping_add(off),
            len: self.len.saturating_sub(off),
        }
    }

    /// A matrix view starting `off` elements in (its extent is checked by the product).
    fn view(self, off: usize, rs: usize, cs: usize) -> MatRef {
        let b = self.skip(off);
        MatRef::new(b.ptr, rs, cs, b.len)
    }
}

/// A writable buffer (`len` 0 and a null pointer: not wanted).
#[derive(Clone, Copy)]
struct BufMut {
    ptr: *mut f32,
    len: usize,
}

impl BufMut {
    const NONE: BufMut = BufMut {
        ptr: std::ptr::null_mut(),
        len: 0,
    };

    fn of(s: &mut [f32]) -> Self {
        Self {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }

    fn skip(self, off: usize) -> Self {
        Self {
            ptr: self.ptr.wrapping_add(off),
            len: self.len.saturating_sub(off),
        }
    }

    fn wanted(self) -> bool {
        !self.ptr.is_null()
    }

    /// An output view starting `off` elements in, rows `ld` apart (its extent is checked
    /// by the product).
    fn view(self, off: usize, ld: usize) -> MatMut {
        let b = self.skip(off);
        MatMut::new(b.ptr, ld, b.len)
    }
}

// SAFETY: a `Buf` is only read through, and every one is made from a slice that outlives
// the parallel loop it is handed to.
unsafe impl Send for Buf {}
unsafe impl Sync for Buf {}
// SAFETY: the tasks that share a `BufMut` write disjoint parts of it (each (example, head)
// task its own columns; the products check that each view stays inside the buffer), and
// the buffer outlives the parallel loop.
unsafe impl Send for BufMut {}
unsafe impl Sync for BufMut {}

#[derive(Clone, Copy)]
struct Ptrs {
    q: Buf,
    k: Buf,
    v: Buf,
}

#[derive(Clone, Copy)]
struct OutPtrs {
    q: BufMut,
    k: BufMut,
    v: BufMut,
}

thread_local! {
    static SCRATCH: RefCell<[Vec<f32>; 3]> = const { RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// `p` := masked softmax of `scale * p`, `tq` rows of `t` keys; hidden keys get 0.
fn softmax_rows(path: KernelPath, p: &mut [f32], tq: usize, t: usize, scale: f32, mask: Mask) {
    for (i, row) in p.chunks_mut(t).enumerate() {
        let (lo, hi) = mask.range(i, tq, t);
        super::fastmath::softmax_in_place(path, &mut row[lo..hi], scale);
        row[..lo].fill(0.0);
        row[hi..].fill(0.0);
    }
}

/// `s = Q K^T` for head `bh` (unscaled; the last `tq` queries against all keys).
///
/// # Safety
/// `x` describes live buffers that no thread writes during the call.
unsafe fn scores(g: &Geom, x: Ptrs, bh: usize, s: &mut [f32]) {
    let base = (bh / g.heads) * g.t * g.row + (bh % g.heads) * g.d;
    let tt = s.len();
    // SAFETY: the caller's contract; the product checks the head's extents against the
    // buffers' lengths.
    unsafe {
        sgemm(
            g.path,
            g.tq,
            g.t,
            g.d,
            x.q.view(base + (g.t - g.tq) * g.row, g.row, 1),
            x.k.view(base, 1, g.row),
            MatMut::new(s.as_mut_ptr(), g.t, tt),
            false,
            None,
            1,
        )
    }
}

fn forward(g: Geom, x: Ptrs, spec: &AttentionSpec) -> Vec<f32> {
    // Every slot is written by its head's product (no zero-fill first).
    let mut out = super::uninit::<f32>(g.b * g.tq * g.c);
    let o = OutPtrs {
        q: BufMut {
            ptr: out.as_mut_ptr() as *mut f32,
            len: out.len(),
        },
        k: BufMut::NONE,
        v: BufMut::NONE,
    };
    let tt = g.tq * g.t;
    let head = |bh: usize| {
        let (o, x) = (o, x); // capture the Send wrappers whole
        SCRATCH.with_borrow_mut(|[s, m, _]| {
            grow(s, tt);
            let s = &mut s[..tt];
            // SAFETY: shapes were checked; each head writes its own columns of `out`.
            unsafe { scores(&g, x, bh, s) };
            softmax_rows(g.path, s, g.tq, g.t, spec.scale as f32, spec.mask);
            if let Some((p, seed)) = spec.dropout {
                grow(m, tt);
                let m = &mut m[..tt];
                fill_mask(g.path, m, seed, bh, p);
                for (a, b) in s.iter_mut().zip(m.iter()) {
                    *a *= b;
                }
            }
            let (bi, hi) = (bh / g.heads, bh % g.heads);
            let base = bi * g.t * g.row + hi * g.d;
            // SAFETY: as above.
            unsafe {
                sgemm(
                    g.path,
                    g.tq,
                    g.d,
                    g.t,
                    MatRef::of(s, g.t, 1),
                    x.v.view(base, g.row, 1),
                    o.q.view(bi * g.tq * g.c + hi * g.d, g.c),
                    false,
                    None,
                    1,
                )
            };
        })
    };
    run_heads(g.b * g.heads, tt * g.d, head);
    // SAFETY: each (example, head) product wrote its rows x columns of `out`.
    unsafe { super::assume_init(out) }
}

/// Runs `f` for every (example, head), in parallel when there is enough work.
fn run_heads(n: usize, work_per_head: usize, f: impl Fn(usize) + Send + Sync) {
    if crate::num_threads() > 1 && n > 1 && n * work_per_head >= 1 << 18 {
        (0..n).into_par_iter().for_each(f);
    } else {
        (0..n).for_each(f);
    }
}

/// Gradients of Q, K and V written through `dx` (row stride `row_out`, same offsets as Q, K
/// and V in their buffers).
fn backward(g: Geom, x: Ptrs, dout: &[f32], dx: OutPtrs, row_out: usize, spec: &AttentionSpec) {
    let tt = g.tq * g.t;
    let scale = spec.scale as f32;
    let dop = Buf::of(dout);
    let head = |bh: usize| {
        let (dx, x) = (dx, x); // capture the Send wrappers whole
        SCRATCH.with_borrow_mut(|[s, w, m]| {
            grow(s, tt);
            grow(w, tt);
            let (s, w) = (&mut s[..tt], &mut w[..tt]);
            let (bi, hi) = (bh / g.heads, bh % g.heads);
            let base = bi * g.t * g.row + hi * g.d;
            let obase = bi * g.t * row_out + hi * g.d;
            let qbase = base + (g.t - g.tq) * g.row;
            let dqbase = obase + (g.t - g.tq) * row_out;
            let dbase = bi * g.tq * g.c + hi * g.d;
            // SAFETY: shapes were checked; each head reads its own rows and writes its own
            // columns of the gradient buffers.
            unsafe {
                scores(&g, x, bh, s);
                softmax_rows(g.path, s, g.tq, g.t, scale, spec.mask);
                // w = P' (dropped probabilities).
                let mask = match spec.dropout {
                    Some((p, seed)) => {
                        grow(m, tt);
                        let m = &mut m[..tt];
                        fill_mask(g.path, m, seed, bh, p);
                        for ((wv, sv), mv) in w.iter_mut().zip(s.iter()).zip(m.iter()) {
                            *wv = sv * mv;
                        }
                        Some(&m[..])
                    }
                    None => {
                        w.copy_from_slice(s);
                        None
                    }
                };
                if dx.v.wanted() {
                    // dV = P'^T dO
                    sgemm(
                        g.path,
                        g.t,
                        g.d,
                        g.tq,
                        MatRef::of(w, 1, g.t),
                        dop.view(dbase, g.c, 1),
                        dx.v.view(obase, row_out),
                        false,
                        None,
                        1,
                    );
                }
                // w = dO V^T, then dP = w * M
                sgemm(
                    g.path,
                    g.tq,
                    g.t,
                    g.d,
                    dop.view(dbase, g.c, 1),
                    x.v.view(base, 1, g.row),
                    MatMut::new(w.as_mut_ptr(), g.t, tt),
                    false,
                    None,
                    1,
                );
                if let Some(m) = mask {
                    for (a, b) in w.iter_mut().zip(m.iter()) {
                        *a *= b;
                    }
                }
                // w = dS = scale * P * (dP - rowsum(dP * P)), zero where hidden.
                for (i, (wr, sr)) in w.chunks_mut(g.t).zip(s.chunks(g.t)).enumerate() {
                    let (lo, hi) = spec.mask.range(i, g.tq, g.t);
                    let dot: f32 = (lo..hi).map(|j| wr[j] * sr[j]).sum();
                    for j in lo..hi {
                        wr[j] = scale * sr[j] * (wr[j] - dot);
                    }
                    wr[..lo].fill(0.0);
                    wr[hi..].fill(0.0);
                }
                if dx.q.wanted() {
                    // dQ = dS K (the other rows of dQ stay zero)
                    sgemm(
                        g.path,
                        g.tq,
                        g.d,
                        g.t,
                        MatRef::of(w, g.t, 1),
                        x.k.view(base, g.row, 1),
                        dx.q.view(dqbase, row_out),
                        false,
                        None,
                        1,
                    );
                }
                if dx.k.wanted() {
                    // dK = dS^T Q
                    sgemm(
                        g.path,
                        g.t,
                        g.d,
                        g.tq,
                        MatRef::of(w, 1, g.t),
                        x.q.view(qbase, g.row, 1),
                        dx.k.view(obase, row_out),
                        false,
                        None,
                        1,
                    );
                }
            }
        })
    };
    run_heads(g.b * g.heads, tt * g.d, head);
}

/// Q, K and V packed as `[b, t, 3c]` (GPT-2's `c_attn` output); the last `.1` queries.
#[derive(Clone, Copy)]
struct Packed(AttentionSpec, Option<usize>);
/// Q, K and V as three `[b, t, c]` tensors.
struct Split(AttentionSpec);

fn geom(shape: &Shape, heads: usize, packed: bool, last: Option<usize>) -> Result<Geom> {
    let (b, t, w) = shape.dims3()?;
    let c = if packed { w / 3 } else { w };
    if (packed && w % 3 != 0) || heads == 0 || c % heads != 0 {
        candle_core::bail!("attention: width {w} does not split into {heads} heads (packed: {packed})")
    }
    let tq = last.unwrap_or(t);
    if tq == 0 || tq > t {
        candle_core::bail!("attention: cannot read out the last {tq} of {t} positions")
    }
    Ok(Geom {
        b,
        t,
        tq,
        c,
        heads,
        d: c / heads,
        row: w,
        path: KernelPath::active(),
    })
}

fn cpu_f32<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    match s.dtype() {
        DType::F32 => super::cpu_slice::<f32>(s, l, "attention"),
        dt => Err(unsupported("attention", dt)),
    }
}

/// Pointers to Q, K and V inside a packed `[b, t, 3c]` buffer.
fn packed_ptrs(qkv: &[f32], g: &Geom) -> Ptrs {
    let b = Buf::of(qkv);
    Ptrs {
        q: b,
        k: b.skip(g.c),
        v: b.skip(2 * g.c),
    }
}

/// The geometry of a packed `qkv` of shape `shape`, checked against the lengths of its data
/// and (in backward) of the output's gradient.
fn packed_geom(
    qkv: &[f32],
    dout: Option<&[f32]>,
    shape: &Shape,
    spec: &AttentionSpec,
    last: Option<usize>,
) -> Result<Geom> {
    let g = geom(shape, spec.heads, true, last)?;
    if qkv.len() != g.b * g.t * g.row || dout.is_some_and(|d| d.len() != g.b * g.tq * g.c) {
        candle_core::bail!(
            "attention: {} values (and {:?} gradients) for shape {shape:?}",
            qkv.len(),
            dout.map(|d| d.len())
        )
    }
    Ok(g)
}

/// Notes the dropout seed the heads' masks come from (drawn per head on the pool's
/// threads; see [`crate::replay`]).
fn note_seed(spec: &AttentionSpec) {
    if let Some((_, seed)) = spec.dropout {
        crate::replay::seed_slot(seed);
    }
}

/// The attention output `[b, tq, c]` of a packed `qkv` (`[b, t, 3c]`, contiguous, f32)
/// whose shape is `shape`.
pub(super) fn packed_forward(
    qkv: &[f32],
    shape: &Shape,
    spec: &AttentionSpec,
    last: Option<usize>,
) -> Result<Vec<f32>> {
    note_seed(spec);
    let g = packed_geom(qkv, None, shape, spec, last)?;
    Ok(forward(g, packed_ptrs(qkv, &g), spec))
}

/// The gradient `[b, t, 3c]` of a packed `qkv` given the output's gradient `dout`
/// (`[b, tq, c]`).
pub(super) fn packed_backward(
    qkv: &[f32],
    dout: &[f32],
    shape: &Shape,
    spec: &AttentionSpec,
    last: Option<usize>,
) -> Result<Vec<f32>> {
    note_seed(spec);
    let g = packed_geom(qkv, Some(dout), shape, spec, last)?;
    // Every slot is written unless only the last queries ran (then the other rows of dQ
    // stay zero).
    let n = g.b * g.t * g.row;
    let mut dx = if g.tq == g.t {
        super::uninit::<f32>(n)
    } else {
        vec![std::mem::MaybeUninit::new(0f32); n]
    };
    let d = BufMut {
        ptr: dx.as_mut_ptr() as *mut f32,
        len: dx.len(),
    };
    let outs = OutPtrs {
        q: d,
        k: d.skip(g.c),
        v: d.skip(2 * g.c),
    };
    backward(g, packed_ptrs(qkv, &g), dout, outs, g.row, spec);
    // SAFETY: the heads wrote dQ (its read-out rows; the rest is zero), dK and dV for
    // every row and column.
    Ok(unsafe { super::assume_init(dx) })
}

impl CustomOp1 for Packed {
    fn name(&self) -> &'static str {
        "fpt-attention-packed"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = packed_forward(cpu_f32(s, l)?, l.shape(), &self.0, self.1)?;
        let g = geom(l.shape(), self.0.heads, true, self.1)?;
        Ok((CpuStorage::F32(out), Shape::from((g.b, g.tq, g.c))))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        if !tracks(arg) {
            return Ok(None);
        }
        Ok(Some(self.input_grad(arg, dy)?))
    }
}

impl Packed {
    /// The packed input's gradient from the output's.
    fn input_grad(&self, arg: &Tensor, dy: &Tensor) -> Result<Tensor> {
        let dx = super::with_cpu_slice::<f32, _>(arg, "attention", |x| {
            super::with_cpu_slice::<f32, _>(dy, "attention", |dout| {
                packed_backward(x, dout, arg.shape(), &self.0, self.1)
            })
        })?;
        Tensor::from_vec(dx, arg.shape(), arg.device())
    }
}

/// The fused CPU op of [`super::attention_packed`] on a detached `qkv`, its backward kept
/// beside it (the same kernels as the op's own backward).
pub(super) fn attention_packed_fused_detached(qkv: &Tensor, spec: AttentionSpec) -> Result<(Tensor, super::InputGrad)> {
    let qkv = qkv.detach().contiguous()?;
    let op = Packed(spec, None);
    let out = qkv.apply_op1_no_bwd(&op)?;
    Ok((out, Box::new(move |dy: &Tensor| op.input_grad(&qkv, dy))))
}

impl super::ThreeOperands for Split {
    fn name(&self) -> &'static str {
        "fpt-attention"
    }

    fn forward_cpu(&self, [(s1, l1), (s2, l2), (s3, l3)]: [(&CpuStorage, &Layout); 3]) -> Result<(CpuStorage, Shape)> {
        let g = geom(l1.shape(), self.0.heads, false, None)?;
        if l2.shape() != l1.shape() || l3.shape() != l1.shape() {
            candle_core::bail!(
                "attention: q {:?}, k {:?}, v {:?} differ",
                l1.shape(),
                l2.shape(),
                l3.shape()
            )
        }
        let ptrs = Ptrs {
            q: Buf::of(cpu_f32(s1, l1)?),
            k: Buf::of(cpu_f32(s2, l2)?),
            v: Buf::of(cpu_f32(s3, l3)?),
        };
        Ok((CpuStorage::F32(forward(g, ptrs, &self.0)), Shape::from((g.b, g.t, g.c))))
    }

    fn gradients(&self, [q, k, v]: [&Tensor; 3], _res: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 3]> {
        let g = geom(q.shape(), self.0.heads, false, None)?;
        let n = g.b * g.t * g.c;
        let want = [tracks(q), tracks(k), tracks(v)];
        let mut bufs: [Vec<f32>; 3] = std::array::from_fn(|i| if want[i] { vec![0f32; n] } else { Vec::new() });
        {
            let [bq, bk, bv] = &mut bufs;
            let ptr = |b: &mut Vec<f32>, w: bool| if w { BufMut::of(b) } else { BufMut::NONE };
            let outs = OutPtrs {
                q: ptr(bq, want[0]),
                k: ptr(bk, want[1]),
                v: ptr(bv, want[2]),
            };
            super::with_cpu_slice::<f32, _>(q, "attention", |qs| {
                super::with_cpu_slice::<f32, _>(k, "attention", |ks| {
                    super::with_cpu_slice::<f32, _>(v, "attention", |vs| {
                        super::with_cpu_slice::<f32, _>(dy, "attention", |dout| {
                            let ptrs = Ptrs {
                                q: Buf::of(qs),
                                k: Buf::of(ks),
                                v: Buf::of(vs),
                            };
                            backward(g, ptrs, dout, outs, g.c, &self.0);
                            Ok(())
                        })
                    })
                })
            })?;
        }
        let [bq, bk, bv] = bufs;
        Ok([
            super::grad_like(bq, q, want[0])?,
            super::grad_like(bk, k, want[1])?,
            super::grad_like(bv, v, want[2])?,
        ])
    }
}

pub(super) fn fused_ok(t: &Tensor) -> bool {
    t.device().is_cpu() && t.dtype() == DType::F32
}

/// The fused CPU op of [`super::attention`] (f32 on a CPU: [`fused_ok`]).
pub(super) fn attention_fused(q: &Tensor, k: &Tensor, v: &Tensor, spec: AttentionSpec) -> Result<Tensor> {
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    q.apply_op3(&k, &v, super::Three(Split(spec)))
}

/// The fused CPU op of [`super::attention_packed`] (and `_last`, for the last `last` query
/// positions).
pub(super) fn attention_packed_fused(qkv: &Tensor, spec: AttentionSpec, last: Option<usize>) -> Result<Tensor> {
    qkv.contiguous()?.apply_op1(Packed(spec, last))
}

/// The probabilities `[b, heads, t, t]` (before dropout) the attention of `q` and `k` uses,
/// composed of candle ops.
pub fn attention_probs(q: &Tensor, k: &Tensor, heads: usize, scale: f64, mask: Mask) -> Result<Tensor> {
    let (b, t, c) = q.dims3()?;
    let split = |x: &Tensor| x.reshape((b, t, heads, c / heads))?.transpose(1, 2)?.contiguous();
    let scores = split(q)?.matmul(&split(k)?.t()?)?;
    super::masked_softmax(&scores, scale, mask)
}

/// [`super::attention`] composed of stock candle ops (every device; the reference in tests).
pub fn attention_composed(q: &Tensor, k: &Tensor, v: &Tensor, spec: AttentionSpec) -> Result<Tensor> {
    let (b, t, c) = q.dims3()?;
    let h = spec.heads;
    let mut probs = attention_probs(q, k, h, spec.scale, spec.mask)?;
    if let Some((p, seed)) = spec.dropout {
        // Drawn where the probabilities are (a kernel on a GPU): the same mask as
        // [`dropout_mask`], never copied from the host.
        probs = super::dropout::DropoutMul { p, seed, block: t * t }.apply(&probs)?;
    }
    let v = v.reshape((b, t, h, c / h))?.transpose(1, 2)?.contiguous()?;
    probs.matmul(&v)?.transpose(1, 2)?.reshape((b, t, c))
}

//! The recurrence of the reference code's layer-norm LSTM layer (paper §3.3, Tables 1, 3-5)
//! as one op with a hand-written backward pass through time.
//!
//! For the input map `xi = LN_i2h(W_ih x + b_ih)` (all steps at once, outside this op),
//! the initial state `(h0, c0)` and per-step dropout multipliers `m_s`, step `s` is
//!
//! ```text
//! r  = h W_hh^T + b_hh                          (4H wide)
//! pre = xi_s + LN_h2h(r)
//! i, f, o = sigmoid(pre[0:H]), sigmoid(pre[H:2H]), sigmoid(pre[2H:3H]);  g = tanh(pre[3H:4H])
//! c' = LN_cell(f * c + i * g);   h' = o * tanh(c') * m_s      (h' is the output and the next state)
//! ```
//!
//! where `LN` is the reference cell's LayerNorm: `(x - mean) / sqrt(var_unbiased + eps) * w
//! + b`. Its backward, with `xhat = (x - mean) * rstd` and `d = dxhat = dy * w` over `n`
//! values: `dx = rstd * (d - mean(d) - xhat * sum(d * xhat) / (n - 1))`.
//!
//! [`ln_lstm`] runs the fused CPU kernel for f32 on the CPU: one small product per step
//! forward (`h W_hh^T`) and one backward (`dr W_hh`), everything else in one pass over the
//! step's rows; the weight gradient of `W_hh`, when it trains, is one product over all
//! steps at the end. Elsewhere it runs [`ln_lstm_composed`], the same recurrence in stock
//! candle ops (the reference the kernel is tested against).

use super::fastmath::{exp_f32, tanh_f32};
use super::linear::product_threads as threads_for;
use super::lstm_grid::{LstmChoice, LstmDrop};
use super::sgemm::{has_micro_kernel, sgemm, sgemm_prepacked, MatMut, MatRef, PackedB};
use super::{cpu_slice, grad_like, tracks, with_cpu_slice};
use crate::kernels::KernelPath;
use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor, D};
use std::sync::Mutex;

/// The cell's parameters other than `W_hh`: `b_hh` and the two LayerNorms.
pub struct LnLstmParams<'a> {
    /// `[4H]`.
    pub b_hh: &'a Tensor,
    /// LN over `W_hh h + b_hh`: weight and bias, `[4H]` each.
    pub ln_h2h: (&'a Tensor, &'a Tensor),
    /// LN over the cell: weight and bias, `[H]` each.
    pub ln_cell: (&'a Tensor, &'a Tensor),
    /// The LayerNorms' epsilon (inside the square root, with the unbiased variance).
    pub eps: f64,
}

/// Runs the layer's recurrence over `xi: [B, T, 4H]` from `h0, c0: [B, H]` with the
/// recurrent weight `w_hh: [4H, H]`; `masks: [T, B, H]` are the dropout multipliers of
/// each step's output (none: no dropout). Returns the outputs `[B, T, H]`. Gradients reach
/// `xi`, `w_hh` and the parameters where they take part in backprop (`h0`, `c0` and the
/// masks are constants).
pub fn ln_lstm(
    xi: &Tensor,
    w_hh: &Tensor,
    p: &LnLstmParams,
    h0: &Tensor,
    c0: &Tensor,
    masks: Option<&Tensor>,
) -> Result<Tensor> {
    ln_lstm_as(super::lstm_grid::lstm_choice()?, xi, w_hh, p, h0, c0, masks)
}

/// [`ln_lstm`] run where `choice` says, whatever `FPT_LSTM` is: `Auto` runs the CPU's fused
/// kernel on the CPU and `kernels/fpt_lstm.h`'s (one block per batch row, one launch each
/// way) on a GPU, for f32, and the composed ops otherwise; `Grid` those kernels on any
/// device (on the CPU over the host grid); `Composed` the stock ops.
pub fn ln_lstm_as(
    choice: LstmChoice,
    xi: &Tensor,
    w_hh: &Tensor,
    p: &LnLstmParams,
    h0: &Tensor,
    c0: &Tensor,
    masks: Option<&Tensor>,
) -> Result<Tensor> {
    run(
        choice,
        xi,
        w_hh,
        p,
        h0,
        c0,
        masks.map_or(LstmDrop::None, LstmDrop::Masks),
    )
}

/// [`ln_lstm`] with step `s`'s dropout multipliers drawn from `seeds[s]` with probability
/// `drop_p`: the masks `dropout_mask_values(B H, drop_p, seeds[s])` stacked over the steps,
/// which the CPU's ops are handed; on a GPU the kernels draw them themselves (only the `T`
/// seeds cross, not `T B H` multipliers).
#[allow(clippy::too_many_arguments)]
pub fn ln_lstm_seeded(
    xi: &Tensor,
    w_hh: &Tensor,
    p: &LnLstmParams,
    h0: &Tensor,
    c0: &Tensor,
    drop_p: f64,
    seeds: &[u64],
) -> Result<Tensor> {
    ln_lstm_seeded_as(super::lstm_grid::lstm_choice()?, xi, w_hh, p, h0, c0, drop_p, seeds)
}

/// [`ln_lstm_seeded`] run where `choice` says (as [`ln_lstm_as`]).
#[allow(clippy::too_many_arguments)]
pub fn ln_lstm_seeded_as(
    choice: LstmChoice,
    xi: &Tensor,
    w_hh: &Tensor,
    p: &LnLstmParams,
    h0: &Tensor,
    c0: &Tensor,
    drop_p: f64,
    seeds: &[u64],
) -> Result<Tensor> {
    let t = xi.dims3()?.1;
    if seeds.len() != t {
        candle_core::bail!("layer-norm LSTM: {} dropout seeds for {t} steps", seeds.len())
    }
    run(choice, xi, w_hh, p, h0, c0, LstmDrop::Seeded { p: drop_p, seeds })
}

/// The `T B H` multipliers of a seeded dropout (`dropout_mask_values(B H, p, seed)` a step,
/// in step order).
fn seeded_values(xi: &Tensor, p: f64, seeds: &[u64]) -> Result<Vec<f32>> {
    let (b, t, g4) = xi.dims3()?;
    let n = b * (g4 / 4);
    let mut m = Vec::with_capacity(t * n);
    for &s in seeds {
        m.extend(super::dropout_mask_values(n, p, s));
    }
    Ok(m)
}

/// The multipliers a seeded dropout stands for, `[T, B, H]` on `xi`'s device in its dtype
/// (one counted upload); given masks as they are.
fn host_masks(xi: &Tensor, drop: LstmDrop<'_>) -> Result<Option<Tensor>> {
    match drop {
        LstmDrop::None => Ok(None),
        LstmDrop::Masks(m) => Ok(Some(m.clone())),
        LstmDrop::Seeded { p, seeds } => {
            let (b, t, g4) = xi.dims3()?;
            let m = crate::transfer::upload(seeded_values(xi, p, seeds)?, (t, b, g4 / 4), xi.device())?;
            Ok(Some(m.to_dtype(xi.dtype())?))
        }
    }
}

fn run(
    choice: LstmChoice,
    xi: &Tensor,
    w_hh: &Tensor,
    p: &LnLstmParams,
    h0: &Tensor,
    c0: &Tensor,
    drop: LstmDrop<'_>,
) -> Result<Tensor> {
    let composed = |drop| ln_lstm_composed(xi, w_hh, p, h0, c0, host_masks(xi, drop)?.as_ref());
    let f32s = xi.dtype() == DType::F32 && w_hh.dtype() == DType::F32;
    let grid = match choice {
        LstmChoice::Composed => return composed(drop),
        LstmChoice::Grid if !f32s => {
            candle_core::bail!(
                "layer-norm LSTM: FPT_LSTM=grid runs f32, the input is {:?} and W_hh {:?}",
                xi.dtype(),
                w_hh.dtype()
            )
        }
        LstmChoice::Grid => true,
        LstmChoice::Auto if f32s && xi.device().is_cpu() => false,
        LstmChoice::Auto if f32s && cfg!(feature = "cuda") && xi.device().is_cuda() => true,
        LstmChoice::Auto => return composed(drop),
    };
    let (b, t, g4) = xi.dims3()?;
    let h = g4 / 4;
    let expect = |what: &str, x: &Tensor, dims: &[usize]| -> Result<()> {
        if x.dims() != dims {
            candle_core::bail!("layer-norm LSTM: {what} has shape {:?}, expected {dims:?}", x.dims())
        }
        Ok(())
    };
    if g4 != 4 * h || h < 2 {
        candle_core::bail!("layer-norm LSTM: gate width {g4} is not 4 x a hidden size of at least 2")
    }
    expect("W_hh", w_hh, &[4 * h, h])?;
    expect("b_hh", p.b_hh, &[4 * h])?;
    expect("ln_h2h weight", p.ln_h2h.0, &[4 * h])?;
    expect("ln_h2h bias", p.ln_h2h.1, &[4 * h])?;
    expect("ln_cell weight", p.ln_cell.0, &[h])?;
    expect("ln_cell bias", p.ln_cell.1, &[h])?;
    expect("h0", h0, &[b, h])?;
    expect("c0", c0, &[b, h])?;
    if let LstmDrop::Masks(m) = drop {
        expect("dropout masks", m, &[t, b, h])?;
    }
    // Two packed operands: `[W_hh | b_hh]` (`[4H, H + 1]`) and the LayerNorms' `[w_h2h,
    // b_h2h, w_cell, b_cell]` (`[10H]`). candle's `cat` hands a gradient to every piece, so
    // each pack holds pieces that all take part in backprop or all do not (a mixed pack
    // runs the composed twin, whose gradients reach exactly the tracked pieces).
    let mixed = |v: &[&Tensor]| v.iter().any(|t| tracks(t)) && !v.iter().all(|t| tracks(t));
    if mixed(&[w_hh, p.b_hh]) || mixed(&[p.ln_h2h.0, p.ln_h2h.1, p.ln_cell.0, p.ln_cell.1]) {
        return composed(drop);
    }
    let vec = |x: &Tensor| -> Result<Vec<f32>> { x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>() };
    let wb = Tensor::cat(&[w_hh, &p.b_hh.unsqueeze(1)?], 1)?;
    let ln = Tensor::cat(&[p.ln_h2h.0, p.ln_h2h.1, p.ln_cell.0, p.ln_cell.1], 0)?;
    if grid {
        return super::lstm_grid::ln_lstm_grid(&xi.contiguous()?, &wb, &ln, w_hh, p, (h0, c0, drop));
    }
    let op = LnLstmOp {
        h0: vec(h0)?,
        c0: vec(c0)?,
        masks: match drop {
            LstmDrop::None => None,
            LstmDrop::Masks(m) => Some(vec(m)?),
            LstmDrop::Seeded { p, seeds } => Some(seeded_values(xi, p, seeds)?),
        },
        eps: p.eps as f32,
        saved: Mutex::new(None),
    };
    xi.contiguous()?.apply_op3(&wb, &ln, super::Three(op))
}

/// The reference LayerNorm in candle ops: `(x - mean) / sqrt(var_unbiased + eps) * w + b`.
fn ref_layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
    let n = x.dim(D::Minus1)? as f64;
    let mean = x.mean_keepdim(D::Minus1)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = (xc.sqr()?.sum_keepdim(D::Minus1)? / (n - 1.0))?;
    let xhat = xc.broadcast_div(&(var + eps)?.sqrt()?)?;
    xhat.broadcast_mul(w)?.broadcast_add(b)
}

/// [`ln_lstm`] in stock candle ops, step by step (every device; the kernel's reference).
pub fn ln_lstm_composed(
    xi: &Tensor,
    w_hh: &Tensor,
    p: &LnLstmParams,
    h0: &Tensor,
    c0: &Tensor,
    masks: Option<&Tensor>,
) -> Result<Tensor> {
    let (_, t, g4) = xi.dims3()?;
    let hsz = g4 / 4;
    let (mut h, mut c) = (h0.clone(), c0.clone());
    let mut ys = Vec::with_capacity(t);
    for s in 0..t {
        let r = h.matmul(&w_hh.t()?)?.broadcast_add(p.b_hh)?;
        let pre = (xi.narrow(1, s, 1)?.squeeze(1)? + ref_layer_norm(&r, p.ln_h2h.0, p.ln_h2h.1, p.eps)?)?;
        let gates = sigmoid_composed(&pre.narrow(1, 0, 3 * hsz)?)?;
        let g = pre.narrow(1, 3 * hsz, hsz)?.tanh()?;
        let (i, f, o) = (
            gates.narrow(1, 0, hsz)?,
            gates.narrow(1, hsz, hsz)?,
            gates.narrow(1, 2 * hsz, hsz)?,
        );
        c = ref_layer_norm(&((f * &c)? + (i * g)?)?, p.ln_cell.0, p.ln_cell.1, p.eps)?;
        h = (o * c.tanh()?)?;
        if let Some(m) = masks {
            h = (h * m.get(s)?)?;
        }
        ys.push(h.clone());
    }
    Tensor::stack(&ys, 1)
}

/// sigmoid(x) = (tanh(x / 2) + 1) / 2, from ops with backward on every device.
fn sigmoid_composed(x: &Tensor) -> Result<Tensor> {
    x.affine(0.5, 0.0)?.tanh()?.affine(0.5, 0.5)
}

/// What forward keeps for backward, per step `s` and row `r` (index `s * B + r`).
struct Saved {
    /// The state fed to the recurrent map, `[T, B, H]`.
    hprev: Vec<f32>,
    /// The cell state before the step, `[T, B, H]`.
    cprev: Vec<f32>,
    /// `LN_h2h`'s normalised input, `[T, B, 4H]`.
    rhat: Vec<f32>,
    /// Its `1 / sqrt(var + eps)`, `[T, B]`.
    rrstd: Vec<f32>,
    /// The activated gates `i, f, o, g`, `[T, B, 4H]`.
    gates: Vec<f32>,
    /// `LN_cell`'s normalised input, `[T, B, H]`.
    chat: Vec<f32>,
    /// Its `1 / sqrt(var + eps)`, `[T, B]`.
    crstd: Vec<f32>,
    /// `tanh(c')`, `[T, B, H]`.
    tc: Vec<f32>,
}

struct LnLstmOp {
    h0: Vec<f32>,
    c0: Vec<f32>,
    /// `[T, B, H]` multipliers.
    masks: Option<Vec<f32>>,
    eps: f32,
    saved: Mutex<Option<Saved>>,
}

/// The right operand of the per-step products: packed once per call where fpt's
/// micro-kernel runs (every step multiplies by the same `W_hh`), else a view.
enum Rhs<'a> {
    Packed(PackedB),
    View(MatRef, std::marker::PhantomData<&'a [f32]>),
}

impl<'a> Rhs<'a> {
    /// `b` (`k x n`, a view of `data`).
    fn new(data: &'a [f32], rs: usize, cs: usize, k: usize, n: usize) -> Self {
        let view = MatRef::of(data, rs, cs);
        if has_micro_kernel(KernelPath::active()) && k > 0 {
            Rhs::Packed(PackedB::new(view, k, n, 1))
        } else {
            Rhs::View(view, std::marker::PhantomData)
        }
    }

    /// `c = a b (+ bias)` for a row-major `a` of `m` rows of `k` into `c` (rows `n` apart).
    fn product(&self, m: usize, n: usize, k: usize, a: &[f32], c: &mut [f32], bias: Option<&[f32]>) {
        let a = MatRef::of(a, k, 1);
        match self {
            Rhs::Packed(p) => {
                let out = MatMut::new(c.as_mut_ptr(), n, c.len());
                // SAFETY: `a` views a live slice and `c` is a distinct &mut slice (valid for
                // writes, aliased by neither operand nor any other thread); sgemm_prepacked
                // checks a's and c's extents against their lengths and that the active path
                // has the micro-kernel the panel was packed for (Rhs::new) before any access.
                unsafe { sgemm_prepacked(KernelPath::active(), m, a, p, out, bias, threads_for(m, n, k)) }
            }
            Rhs::View(b, _) => product(m, n, k, a, *b, c, n, bias),
        }
    }
}

/// `c = a b (+ bias)` for views `a: [m, k]`, `b: [k, n]` into row-major `c` with rows
/// `ldc` apart.
#[allow(clippy::too_many_arguments)]
fn product(m: usize, n: usize, k: usize, a: MatRef, b: MatRef, c: &mut [f32], ldc: usize, bias: Option<&[f32]>) {
    // SAFETY: `a` and `b` view live slices of the caller, and `c` is a distinct &mut slice,
    // so it is valid for writes and aliased by neither and by no other thread during the
    // call; sgemm checks every extent (a's, b's, and c's m rows of n, `ldc` apart) against
    // the views' lengths before any access.
    unsafe {
        sgemm(
            KernelPath::active(),
            m,
            n,
            k,
            a,
            b,
            MatMut::new(c.as_mut_ptr(), ldc, c.len()),
            false,
            bias,
            threads_for(m, n, k),
        )
    }
}

/// The reference LayerNorm of one row: writes `xhat` and returns `rstd`.
#[inline]
fn ref_ln_row(x: &[f32], xhat: &mut [f32], eps: f32) -> f32 {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|&v| (v - mean) * (v - mean)).sum::<f32>() / (n - 1.0);
    let rstd = 1.0 / (var + eps).sqrt();
    for (o, &v) in xhat.iter_mut().zip(x) {
        *o = (v - mean) * rstd;
    }
    rstd
}

/// The reference LayerNorm's backward for one row: from `d = dy * w` (overwritten with
/// `dx`), the normalised input and `rstd`.
#[inline]
fn ref_ln_row_bwd(d: &mut [f32], xhat: &[f32], rstd: f32) {
    let n = d.len() as f32;
    let mean_d = d.iter().sum::<f32>() / n;
    let dot = d.iter().zip(xhat).map(|(a, b)| a * b).sum::<f32>() / (n - 1.0);
    for (v, &x) in d.iter_mut().zip(xhat) {
        *v = rstd * (*v - mean_d - x * dot);
    }
}

/// Below this magnitude (2^-100, about 7.9e-31) a gradient that the backward pass through
/// time hands from step to step is set to zero: [`flush_tiny`].
const TINY: f32 = f32::from_bits((127 - 100) << 23); // 2^-100: biased exponent 27, no mantissa bits

/// Sets every value of `v` whose magnitude is below [`TINY`] (2^-100) to a zero of its sign
/// and leaves every other value as it is (larger values, infinities and NaNs keep their
/// bits), with integer operations only, so that no subnormal is an operand of the
/// arithmetic.
///
/// The backward pass through time carries `dh` and `dc` from step to step, and with the
/// gradient entering late in a long sequence (ListOps reads out one token after 512) they
/// shrink geometrically and pass through the subnormal range (below 2^-126) for many steps
/// on their way to zero. On Intel CPUs every vector instruction with a subnormal operand or
/// result takes a microcode assist of a hundred cycles or more (most AMD cores handle them
/// in hardware; the measurements on an Intel Xeon are in `bench/HISTORY.md`). The CPU's
/// flush-to-zero and denormals-are-zero modes would do it for the process, but Rust declares
/// them undefined behaviour; flushing only subnormals is not enough (products and sums of
/// the small normal values that are left still land in the subnormal range), hence a
/// threshold. 2^-100 leaves 26 binades below it, so a value
/// handed on times a weight or gate derivative above 2^-26 stays normal. What is zeroed is
/// at least 2^-100 below everything f32 can add it to at 1, far below the rounding of any
/// sum it joins: `dr` (the per-step product's operand), `dh` (its result), the carried
/// `dc` and the pre-activation gradients (which also feed the input map's product), the
/// same way on every kernel path.
#[inline]
fn flush_tiny(v: &mut [f32]) {
    const MAGNITUDE: u32 = 0x7fff_ffff;
    const SIGN: u32 = 0x8000_0000;
    let tiny = TINY.to_bits();
    for x in v {
        let bits = x.to_bits();
        *x = f32::from_bits(if bits & MAGNITUDE < tiny { bits & SIGN } else { bits });
    }
}

#[inline]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

impl LnLstmOp {
    fn dims(&self, l1: &Layout) -> Result<(usize, usize, usize)> {
        let (b, t, g4) = l1.shape().dims3()?;
        Ok((b, t, g4 / 4))
    }

    fn forward(&self, xi: &[f32], wb: &[f32], ln: &[f32], b: usize, t: usize, h: usize) -> (Vec<f32>, Saved) {
        let g4 = 4 * h;
        let b_hh: Vec<f32> = (0..g4).map(|j| wb[j * (h + 1) + h]).collect();
        let (lnh_w, rest) = ln.split_at(g4);
        let (lnh_b, rest) = rest.split_at(g4);
        let (lnc_w, lnc_b) = rest.split_at(h);
        let n = t * b;
        let mut sv = Saved {
            hprev: vec![0.0; n * h],
            cprev: vec![0.0; n * h],
            rhat: vec![0.0; n * g4],
            rrstd: vec![0.0; n],
            gates: vec![0.0; n * g4],
            chat: vec![0.0; n * h],
            crstd: vec![0.0; n],
            tc: vec![0.0; n * h],
        };
        let mut y = vec![0.0f32; b * t * h];
        let mut hcur = self.h0.clone();
        let mut ccur = self.c0.clone();
        let mut r = vec![0.0f32; b * g4];
        let mut cp = vec![0.0f32; h];
        // W_hh^T as a view of [W_hh | b_hh] ([4H, H + 1] row-major): (p, j) at j (H + 1) + p.
        let wt = Rhs::new(wb, 1, h + 1, h, g4);
        for s in 0..t {
            let at = s * b;
            sv.hprev[at * h..(at + b) * h].copy_from_slice(&hcur);
            sv.cprev[at * h..(at + b) * h].copy_from_slice(&ccur);
            wt.product(b, g4, h, &hcur, &mut r, Some(&b_hh));
            for row in 0..b {
                let k = at + row;
                let rhat = &mut sv.rhat[k * g4..(k + 1) * g4];
                sv.rrstd[k] = ref_ln_row(&r[row * g4..(row + 1) * g4], rhat, self.eps);
                let x = &xi[(row * t + s) * g4..(row * t + s + 1) * g4];
                let gates = &mut sv.gates[k * g4..(k + 1) * g4];
                // Input, forget and output gates, then the cell candidate: two loops without
                // a branch, which the compiler vectorizes.
                let pre = |j: usize| x[j] + rhat[j] * lnh_w[j] + lnh_b[j];
                for (j, g) in gates[..3 * h].iter_mut().enumerate() {
                    *g = sigmoid(pre(j));
                }
                for (j, g) in gates[3 * h..].iter_mut().enumerate() {
                    *g = tanh_f32(pre(3 * h + j));
                }
                let c = &mut ccur[row * h..(row + 1) * h];
                for j in 0..h {
                    cp[j] = gates[h + j] * c[j] + gates[j] * gates[3 * h + j];
                }
                let chat = &mut sv.chat[k * h..(k + 1) * h];
                sv.crstd[k] = ref_ln_row(&cp, chat, self.eps);
                let tc = &mut sv.tc[k * h..(k + 1) * h];
                let hrow = &mut hcur[row * h..(row + 1) * h];
                let mask = self.masks.as_ref().map(|m| &m[k * h..(k + 1) * h]);
                let out = &mut y[(row * t + s) * h..(row * t + s + 1) * h];
                for j in 0..h {
                    c[j] = chat[j] * lnc_w[j] + lnc_b[j];
                    tc[j] = tanh_f32(c[j]);
                    let v = gates[2 * h + j] * tc[j] * mask.map_or(1.0, |m| m[j]);
                    hrow[j] = v;
                    out[j] = v;
                }
            }
        }
        (y, sv)
    }

    /// Returns `(dxi, dwb, dln)`; `dwb` (`[W_hh | b_hh]`'s) only when `want_w`.
    fn backward(
        &self,
        sv: &Saved,
        dy: &[f32],
        wb: &[f32],
        ln: &[f32],
        (b, t, h): (usize, usize, usize),
        want_w: bool,
    ) -> (Vec<f32>, Option<Vec<f32>>, Vec<f32>) {
        let g4 = 4 * h;
        let lnh_w = &ln[..g4];
        let lnc_w = &ln[2 * g4..2 * g4 + h];
        // dln: [w_h2h, b_h2h, w_cell, b_cell] at 0, 4H, 8H, 9H.
        let mut dln = vec![0.0f32; ln.len()];
        let mut db = vec![0.0f32; if want_w { g4 } else { 0 }];
        let mut dxi = vec![0.0f32; b * t * g4];
        // dr of every step when W_hh trains (one product at the end), else one step's.
        let mut dr_all = vec![0.0f32; if want_w { t * b * g4 } else { b * g4 }];
        let mut dh = vec![0.0f32; b * h];
        let mut dc = vec![0.0f32; b * h];
        let mut d = vec![0.0f32; h];
        // W_hh as a view of [W_hh | b_hh]: (p, j) at p (H + 1) + j.
        let wv = Rhs::new(wb, h + 1, 1, g4, h);
        for s in (0..t).rev() {
            let at = s * b;
            let dr_step = if want_w {
                &mut dr_all[at * g4..(at + b) * g4]
            } else {
                &mut dr_all[..]
            };
            for row in 0..b {
                let k = at + row;
                let gates = &sv.gates[k * g4..(k + 1) * g4];
                let (chat, tc) = (&sv.chat[k * h..(k + 1) * h], &sv.tc[k * h..(k + 1) * h]);
                let cprev = &sv.cprev[k * h..(k + 1) * h];
                let mask = self.masks.as_ref().map(|m| &m[k * h..(k + 1) * h]);
                let dyr = &dy[(row * t + s) * h..(row * t + s + 1) * h];
                let dhr = &dh[row * h..(row + 1) * h];
                let dcr = &mut dc[row * h..(row + 1) * h];
                let dpre = &mut dxi[(row * t + s) * g4..(row * t + s + 1) * g4];
                // Through h' = o tanh(c') m and into c' (plus the next step's dc).
                for j in 0..h {
                    let dhraw = (dyr[j] + dhr[j]) * mask.map_or(1.0, |m| m[j]);
                    let o = gates[2 * h + j];
                    dpre[2 * h + j] = dhraw * tc[j] * o * (1.0 - o);
                    let dcn = dcr[j] + dhraw * o * (1.0 - tc[j] * tc[j]);
                    dln[2 * g4 + j] += dcn * chat[j];
                    dln[2 * g4 + h + j] += dcn;
                    d[j] = dcn * lnc_w[j];
                }
                ref_ln_row_bwd(&mut d, chat, sv.crstd[k]);
                // d is now d(f c + i g): into the gates and the previous cell.
                for j in 0..h {
                    let (i, f, g) = (gates[j], gates[h + j], gates[3 * h + j]);
                    let dcp = d[j];
                    dpre[j] = dcp * g * i * (1.0 - i);
                    dpre[h + j] = dcp * cprev[j] * f * (1.0 - f);
                    dpre[3 * h + j] = dcp * i * (1.0 - g * g);
                    dcr[j] = dcp * f;
                }
                flush_tiny(dpre);
                flush_tiny(dcr);
                // Into LN_h2h and r = W_hh h + b_hh.
                let rhat = &sv.rhat[k * g4..(k + 1) * g4];
                let drr = &mut dr_step[row * g4..(row + 1) * g4];
                for j in 0..g4 {
                    dln[j] += dpre[j] * rhat[j];
                    dln[g4 + j] += dpre[j];
                    drr[j] = dpre[j] * lnh_w[j];
                }
                ref_ln_row_bwd(drr, rhat, sv.rrstd[k]);
                flush_tiny(drr);
                for (a, &v) in db.iter_mut().zip(drr.iter()) {
                    *a += v;
                }
            }
            // dh for the step before: dr W_hh.
            wv.product(b, h, g4, dr_step, &mut dh, None);
            flush_tiny(&mut dh);
        }
        let dwb = want_w.then(|| {
            // dW_hh = sum over steps and rows of dr^T hprev ([4H, T B] x [T B, H]) into the
            // first H columns of [4H, H + 1]; db_hh into the last.
            let mut dwb = vec![0.0f32; g4 * (h + 1)];
            product(
                g4,
                h,
                t * b,
                MatRef::of(&dr_all, 1, g4),
                MatRef::of(&sv.hprev, h, 1),
                &mut dwb,
                h + 1,
                None,
            );
            for (j, &v) in db.iter().enumerate() {
                dwb[j * (h + 1) + h] = v;
            }
            dwb
        });
        (dxi, dwb, dln)
    }
}

impl super::ThreeOperands for LnLstmOp {
    fn name(&self) -> &'static str {
        "fpt-ln-lstm"
    }

    fn forward_cpu(&self, [(s1, l1), (s2, l2), (s3, l3)]: [(&CpuStorage, &Layout); 3]) -> Result<(CpuStorage, Shape)> {
        super::f32_only(&[s1, s2, s3], "layer-norm LSTM")?;
        let (b, t, h) = self.dims(l1)?;
        let xi = cpu_slice::<f32>(s1, l1, "layer-norm LSTM")?;
        let wb = cpu_slice::<f32>(s2, l2, "layer-norm LSTM")?;
        let ln = cpu_slice::<f32>(s3, l3, "layer-norm LSTM")?;
        let ok = wb.len() == 4 * h * (h + 1)
            && ln.len() == 10 * h
            && self.h0.len() == b * h
            && self.c0.len() == b * h
            && self.masks.as_ref().is_none_or(|m| m.len() == t * b * h);
        if !ok {
            candle_core::bail!("layer-norm LSTM: operands do not fit [{b}, {t}, {}]", 4 * h)
        }
        let (y, saved) = self.forward(xi, wb, ln, b, t, h);
        *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = Some(saved);
        Ok((CpuStorage::F32(y), Shape::from((b, t, h))))
    }

    fn gradients(&self, [xi, wb, ln]: [&Tensor; 3], _res: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 3]> {
        let want = [tracks(xi), tracks(wb), tracks(ln)];
        let (b, t, g4) = xi.dims3()?;
        let guard = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        let sv = guard
            .as_ref()
            .ok_or_else(|| candle_core::Error::Msg("layer-norm LSTM: backward before forward".into()))?;
        let (dxi, dw, dln) = with_cpu_slice::<f32, _>(dy, "layer-norm LSTM", |g| {
            with_cpu_slice::<f32, _>(wb, "layer-norm LSTM", |wv| {
                with_cpu_slice::<f32, _>(ln, "layer-norm LSTM", |sm| {
                    Ok(self.backward(sv, g, wv, sm, (b, t, g4 / 4), want[1]))
                })
            })
        })?;
        let dw = match dw {
            Some(v) => grad_like(v, wb, true)?,
            None => None,
        };
        Ok([grad_like(dxi, xi, want[0])?, dw, grad_like(dln, ln, want[2])?])
    }
}

#[cfg(test)]
mod tests {
    use super::{flush_tiny, TINY};

    /// What [`flush_tiny`] must do to one value: a zero of its sign below [`TINY`], else the
    /// value itself (bit for bit).
    fn expected(x: f32) -> u32 {
        if x.abs() < TINY {
            x.to_bits() & 0x8000_0000
        } else {
            x.to_bits()
        }
    }

    #[test]
    fn flush_tiny_zeroes_exactly_the_values_below_2_pow_minus_100() {
        assert_eq!(TINY, 0.5f32.powi(100));
        let below = f32::from_bits(TINY.to_bits() - 1);
        let above = f32::from_bits(TINY.to_bits() + 1);
        let cases = [
            (0.0f32, 0.0f32),
            (-0.0, -0.0),
            (f32::from_bits(1), 0.0),
            (-f32::from_bits(1), -0.0),
            (f32::MIN_POSITIVE / 2.0, 0.0),
            (f32::MIN_POSITIVE, 0.0),
            (-f32::MIN_POSITIVE, -0.0),
            (below, 0.0),
            (-below, -0.0),
            (TINY, TINY),
            (-TINY, -TINY),
            (above, above),
            (1.0, 1.0),
            (-3.5e30, -3.5e30),
            (f32::INFINITY, f32::INFINITY),
            (f32::NEG_INFINITY, f32::NEG_INFINITY),
        ];
        let mut v: Vec<f32> = cases.iter().map(|c| c.0).collect();
        v.push(f32::NAN);
        flush_tiny(&mut v);
        for ((x, want), got) in cases.iter().zip(&v) {
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "flush_tiny({x:e}) gave {got:e}, not {want:e}"
            );
        }
        assert!(v.last().unwrap().is_nan(), "NaN stays NaN");
        // A long slice of every magnitude (vectorized body and tail), against the rule.
        let mut s = 0x9e37_79b9u32;
        let xs: Vec<f32> = (0..1003)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                // Exponents across the whole range, subnormals and zeros included.
                f32::from_bits(s & !(0xff << 23) | ((s >> 7) % 256).min(254) << 23)
            })
            .collect();
        let mut got = xs.clone();
        flush_tiny(&mut got);
        let (mut zeroed, mut kept) = (0, 0);
        for (x, g) in xs.iter().zip(&got) {
            assert_eq!(g.to_bits(), expected(*x), "flush_tiny({x:e}) gave {g:e}");
            if x.abs() < TINY && *x != 0.0 {
                zeroed += 1;
            } else {
                kept += 1;
            }
        }
        assert!(
            zeroed > 50 && kept > 500,
            "the slice covers both sides: {zeroed} zeroed, {kept} kept"
        );
    }
}

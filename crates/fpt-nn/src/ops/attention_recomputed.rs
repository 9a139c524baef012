//! Attention as one node of the autograd graph on any device: the GPU's path (the CPU's
//! f32 path is the fused op of `attention.rs`).
//!
//! Composed of candle ops, attention leaves `[batch, heads, t, t]` intermediates in the
//! graph (the scores, the probabilities, the dropped probabilities), and candle's backprop
//! starts each of their gradients as zeros and adds into it: at lra's 2 x 1024 tokens that
//! is 36 passes over 25 M values a step, and 36 more over the packed `qkv` for the three
//! `narrow`s' gradients (bench/HISTORY.md, "The GPU step measured"). Here the forward runs
//! the composed ops on detached inputs, so none of that stays in the graph, and the op's
//! backward recomputes the probabilities (the same dropout mask, redrawn from its seed) and
//! returns only the gradients of Q, K and V (or of the packed `qkv`, in one tensor). Its
//! values are the composed ops' to the last bit in the forward, and within rounding in the
//! backward (the same products in the same order; `tests/ops.rs` checks both).
//!
//! Gradients, for P = softmax(S), P' = P * M (M: dropout's 0 or 1/(1-p)), O = P' V:
//! dV = P'^T dO; dP = (dO V^T) * M; dS = softmax's backward of dP; dQ = dS K; dK = dS^T Q.
//!
//! For f32 (every device) the softmax and its dropout are one pass each way
//! ([`super::attention_rows`]): the forward's probabilities in one kernel, the backward's
//! scores' gradient in one more from each row's log-sum-exp and `dO . O`, the output's own
//! row, where the softmax's backward would reduce each row of `dP` first.
//! `FPT_SOFTMAX=composed` keeps the separate softmax, dropout and softmax-backward ops (to
//! time one against the other); other dtypes always take them.

use super::attention::{attention_composed, AttentionSpec};
use super::attention_rows::{scores_grad, softmax_dropout, RowSoftmax};
use super::dropout::DropoutMul;
use super::{tracks, Computed, Three, ThreeOperands};
use candle_core::{CpuStorage, CudaStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, D};

/// Whether `FPT_SOFTMAX` asks for the composed softmax, dropout and softmax backward in the
/// recomputing node: `composed`; unset, empty or `auto` keep the one-pass ops; anything else
/// is refused, naming the variable.
pub fn composed_softmax_requested() -> Result<bool> {
    static CHOICE: std::sync::OnceLock<std::result::Result<bool, String>> = std::sync::OnceLock::new();
    CHOICE
        .get_or_init(|| {
            let v = std::env::var("FPT_SOFTMAX").ok();
            super::parse_switch(
                "FPT_SOFTMAX",
                v.as_deref(),
                "composed",
                "the recomputing attention's softmax, dropout and softmax backward as separate ops",
            )
        })
        .clone()
        .map_err(candle_core::Error::Msg)
}

/// Whether the node takes the one-pass softmax ops for `x` (f32 where fpt's kernels run).
fn one_pass(x: &Tensor) -> Result<bool> {
    Ok(x.dtype() == DType::F32 && super::fused_here(x) && !composed_softmax_requested()?)
}

/// Splits `[b, t, c]` into heads, `[b, heads, t, c / heads]`, contiguous and detached.
fn heads(x: &Tensor, h: usize) -> Result<Tensor> {
    let (b, t, c) = x.dims3()?;
    x.detach().reshape((b, t, h, c / h))?.transpose(1, 2)?.contiguous()
}

/// Merges `[b, heads, t, d]` back to `[b, t, heads * d]`.
fn merge(x: Tensor) -> Result<Tensor> {
    let (b, h, t, d) = x.dims4()?;
    x.transpose(1, 2)?.reshape((b, t, h * d))
}

/// The attention's values: [`attention_composed`]'s to the last bit; for f32 its softmax
/// and dropout in one op ([`softmax_dropout`]).
fn values(q: &Tensor, k: &Tensor, v: &Tensor, spec: AttentionSpec) -> Result<Tensor> {
    if !one_pass(q)? {
        return attention_composed(q, k, v, spec);
    }
    let t = q.dim(1)?;
    let scores = heads(q, spec.heads)?.matmul(&heads(k, spec.heads)?.t()?)?;
    let (probs, _) = softmax_dropout(&scores, RowSoftmax::of(&spec, t), false)?;
    merge(probs.matmul(&heads(v, spec.heads)?)?)
}

/// dQ = dS K and dK = dS^T Q (merged to `[b, t, c]`) where `want` asks for them.
fn qk_grads(ds: &Tensor, qh: &Tensor, kh: &Tensor, want: [bool; 3]) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let dq = want[0].then(|| merge(ds.matmul(kh)?)).transpose()?;
    let dk = want[1].then(|| merge(ds.t()?.matmul(qh)?)).transpose()?;
    Ok((dq, dk))
}

/// [`gradients`] for f32 through the one-pass ops: the probabilities and each row's
/// log-sum-exp in one pass, the scores' gradient in one more, with
/// `D = sum_j P'_j dP_j = dO . O` taken from the output `out` (see the module docs).
#[allow(clippy::too_many_arguments)]
fn gradients_one_pass(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    dout: &Tensor,
    spec: &AttentionSpec,
    want: [bool; 3],
) -> Result<[Option<Tensor>; 3]> {
    let (b, t, c) = q.dims3()?;
    let h = spec.heads;
    let rs = RowSoftmax::of(spec, t);
    let (qh, kh, vh, doh) = (heads(q, h)?, heads(k, h)?, heads(v, h)?, heads(dout, h)?);
    let scores = qh.matmul(&kh.t()?)?;
    let want_qk = want[0] || want[1];
    let (probs, lse) = softmax_dropout(&scores, rs, want_qk)?;
    let dv = want[2].then(|| merge(probs.t()?.matmul(&doh)?)).transpose()?;
    let Some(lse) = lse else {
        return Ok([None, None, dv]);
    };
    drop(probs);
    // D per (example, head, query), in the scores' row order.
    let dd = (dout.detach() * out.detach())?
        .reshape((b, t, h, c / h))?
        .sum(3)?
        .transpose(1, 2)?
        .contiguous()?;
    let dp = doh.matmul(&vh.t()?)?;
    let ds = scores_grad(&scores, &dp, &lse, &dd, rs)?;
    let (dq, dk) = qk_grads(&ds, &qh, &kh, want)?;
    Ok([dq, dk, dv])
}

/// dQ, dK, dV (each `[b, t, c]`, `None` where `want` says no) from the forward's inputs and
/// the output's gradient, the probabilities recomputed; `out` is the forward's output (the
/// one-pass ops take `D` from it).
fn gradients(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    dout: &Tensor,
    spec: &AttentionSpec,
    want: [bool; 3],
) -> Result<[Option<Tensor>; 3]> {
    if one_pass(q)? {
        return gradients_one_pass(q, k, v, out, dout, spec, want);
    }
    let (t, h) = (q.dim(1)?, spec.heads);
    let (qh, kh, vh, doh) = (heads(q, h)?, heads(k, h)?, heads(v, h)?, heads(dout, h)?);
    let probs = super::masked_softmax(&qh.matmul(&kh.t()?)?, spec.scale, spec.mask)?;
    let drop = |x: &Tensor| match spec.dropout {
        // The forward's mask: one block per (example, head) matrix, from the same seed.
        Some((p, seed)) => DropoutMul { p, seed, block: t * t }.apply(x),
        None => Ok(x.clone()),
    };
    let dv = want[2].then(|| merge(drop(&probs)?.t()?.matmul(&doh)?)).transpose()?;
    if !want[0] && !want[1] {
        return Ok([None, None, dv]);
    }
    let dp = drop(&doh.matmul(&vh.t()?)?)?;
    let ds = super::softmax::masked_softmax_backward(&probs, &dp, spec.scale, spec.mask)?;
    let (dq, dk) = qk_grads(&ds, &qh, &kh, want)?;
    Ok([dq, dk, dv])
}

struct Split {
    spec: AttentionSpec,
    out: Computed,
}

impl ThreeOperands for Split {
    fn name(&self) -> &'static str {
        "fpt-attention-recomputed"
    }

    fn forward_cpu(&self, _: [(&CpuStorage, &Layout); 3]) -> Result<(CpuStorage, Shape)> {
        self.out.take(super::computed_cpu)
    }

    fn forward_cuda(&self, _: [(&CudaStorage, &Layout); 3]) -> Result<(CudaStorage, Shape)> {
        self.out.take(super::computed_cuda)
    }

    fn gradients(&self, [q, k, v]: [&Tensor; 3], res: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 3]> {
        gradients(q, k, v, res, dy, &self.spec, [tracks(q), tracks(k), tracks(v)])
    }
}

struct Packed {
    spec: AttentionSpec,
    out: Computed,
}

/// Q, K and V: the three `[b, t, c]` thirds of `qkv`.
fn thirds(qkv: &Tensor) -> Result<[Tensor; 3]> {
    let c = qkv.dim(D::Minus1)? / 3;
    Ok([qkv.narrow(2, 0, c)?, qkv.narrow(2, c, c)?, qkv.narrow(2, 2 * c, c)?])
}

impl CustomOp1 for Packed {
    fn name(&self) -> &'static str {
        "fpt-attention-packed-recomputed"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        self.out.take(super::computed_cpu)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, _: &CudaStorage, _: &Layout) -> Result<(CudaStorage, Shape)> {
        self.out.take(super::computed_cuda)
    }

    fn bwd(&self, qkv: &Tensor, res: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        if !tracks(qkv) {
            return Ok(None);
        }
        Ok(Some(packed_grad(&qkv.detach(), res, dy, &self.spec)?))
    }
}

/// The packed `qkv`'s gradient (`[b, t, 3c]`) from the output `out` and its gradient, the
/// probabilities recomputed.
fn packed_grad(qkv: &Tensor, out: &Tensor, dy: &Tensor, spec: &AttentionSpec) -> Result<Tensor> {
    let [q, k, v] = thirds(qkv)?;
    let [dq, dk, dv] = gradients(&q, &k, &v, out, dy, spec, [true; 3])?;
    let missing = || candle_core::Error::Msg("attention: a wanted gradient was not computed".into());
    Tensor::cat(
        &[
            dq.ok_or_else(missing)?,
            dk.ok_or_else(missing)?,
            dv.ok_or_else(missing)?,
        ],
        2,
    )
}

/// [`attention_packed_recomputed`]'s values on a detached `qkv`, its backward kept beside
/// them (the probabilities recomputed when it runs).
pub(super) fn attention_packed_recomputed_detached(
    qkv: &Tensor,
    spec: AttentionSpec,
) -> Result<(Tensor, super::InputGrad)> {
    let qkv = qkv.detach();
    let [q, k, v] = thirds(&qkv)?;
    let out = values(&q, &k, &v, spec)?;
    let kept = out.clone();
    Ok((out, Box::new(move |dy: &Tensor| packed_grad(&qkv, &kept, dy, &spec))))
}

/// Multi-head self-attention of `q, k, v: [b, t, c]` as one node of the graph, on any device
/// and dtype the composed ops take: the values of [`attention_composed`], with a backward
/// that recomputes the probabilities instead of keeping them (see the module docs).
/// [`super::attention`] takes it on a GPU.
pub fn attention_recomputed(q: &Tensor, k: &Tensor, v: &Tensor, spec: AttentionSpec) -> Result<Tensor> {
    let out = values(&q.detach(), &k.detach(), &v.detach(), spec)?;
    q.apply_op3(
        k,
        v,
        Three(Split {
            spec,
            out: Computed::new("attention", out),
        }),
    )
}

/// [`attention_recomputed`] of Q, K and V packed side by side in `qkv: [b, t, 3c]`: one node,
/// whose gradient is one `[b, t, 3c]` tensor.
pub fn attention_packed_recomputed(qkv: &Tensor, spec: AttentionSpec) -> Result<Tensor> {
    let [q, k, v] = thirds(&qkv.detach())?;
    let out = values(&q, &k, &v, spec)?;
    qkv.apply_op1(Packed {
        spec,
        out: Computed::new("attention", out),
    })
}

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

use super::attention::{attention_composed, AttentionSpec};
use super::dropout::DropoutMul;
use super::{tracks, Computed, Three, ThreeOperands};
use candle_core::{CpuStorage, CudaStorage, CustomOp1, Layout, Result, Shape, Tensor, D};

/// dQ, dK, dV (each `[b, t, c]`, `None` where `want` says no) from the forward's inputs and
/// the output's gradient, the probabilities recomputed.
fn gradients(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    dout: &Tensor,
    spec: &AttentionSpec,
    want: [bool; 3],
) -> Result<[Option<Tensor>; 3]> {
    let (b, t, c) = q.dims3()?;
    let h = spec.heads;
    let split = |x: &Tensor| x.detach().reshape((b, t, h, c / h))?.transpose(1, 2)?.contiguous();
    let merge = |x: Tensor| x.transpose(1, 2)?.reshape((b, t, c));
    let (qh, kh, vh, doh) = (split(q)?, split(k)?, split(v)?, split(dout)?);
    let probs = super::masked_softmax(&qh.matmul(&kh.t()?)?, spec.scale, spec.mask)?;
    let drop = |x: &Tensor| match spec.dropout {
        // The forward's mask: one block per (example, head) matrix, from the same seed.
        Some((p, seed)) => DropoutMul { p, seed, block: t * t }.apply(x),
        None => Ok(x.clone()),
    };
    let dv = match want[2] {
        true => Some(merge(drop(&probs)?.t()?.matmul(&doh)?)?),
        false => None,
    };
    if !want[0] && !want[1] {
        return Ok([None, None, dv]);
    }
    let dp = drop(&doh.matmul(&vh.t()?)?)?;
    let ds = super::softmax::masked_softmax_backward(&probs, &dp, spec.scale, spec.mask)?;
    let dq = match want[0] {
        true => Some(merge(ds.matmul(&kh)?)?),
        false => None,
    };
    let dk = match want[1] {
        true => Some(merge(ds.t()?.matmul(&qh)?)?),
        false => None,
    };
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

    fn gradients(&self, [q, k, v]: [&Tensor; 3], _res: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 3]> {
        gradients(q, k, v, dy, &self.spec, [tracks(q), tracks(k), tracks(v)])
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

    fn bwd(&self, qkv: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        if !tracks(qkv) {
            return Ok(None);
        }
        Ok(Some(packed_grad(&qkv.detach(), dy, &self.spec)?))
    }
}

/// The packed `qkv`'s gradient (`[b, t, 3c]`) from the output's, the probabilities
/// recomputed.
fn packed_grad(qkv: &Tensor, dy: &Tensor, spec: &AttentionSpec) -> Result<Tensor> {
    let [q, k, v] = thirds(qkv)?;
    let [dq, dk, dv] = gradients(&q, &k, &v, dy, spec, [true; 3])?;
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
    let out = attention_composed(&q, &k, &v, spec)?;
    Ok((out, Box::new(move |dy: &Tensor| packed_grad(&qkv, dy, &spec))))
}

/// Multi-head self-attention of `q, k, v: [b, t, c]` as one node of the graph, on any device
/// and dtype the composed ops take: the values of [`attention_composed`], with a backward
/// that recomputes the probabilities instead of keeping them (see the module docs).
/// [`super::attention`] takes it on a GPU.
pub fn attention_recomputed(q: &Tensor, k: &Tensor, v: &Tensor, spec: AttentionSpec) -> Result<Tensor> {
    let out = attention_composed(&q.detach(), &k.detach(), &v.detach(), spec)?;
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
    let out = attention_composed(&q, &k, &v, spec)?;
    qkv.apply_op1(Packed {
        spec,
        out: Computed::new("attention", out),
    })
}

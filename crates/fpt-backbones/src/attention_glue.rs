//! Multi-head attention over projected queries, keys and values, shared by the
//! architectures (fused `fpt_nn` kernels where they apply).

#[allow(unused_imports)]
use super::*;

/// Multi-head attention over projected `q, k, v: [b, t, heads * d]`: scores `q k^T`
/// times `scale`, plus `bias` (`[1 or b, heads, t, t]`) where given, softmax over the keys
/// `mask` leaves visible, probabilities dropped at rate `dropout` where given (and recorded
/// in `ctx.attention` when it is `Some`); returns `[b, t, heads * d]`. Without a bias and
/// without recording, this is the fused op ([`fpt_nn::ops::attention`]); otherwise it is
/// composed of candle ops (T5's relative-position bias, the attention-map figures).
#[allow(clippy::too_many_arguments)] // q, k, v and the attention's settings; a struct would only rename them
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    heads: usize,
    scale: f64,
    mask: fpt_nn::ops::Mask,
    bias: Option<&Tensor>,
    ctx: &mut Ctx,
    dropout: Option<f64>,
) -> candle_core::Result<Tensor> {
    if bias.is_none() && ctx.attention.is_none() {
        let spec = attention_spec(heads, scale, mask, ctx, dropout);
        return fpt_nn::ops::attention(q, k, v, spec);
    }
    let (b, t, width) = q.dims3()?;
    let d = width / heads;
    let split = |x: &Tensor| x.reshape((b, t, heads, d))?.transpose(1, 2)?.contiguous();
    let (q, k, v) = (split(q)?, split(k)?, split(v)?);
    let scores = q.matmul(&k.t()?)?;
    let probs = match bias {
        Some(bias) => fpt_nn::ops::masked_softmax(&(scores * scale)?.broadcast_add(bias)?, 1.0, mask)?,
        None => fpt_nn::ops::masked_softmax(&scores, scale, mask)?,
    };
    if let Some(rec) = ctx.attention.as_mut() {
        rec.push(probs.detach());
    }
    let probs = match dropout {
        Some(p) => ctx.dropout(&probs, p)?,
        None => probs,
    };
    probs.matmul(&v)?.transpose(1, 2)?.reshape((b, t, width))
}

/// The fused op's spec; draws the dropout mask's seed from the run's stream when training.
pub(crate) fn attention_spec(
    heads: usize,
    scale: f64,
    mask: fpt_nn::ops::Mask,
    ctx: &mut Ctx,
    dropout: Option<f64>,
) -> fpt_nn::ops::AttentionSpec {
    let dropout = match dropout {
        Some(p) if ctx.train && p > 0.0 => Some((p, ctx.rng.next_u64())),
        _ => None,
    };
    fpt_nn::ops::AttentionSpec {
        heads,
        scale,
        mask,
        dropout,
    }
}

/// [`attention`] of Q, K and V packed side by side in `qkv: [b, t, 3c]` (GPT-2's `c_attn`
/// output): the fused op reads them in place and returns one gradient for `qkv`. With
/// `last = Some(n)` only the last `n` positions query (`[b, n, c]`; never while recording).
#[allow(clippy::too_many_arguments)] // as attention()
pub(crate) fn attention_packed(
    qkv: &Tensor,
    heads: usize,
    scale: f64,
    mask: fpt_nn::ops::Mask,
    ctx: &mut Ctx,
    dropout: Option<f64>,
    last: Option<usize>,
) -> candle_core::Result<Tensor> {
    if ctx.attention.is_none() {
        let spec = attention_spec(heads, scale, mask, ctx, dropout);
        return match last {
            Some(n) => fpt_nn::ops::attention_packed_last(qkv, spec, n),
            None => fpt_nn::ops::attention_packed(qkv, spec),
        };
    }
    let c = qkv.dim(2)? / 3;
    let part = |k: usize| qkv.narrow(2, k * c, c);
    let o = attention(&part(0)?, &part(1)?, &part(2)?, heads, scale, mask, None, ctx, dropout)?;
    match last {
        Some(n) => {
            let t = o.dim(1)?;
            o.narrow(1, t - n, n)
        }
        None => Ok(o),
    }
}

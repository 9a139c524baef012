//! Which attention runs where: the fused CPU op for f32 on a CPU ([`super::attention`]'s
//! module), on a GPU one node whose backward recomputes the probabilities
//! ([`super::attention_recomputed`]), the composed candle ops otherwise. `FPT_ATTENTION=tiled`
//! runs the attention tiled over keys ([`super::attention_tiled`]) on every device instead
//! (f32): its CUDA kernels on a GPU, their host-grid bodies on the CPU (a reference there,
//! one thread); `FPT_ATTENTION=mma` the same op on the tensor-core kernels (`mma-tf32`: one
//! TF32 term a product). None is the default until a GPU has measured it. The dispatch lives
//! here so that the two implementations depend one way: the recomputed node uses the
//! composed ops; neither knows of the other's dispatch.

use super::attention::{attention_composed, attention_fused, attention_packed_fused, fused_ok, AttentionSpec};
use super::attention_tiled::{attention_tiled_packed_with, TiledKernels};
use candle_core::{Result, Tensor, D};

/// Multi-head self-attention of `q`, `k`, `v` (`[b, t, c]` each), heads merged back to
/// `[b, t, c]`. Fused on CPU for f32; on a GPU one node of the graph whose backward
/// recomputes the probabilities ([`super::attention_recomputed`]); composed of candle ops
/// otherwise ([`attention_composed`]). The same dropout mask everywhere.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, spec: AttentionSpec) -> Result<Tensor> {
    if let (Some(kernels), candle_core::DType::F32) = (tiled_requested()?, q.dtype()) {
        return attention_tiled_packed_with(&Tensor::cat(&[q, k, v], 2)?, spec, None, kernels);
    }
    if !q.device().is_cpu() {
        return super::attention_recomputed(q, k, v, spec);
    }
    if !fused_ok(q) {
        return attention_composed(q, k, v, spec);
    }
    attention_fused(q, k, v, spec)
}

/// [`attention`] on Q, K and V packed side by side in `[b, t, 3c]` (GPT-2's `c_attn`
/// output): the gradient comes back as one `[b, t, 3c]` tensor.
pub fn attention_packed(qkv: &Tensor, spec: AttentionSpec) -> Result<Tensor> {
    if let (Some(kernels), candle_core::DType::F32) = (tiled_requested()?, qkv.dtype()) {
        return attention_tiled_packed_with(qkv, spec, None, kernels);
    }
    if !qkv.device().is_cpu() {
        return super::attention_packed_recomputed(qkv, spec);
    }
    if !fused_ok(qkv) {
        let c = qkv.dim(D::Minus1)? / 3;
        return attention_composed(
            &qkv.narrow(2, 0, c)?,
            &qkv.narrow(2, c, c)?,
            &qkv.narrow(2, 2 * c, c)?,
            spec,
        );
    }
    attention_packed_fused(qkv, spec, None)
}

/// [`attention_packed`]'s values on a detached `qkv`, the same dispatch, with the chosen
/// op's backward kept beside them: what a hand-chained backward ([`super::branch_node`])
/// calls instead of candle's backprop through the op.
pub(crate) fn attention_packed_detached(qkv: &Tensor, spec: AttentionSpec) -> Result<(Tensor, super::InputGrad)> {
    if let (Some(kernels), candle_core::DType::F32) = (tiled_requested()?, qkv.dtype()) {
        return super::attention_tiled::attention_tiled_packed_detached(qkv, spec, kernels);
    }
    if !qkv.device().is_cpu() {
        return super::attention_recomputed::attention_packed_recomputed_detached(qkv, spec);
    }
    if !fused_ok(qkv) {
        let qkv = qkv.detach();
        let composed = move |x: &Tensor| {
            let c = x.dim(D::Minus1)? / 3;
            attention_composed(&x.narrow(2, 0, c)?, &x.narrow(2, c, c)?, &x.narrow(2, 2 * c, c)?, spec)
        };
        let out = composed(&qkv)?;
        return Ok((out, Box::new(move |dy: &Tensor| super::vjp(&qkv, dy, composed))));
    }
    super::attention::attention_packed_fused_detached(qkv, spec)
}

/// [`attention_packed`] for the last `last` query positions only (all positions still act
/// as keys and values): `[b, last, c]`, equal to the last `last` rows of the full result
/// without dropout (with dropout the mask is drawn for the `last x t` scores only). What a
/// causal model's last block needs when only its last positions are read out.
pub fn attention_packed_last(qkv: &Tensor, spec: AttentionSpec, last: usize) -> Result<Tensor> {
    if !fused_ok(qkv) || tiled_requested()?.is_some() {
        let full = attention_packed(qkv, spec)?;
        let t = full.dim(1)?;
        return full.narrow(1, t.saturating_sub(last), last.min(t));
    }
    attention_packed_fused(qkv, spec, Some(last))
}

/// Whether `FPT_ATTENTION` asks for the attention tiled over keys, and on which kernels:
/// `tiled` (the SIMT ones), `mma` (the tensor-core ones) or `mma-tf32` (those with one TF32
/// term a product, for bf16 runs); unset, empty or `auto` keep the
/// dispatch above (None); anything else is refused, naming the variable.
pub fn tiled_requested() -> Result<Option<TiledKernels>> {
    static CHOICE: std::sync::OnceLock<std::result::Result<Option<TiledKernels>, String>> = std::sync::OnceLock::new();
    CHOICE
        .get_or_init(|| parse_attention(std::env::var("FPT_ATTENTION").ok().as_deref()))
        .clone()
        .map_err(candle_core::Error::Msg)
}

/// `FPT_ATTENTION`'s value read.
fn parse_attention(v: Option<&str>) -> std::result::Result<Option<TiledKernels>, String> {
    match v.map(str::trim) {
        Some("mma") => Ok(Some(TiledKernels::Mma)),
        Some("mma-tf32") => Ok(Some(TiledKernels::MmaTf32)),
        v => super::parse_switch("FPT_ATTENTION", v, "tiled", "attention tiled over keys on every device")
            .map(|on| on.then_some(TiledKernels::Simt))
            .map_err(|e| {
                format!(
                    "{e}, or `mma` (the tiled attention on the tensor cores) or `mma-tf32` (there in one TF32 term)"
                )
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_switch;

    #[test]
    fn switches_are_read_and_bad_values_named() {
        let p = |v| parse_switch("FPT_ATTENTION", v, "tiled", "the tiled op");
        assert_eq!(p(None), Ok(false));
        assert_eq!(p(Some("auto")), Ok(false));
        assert_eq!(p(Some(" tiled ")), Ok(true));
        let e = p(Some("flash")).unwrap_err();
        assert!(
            e.contains("FPT_ATTENTION") && e.contains("flash") && e.contains("tiled"),
            "{e}"
        );
        use super::super::attention_tiled::TiledKernels::*;
        let a = super::parse_attention;
        assert_eq!(a(None), Ok(None));
        assert_eq!(a(Some("auto")), Ok(None));
        assert_eq!(a(Some("tiled")), Ok(Some(Simt)));
        assert_eq!(a(Some(" mma ")), Ok(Some(Mma)));
        assert_eq!(a(Some("mma-tf32")), Ok(Some(MmaTf32)));
        let e = a(Some("flash")).unwrap_err();
        assert!(e.contains("flash") && e.contains("tiled") && e.contains("mma"), "{e}");
    }
}

#[cfg(test)]
mod detached_tests {
    use super::super::{attention_packed_recomputed, attention_tiled_packed, Mask};
    use super::*;
    use candle_core::{DType, Device, Var};

    /// Each attention op's detached twin (what `branch_node` chains) against the op through
    /// candle's backprop: the same values and, from the same output gradient, the same
    /// input gradient, to the last bit. The fused CPU op, the recomputed one, the tiled one
    /// and the composed ops (f64), with dropout and a causal mask.
    #[test]
    fn detached_attention_and_its_kept_backward_equal_the_op() -> Result<()> {
        let (b, t, c) = (2, 6, 8);
        let spec = AttentionSpec {
            heads: 2,
            scale: 0.4,
            mask: Mask::Causal,
            dropout: Some((0.25, 9)),
        };
        let mut rng = crate::Rng::new(4);
        let dev = Device::Cpu;
        let qkv = crate::init::normal(&[b, t, 3 * c], 0.0, 1.0, &mut rng, &dev)?;
        let dy = crate::init::normal(&[b, t, c], 0.0, 1.0, &mut rng, &dev)?;
        type Op = fn(&Tensor, AttentionSpec) -> Result<Tensor>;
        type Detached = fn(&Tensor, AttentionSpec) -> Result<(Tensor, crate::ops::InputGrad)>;
        let composed: Op = |x, spec| {
            let c = x.dim(D::Minus1)? / 3;
            attention_composed(&x.narrow(2, 0, c)?, &x.narrow(2, c, c)?, &x.narrow(2, 2 * c, c)?, spec)
        };
        let cases: [(&str, DType, Op, Detached); 5] = [
            ("fused", DType::F32, attention_packed, |x, s| {
                crate::ops::attention::attention_packed_fused_detached(x, s)
            }),
            ("recomputed", DType::F32, attention_packed_recomputed, |x, s| {
                crate::ops::attention_recomputed::attention_packed_recomputed_detached(x, s)
            }),
            (
                "tiled",
                DType::F32,
                |x, s| attention_tiled_packed(x, s, None),
                |x, s| crate::ops::attention_tiled::attention_tiled_packed_detached(x, s, TiledKernels::Simt),
            ),
            (
                "mma",
                DType::F32,
                |x, s| attention_tiled_packed_with(x, s, None, TiledKernels::Mma),
                |x, s| crate::ops::attention_tiled::attention_tiled_packed_detached(x, s, TiledKernels::Mma),
            ),
            ("composed", DType::F64, composed, attention_packed_detached),
        ];
        for (what, dtype, op, detached) in cases {
            let (x, dy) = (qkv.to_dtype(dtype)?, dy.to_dtype(dtype)?);
            let var = Var::from_tensor(&x)?;
            let out = op(var.as_tensor(), spec)?;
            let want = (&out * &dy)?.sum_all()?.backward()?;
            let want = want.get(var.as_tensor()).expect("the op's gradient");
            let (got, grad) = detached(&x, spec)?;
            let bits = |t: &Tensor| t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>();
            assert_eq!(bits(&got)?, bits(&out)?, "{what}: values");
            assert_eq!(bits(&grad(&dy)?)?, bits(want)?, "{what}: gradients");
            // The kept backward runs again (a step's backward may be retried).
            assert_eq!(bits(&grad(&dy)?)?, bits(want)?, "{what}: gradients, twice");
        }
        Ok(())
    }
}

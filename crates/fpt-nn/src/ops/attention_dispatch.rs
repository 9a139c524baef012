//! Which attention runs where: the fused CPU op for f32 on a CPU ([`super::attention`]'s
//! module), on a GPU one node whose backward recomputes the probabilities
//! ([`super::attention_recomputed`]), the composed candle ops otherwise. `FPT_ATTENTION=tiled`
//! runs the attention tiled over keys ([`super::attention_tiled`]) on every device instead
//! (f32): its CUDA kernels on a GPU, their host-grid bodies on the CPU (a reference there,
//! one thread); it is not the default until a GPU has measured it. The dispatch lives
//! here so that the two implementations depend one way: the recomputed node uses the
//! composed ops; neither knows of the other's dispatch.

use super::attention::{attention_composed, attention_fused, attention_packed_fused, fused_ok, AttentionSpec};
use candle_core::{Result, Tensor, D};

/// Multi-head self-attention of `q`, `k`, `v` (`[b, t, c]` each), heads merged back to
/// `[b, t, c]`. Fused on CPU for f32; on a GPU one node of the graph whose backward
/// recomputes the probabilities ([`super::attention_recomputed`]); composed of candle ops
/// otherwise ([`attention_composed`]). The same dropout mask everywhere.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, spec: AttentionSpec) -> Result<Tensor> {
    if tiled_requested()? && q.dtype() == candle_core::DType::F32 {
        return super::attention_tiled(q, k, v, spec, None);
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
    if tiled_requested()? && qkv.dtype() == candle_core::DType::F32 {
        return super::attention_tiled_packed(qkv, spec, None);
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

/// [`attention_packed`] for the last `last` query positions only (all positions still act
/// as keys and values): `[b, last, c]`, equal to the last `last` rows of the full result
/// without dropout (with dropout the mask is drawn for the `last x t` scores only). What a
/// causal model's last block needs when only its last positions are read out.
pub fn attention_packed_last(qkv: &Tensor, spec: AttentionSpec, last: usize) -> Result<Tensor> {
    if !fused_ok(qkv) || tiled_requested()? {
        let full = attention_packed(qkv, spec)?;
        let t = full.dim(1)?;
        return full.narrow(1, t.saturating_sub(last), last.min(t));
    }
    attention_packed_fused(qkv, spec, Some(last))
}

/// Whether `FPT_ATTENTION` asks for the attention tiled over keys: `tiled`; unset, empty or
/// `auto` keep the dispatch above; anything else is refused, naming the variable.
pub fn tiled_requested() -> Result<bool> {
    static CHOICE: std::sync::OnceLock<std::result::Result<bool, String>> = std::sync::OnceLock::new();
    CHOICE
        .get_or_init(|| {
            let v = std::env::var("FPT_ATTENTION").ok();
            super::parse_switch(
                "FPT_ATTENTION",
                v.as_deref(),
                "tiled",
                "attention tiled over keys on every device",
            )
        })
        .clone()
        .map_err(candle_core::Error::Msg)
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
    }
}

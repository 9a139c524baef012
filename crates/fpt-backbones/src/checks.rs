//! Size checks of a config and of the input embeddings, before anything is allocated.

#[allow(unused_imports)]
use super::*;

/// Checks each `(name, value, limit)` of a config: at least 1 and at most the limit
/// ([`fpt_spec::limits`]), so that a size in a `config.json` is an error naming it, never an
/// allocation that aborts.
pub(crate) fn check_sizes(sizes: &[(&str, usize, usize)]) -> std::result::Result<(), String> {
    sizes
        .iter()
        .try_for_each(|&(name, value, max)| fpt_spec::limits::check_positive(name, value, max))
}

/// Checks that a config's width (`width`: (field name, value)) splits evenly into its
/// attention heads (`heads`: (field name, value), positive by `check_sizes`).
pub(crate) fn check_heads(width: (&str, usize), heads: (&str, usize)) -> std::result::Result<(), String> {
    if width.1.is_multiple_of(heads.1) {
        Ok(())
    } else {
        Err(format!(
            "{} {} is not divisible by {} {}",
            width.0, width.1, heads.0, heads.1
        ))
    }
}

/// Checks the encoder fields BERT-family configs (BERT, Longformer, ViT) share:
/// `hidden_size`, `num_hidden_layers`, `num_attention_heads`, `intermediate_size` and
/// `hidden_act` (exact GELU is the one implemented).
pub(crate) fn check_bert_encoder(
    hidden: usize,
    layers: usize,
    heads: usize,
    ffn: usize,
    act: &str,
) -> std::result::Result<(), String> {
    use fpt_spec::limits::*;
    check_sizes(&[
        ("hidden_size", hidden, MAX_HIDDEN),
        ("num_hidden_layers", layers, MAX_LAYERS),
        ("num_attention_heads", heads, MAX_HEADS),
        ("intermediate_size", ffn, MAX_FFN),
    ])?;
    check_heads(("hidden_size", hidden), ("num_attention_heads", heads))?;
    if act == "gelu" {
        Ok(())
    } else {
        Err(format!("hidden_act `{act}` is not supported (gelu only)"))
    }
}

/// Checks input embeddings `[batch, tokens, width]` against a backbone's width and
/// position table; returns the number of tokens.
pub(crate) fn check_embeds(b: &dyn Backbone, embeds: &Tensor) -> candle_core::Result<usize> {
    let (_, t, width) = embeds.dims3()?;
    if width != b.hidden_size() {
        candle_core::bail!(
            "{}: input width {width} does not match the hidden size {}",
            b.architecture(),
            b.hidden_size()
        )
    }
    if t > b.max_positions() {
        candle_core::bail!(
            "{}: {t} tokens exceed the {} learned positions",
            b.architecture(),
            b.max_positions()
        )
    }
    Ok(t)
}

//! Transformer backbones for fpt, loaded from Hugging Face checkpoints and fed input
//! embeddings (no token lookup), as the FPT recipe needs (paper §2.2).
//!
//! - [`gpt2`]: GPT-2 (all sizes), from `config.json` + `model.safetensors` with the Hub's
//!   tensor names, or randomly initialised at any shape.
//! - [`bert`]: BERT and BERT-family checkpoints (`bert-base-uncased`,
//!   `sentence-transformers/all-MiniLM-L6-v2`), and Longformer (`allenai/longformer-base-4096`,
//!   sliding-window attention).
//! - [`t5`]: the T5 encoder (`t5-base`), relative-position bias as the positions group.
//! - [`vit`]: ViT (`google/vit-base-patch16-224-in21k`) with fpt's own 1024-position table.
//! - [`hub`]: resolves a model id or a local directory to files, using the standard Hugging
//!   Face cache (so a cache filled by Python tools is reused).
//!
//! Every backbone reports its parameters with their [`Role`]; which roles train is
//! decided at construction ([`TrainGroups`]), and frozen tensors are plain tensors, never
//! `Var`s.

pub mod bert;
pub mod golden;
pub mod gpt2;
pub mod hub;
pub mod lstm;
pub mod t5;
pub mod vit;

use candle_core::{DType, Device, Tensor};
use fpt_nn::{Ctx, Param, Rng};
use fpt_spec::{BackboneSpec, Init, Role, ShapeOverrides, TrainGroups};
use std::path::{Path, PathBuf};

/// Errors from loading or running a backbone. Every variant names the file or tensor.
#[derive(Debug, thiserror::Error)]
pub enum BackboneError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `config.json` is not a valid config for this architecture.
    #[error("{path}: {msg}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// The weights file is not a readable safetensors file.
    #[error("{path}: not a valid safetensors file: {msg}")]
    Safetensors {
        /// The weights file.
        path: PathBuf,
        /// The parser's message.
        msg: String,
    },
    /// A tensor the architecture needs is not in the checkpoint.
    #[error("{path}: missing tensor `{tensor}`")]
    MissingTensor {
        /// The weights file.
        path: PathBuf,
        /// The tensor name (as it would appear without a prefix).
        tensor: String,
    },
    /// A tensor has the wrong shape.
    #[error("{path}: tensor `{tensor}` has shape {found:?}, expected {expected:?}")]
    Shape {
        /// The weights file.
        path: PathBuf,
        /// The tensor name.
        tensor: String,
        /// Shape the config implies.
        expected: Vec<usize>,
        /// Shape in the file.
        found: Vec<usize>,
    },
    /// A model is not in the local cache and the Hub cannot be used.
    #[error("model `{model}` is not in the Hugging Face cache ({cache}) and {why}; fetch it first: {hint}")]
    NotCached {
        /// The model id.
        model: String,
        /// The cache directory searched.
        cache: String,
        /// Why the Hub was not asked (offline) or what it answered.
        why: String,
        /// The command that puts it in the cache.
        hint: String,
    },
    /// A setting this backbone does not support.
    #[error("{0}")]
    Unsupported(String),
    /// An error inside candle.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, BackboneError>;

/// A parameter tensor's name, shape and role, known from the config alone (no weights
/// needed), so parameter counts can be reported for any size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    /// Checkpoint name without prefix, e.g. `h.0.attn.c_attn.weight`.
    pub name: String,
    /// Shape in our (PyTorch `nn.Linear`) layout.
    pub shape: Vec<usize>,
    /// Its role in the FPT recipe.
    pub role: Role,
    /// Whether the forward pass uses it (GPT-2's token table `wte` is not used with input
    /// embeddings; it is counted but never loaded).
    pub used: bool,
}

impl ParamSpec {
    /// Number of scalars.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether this tensor trains under `groups` in a backbone whose last block is
    /// `last_block` ([`last_block`] of its specs); unused tensors never train.
    pub fn trains(&self, groups: &TrainGroups, last_block: Option<usize>) -> bool {
        self.used && groups.trains_tensor(self.role, layer_index(&self.name), last_block)
    }
}

/// The highest block index among `names` (see [`layer_index`]): the block
/// `TrainGroups::last_attention` trains.
pub fn last_block<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<usize> {
    names.into_iter().filter_map(layer_index).max()
}

/// Maps a parameter name to its role by the first matching substring of `rules` (checked
/// on the lower-cased name), `Role::Other` if none matches. This is the reference code's
/// freezing rule, kept as data per architecture.
pub fn role_by_rules(name: &str, rules: &[(&str, Role)]) -> Role {
    let lower = name.to_lowercase();
    rules
        .iter()
        .find(|(pat, _)| lower.contains(pat))
        .map(|(_, r)| *r)
        .unwrap_or(Role::Other)
}

/// A transformer that maps input embeddings `[batch, tokens, hidden]` to hidden states of
/// the same shape.
pub trait Backbone: Send + Sync {
    /// Architecture name, e.g. `gpt2`.
    fn architecture(&self) -> &'static str;
    /// Width of the hidden states.
    fn hidden_size(&self) -> usize;
    /// Longest input the position table covers.
    fn max_positions(&self) -> usize;
    /// Number of transformer blocks.
    fn num_layers(&self) -> usize;
    /// Whether attention is causal (GPT-2) or bidirectional (BERT).
    fn is_causal(&self) -> bool;
    /// Runs the blocks; `embeds: [batch, tokens, hidden]`.
    fn forward(&self, embeds: &Tensor, ctx: &mut Ctx) -> candle_core::Result<Tensor>;
    /// The last `last` positions of [`Backbone::forward`], `[batch, last, hidden]`. A
    /// causal backbone computes its last block's attention output, feed-forward and final
    /// norm for those positions only (the others still serve as keys and values), which is
    /// exact and saves most of a block when one token is read out; the default runs the
    /// whole forward and narrows.
    fn forward_last(&self, embeds: &Tensor, ctx: &mut Ctx, last: usize) -> candle_core::Result<Tensor> {
        let h = self.forward(embeds, ctx)?;
        let t = h.dim(1)?;
        h.narrow(1, t.saturating_sub(last), last.min(t))
    }
    /// Every materialised parameter with its checkpoint name and role.
    fn params(&self) -> Vec<(String, Role, &Param)>;
    /// Every parameter of the architecture (materialised or not) from the config.
    fn param_specs(&self) -> Vec<ParamSpec>;
    /// Turns the backbone's own dropouts on or off during training (evaluation never
    /// drops). The reference code keeps them on.
    fn set_dropout(&mut self, on: bool);
    /// Where the weights came from: a checkpoint path, or a description of the random init.
    fn origin(&self) -> &str;
    /// Keeps only the first `layers` blocks (the final norm, where the architecture has one,
    /// stays); their parameters leave [`Backbone::params`] and the counts.
    fn truncate(&mut self, layers: usize) -> Result<()>;
    /// Removes the final norm (GPT-2's `ln_f`, T5's final RMS norm, ViT's `layernorm`), so
    /// the output is the last block's residual stream (Tables 11-12 "without final norm").
    fn drop_final_norm(&mut self) -> Result<()> {
        Err(BackboneError::Unsupported(format!(
            "{} has no final norm to drop",
            self.architecture()
        )))
    }
    /// The architecture's config as the model now stands (after any depth cut).
    fn config(&self) -> Config;
}

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

/// Drops the named parameters whose names contain `part`.
pub(crate) fn drop_named(named: &mut Vec<(String, Role, Param)>, part: &str) {
    named.retain(|(n, _, _)| !n.contains(part));
}

/// The `Backbone` methods every architecture implements the same way, for a struct with a
/// `config` field and a `common: Common` one: `backbone_common!(blocks, depth, width)`
/// names the field holding the blocks and the config fields holding their count and the
/// hidden width.
macro_rules! backbone_common {
    ($blocks:ident, $depth:ident, $width:ident) => {
        fn hidden_size(&self) -> usize {
            self.config.$width
        }

        fn num_layers(&self) -> usize {
            self.config.$depth
        }

        fn params(&self) -> Vec<(String, Role, &Param)> {
            self.common
                .named
                .iter()
                .map(|(n, r, p)| (n.clone(), *r, p))
                .collect()
        }

        fn param_specs(&self) -> Vec<ParamSpec> {
            // The config's tensors, less any the model has dropped (a final norm).
            let have: std::collections::HashSet<&str> = self.common.named.iter().map(|(n, _, _)| n.as_str()).collect();
            self.config
                .param_specs()
                .into_iter()
                .filter(|s| !s.used || have.contains(s.name.as_str()))
                .collect()
        }

        fn set_dropout(&mut self, on: bool) {
            self.common.dropout = on;
        }

        fn origin(&self) -> &str {
            &self.common.origin
        }

        fn truncate(&mut self, layers: usize) -> Result<()> {
            crate::check_truncate(layers, self.config.$depth)?;
            self.$blocks.truncate(layers);
            self.config.$depth = layers;
            crate::keep_layers(&mut self.common.named, layers);
            Ok(())
        }
    };
}
pub(crate) use backbone_common;

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
fn attention_spec(
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

/// The block index in a parameter name (`h.3.`, `encoder.layer.3.`, `encoder.block.3.`).
pub fn layer_index(name: &str) -> Option<usize> {
    let parts: Vec<&str> = name.split('.').collect();
    parts.windows(2).find_map(|w| match w[0] {
        "h" | "layer" | "layers" | "block" | "blocks" => w[1].parse().ok(),
        _ => None,
    })
}

/// Checks a truncation request against a backbone's depth.
pub(crate) fn check_truncate(layers: usize, have: usize) -> Result<()> {
    if layers == 0 || layers > have {
        return Err(BackboneError::Unsupported(format!(
            "cannot keep {layers} of {have} layers (choose 1..={have})"
        )));
    }
    Ok(())
}

/// Drops the named parameters of blocks `layers..`.
pub(crate) fn keep_layers(named: &mut Vec<(String, Role, Param)>, layers: usize) {
    named.retain(|(n, _, _)| layer_index(n).is_none_or(|i| i < layers));
}

/// A backbone's config, by architecture.
#[derive(Debug, Clone, PartialEq)]
pub enum Config {
    /// GPT-2.
    Gpt2(gpt2::Gpt2Config),
    /// BERT family.
    Bert(bert::BertConfig),
    /// T5 encoder.
    T5(t5::T5Config),
    /// ViT.
    Vit(vit::VitConfig),
    /// The layer-norm LSTM baseline.
    Lstm(lstm::LstmConfig),
}

impl Config {
    /// The built-in config of a known model name (`gpt2`..`gpt2-xl`, `bert-base-uncased`,
    /// `sentence-transformers/all-MiniLM-L6-v2`).
    pub fn builtin(name: &str) -> Option<Self> {
        gpt2::Gpt2Config::builtin(name)
            .map(Config::Gpt2)
            .or_else(|| bert::BertConfig::builtin(name).map(Config::Bert))
            .or_else(|| t5::T5Config::builtin(name).map(Config::T5))
            .or_else(|| vit::VitConfig::builtin(name).map(Config::Vit))
            .or_else(|| lstm::LstmConfig::builtin(name).map(Config::Lstm))
    }

    /// Reads a `config.json`, picking the architecture from its `model_type`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| BackboneError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text, path)
    }

    /// Parses a `config.json` text (`path` names it in errors).
    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        let text = text.to_string();
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| BackboneError::Config {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        match v.get("model_type").and_then(|t| t.as_str()) {
            Some("gpt2") => Ok(Config::Gpt2(gpt2::Gpt2Config::from_json(&text, path)?)),
            Some("bert") => Ok(Config::Bert(bert::BertConfig::from_json(&text, path)?)),
            Some("longformer") => Ok(Config::Bert(bert::BertConfig::from_longformer_json(&text, path)?)),
            Some("t5") => Ok(Config::T5(t5::T5Config::from_json(&text, path)?)),
            Some("vit") => Ok(Config::Vit(vit::VitConfig::from_json(&text, path)?)),
            Some("fpt-lstm") => Ok(Config::Lstm(lstm::LstmConfig::from_json(&text, path)?)),
            Some(other) => Err(BackboneError::Config {
                path: path.to_path_buf(),
                msg: format!("model_type `{other}` is not supported (supported: gpt2, bert, longformer, t5, vit, fpt-lstm)"),
            }),
            // timm checkpoints name their architecture instead.
            None if v.get("architecture").and_then(|a| a.as_str()).is_some_and(|a| a.starts_with("vit_")) => {
                Ok(Config::Vit(vit::VitConfig::from_timm_json(&v, path)?))
            }
            None => Err(BackboneError::Config {
                path: path.to_path_buf(),
                msg: "missing field `model_type` (expected gpt2, bert, longformer, t5 or vit; or a timm `architecture` vit_*)".into(),
            }),
        }
    }

    /// Applies shape overrides (random init).
    pub fn with_overrides(self, o: &ShapeOverrides) -> Result<Self> {
        Ok(match self {
            Config::Gpt2(c) => Config::Gpt2(c.with_overrides(o)?),
            Config::Bert(c) => Config::Bert(c.with_overrides(o)?),
            Config::T5(c) => Config::T5(c.with_overrides(o)?),
            Config::Vit(c) => Config::Vit(c.with_overrides(o)?),
            Config::Lstm(c) => Config::Lstm(c.with_overrides(o)?),
        })
    }

    /// `gpt2` or `bert`.
    pub fn architecture(&self) -> &'static str {
        match self {
            Config::Gpt2(_) => "gpt2",
            Config::Bert(c) if c.longformer.is_some() => "longformer",
            Config::Bert(_) => "bert",
            Config::T5(_) => "t5",
            Config::Vit(_) => "vit",
            Config::Lstm(_) => "lstm",
        }
    }

    /// Number of transformer blocks.
    pub fn layers(&self) -> usize {
        match self {
            Config::Gpt2(c) => c.n_layer,
            Config::Bert(c) => c.num_hidden_layers,
            Config::T5(c) => c.num_layers,
            Config::Vit(c) => c.num_hidden_layers,
            Config::Lstm(c) => c.num_layers,
        }
    }

    /// Attention heads per block (0 for an LSTM).
    pub fn heads(&self) -> usize {
        match self {
            Config::Gpt2(c) => c.n_head,
            Config::Bert(c) => c.num_attention_heads,
            Config::T5(c) => c.num_heads,
            Config::Vit(c) => c.num_attention_heads,
            Config::Lstm(_) => 0,
        }
    }

    /// Hidden width.
    pub fn hidden_size(&self) -> usize {
        match self {
            Config::Gpt2(c) => c.n_embd,
            Config::Bert(c) => c.hidden_size,
            Config::T5(c) => c.d_model,
            Config::Vit(c) => c.hidden_size,
            Config::Lstm(c) => c.hidden_size,
        }
    }

    /// Every parameter from the config.
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        match self {
            Config::Gpt2(c) => c.param_specs(),
            Config::Bert(c) => c.param_specs(),
            Config::T5(c) => c.param_specs(),
            Config::Vit(c) => c.param_specs(),
            Config::Lstm(c) => c.param_specs(),
        }
    }

    /// One line: layers, width, heads, MLP width, positions, causal or not.
    pub fn summary(&self) -> String {
        match self {
            Config::Gpt2(c) => format!(
                "gpt2: {} layers, hidden {}, {} heads, mlp {}, {} positions, causal, eps {:e}",
                c.n_layer,
                c.n_embd,
                c.n_head,
                c.inner(),
                c.n_positions,
                c.layer_norm_epsilon
            ),
            Config::Bert(c) if c.longformer.is_some() => {
                let l = c.longformer.expect("checked");
                format!(
                    "longformer: {} layers, hidden {}, {} heads, mlp {}, {} positions, sliding window of {} keys each side, eps {:e}",
                    c.num_hidden_layers,
                    c.hidden_size,
                    c.num_attention_heads,
                    c.intermediate_size,
                    c.max_position_embeddings - l.position_offset,
                    l.one_sided_window,
                    c.layer_norm_eps
                )
            }
            Config::Bert(c) => format!(
                "bert: {} layers, hidden {}, {} heads, mlp {}, {} positions, bidirectional, eps {:e}",
                c.num_hidden_layers,
                c.hidden_size,
                c.num_attention_heads,
                c.intermediate_size,
                c.max_position_embeddings,
                c.layer_norm_eps
            ),
            Config::T5(c) => format!(
                "t5 encoder: {} layers, d_model {}, {} heads x d_kv {}, mlp {} relu, {} relative-position buckets (max distance {}), bidirectional, RMS norm eps {:e}",
                c.num_layers,
                c.d_model,
                c.num_heads,
                c.d_kv,
                c.d_ff,
                c.relative_attention_num_buckets,
                c.relative_attention_max_distance,
                c.layer_norm_epsilon
            ),
            Config::Vit(c) => format!(
                "vit: {} layers, hidden {}, {} heads, mlp {}, fpt's {} zero-init positions (patch embedding, class token, head bypassed), bidirectional, eps {:e}",
                c.num_hidden_layers,
                c.hidden_size,
                c.num_attention_heads,
                c.intermediate_size,
                vit::FPT_POSITIONS,
                c.layer_norm_eps
            ),
            Config::Lstm(c) => format!(
                "layer-norm lstm: {} layers, hidden {}, {}, {}, {:?} LayerNorm init, {:?} initial state, dropout {}",
                c.num_layers,
                c.hidden_size,
                if c.residual { "residual" } else { "no residual" },
                if c.positions {
                    format!("{} learned positions", c.max_positions)
                } else {
                    "no positions".to_string()
                },
                c.ln_init,
                c.initial_state,
                c.dropout
            ),
        }
    }

    /// The config as JSON (for reports).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Config::Gpt2(c) => serde_json::to_value(c),
            Config::Bert(c) => serde_json::to_value(c),
            Config::T5(c) => serde_json::to_value(c),
            Config::Vit(c) => serde_json::to_value(c),
            Config::Lstm(c) => serde_json::to_value(c),
        }
        .expect("config serialises")
    }
}

/// Parses a `config.json` text into `T` and checks it; errors name `path`.
pub(crate) fn parse_config<T: serde::de::DeserializeOwned>(
    text: &str,
    path: &Path,
    validate: impl Fn(&T) -> std::result::Result<(), String>,
) -> Result<T> {
    let err = |msg: String| BackboneError::Config {
        path: path.to_path_buf(),
        msg,
    };
    let cfg: T = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
    validate(&cfg).map_err(err)?;
    Ok(cfg)
}

/// What every backbone carries beside its layers: each parameter with its name and role,
/// where the weights came from, and whether its dropouts are on.
pub(crate) struct Common {
    /// Every parameter, in the order taken, with its name and role.
    pub named: Vec<(String, Role, Param)>,
    /// Where the weights came from (a file, a random init).
    pub origin: String,
    /// Dropouts on (the reference keeps them on during training).
    pub dropout: bool,
}

/// Turns named tensors into [`Param`]s (trainable or frozen by role) and records them.
pub(crate) struct ParamTaker<'a> {
    tensors: std::collections::HashMap<String, Tensor>,
    groups: &'a TrainGroups,
    rules: &'static [(&'static str, Role)],
    /// The last block's index (for `TrainGroups::last_attention`).
    last_block: Option<usize>,
    /// Every parameter taken, in order, with its name and role.
    pub named: Vec<(String, Role, Param)>,
}

impl<'a> ParamTaker<'a> {
    pub(crate) fn new(
        tensors: std::collections::HashMap<String, Tensor>,
        groups: &'a TrainGroups,
        rules: &'static [(&'static str, Role)],
    ) -> Self {
        let last_block = last_block(tensors.keys().map(String::as_str));
        Self {
            tensors,
            groups,
            rules,
            last_block,
            named: Vec::new(),
        }
    }

    /// The parameter `name` (the caller has checked that it exists).
    pub(crate) fn take(&mut self, name: String) -> candle_core::Result<Param> {
        let t = self.tensors.remove(&name).expect("tensor checked by the caller");
        let role = role_by_rules(&name, self.rules);
        let trains = self.groups.trains_tensor(role, layer_index(&name), self.last_block);
        let p = Param::new(t, trains)?;
        self.named.push((name, role, p.clone()));
        Ok(p)
    }

    /// The parameters taken, as a backbone's [`Common`] part (dropouts on).
    pub(crate) fn finish(self, origin: String) -> Common {
        Common {
            named: self.named,
            origin,
            dropout: true,
        }
    }

    /// `{prefix}.weight` and `{prefix}.bias` as a LayerNorm.
    pub(crate) fn layer_norm(&mut self, prefix: &str, eps: f64) -> candle_core::Result<fpt_nn::LayerNorm> {
        Ok(fpt_nn::LayerNorm {
            weight: self.take(format!("{prefix}.weight"))?,
            bias: self.take(format!("{prefix}.bias"))?,
            eps,
        })
    }

    /// `{prefix}.weight` and `{prefix}.bias` as a Linear.
    pub(crate) fn linear(&mut self, prefix: &str) -> candle_core::Result<fpt_nn::Linear> {
        Ok(fpt_nn::Linear::new(
            self.take(format!("{prefix}.weight"))?,
            Some(self.take(format!("{prefix}.bias"))?),
        ))
    }
}

/// The usual transformer init for every used parameter: LayerNorm weights 1 and biases 0,
/// other biases 0, every other tensor N(0, std(name)).
pub(crate) fn random_tensors(
    specs: &[ParamSpec],
    std: &dyn Fn(&str) -> f64,
    device: &Device,
    rng: &mut Rng,
) -> Result<std::collections::HashMap<String, Tensor>> {
    let mut out = std::collections::HashMap::new();
    for spec in specs.iter().filter(|s| s.used) {
        let (n, shape) = (&spec.name, spec.shape.as_slice());
        let t = if spec.role == Role::LayerNorm && n.ends_with(".weight") {
            Tensor::ones(shape, DType::F32, device)?
        } else if n.ends_with(".bias") {
            Tensor::zeros(shape, DType::F32, device)?
        } else {
            fpt_nn::init::normal(shape, 0.0, std(n), rng, device)?
        };
        out.insert(n.clone(), t);
    }
    Ok(out)
}

/// How an architecture's checkpoints name its tensors, for [`read_checked`].
pub(crate) struct Naming {
    /// Prefixes a wrapping model puts before the backbone's names (`transformer.`,
    /// `bert.`); the first one the file uses is stripped.
    pub prefixes: &'static [&'static str],
    /// A second name to try for a tensor (old checkpoints' spellings).
    pub alias: fn(&str) -> String,
    /// Whether a tensor is stored `[in, out]` (GPT-2's Conv1D) and is transposed on reading.
    pub transposed: fn(&str) -> bool,
    /// Names that may stand in a checkpoint and that fpt never reads (heads, buffers):
    /// ignored with a debug log; other unknown names get a warning.
    pub quiet: &'static [&'static str],
}

impl Naming {
    /// A checkpoint under fpt's own names, nothing transposed, no alias.
    pub const PLAIN: Naming = Naming {
        prefixes: &[],
        alias: str::to_string,
        transposed: |_| false,
        quiet: &[],
    };
}

/// Reads the tensors `specs` name from a safetensors file, checking each one's presence
/// and shape, the names read as `naming` says. Tensors not `used` are shape-checked when
/// present but not loaded, and may be absent; a missing used tensor is an error naming it.
pub(crate) fn read_checked(
    weights: &Path,
    specs: &[ParamSpec],
    naming: &Naming,
    device: &Device,
) -> Result<std::collections::HashMap<String, Tensor>> {
    let Naming {
        prefixes,
        alias,
        transposed,
        quiet,
    } = naming;
    let st_err = |msg: String| BackboneError::Safetensors {
        path: weights.to_path_buf(),
        msg,
    };
    let shards = shard_files(weights)?;
    // SAFETY: the files are mapped read-only; fpt never writes checkpoints in place
    // (writes go to a temporary file that is renamed), so they do not change under us.
    let st = match &shards {
        Some(files) => unsafe { candle_core::safetensors::MmapedSafetensors::multi(files) },
        None => unsafe { candle_core::safetensors::MmapedSafetensors::new(weights) },
    }
    .map_err(|e| st_err(e.to_string()))?;
    let names: std::collections::HashSet<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
    let prefix = prefixes
        .iter()
        .copied()
        .find(|p| names.iter().any(|n| n.starts_with(p)))
        .unwrap_or("");
    let mut used_names = std::collections::HashSet::new();
    let mut out = std::collections::HashMap::new();
    for spec in specs {
        let found = [
            format!("{prefix}{}", spec.name),
            format!("{prefix}{}", alias(&spec.name)),
        ]
        .into_iter()
        .find(|n| names.contains(n));
        let full = match found {
            Some(n) => n,
            // FPT never reads it (a pooler, a token table): a checkpoint may leave it out,
            // as `BertModel(add_pooling_layer=False)` does.
            None if !spec.used => {
                tracing::debug!(file = %weights.display(), "`{prefix}{}` is absent; fpt does not use it", spec.name);
                continue;
            }
            None => {
                return Err(BackboneError::MissingTensor {
                    path: weights.to_path_buf(),
                    tensor: format!("{prefix}{}", spec.name),
                })
            }
        };
        used_names.insert(full.clone());
        let view = st.get(&full).map_err(|e| st_err(e.to_string()))?;
        let t = transposed(&spec.name);
        let mut expected = spec.shape.clone();
        if t {
            expected.reverse();
        }
        if view.shape() != expected.as_slice() {
            return Err(BackboneError::Shape {
                path: weights.to_path_buf(),
                tensor: full,
                expected,
                found: view.shape().to_vec(),
            });
        }
        if !matches!(
            view.dtype(),
            safetensors::Dtype::F32 | safetensors::Dtype::F16 | safetensors::Dtype::BF16 | safetensors::Dtype::F64
        ) {
            return Err(st_err(format!(
                "tensor `{full}` is {:?}; a weight must be floating point (f32, f16, bf16 or f64)",
                view.dtype()
            )));
        }
        if !spec.used {
            continue;
        }
        let x = st
            .load(&full, device)
            .map_err(|e| st_err(format!("tensor `{full}`: {e}")))?
            .to_dtype(DType::F32)?;
        if let Some(i) = first_non_finite(&x)? {
            return Err(st_err(format!(
                "tensor `{full}` holds a non-finite value (NaN or infinity) at flat index {i}"
            )));
        }
        let x = if t { x.t()?.contiguous()? } else { x };
        out.insert(spec.name.clone(), x);
    }
    let (known, unknown): (Vec<&String>, Vec<&String>) = names
        .iter()
        .filter(|n| !used_names.contains(*n))
        .partition(|n| quiet.iter().any(|q| n.contains(q)));
    if let Some(first) = known.first() {
        tracing::debug!(file = %weights.display(), "ignoring {} tensors FPT does not use (heads, buffers), e.g. `{first}`", known.len());
    }
    if let Some(first) = unknown.first() {
        tracing::warn!(file = %weights.display(), "ignoring {} tensors this architecture does not use, e.g. `{first}`", unknown.len());
    }
    Ok(out)
}

/// The flat index of the first NaN or infinity in an f32 tensor, if any (read in place on
/// the CPU).
pub(crate) fn first_non_finite(t: &Tensor) -> candle_core::Result<Option<usize>> {
    let t = t.to_device(&Device::Cpu)?.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(cs) = &*storage else {
        candle_core::bail!("first_non_finite: expected a CPU tensor")
    };
    let data = cs.as_slice::<f32>()?;
    let (a, b) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("first_non_finite: not contiguous".into()))?;
    Ok(data[a..b].iter().position(|v| !v.is_finite()))
}

/// For a sharded checkpoint (`model.safetensors.index.json`), its shard files (each checked
/// to exist); `None` for a single file.
pub fn shard_files(weights: &Path) -> Result<Option<Vec<PathBuf>>> {
    if !weights.to_string_lossy().ends_with(".index.json") {
        return Ok(None);
    }
    let bad = |msg: String| BackboneError::Config {
        path: weights.to_path_buf(),
        msg,
    };
    let text = std::fs::read_to_string(weights).map_err(|source| BackboneError::Io {
        path: weights.to_path_buf(),
        source,
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("missing field `weight_map`".into()))?;
    let dir = weights.parent().unwrap_or(Path::new("."));
    let mut files: Vec<PathBuf> = Vec::new();
    for (tensor, file) in map {
        let f = file
            .as_str()
            .ok_or_else(|| bad(format!("weight_map entry `{tensor}` is not a file name")))?;
        let p = dir.join(f);
        if !files.contains(&p) {
            if !p.is_file() {
                return Err(BackboneError::Io {
                    path: p,
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("shard listed in {} is missing", weights.display()),
                    ),
                });
            }
            files.push(p);
        }
    }
    Ok(Some(files))
}

/// The statistics-only init (paper Table 9): every tensor replaced by draws from a Gaussian
/// with its own mean and standard deviation. Tensors are visited in name order, so `rng`
/// fixes the result.
pub fn stats_only(
    tensors: std::collections::HashMap<String, Tensor>,
    rng: &mut Rng,
) -> Result<std::collections::HashMap<String, Tensor>> {
    let mut names: Vec<String> = tensors.keys().cloned().collect();
    names.sort();
    let mut out = std::collections::HashMap::new();
    for n in names {
        let t = &tensors[&n];
        let v: Vec<f32> = t.flatten_all()?.to_vec1()?;
        let len = v.len().max(1) as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / len;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / len;
        let drawn = rng.normal_vec(v.len(), mean, var.sqrt());
        out.insert(n, Tensor::from_vec(drawn, t.dims(), t.device())?);
    }
    Ok(out)
}

/// Builds the backbone a spec names: a known model name (`gpt2`..`gpt2-xl`,
/// `bert-base-uncased`, `sentence-transformers/all-MiniLM-L6-v2`, `t5-base`,
/// `google/vit-base-patch16-224-in21k`), a local directory, or a
/// Hugging Face model id. Random init needs only a config (known names have theirs built
/// in); pretrained needs weights. The spec's depth cut (`depth`, `final_norm`) is applied.
///
/// A `bit-pretrained` spec is refused: its weights come from a Bit Memory training run that
/// `fpt_train::pretrain::resolve_backbone` makes (and caches) first, turning the spec into a
/// `pretrained` one; loading it here would silently give a random backbone.
pub fn load(spec: &BackboneSpec, groups: &TrainGroups, device: &Device, rng: &mut Rng) -> Result<Box<dyn Backbone>> {
    if spec.init == Init::BitPretrained {
        return Err(BackboneError::Unsupported(format!(
            "backbone `{}` with init bit-pretrained: its weights are trained first; resolve the spec with \
             fpt_train::pretrain::resolve_backbone (fpt_train::train does) and load the `pretrained` spec it returns",
            spec.source
        )));
    }
    let mut backbone = build(spec, groups, device, rng)?;
    if let Some(k) = spec.depth {
        backbone.truncate(k)?;
        if !spec.final_norm {
            backbone.drop_final_norm()?;
        }
    }
    Ok(backbone)
}

/// What each architecture provides to be built from a checkpoint: how its checkpoints name
/// the tensors, which roles they have, and a model assembled from them (pretrained,
/// statistics-only or random alike).
pub(crate) trait Arch: Backbone + Sized + 'static {
    /// The architecture's config.
    type Config;
    /// How its checkpoints name the tensors.
    const NAMING: Naming;
    /// Each tensor's role, by the first rule whose pattern its name contains.
    const ROLE_RULES: &'static [(&'static str, Role)];
    /// Every tensor the config implies.
    fn specs(config: &Self::Config) -> Vec<ParamSpec>;
    /// The model from the tensors `t` hands out (every name the config implies); `origin`
    /// says where the weights came from.
    fn assemble(config: &Self::Config, t: ParamTaker, origin: String) -> candle_core::Result<Self>;
    /// The checkpoint's tensors under fpt's names, every one checked.
    fn read(
        config: &Self::Config,
        weights: &Path,
        device: &Device,
    ) -> Result<std::collections::HashMap<String, Tensor>> {
        read_checked(weights, &Self::specs(config), &Self::NAMING, device)
    }
    /// The model from `tensors`, with the roles `groups` trains as `Var`s.
    fn from_tensors(
        config: &Self::Config,
        tensors: std::collections::HashMap<String, Tensor>,
        groups: &TrainGroups,
        origin: String,
    ) -> candle_core::Result<Self> {
        Self::assemble(config, ParamTaker::new(tensors, groups, Self::ROLE_RULES), origin)
    }
    /// The checkpoint at `weights` as read.
    fn load_checkpoint(config: &Self::Config, weights: &Path, groups: &TrainGroups, device: &Device) -> Result<Self> {
        let tensors = Self::read(config, weights, device)?;
        Ok(Self::from_tensors(
            config,
            tensors,
            groups,
            weights.display().to_string(),
        )?)
    }
    /// The usual transformer init ([`random_tensors`] with `std`), described by `origin`.
    fn random_init(
        config: &Self::Config,
        std: &dyn Fn(&str) -> f64,
        origin: String,
        groups: &TrainGroups,
        device: &Device,
        rng: &mut Rng,
    ) -> Result<Self> {
        let tensors = random_tensors(&Self::specs(config), std, device, rng)?;
        Ok(Self::from_tensors(config, tensors, groups, origin)?)
    }
}

/// How a randomly initialised transformer's origin reads.
pub(crate) fn random_origin(layers: usize, wide: usize, heads: usize) -> String {
    format!("random init ({layers} layers x {wide} wide x {heads} heads)")
}

/// The checkpoint at `weights`, its tensors passed through `prep`, as a boxed backbone.
fn boxed<A: Arch>(
    config: &A::Config,
    weights: &Path,
    groups: &TrainGroups,
    device: &Device,
    origin: String,
    prep: &mut dyn FnMut(
        std::collections::HashMap<String, Tensor>,
    ) -> Result<std::collections::HashMap<String, Tensor>>,
) -> Result<Box<dyn Backbone>> {
    let tensors = prep(A::read(config, weights, device)?)?;
    Ok(Box::new(A::from_tensors(config, tensors, groups, origin)?))
}

fn build(spec: &BackboneSpec, groups: &TrainGroups, device: &Device, rng: &mut Rng) -> Result<Box<dyn Backbone>> {
    let config = match Config::builtin(&spec.source) {
        Some(c) if spec.init == Init::Random => c,
        // No checkpoint of the built-in LSTM exists anywhere: say so instead of asking the
        // Hub for a model called `lstm`.
        Some(Config::Lstm(_)) if spec.init.needs_weights() && !Path::new(&spec.source).is_dir() => {
            return Err(BackboneError::Unsupported(format!(
                "the built-in `{}` baseline has no pretrained weights (init `{}` asked for them): \
                 train it from a random init (`--init random`), or pass a directory written by \
                 `fpt pretrain`",
                spec.source, spec.init
            )))
        }
        _ => {
            let files = hub::resolve(&spec.source, spec.init.needs_weights())?;
            let config = Config::from_file(&files.config)?;
            if let Some(w) = files.weights.as_ref().filter(|_| spec.init.needs_weights()) {
                // Pretrained: the checkpoint as read; statistics-only: each tensor redrawn.
                let stats = spec.init == Init::StatsOnly;
                let origin = if stats {
                    format!("statistics-only init from {}", w.display())
                } else {
                    w.display().to_string()
                };
                let mut prep = |t| if stats { stats_only(t, rng) } else { Ok(t) };
                let (w, prep) = (w.as_path(), &mut prep);
                return match config {
                    Config::Gpt2(c) => boxed::<gpt2::Gpt2>(&c, w, groups, device, origin, prep),
                    Config::Bert(c) => boxed::<bert::Bert>(&c, w, groups, device, origin, prep),
                    Config::T5(c) => boxed::<t5::T5Encoder>(&c, w, groups, device, origin, prep),
                    Config::Vit(c) => boxed::<vit::Vit>(&c, w, groups, device, origin, prep),
                    Config::Lstm(c) => boxed::<lstm::Lstm>(&c, w, groups, device, origin, prep),
                };
            }
            config
        }
    };
    Ok(match config.with_overrides(&spec.shape)? {
        Config::Gpt2(c) => Box::new(gpt2::Gpt2::random(&c, spec.residual_init, groups, device, rng)?),
        Config::Bert(c) => Box::new(bert::Bert::random(&c, groups, device, rng)?),
        Config::T5(c) => Box::new(t5::T5Encoder::random(&c, groups, device, rng)?),
        Config::Vit(c) => Box::new(vit::Vit::random(&c, groups, device, rng)?),
        Config::Lstm(c) => Box::new(lstm::Lstm::random(&c, groups, device, rng)?),
    })
}

/// The config and parameter specs of the backbone a spec names, without materialising
/// weights (only its config is read), for `fpt inspect`.
pub fn param_specs(spec: &BackboneSpec) -> Result<(Config, Vec<ParamSpec>)> {
    let config = match Config::builtin(&spec.source) {
        Some(c) => c,
        None => Config::from_file(&hub::resolve(&spec.source, false)?.config)?,
    };
    let config = config.with_overrides(&spec.shape)?;
    let specs = config.param_specs();
    Ok((config, specs))
}

/// Writes `backbone` as a checkpoint directory that [`load`] (and, for GPT-2, BERT and T5,
/// Hugging Face `transformers`) reads: `config.json` (with `model_type`) and
/// `model.safetensors` under the Hub's tensor names (GPT-2's Conv1D weights back in
/// `[in, out]` layout). Tensors the backbone does not use with input embeddings (GPT-2's
/// `wte`, BERT's word and type embeddings, T5's `shared`) come from `extra` when given
/// (e.g. the token table `fpt pretrain` trained) and are otherwise drawn from N(0, 0.02)
/// with `rng`. Each file is written to a temporary name and renamed. ViT and Longformer
/// are not written (their fpt position tables have no Hub counterpart).
pub fn save_pretrained(
    backbone: &dyn Backbone,
    dir: &Path,
    extra: std::collections::HashMap<String, Tensor>,
    rng: &mut Rng,
) -> Result<()> {
    let config = backbone.config();
    // Tensors are stored as the architecture's checkpoints store them (`Arch::NAMING`).
    let (model_type, arch, naming) = match &config {
        Config::Gpt2(_) => ("gpt2", "GPT2Model", gpt2::Gpt2::NAMING),
        Config::Bert(c) if c.longformer.is_none() => ("bert", "BertModel", bert::Bert::NAMING),
        Config::T5(_) => ("t5", "T5EncoderModel", t5::T5Encoder::NAMING),
        Config::Lstm(_) => ("fpt-lstm", "FptLstm", lstm::Lstm::NAMING),
        other => {
            return Err(BackboneError::Unsupported(format!(
                "saving a {} backbone is not supported (gpt2, bert, t5 and lstm are)",
                other.architecture()
            )))
        }
    };
    let io = |path: PathBuf| move |source| BackboneError::Io { path, source };
    std::fs::create_dir_all(dir).map_err(io(dir.to_path_buf()))?;
    let have: std::collections::HashMap<String, Tensor> = backbone
        .params()
        .into_iter()
        .map(|(n, _, p)| (n, p.tensor().clone()))
        .collect();
    let mut out: std::collections::HashMap<String, Tensor> = std::collections::HashMap::new();
    for spec in config.param_specs() {
        let t = match have.get(&spec.name).or_else(|| extra.get(&spec.name)) {
            Some(t) => t.to_device(&Device::Cpu)?,
            None if !spec.used => fpt_nn::init::normal(&spec.shape, 0.0, 0.02, rng, &Device::Cpu)?,
            None => {
                return Err(BackboneError::Unsupported(format!(
                    "cannot save: the backbone has no tensor `{}` (a dropped final norm?)",
                    spec.name
                )))
            }
        };
        if t.dims() != spec.shape.as_slice() {
            return Err(BackboneError::Shape {
                path: dir.join("model.safetensors"),
                tensor: spec.name.clone(),
                expected: spec.shape.clone(),
                found: t.dims().to_vec(),
            });
        }
        let t = if (naming.transposed)(&spec.name) {
            t.t()?.contiguous()?
        } else {
            t
        };
        out.insert(spec.name, t);
    }
    let weights = dir.join("model.safetensors");
    fpt_spec::files::write_atomic_with(&weights, |tmp| {
        candle_core::safetensors::save(&out, tmp).map_err(std::io::Error::other)
    })
    .map_err(io(weights))?;
    let mut cfg = config.to_json();
    cfg["model_type"] = model_type.into();
    cfg["architectures"] = serde_json::json!([arch]);
    let c = dir.join("config.json");
    fpt_spec::files::write_atomic(&c, serde_json::to_string_pretty(&cfg).expect("json").as_bytes()).map_err(io(c))?;
    Ok(())
}

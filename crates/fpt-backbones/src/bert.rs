//! BERT (Devlin et al. 2019) as an FPT backbone, and BERT-family checkpoints such as
//! `sentence-transformers/all-MiniLM-L6-v2`, and Longformer (Beltagy et al. 2020:
//! `allenai/longformer-base-4096`, the same blocks with sliding-window attention of
//! `attention_window / 2` keys on each side, positions offset by `pad_token_id + 1`, and
//! global-attention projections that stay unused without global tokens): input embeddings plus learned positions plus
//! the token-type-0 embedding, LayerNorm and dropout, then post-LayerNorm blocks of
//! bidirectional self-attention and an exact-GELU MLP.
//!
//! Follows Hugging Face `transformers`' `modeling_bert.py` (`BertModel` called with
//! `inputs_embeds` and no attention mask). Checkpoint names: `embeddings.{position_embeddings,
//! token_type_embeddings, word_embeddings, LayerNorm}`, `encoder.layer.N.{attention.self.{query,
//! key,value}, attention.output.{dense, LayerNorm}, intermediate.dense, output.{dense,
//! LayerNorm}}`, `pooler.dense` (unused), with or without a `bert.` prefix; the old
//! `LayerNorm.gamma`/`beta` names of `bert-base-uncased` are read as `weight`/`bias`.

use crate::{role_by_rules, Arch, Backbone, BackboneError, Common, Naming, ParamSpec, ParamTaker, Result};
use candle_core::{Device, Tensor};
use fpt_nn::ops::Mask;
use fpt_nn::{ops, BranchMid, Ctx, LayerNorm, Linear, NormAt, Param, ResidualBranch, Rng};
use fpt_spec::{Role, ShapeOverrides, TrainGroups};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Parameter roles by name, first match wins (lower-cased names).
pub const ROLE_RULES: &[(&str, Role)] = &[
    ("layernorm", Role::LayerNorm),
    ("position_embeddings", Role::Positions),
    ("attention", Role::Attention),
    ("intermediate", Role::FeedForward),
    ("output.dense", Role::FeedForward),
];

fn default_pdrop() -> f64 {
    0.1
}
fn default_act() -> String {
    "gelu".into()
}
fn default_type_vocab() -> usize {
    2
}

/// A BERT `config.json` (the fields this implementation reads).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BertConfig {
    /// Token vocabulary size (the unused `word_embeddings` table).
    pub vocab_size: usize,
    /// Hidden width.
    pub hidden_size: usize,
    /// Number of blocks.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Size of the learned position table.
    pub max_position_embeddings: usize,
    /// Token-type vocabulary (row 0 is added to every input).
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// Activation: `gelu` (exact) is supported.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Dropout on embeddings and sublayer outputs.
    #[serde(default = "default_pdrop")]
    pub hidden_dropout_prob: f64,
    /// Dropout on attention probabilities.
    #[serde(default = "default_pdrop")]
    pub attention_probs_dropout_prob: f64,
    /// `bert`.
    #[serde(default)]
    pub model_type: Option<String>,
    /// Only `absolute` is supported.
    #[serde(default)]
    pub position_embedding_type: Option<String>,
    /// Set for Longformer checkpoints.
    #[serde(skip)]
    pub longformer: Option<LongformerExtras>,
    /// fpt's own, never in a Hub config: blocks without their feed-forward half (attention
    /// and its LayerNorm only; a random-init shape, the critics' LLM2Attn).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attention_only: bool,
}

/// What Longformer adds to the BERT blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LongformerExtras {
    /// Keys attended on each side of a query (`attention_window / 2`).
    pub one_sided_window: usize,
    /// First position id used (`pad_token_id + 1`, RoBERTa style).
    pub position_offset: usize,
}

fn default_pad() -> usize {
    1
}

/// The Longformer fields of a `config.json`, beyond BERT's.
#[derive(Deserialize)]
struct LongformerFields {
    attention_window: serde_json::Value,
    #[serde(default = "default_pad")]
    pad_token_id: usize,
}

impl BertConfig {
    /// Built-in configs of known checkpoints, so random-init runs and `fpt inspect` need
    /// no files.
    pub fn builtin(name: &str) -> Option<Self> {
        if name == "allenai/longformer-base-4096" {
            return Self::longformer_base();
        }
        let (layers, hidden, heads, ffn) = match name {
            "bert-base-uncased" | "google-bert/bert-base-uncased" => (12, 768, 12, 3072),
            "sentence-transformers/all-MiniLM-L6-v2" | "minilm" => (6, 384, 12, 1536),
            _ => return None,
        };
        Some(Self {
            vocab_size: 30522,
            hidden_size: hidden,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            intermediate_size: ffn,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            hidden_act: "gelu".into(),
            hidden_dropout_prob: 0.1,
            attention_probs_dropout_prob: 0.1,
            model_type: Some("bert".into()),
            position_embedding_type: Some("absolute".into()),
            longformer: None,
            attention_only: false,
        })
    }

    fn longformer_base() -> Option<Self> {
        Some(Self {
            vocab_size: 50265,
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            max_position_embeddings: 4098,
            type_vocab_size: 1,
            layer_norm_eps: 1e-5,
            hidden_act: "gelu".into(),
            hidden_dropout_prob: 0.1,
            attention_probs_dropout_prob: 0.1,
            model_type: Some("longformer".into()),
            position_embedding_type: Some("absolute".into()),
            longformer: Some(LongformerExtras {
                one_sided_window: 256,
                position_offset: 2,
            }),
            attention_only: false,
        })
    }

    /// Parses a Longformer `config.json` (BERT fields plus `attention_window`, one value for
    /// every layer, and `pad_token_id`).
    pub fn from_longformer_json(text: &str, path: &Path) -> Result<Self> {
        let bad = |msg: String| BackboneError::Config {
            path: path.to_path_buf(),
            msg,
        };
        let mut cfg = Self::from_json(text, path)?;
        let extra: LongformerFields = serde_json::from_str(text).map_err(|e| bad(crate::config::with_key(text, &e)))?;
        let windows: Vec<u64> = match &extra.attention_window {
            serde_json::Value::Number(n) => vec![n.as_u64().unwrap_or(0)],
            serde_json::Value::Array(a) => a.iter().map(|v| v.as_u64().unwrap_or(0)).collect(),
            other => return Err(bad(format!("attention_window must be a number or a list, got {other}"))),
        };
        let w = windows[0];
        if w == 0 || !w.is_multiple_of(2) || windows.iter().any(|&x| x != w) {
            return Err(bad(format!(
                "attention_window {windows:?}: fpt supports one positive even window for all layers"
            )));
        }
        if cfg.max_position_embeddings <= extra.pad_token_id + 1 {
            return Err(bad(
                "max_position_embeddings leaves no positions after the pad offset".into()
            ));
        }
        cfg.longformer = Some(LongformerExtras {
            one_sided_window: (w / 2) as usize,
            position_offset: extra.pad_token_id + 1,
        });
        Ok(cfg)
    }

    /// Parses and checks a `config.json` text (`path` names it in errors).
    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        crate::parse_config(text, path, Self::validate)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        use fpt_spec::limits::*;
        let c = self;
        let (hidden, layers, heads) = (c.hidden_size, c.num_hidden_layers, c.num_attention_heads);
        crate::check_bert_encoder(hidden, layers, heads, c.intermediate_size, &c.hidden_act)?;
        crate::check_sizes(&[
            ("max_position_embeddings", c.max_position_embeddings, MAX_POSITIONS),
            ("vocab_size", c.vocab_size, MAX_VOCAB),
            ("type_vocab_size", c.type_vocab_size, MAX_VOCAB),
        ])?;
        if let Some(p) = &self.position_embedding_type {
            if p != "absolute" {
                return Err(format!(
                    "position_embedding_type `{p}` is not supported (absolute only)"
                ));
            }
        }
        if self.type_vocab_size == 0 {
            return Err("type_vocab_size must be positive".into());
        }
        Ok(())
    }

    /// Applies shape overrides (random init).
    pub fn with_overrides(mut self, o: &ShapeOverrides) -> Result<Self> {
        if let Some(l) = o.layers {
            self.num_hidden_layers = l;
        }
        if let Some(h) = o.hidden {
            self.intermediate_size = 4 * h;
            self.hidden_size = h;
        }
        if let Some(h) = o.heads {
            self.num_attention_heads = h;
        }
        if let Some(p) = o.positions {
            self.max_position_embeddings = p + self.longformer.map_or(0, |l| l.position_offset);
        }
        if let Some(v) = o.vocab {
            self.vocab_size = v;
        }
        if let Some(a) = o.attention_only {
            self.attention_only = a;
        }
        self.validate()
            .map_err(|m| BackboneError::Unsupported(format!("invalid BERT shape: {m}")))?;
        Ok(self)
    }

    /// Every parameter with our shapes (all `[out, in]` already, as in the checkpoint).
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        let (c, f) = (self.hidden_size, self.intermediate_size);
        let mut v = Vec::new();
        let mut push = |name: String, shape: Vec<usize>, used: bool| {
            let role = role_by_rules(&name, ROLE_RULES);
            v.push(ParamSpec {
                name,
                shape,
                role,
                used,
            });
        };
        push(
            "embeddings.word_embeddings.weight".into(),
            vec![self.vocab_size, c],
            false,
        );
        push(
            "embeddings.position_embeddings.weight".into(),
            vec![self.max_position_embeddings, c],
            true,
        );
        push(
            "embeddings.token_type_embeddings.weight".into(),
            vec![self.type_vocab_size, c],
            true,
        );
        push("embeddings.LayerNorm.weight".into(), vec![c], true);
        push("embeddings.LayerNorm.bias".into(), vec![c], true);
        for i in 0..self.num_hidden_layers {
            let p = format!("encoder.layer.{i}.");
            for n in ["query", "key", "value"] {
                push(format!("{p}attention.self.{n}.weight"), vec![c, c], true);
                push(format!("{p}attention.self.{n}.bias"), vec![c], true);
            }
            if self.longformer.is_some() {
                for n in ["query_global", "key_global", "value_global"] {
                    push(format!("{p}attention.self.{n}.weight"), vec![c, c], false);
                    push(format!("{p}attention.self.{n}.bias"), vec![c], false);
                }
            }
            push(format!("{p}attention.output.dense.weight"), vec![c, c], true);
            push(format!("{p}attention.output.dense.bias"), vec![c], true);
            push(format!("{p}attention.output.LayerNorm.weight"), vec![c], true);
            push(format!("{p}attention.output.LayerNorm.bias"), vec![c], true);
            if self.attention_only {
                continue;
            }
            push(format!("{p}intermediate.dense.weight"), vec![f, c], true);
            push(format!("{p}intermediate.dense.bias"), vec![f], true);
            push(format!("{p}output.dense.weight"), vec![c, f], true);
            push(format!("{p}output.dense.bias"), vec![c], true);
            push(format!("{p}output.LayerNorm.weight"), vec![c], true);
            push(format!("{p}output.LayerNorm.bias"), vec![c], true);
        }
        if self.longformer.is_none() {
            push("pooler.dense.weight".into(), vec![c, c], false);
            push("pooler.dense.bias".into(), vec![c], false);
        }
        v
    }
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    /// Q, K and V as one frozen product when all three are frozen (see [`packed_qkv`]).
    qkv: Option<Linear>,
    attn_out: Linear,
    attn_ln: LayerNorm,
    /// The feed-forward half (none in attention-only blocks).
    ffn: Option<Ffn>,
}

/// A block's feed-forward half: `intermediate.dense`, `output.dense`, `output.LayerNorm`.
struct Ffn {
    intermediate: Linear,
    output: Linear,
    out_ln: LayerNorm,
}

/// A BERT backbone.
pub struct Bert {
    config: BertConfig,
    positions: Param,
    token_type: Param,
    emb_ln: LayerNorm,
    layers: Vec<Layer>,
    common: Common,
}

/// Q, K and V as one frozen linear layer (`[3 * hidden, hidden]`, biases likewise) when all
/// three weights and biases are frozen: one product over the input instead of three, whose
/// output is already the packed `[q | k | v]` layout the fused attention reads. (A copy of
/// the three weights; the named parameters stay the three originals.)
fn packed_qkv(q: &Linear, k: &Linear, v: &Linear) -> candle_core::Result<Option<Linear>> {
    let parts = [q, k, v];
    let frozen = parts
        .iter()
        .all(|l| !l.weight.is_trainable() && l.bias.as_ref().is_some_and(|b| !b.is_trainable()));
    if !frozen {
        return Ok(None);
    }
    let w = Tensor::cat(&parts.map(|l| l.weight.tensor()), 0)?;
    let b = Tensor::cat(&parts.map(|l| l.bias.as_ref().expect("checked above").tensor()), 0)?;
    Ok(Some(Linear::new(Param::new(w, false)?, Some(Param::new(b, false)?))))
}

/// BERT's (and Longformer's) entry in [`crate::ARCHITECTURES`].
pub const REGISTRATION: crate::Registration = crate::Registration {
    names: &["BERT", "Longformer"],
    model_types: &["bert", "longformer"],
    builtin: |name| BertConfig::builtin(name).map(crate::Config::new),
    read: |v, text, path| match crate::model_type(v) {
        Some("bert") => Some(BertConfig::from_json(text, path).map(crate::Config::new)),
        Some("longformer") => Some(BertConfig::from_longformer_json(text, path).map(crate::Config::new)),
        _ => None,
    },
    gguf: None,
};

impl crate::ArchConfig for BertConfig {
    crate::arch_config_common!(BertConfig, Bert, |c| (
        c.num_hidden_layers,
        c.num_attention_heads,
        c.hidden_size
    ));

    fn architecture(&self) -> &'static str {
        if self.longformer.is_some() {
            "longformer"
        } else {
            "bert"
        }
    }

    fn summary(&self) -> String {
        let c = self;
        match c.longformer {
            Some(l) => format!(
                "longformer: {} layers, hidden {}, {} heads, mlp {}, {} positions, sliding window of {} keys each side, eps {:e}",
                c.num_hidden_layers,
                c.hidden_size,
                c.num_attention_heads,
                c.intermediate_size,
                c.max_position_embeddings - l.position_offset,
                l.one_sided_window,
                c.layer_norm_eps
            ),
            None => format!(
                "bert: {} layers, hidden {}, {} heads, {}, {} positions, bidirectional, eps {:e}",
                c.num_hidden_layers,
                c.hidden_size,
                c.num_attention_heads,
                if c.attention_only {
                    "attention only (no feed-forward half)".to_string()
                } else {
                    format!("mlp {}", c.intermediate_size)
                },
                c.max_position_embeddings,
                c.layer_norm_eps
            ),
        }
    }

    fn saved_as(&self) -> Option<crate::SavedAs> {
        // Longformer's fpt position table, and blocks without a feed-forward half, have no
        // Hub counterpart.
        (self.longformer.is_none() && !self.attention_only).then_some(crate::SavedAs {
            model_type: "bert",
            class: "BertModel",
            naming: Bert::NAMING,
        })
    }
}

impl Arch for Bert {
    type Config = BertConfig;
    const NAMING: Naming = Naming {
        prefixes: &["bert.", "longformer.", "roberta."],
        // Old TF-converted checkpoints name LayerNorm parameters gamma and beta.
        alias: |n| {
            n.replace("LayerNorm.weight", "LayerNorm.gamma")
                .replace("LayerNorm.bias", "LayerNorm.beta")
        },
        transposed: |_| false,
        quiet: &["position_ids", "cls.", "lm_head.", "pooler."],
    };
    const ROLE_RULES: &'static [(&'static str, Role)] = ROLE_RULES;

    fn specs(config: &Self::Config) -> Vec<ParamSpec> {
        config.param_specs()
    }

    fn assemble(config: &BertConfig, mut t: ParamTaker, origin: String) -> candle_core::Result<Self> {
        let eps = config.layer_norm_eps;
        let positions = t.take("embeddings.position_embeddings.weight".into())?;
        let token_type = t.take("embeddings.token_type_embeddings.weight".into())?;
        let emb_ln = t.layer_norm("embeddings.LayerNorm", eps)?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{i}.");
            let query = t.linear(&format!("{p}attention.self.query"))?;
            let key = t.linear(&format!("{p}attention.self.key"))?;
            let value = t.linear(&format!("{p}attention.self.value"))?;
            layers.push(Layer {
                qkv: packed_qkv(&query, &key, &value)?,
                query,
                key,
                value,
                attn_out: t.linear(&format!("{p}attention.output.dense"))?,
                attn_ln: t.layer_norm(&format!("{p}attention.output.LayerNorm"), eps)?,
                ffn: if config.attention_only {
                    None
                } else {
                    Some(Ffn {
                        intermediate: t.linear(&format!("{p}intermediate.dense"))?,
                        output: t.linear(&format!("{p}output.dense"))?,
                        out_ln: t.layer_norm(&format!("{p}output.LayerNorm"), eps)?,
                    })
                },
            });
        }
        Ok(Self {
            config: config.clone(),
            positions,
            token_type,
            emb_ln,
            layers,
            common: t.finish(origin),
        })
    }
}

impl Bert {
    /// Loads `model.safetensors` (see the module docs for the accepted names), checking
    /// every tensor's presence and shape.
    pub fn load(config: &BertConfig, weights: &Path, groups: &TrainGroups, device: &Device) -> Result<Self> {
        <Self as Arch>::load_checkpoint(config, weights, groups, device)
    }

    /// BERT's default random init: weights and embeddings N(0, 0.02), biases 0,
    /// LayerNorm 1/0.
    pub fn random(config: &BertConfig, groups: &TrainGroups, device: &Device, rng: &mut Rng) -> Result<Self> {
        let c = config;
        let origin = crate::random_origin(c.num_hidden_layers, c.hidden_size, c.num_attention_heads);
        Self::random_init(config, &|_| 0.02, origin, groups, device, rng)
    }

    /// The config this model was built from.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }
}

impl Bert {
    fn position_offset(&self) -> usize {
        self.config.longformer.map_or(0, |l| l.position_offset)
    }

    /// Embeddings and the layers; with `last = Some(n)` the last layer runs its queries,
    /// attention output, LayerNorms and feed-forward for the last `n` positions only (all
    /// positions are still its keys and values): exact, and most of a layer saved when one
    /// token is read out. (Dropout masks are then drawn for those positions only.)
    fn run(&self, embeds: &Tensor, ctx: &mut Ctx, last: Option<usize>) -> candle_core::Result<Tensor> {
        let c = &self.config;
        let t = crate::check_embeds(self, embeds)?;
        let mask = match c.longformer {
            Some(l) => Mask::Band(l.one_sided_window),
            None => Mask::None,
        };
        let drop = |ctx: &mut Ctx, x: &Tensor, p: f64| {
            if self.common.dropout {
                ctx.dropout(x, p)
            } else {
                Ok(x.clone())
            }
        };
        let pos = self.positions.get().narrow(0, self.position_offset(), t)?;
        let tt = self.token_type.get().narrow(0, 0, 1)?;
        let h = embeds.broadcast_add(&pos)?.broadcast_add(&tt)?;
        let mut h = drop(ctx, &self.emb_ln.forward(&h)?, c.hidden_dropout_prob)?;
        let (nh, hd) = (c.num_attention_heads, c.hidden_size / c.num_attention_heads);
        let n = self.layers.len();
        // The residual dropout's (p, seed), drawn where `Ctx::dropout` would draw it (the
        // same mask).
        let resid = |ctx: &mut Ctx| {
            let p = c.hidden_dropout_prob;
            (self.common.dropout && ctx.train && p > 0.0).then(|| (p, ctx.rng.next_u64()))
        };
        for (i, l) in self.layers.iter().enumerate() {
            let dropout = self.common.dropout.then_some(c.attention_probs_dropout_prob);
            let scale = 1.0 / (hd as f64).sqrt();
            let read_out = last.filter(|_| i + 1 == n);
            let h1 = match (&l.qkv, read_out) {
                // The attention half as one post-norm branch (fused on the CPU: its layers
                // are frozen, or there would be no packed Q/K/V).
                (Some(qkv), None) if ctx.attention.is_none() => {
                    let spec = crate::attention_spec(nh, scale, mask, ctx, dropout);
                    let branch = ResidualBranch {
                        norm: &l.attn_ln,
                        norm_at: NormAt::Output,
                        input: qkv,
                        mid: BranchMid::Attention(spec),
                        output: &l.attn_out,
                    };
                    let r = resid(ctx);
                    branch.forward(&h, r)?
                }
                _ => {
                    let (o, residual) = match read_out {
                        Some(k) => {
                            // Q, K and V packed for the fused read-out attention.
                            let qkv = match &l.qkv {
                                Some(qkv) => qkv.forward(&h)?,
                                None => {
                                    Tensor::cat(&[l.query.forward(&h)?, l.key.forward(&h)?, l.value.forward(&h)?], 2)?
                                }
                            };
                            let o = crate::attention_packed(&qkv, nh, scale, mask, ctx, dropout, Some(k))?;
                            (o, h.narrow(1, t - k, k)?)
                        }
                        None if l.qkv.is_some() => {
                            let qkv = l.qkv.as_ref().expect("matched").forward(&h)?;
                            (crate::attention_packed(&qkv, nh, scale, mask, ctx, dropout, None)?, h)
                        }
                        None => {
                            let (q, k, v) = (l.query.forward(&h)?, l.key.forward(&h)?, l.value.forward(&h)?);
                            (crate::attention(&q, &k, &v, nh, scale, mask, None, ctx, dropout)?, h)
                        }
                    };
                    let a = l.attn_out.forward(&o)?;
                    let sum = match resid(ctx) {
                        Some((p, seed)) => ops::dropout_add(&residual, &a, p, seed)?,
                        None => (a + &residual)?,
                    };
                    l.attn_ln.forward(&sum)?
                }
            };
            // The feed-forward half: fused when its layers are frozen.
            let Some(f) = &l.ffn else {
                h = h1;
                continue;
            };
            let branch = ResidualBranch {
                norm: &f.out_ln,
                norm_at: NormAt::Output,
                input: &f.intermediate,
                mid: BranchMid::GeluErf,
                output: &f.output,
            };
            let r = resid(ctx);
            h = branch.forward(&h1, r)?;
        }
        Ok(h)
    }
}

impl Backbone for Bert {
    fn architecture(&self) -> &'static str {
        if self.config.longformer.is_some() {
            "longformer"
        } else {
            "bert"
        }
    }
    fn max_positions(&self) -> usize {
        self.config.max_position_embeddings - self.position_offset()
    }
    fn is_causal(&self) -> bool {
        false
    }

    fn forward(&self, embeds: &Tensor, ctx: &mut Ctx) -> candle_core::Result<Tensor> {
        self.run(embeds, ctx, None)
    }

    fn forward_last(&self, embeds: &Tensor, ctx: &mut Ctx, last: usize) -> candle_core::Result<Tensor> {
        let t = embeds.dim(1)?;
        if last == 0 || last >= t {
            let h = self.run(embeds, ctx, None)?;
            return h.narrow(1, t.saturating_sub(last), last.min(t));
        }
        self.run(embeds, ctx, Some(last))
    }

    fn config(&self) -> crate::Config {
        crate::Config::new(self.config.clone())
    }

    crate::backbone_common!(layers, num_hidden_layers, hidden_size);
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    /// The packed Q/K/V product gives what the three products give, dropout included
    /// (train mode, the same seed), forward and input gradient, on every kernel path.
    #[test]
    fn packed_qkv_equals_three_products() {
        fpt_nn::kernels::on_every_path(|_| {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fixtures/bert-tiny");
            let Some(cfg) = crate::Config::from_file(&dir.join("config.json"))
                .unwrap()
                .get::<crate::bert::BertConfig>()
                .cloned()
            else {
                panic!("expected a BERT config")
            };
            let mut model =
                Bert::load(&cfg, &dir.join("model.safetensors"), &TrainGroups::fpt(), &Device::Cpu).unwrap();
            assert!(model.layers.iter().all(|l| l.qkv.is_some()));
            let x = Var::from_tensor(
                &Tensor::from_vec(
                    Rng::new(3).normal_vec(2 * 5 * cfg.hidden_size, 0.0, 1.0),
                    (2, 5, cfg.hidden_size),
                    &Device::Cpu,
                )
                .unwrap(),
            )
            .unwrap();
            let run = |m: &Bert| {
                let y = m.forward(x.as_tensor(), &mut Ctx::train(11)).unwrap();
                let g = y.sqr().unwrap().sum_all().unwrap().backward().unwrap();
                (y, g.get(x.as_tensor()).unwrap().clone())
            };
            let (y1, g1) = run(&model);
            for l in &mut model.layers {
                l.qkv = None;
            }
            let (y2, g2) = run(&model);
            let diff =
                |a: &Tensor, b: &Tensor| -> f32 { (a - b).and_then(|d| d.abs()?.max_all()?.to_scalar()).unwrap() };
            assert!(diff(&y1, &y2) < 1e-5, "forward differs by {}", diff(&y1, &y2));
            assert!(diff(&g1, &g2) < 1e-4, "gradient differs by {}", diff(&g1, &g2));
        });
        // An attention group that trains keeps the three products.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fixtures/bert-tiny");
        let Some(cfg) = crate::Config::from_file(&dir.join("config.json"))
            .unwrap()
            .get::<crate::bert::BertConfig>()
            .cloned()
        else {
            panic!("expected a BERT config")
        };
        let model = Bert::load(
            &cfg,
            &dir.join("model.safetensors"),
            &"in,out,ln,pos,attn".parse().unwrap(),
            &Device::Cpu,
        )
        .unwrap();
        assert!(model.layers.iter().all(|l| l.qkv.is_none()));
    }
}

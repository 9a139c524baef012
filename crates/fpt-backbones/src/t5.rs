//! The T5 encoder (Raffel et al. 2020) as an FPT backbone: no absolute positions; a learned
//! relative-position bias (32 buckets, shared by all layers, from block 0) added to the
//! unscaled attention scores; RMS LayerNorms without bias before each sublayer; a ReLU MLP;
//! a final RMS norm. The relative-position bias table is the positions group.
//!
//! Follows Hugging Face `transformers`' `modeling_t5.py` (`T5EncoderModel` called with
//! `inputs_embeds`, no attention mask). Checkpoint names: `encoder.block.N.layer.0.
//! {SelfAttention.{q,k,v,o}, layer_norm}`, `encoder.block.0.layer.0.SelfAttention.
//! relative_attention_bias`, `encoder.block.N.layer.1.{DenseReluDense.{wi,wo}, layer_norm}`,
//! `encoder.final_layer_norm`, `shared` (unused); a full encoder-decoder checkpoint
//! (`t5-base`) loads too, its decoder ignored.

use crate::{role_by_rules, Arch, Backbone, BackboneError, Common, Naming, ParamSpec, ParamTaker, Result};
use candle_core::{Device, Tensor};
use fpt_nn::{ops, Ctx, Linear, Param, Rng};
use fpt_spec::{Role, ShapeOverrides, TrainGroups};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Parameter roles by name, first match wins (lower-cased names).
pub const ROLE_RULES: &[(&str, Role)] = &[
    ("relative_attention_bias", Role::Positions),
    ("norm", Role::LayerNorm),
    ("densereludense", Role::FeedForward),
    ("selfattention", Role::Attention),
];

fn default_buckets() -> usize {
    32
}
fn default_max_distance() -> usize {
    128
}
fn default_pdrop() -> f64 {
    0.1
}
fn default_ff() -> String {
    "relu".into()
}

/// A T5 `config.json` (the encoder fields this implementation reads).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct T5Config {
    /// Token vocabulary size (the unused `shared` table).
    pub vocab_size: usize,
    /// Hidden width.
    pub d_model: usize,
    /// Width of each attention head.
    pub d_kv: usize,
    /// MLP width.
    pub d_ff: usize,
    /// Encoder blocks.
    pub num_layers: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Relative-position buckets.
    #[serde(default = "default_buckets")]
    pub relative_attention_num_buckets: usize,
    /// Distance beyond which relative positions share a bucket.
    #[serde(default = "default_max_distance")]
    pub relative_attention_max_distance: usize,
    /// Dropout.
    #[serde(default = "default_pdrop")]
    pub dropout_rate: f64,
    /// RMS norm epsilon.
    pub layer_norm_epsilon: f64,
    /// Only `relu` (T5 v1.0, `t5-base`) is supported.
    #[serde(default = "default_ff")]
    pub feed_forward_proj: String,
    /// `t5`.
    #[serde(default)]
    pub model_type: Option<String>,
}

impl T5Config {
    /// Built-in config of `t5-base`.
    pub fn builtin(name: &str) -> Option<Self> {
        match name {
            "t5-base" | "google-t5/t5-base" => Some(Self {
                vocab_size: 32128,
                d_model: 768,
                d_kv: 64,
                d_ff: 3072,
                num_layers: 12,
                num_heads: 12,
                relative_attention_num_buckets: 32,
                relative_attention_max_distance: 128,
                dropout_rate: 0.1,
                layer_norm_epsilon: 1e-6,
                feed_forward_proj: "relu".into(),
                model_type: Some("t5".into()),
            }),
            _ => None,
        }
    }

    /// Parses and checks a `config.json` text (`path` names it in errors).
    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        crate::parse_config(text, path, Self::validate)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        use fpt_spec::limits::*;
        crate::check_sizes(&[
            ("d_model", self.d_model, MAX_HIDDEN),
            ("d_kv", self.d_kv, MAX_HIDDEN),
            ("num_layers", self.num_layers, MAX_LAYERS),
            ("num_heads", self.num_heads, MAX_HEADS),
            ("d_ff", self.d_ff, MAX_FFN),
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            (
                "relative_attention_num_buckets",
                self.relative_attention_num_buckets,
                MAX_POSITIONS,
            ),
        ])?;
        if self.feed_forward_proj != "relu" {
            return Err(format!(
                "feed_forward_proj `{}` is not supported (relu only)",
                self.feed_forward_proj
            ));
        }
        if self.relative_attention_num_buckets < 4 {
            return Err("relative_attention_num_buckets must be at least 4".into());
        }
        Ok(())
    }

    /// Applies shape overrides (random init); `--hidden` sets d_model, and d_kv to
    /// d_model / heads.
    pub fn with_overrides(mut self, o: &ShapeOverrides) -> Result<Self> {
        if let Some(l) = o.layers {
            self.num_layers = l;
        }
        if let Some(h) = o.heads {
            self.num_heads = h;
        }
        if let Some(h) = o.hidden {
            self.d_model = h;
            self.d_ff = 4 * h;
            if self.num_heads == 0 || h % self.num_heads != 0 {
                return Err(BackboneError::Unsupported(format!(
                    "invalid T5 shape: d_model {h} is not divisible by num_heads {}",
                    self.num_heads
                )));
            }
            self.d_kv = h / self.num_heads;
        }
        if o.positions.is_some() {
            return Err(BackboneError::Unsupported(
                "T5 has no position table (a `positions` override does not apply; it uses relative-position buckets)"
                    .into(),
            ));
        }
        self.validate()
            .map_err(|m| BackboneError::Unsupported(format!("invalid T5 shape: {m}")))?;
        Ok(self)
    }

    /// Every encoder parameter with our `[out, in]` shapes.
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        let (c, inner, f) = (self.d_model, self.num_heads * self.d_kv, self.d_ff);
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
        push("shared.weight".into(), vec![self.vocab_size, c], false);
        for i in 0..self.num_layers {
            let p = format!("encoder.block.{i}.layer.");
            for n in ["q", "k", "v"] {
                push(format!("{p}0.SelfAttention.{n}.weight"), vec![inner, c], true);
            }
            push(format!("{p}0.SelfAttention.o.weight"), vec![c, inner], true);
            if i == 0 {
                push(
                    format!("{p}0.SelfAttention.relative_attention_bias.weight"),
                    vec![self.relative_attention_num_buckets, self.num_heads],
                    true,
                );
            }
            push(format!("{p}0.layer_norm.weight"), vec![c], true);
            push(format!("{p}1.DenseReluDense.wi.weight"), vec![f, c], true);
            push(format!("{p}1.DenseReluDense.wo.weight"), vec![c, f], true);
            push(format!("{p}1.layer_norm.weight"), vec![c], true);
        }
        push("encoder.final_layer_norm.weight".into(), vec![c], true);
        v
    }

    /// T5's bidirectional relative-position bucket of `key - query`.
    pub fn bucket(&self, relative: i64) -> usize {
        let half = (self.relative_attention_num_buckets / 2) as i64;
        let mut bucket = if relative > 0 { half } else { 0 };
        let n = relative.abs();
        let max_exact = half / 2;
        if n < max_exact {
            bucket += n;
        } else {
            let large = max_exact
                + ((n as f32 / max_exact as f32).ln()
                    / (self.relative_attention_max_distance as f32 / max_exact as f32).ln()
                    * (half - max_exact) as f32) as i64;
            bucket += large.min(half - 1);
        }
        bucket as usize
    }
}

/// RMS norm (T5's LayerNorm, Llama's norm): `x / sqrt(mean(x^2) + eps) * weight`, fpt-nn's
/// fused op on the CPU.
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    fpt_nn::ops::rms_norm(x, weight, eps)
}

struct Block {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln_attn: Param,
    wi: Linear,
    wo: Linear,
    ln_ff: Param,
}

/// A T5 encoder backbone.
pub struct T5Encoder {
    config: T5Config,
    rel_bias: Param,
    blocks: Vec<Block>,
    /// `None` after [`Backbone::drop_final_norm`].
    final_ln: Option<Param>,
    common: Common,
}

/// T5's entry in [`crate::ARCHITECTURES`].
pub const REGISTRATION: crate::Registration = crate::Registration {
    names: &["T5"],
    model_types: &["t5"],
    builtin: |name| T5Config::builtin(name).map(crate::Config::new),
    read: |v, text, path| {
        (crate::model_type(v) == Some("t5")).then(|| T5Config::from_json(text, path).map(crate::Config::new))
    },
    gguf: None,
};

impl crate::ArchConfig for T5Config {
    crate::arch_config_common!(T5Config, T5Encoder, |c| (c.num_layers, c.num_heads, c.d_model));

    fn architecture(&self) -> &'static str {
        "t5"
    }

    fn summary(&self) -> String {
        let c = self;
        format!(
            "t5 encoder: {} layers, d_model {}, {} heads x d_kv {}, mlp {} relu, {} relative-position buckets (max distance {}), bidirectional, RMS norm eps {:e}",
            c.num_layers,
            c.d_model,
            c.num_heads,
            c.d_kv,
            c.d_ff,
            c.relative_attention_num_buckets,
            c.relative_attention_max_distance,
            c.layer_norm_epsilon
        )
    }

    fn saved_as(&self) -> Option<crate::SavedAs> {
        Some(crate::SavedAs {
            model_type: "t5",
            class: "T5EncoderModel",
            naming: T5Encoder::NAMING,
        })
    }
}

impl Arch for T5Encoder {
    type Config = T5Config;
    const NAMING: Naming = Naming {
        quiet: &["decoder.", "lm_head.", "encoder.embed_tokens."],
        ..Naming::PLAIN
    };
    const ROLE_RULES: &'static [(&'static str, Role)] = ROLE_RULES;

    fn specs(config: &Self::Config) -> Vec<ParamSpec> {
        config.param_specs()
    }

    fn assemble(config: &T5Config, mut t: ParamTaker, origin: String) -> candle_core::Result<Self> {
        let no_bias =
            |t: &mut ParamTaker, n: String| -> candle_core::Result<Linear> { Ok(Linear::new(t.weight(n)?, None)) };
        let mut blocks = Vec::with_capacity(config.num_layers);
        let mut rel_bias = None;
        for i in 0..config.num_layers {
            let p = format!("encoder.block.{i}.layer.");
            let q = no_bias(&mut t, format!("{p}0.SelfAttention.q.weight"))?;
            let k = no_bias(&mut t, format!("{p}0.SelfAttention.k.weight"))?;
            let v = no_bias(&mut t, format!("{p}0.SelfAttention.v.weight"))?;
            let o = no_bias(&mut t, format!("{p}0.SelfAttention.o.weight"))?;
            if i == 0 {
                rel_bias = Some(t.take(format!("{p}0.SelfAttention.relative_attention_bias.weight"))?);
            }
            blocks.push(Block {
                q,
                k,
                v,
                o,
                ln_attn: t.take(format!("{p}0.layer_norm.weight"))?,
                wi: no_bias(&mut t, format!("{p}1.DenseReluDense.wi.weight"))?,
                wo: no_bias(&mut t, format!("{p}1.DenseReluDense.wo.weight"))?,
                ln_ff: t.take(format!("{p}1.layer_norm.weight"))?,
            });
        }
        let final_ln = t.take("encoder.final_layer_norm.weight".into())?;
        Ok(Self {
            config: config.clone(),
            rel_bias: rel_bias.expect("at least one block"),
            blocks,
            final_ln: Some(final_ln),
            common: t.finish(origin),
        })
    }
}

impl T5Encoder {
    /// Loads the encoder from `model.safetensors` (an encoder-only or a full T5 checkpoint).
    pub fn load(config: &T5Config, weights: &Path, groups: &TrainGroups, device: &Device) -> Result<Self> {
        <Self as Arch>::load_checkpoint(config, weights, groups, device)
    }

    /// Random init in the spirit of T5's `_init_weights` (N(0, 0.02) for every matrix and
    /// the bias table, RMS norm weights 1). T5's own init scales each matrix by its fan-in;
    /// the fixed 0.02 keeps random rows comparable with the other backbones.
    pub fn random(config: &T5Config, groups: &TrainGroups, device: &Device, rng: &mut Rng) -> Result<Self> {
        let origin = crate::random_origin(config.num_layers, config.d_model, config.num_heads);
        Self::random_init(config, &|_| 0.02, origin, groups, device, rng)
    }

    /// The `[heads, t, t]` relative-position bias for `t` tokens.
    fn position_bias(&self, t: usize) -> candle_core::Result<Tensor> {
        let table = self.rel_bias.get();
        let c = &self.config;
        // Made once per length and bucketing and device: a constant, not a per-step upload.
        let key = format!(
            "t5-buckets:{t}:{}:{}",
            c.relative_attention_num_buckets, c.relative_attention_max_distance
        );
        let ids = fpt_nn::transfer::constant(key, table.device(), || {
            let buckets: Vec<u32> = (0..t)
                .flat_map(|i| (0..t).map(move |j| (i, j)))
                .map(|(i, j)| c.bucket(j as i64 - i as i64) as u32)
                .collect();
            fpt_nn::transfer::upload(buckets, t * t, table.device())
        })?;
        table
            .index_select(&ids, 0)?
            .reshape((t, t, self.config.num_heads))?
            .permute((2, 0, 1))
    }
}

impl Backbone for T5Encoder {
    fn architecture(&self) -> &'static str {
        "t5"
    }
    fn max_positions(&self) -> usize {
        usize::MAX
    }
    fn is_causal(&self) -> bool {
        false
    }

    fn forward(&self, embeds: &Tensor, ctx: &mut Ctx) -> candle_core::Result<Tensor> {
        let c = &self.config;
        let (_, t, width) = embeds.dims3()?;
        if width != c.d_model {
            candle_core::bail!("t5: input width {width} does not match d_model {}", c.d_model)
        }
        let drop = |ctx: &mut Ctx, x: &Tensor| {
            if self.common.dropout {
                ctx.dropout(x, c.dropout_rate)
            } else {
                Ok(x.clone())
            }
        };
        let bias = self.position_bias(t)?.unsqueeze(0)?; // [1, heads, t, t]
        let eps = c.layer_norm_epsilon;
        let nh = c.num_heads;
        let mut h = drop(ctx, embeds)?;
        for blk in &self.blocks {
            let x = rms_norm(&h, &blk.ln_attn.get(), eps)?;
            let (q, k, v) = (blk.q.forward(&x)?, blk.k.forward(&x)?, blk.v.forward(&x)?);
            // T5 does not scale scores by 1/sqrt(d_kv).
            let dropout = self.common.dropout.then_some(c.dropout_rate);
            let o = crate::attention(&q, &k, &v, nh, 1.0, ops::Mask::None, Some(&bias), ctx, dropout)?;
            h = (&h + drop(ctx, &blk.o.forward(&o)?)?)?;
            let x = rms_norm(&h, &blk.ln_ff.get(), eps)?;
            let m = drop(ctx, &blk.wi.forward(&x)?.relu()?)?;
            h = (&h + drop(ctx, &blk.wo.forward(&m)?)?)?;
        }
        match &self.final_ln {
            Some(w) => drop(ctx, &rms_norm(&h, &w.get(), eps)?),
            None => drop(ctx, &h),
        }
    }

    fn drop_final_norm(&mut self) -> Result<()> {
        self.final_ln = None;
        crate::drop_named(&mut self.common.named, "final_layer_norm.");
        Ok(())
    }

    fn config(&self) -> crate::Config {
        crate::Config::new(self.config.clone())
    }

    crate::backbone_common!(blocks, num_layers, d_model);
}

//! ViT (Dosovitskiy et al. 2021) as an FPT backbone, as the reference code uses it: the
//! patch embedding, class token and head are bypassed; the input embeddings get fpt's own
//! zero-initialised learned position table of 1024 positions (the checkpoint's 197-token
//! table is not used), then pre-LayerNorm blocks of bidirectional attention and a GELU MLP,
//! and the final `layernorm`.
//!
//! Follows Hugging Face `transformers`' `modeling_vit.py` (`ViTModel`'s encoder and final
//! norm). Checkpoint names: `embeddings.{cls_token, position_embeddings,
//! patch_embeddings.projection}` (unused), `encoder.layer.N.{layernorm_before,
//! attention.attention.{query,key,value}, attention.output.dense, layernorm_after,
//! intermediate.dense, output.dense}`, `layernorm`, `pooler.dense` (unused), with or
//! without a `vit.` prefix. fpt's position table is `fpt.position_embeddings.weight`.
//!
//! timm checkpoints (the reference code's `vit_base_patch16_224`; a `config.json` with an
//! `architecture` such as `vit_base_patch16_224` and no `model_type`) load too: their
//! `blocks.N.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}` and `norm` are mapped to
//! the names above, the fused `qkv` split into query, key and value (timm's LayerNorm eps
//! is 1e-6).

use crate::{role_by_rules, Arch, Backbone, BackboneError, Common, Naming, ParamSpec, ParamTaker, Result};
use candle_core::{DType, Device, Tensor};
use fpt_nn::{ops, Ctx, LayerNorm, Linear, Param, Rng};
use fpt_spec::{Role, ShapeOverrides, TrainGroups};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// Parameter roles by name, first match wins (lower-cased names).
pub const ROLE_RULES: &[(&str, Role)] = &[
    ("fpt.position_embeddings", Role::Positions),
    ("layernorm", Role::LayerNorm),
    ("attention", Role::Attention),
    ("intermediate", Role::FeedForward),
    ("output.dense", Role::FeedForward),
];

/// fpt's position table for ViT, as in the reference code: 1024 positions, zero init.
pub const FPT_POSITIONS: usize = 1024;

fn default_pdrop() -> f64 {
    0.0
}
fn default_act() -> String {
    "gelu".into()
}
fn default_true() -> bool {
    true
}
fn default_channels() -> usize {
    3
}

/// A ViT `config.json` (the fields this implementation reads).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VitConfig {
    /// Hidden width.
    pub hidden_size: usize,
    /// Blocks.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Image side (for the unused patch embedding's shape).
    pub image_size: usize,
    /// Patch side.
    pub patch_size: usize,
    /// Image channels.
    #[serde(default = "default_channels")]
    pub num_channels: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// Only `gelu` (exact) is supported.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Whether q, k, v have biases.
    #[serde(default = "default_true")]
    pub qkv_bias: bool,
    /// Dropout on sublayer outputs.
    #[serde(default = "default_pdrop")]
    pub hidden_dropout_prob: f64,
    /// Dropout on attention probabilities.
    #[serde(default = "default_pdrop")]
    pub attention_probs_dropout_prob: f64,
    /// `vit`.
    #[serde(default)]
    pub model_type: Option<String>,
    /// The checkpoint uses timm's names.
    #[serde(skip)]
    pub timm: bool,
}

impl VitConfig {
    /// Built-in config of `google/vit-base-patch16-224-in21k`.
    pub fn builtin(name: &str) -> Option<Self> {
        match name {
            "google/vit-base-patch16-224-in21k" | "vit-base" => Some(Self {
                hidden_size: 768,
                num_hidden_layers: 12,
                num_attention_heads: 12,
                intermediate_size: 3072,
                image_size: 224,
                patch_size: 16,
                num_channels: 3,
                layer_norm_eps: 1e-12,
                hidden_act: "gelu".into(),
                qkv_bias: true,
                hidden_dropout_prob: 0.0,
                attention_probs_dropout_prob: 0.0,
                model_type: Some("vit".into()),
                timm: false,
            }),
            _ => None,
        }
    }

    /// A timm `config.json`: `architecture` (`vit_{tiny,small,base,large}_patch{16,32}_{224,384}`,
    /// optionally with a `.tag`), overridden by `model_args` (`embed_dim`, `depth`,
    /// `num_heads`, `mlp_ratio`, `img_size`, `patch_size`) where present.
    pub fn from_timm_json(v: &serde_json::Value, path: &Path) -> Result<Self> {
        let bad = |msg: String| BackboneError::Config {
            path: path.to_path_buf(),
            msg,
        };
        let arch = v["architecture"]
            .as_str()
            .ok_or_else(|| bad("missing field `architecture`".into()))?;
        let base = arch.split('.').next().unwrap_or(arch);
        let parts: Vec<&str> = base.split('_').collect();
        let (width, depth, heads) = match parts.get(1).copied() {
            Some("tiny") => (192, 12, 3),
            Some("small") => (384, 12, 6),
            Some("base") => (768, 12, 12),
            Some("large") => (1024, 24, 16),
            _ => {
                return Err(bad(format!(
                    "timm architecture `{arch}` is not supported (vit_tiny/small/base/large_patchP_S)"
                )))
            }
        };
        let patch = parts
            .get(2)
            .and_then(|p| p.strip_prefix("patch"))
            .and_then(|p| p.parse().ok())
            .unwrap_or(16);
        let img = parts.get(3).and_then(|p| p.parse().ok()).unwrap_or(224);
        let a = &v["model_args"];
        let get = |k: &str, d: usize| a.get(k).and_then(|x| x.as_u64()).map_or(d, |x| x as usize);
        let hidden = get("embed_dim", width);
        let mlp_ratio = a.get("mlp_ratio").and_then(|x| x.as_f64()).unwrap_or(4.0);
        let cfg = Self {
            hidden_size: hidden,
            num_hidden_layers: get("depth", depth),
            num_attention_heads: get("num_heads", heads),
            intermediate_size: (hidden as f64 * mlp_ratio) as usize,
            image_size: get("img_size", img),
            patch_size: get("patch_size", patch),
            num_channels: 3,
            layer_norm_eps: 1e-6,
            hidden_act: "gelu".into(),
            qkv_bias: true,
            hidden_dropout_prob: 0.0,
            attention_probs_dropout_prob: 0.0,
            model_type: Some("vit".into()),
            timm: true,
        };
        cfg.validate().map_err(bad)?;
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
            ("image_size", c.image_size, MAX_POSITIONS),
            ("num_channels", c.num_channels, MAX_INPUT_WIDTH),
        ])?;
        if self.patch_size == 0 || !self.image_size.is_multiple_of(self.patch_size) {
            return Err(format!(
                "image_size {} is not a multiple of patch_size {}",
                self.image_size, self.patch_size
            ));
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
        if o.positions.is_some() {
            return Err(BackboneError::Unsupported(format!(
                "ViT's fpt position table has {FPT_POSITIONS} positions (a `positions` override does not apply)"
            )));
        }
        self.validate()
            .map_err(|m| BackboneError::Unsupported(format!("invalid ViT shape: {m}")))?;
        Ok(self)
    }

    fn tokens(&self) -> usize {
        (self.image_size / self.patch_size).pow(2) + 1
    }

    /// Every parameter with our `[out, in]` shapes; fpt's own position table first.
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        let (c, f, bias) = (self.hidden_size, self.intermediate_size, self.qkv_bias);
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
        push("fpt.position_embeddings.weight".into(), vec![FPT_POSITIONS, c], true);
        push("embeddings.cls_token".into(), vec![1, 1, c], false);
        push(
            "embeddings.position_embeddings".into(),
            vec![1, self.tokens(), c],
            false,
        );
        let p = self.patch_size;
        push(
            "embeddings.patch_embeddings.projection.weight".into(),
            vec![c, self.num_channels, p, p],
            false,
        );
        push("embeddings.patch_embeddings.projection.bias".into(), vec![c], false);
        for i in 0..self.num_hidden_layers {
            let p = format!("encoder.layer.{i}.");
            push(format!("{p}layernorm_before.weight"), vec![c], true);
            push(format!("{p}layernorm_before.bias"), vec![c], true);
            for n in ["query", "key", "value"] {
                push(format!("{p}attention.attention.{n}.weight"), vec![c, c], true);
                if bias {
                    push(format!("{p}attention.attention.{n}.bias"), vec![c], true);
                }
            }
            push(format!("{p}attention.output.dense.weight"), vec![c, c], true);
            push(format!("{p}attention.output.dense.bias"), vec![c], true);
            push(format!("{p}layernorm_after.weight"), vec![c], true);
            push(format!("{p}layernorm_after.bias"), vec![c], true);
            push(format!("{p}intermediate.dense.weight"), vec![f, c], true);
            push(format!("{p}intermediate.dense.bias"), vec![f], true);
            push(format!("{p}output.dense.weight"), vec![c, f], true);
            push(format!("{p}output.dense.bias"), vec![c], true);
        }
        push("layernorm.weight".into(), vec![c], true);
        push("layernorm.bias".into(), vec![c], true);
        v
    }
}

struct Layer {
    ln_before: LayerNorm,
    query: Linear,
    key: Linear,
    value: Linear,
    attn_out: Linear,
    ln_after: LayerNorm,
    intermediate: Linear,
    output: Linear,
}

/// A ViT backbone.
pub struct Vit {
    config: VitConfig,
    positions: Param,
    layers: Vec<Layer>,
    /// `None` after [`Backbone::drop_final_norm`].
    ln: Option<LayerNorm>,
    common: Common,
}

/// ViT's entry in [`crate::ARCHITECTURES`].
pub const REGISTRATION: crate::Registration = crate::Registration {
    names: &["ViT"],
    model_types: &["vit"],
    builtin: |name| VitConfig::builtin(name).map(crate::Config::new),
    read: |v, text, path| match crate::model_type(v) {
        Some("vit") => Some(VitConfig::from_json(text, path).map(crate::Config::new)),
        // timm checkpoints name their architecture instead.
        None if v
            .get("architecture")
            .and_then(|a| a.as_str())
            .is_some_and(|a| a.starts_with("vit_")) =>
        {
            Some(VitConfig::from_timm_json(v, path).map(crate::Config::new))
        }
        _ => None,
    },
    gguf: None,
};

impl crate::ArchConfig for VitConfig {
    crate::arch_config_common!(VitConfig, Vit, |c| (
        c.num_hidden_layers,
        c.num_attention_heads,
        c.hidden_size
    ));

    fn architecture(&self) -> &'static str {
        "vit"
    }

    fn summary(&self) -> String {
        let c = self;
        format!(
            "vit: {} layers, hidden {}, {} heads, mlp {}, fpt's {} zero-init positions (patch embedding, class token, head bypassed), bidirectional, eps {:e}",
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.intermediate_size,
            FPT_POSITIONS,
            c.layer_norm_eps
        )
    }
}

impl Arch for Vit {
    type Config = VitConfig;
    const NAMING: Naming = Naming {
        prefixes: &["vit."],
        quiet: &["classifier.", "pooler."],
        ..Naming::PLAIN
    };
    const ROLE_RULES: &'static [(&'static str, Role)] = ROLE_RULES;

    fn specs(config: &Self::Config) -> Vec<ParamSpec> {
        config.param_specs()
    }

    fn assemble(config: &VitConfig, mut t: ParamTaker, origin: String) -> candle_core::Result<Self> {
        let eps = config.layer_norm_eps;
        let positions = t.take("fpt.position_embeddings.weight".into())?;
        let qkv = |t: &mut ParamTaker, prefix: String| -> candle_core::Result<Linear> {
            if config.qkv_bias {
                t.linear(&prefix)
            } else {
                Ok(Linear::new(t.weight(format!("{prefix}.weight"))?, None))
            }
        };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{i}.");
            layers.push(Layer {
                ln_before: t.layer_norm(&format!("{p}layernorm_before"), eps)?,
                query: qkv(&mut t, format!("{p}attention.attention.query"))?,
                key: qkv(&mut t, format!("{p}attention.attention.key"))?,
                value: qkv(&mut t, format!("{p}attention.attention.value"))?,
                attn_out: t.linear(&format!("{p}attention.output.dense"))?,
                ln_after: t.layer_norm(&format!("{p}layernorm_after"), eps)?,
                intermediate: t.linear(&format!("{p}intermediate.dense"))?,
                output: t.linear(&format!("{p}output.dense"))?,
            });
        }
        let ln = t.layer_norm("layernorm", eps)?;
        Ok(Self {
            config: config.clone(),
            positions,
            layers,
            ln: Some(ln),
            common: t.finish(origin),
        })
    }

    /// The checkpoint's tensors under fpt's names (HF or timm), every one checked, plus
    /// fpt's zero position table.
    fn read(config: &VitConfig, weights: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
        let specs: Vec<ParamSpec> = config
            .param_specs()
            .into_iter()
            .filter(|s| !s.name.starts_with("fpt."))
            .collect();
        let mut tensors = if config.timm {
            Self::read_timm(config, weights, device)?
        } else {
            crate::read_checked(weights, &specs, &Self::NAMING, device)?
        };
        tensors.insert(
            "fpt.position_embeddings.weight".into(),
            Tensor::zeros((FPT_POSITIONS, config.hidden_size), DType::F32, device)?,
        );
        Ok(tensors)
    }
}

impl Vit {
    /// Loads `model.safetensors`; fpt's position table starts at zero.
    pub fn load(config: &VitConfig, weights: &Path, groups: &TrainGroups, device: &Device) -> Result<Self> {
        <Self as Arch>::load_checkpoint(config, weights, groups, device)
    }

    /// Reads a timm checkpoint, checked, under the HF names.
    fn read_timm(config: &VitConfig, weights: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
        let (c, f) = (config.hidden_size, config.intermediate_size);
        let spec = |name: String, shape: Vec<usize>| ParamSpec {
            name,
            shape,
            role: Role::Other,
            used: true,
        };
        let mut specs = vec![spec("norm.weight".into(), vec![c]), spec("norm.bias".into(), vec![c])];
        for i in 0..config.num_hidden_layers {
            let b = format!("blocks.{i}.");
            for (n, shape) in [
                ("norm1.weight", vec![c]),
                ("norm1.bias", vec![c]),
                ("attn.qkv.weight", vec![3 * c, c]),
                ("attn.qkv.bias", vec![3 * c]),
                ("attn.proj.weight", vec![c, c]),
                ("attn.proj.bias", vec![c]),
                ("norm2.weight", vec![c]),
                ("norm2.bias", vec![c]),
                ("mlp.fc1.weight", vec![f, c]),
                ("mlp.fc1.bias", vec![f]),
                ("mlp.fc2.weight", vec![c, f]),
                ("mlp.fc2.bias", vec![c]),
            ] {
                specs.push(spec(format!("{b}{n}"), shape));
            }
        }
        let timm = Naming {
            quiet: &["cls_token", "pos_embed", "patch_embed.", "head.", "fc_norm."],
            ..Naming::PLAIN
        };
        let mut t = crate::read_checked(weights, &specs, &timm, device)?;
        let mut out = HashMap::new();
        let mut take = |from: String, to: String| {
            let x = t.remove(&from).expect("checked above");
            out.insert(to, x);
        };
        take("norm.weight".into(), "layernorm.weight".into());
        take("norm.bias".into(), "layernorm.bias".into());
        for i in 0..config.num_hidden_layers {
            let (b, h) = (format!("blocks.{i}."), format!("encoder.layer.{i}."));
            for (from, to) in [
                ("norm1", "layernorm_before"),
                ("attn.proj", "attention.output.dense"),
                ("norm2", "layernorm_after"),
                ("mlp.fc1", "intermediate.dense"),
                ("mlp.fc2", "output.dense"),
            ] {
                for p in ["weight", "bias"] {
                    take(format!("{b}{from}.{p}"), format!("{h}{to}.{p}"));
                }
            }
        }
        for i in 0..config.num_hidden_layers {
            let (b, h) = (format!("blocks.{i}."), format!("encoder.layer.{i}."));
            let w = t.remove(&format!("{b}attn.qkv.weight")).expect("checked above");
            let bias = t.remove(&format!("{b}attn.qkv.bias")).expect("checked above");
            for (k, n) in ["query", "key", "value"].iter().enumerate() {
                out.insert(
                    format!("{h}attention.attention.{n}.weight"),
                    w.narrow(0, k * c, c)?.contiguous()?,
                );
                out.insert(
                    format!("{h}attention.attention.{n}.bias"),
                    bias.narrow(0, k * c, c)?.contiguous()?,
                );
            }
        }
        Ok(out)
    }

    /// Random init: weights N(0, 0.02), biases 0, LayerNorm 1/0, fpt's positions 0.
    pub fn random(config: &VitConfig, groups: &TrainGroups, device: &Device, rng: &mut Rng) -> Result<Self> {
        // fpt's position table starts at 0 (drawn with std 0: the generator advances as for
        // any other tensor).
        let std = |n: &str| if n.starts_with("fpt.") { 0.0 } else { 0.02 };
        let c = config;
        let origin = crate::random_origin(c.num_hidden_layers, c.hidden_size, c.num_attention_heads);
        Self::random_init(config, &std, origin, groups, device, rng)
    }
}

impl Backbone for Vit {
    fn architecture(&self) -> &'static str {
        "vit"
    }
    fn max_positions(&self) -> usize {
        FPT_POSITIONS
    }
    fn is_causal(&self) -> bool {
        false
    }

    fn forward(&self, embeds: &Tensor, ctx: &mut Ctx) -> candle_core::Result<Tensor> {
        let c = &self.config;
        let t = crate::check_embeds(self, embeds)?;
        let drop = |ctx: &mut Ctx, x: &Tensor, p: f64| {
            if self.common.dropout {
                ctx.dropout(x, p)
            } else {
                Ok(x.clone())
            }
        };
        let mut h = drop(
            ctx,
            &embeds.broadcast_add(&self.positions.get().narrow(0, 0, t)?)?,
            c.hidden_dropout_prob,
        )?;
        let (nh, hd) = (c.num_attention_heads, c.hidden_size / c.num_attention_heads);
        for l in &self.layers {
            let x = l.ln_before.forward(&h)?;
            let (q, k, v) = (l.query.forward(&x)?, l.key.forward(&x)?, l.value.forward(&x)?);
            let dropout = self.common.dropout.then_some(c.attention_probs_dropout_prob);
            let o = crate::attention(
                &q,
                &k,
                &v,
                nh,
                1.0 / (hd as f64).sqrt(),
                ops::Mask::None,
                None,
                ctx,
                dropout,
            )?;
            h = (drop(ctx, &l.attn_out.forward(&o)?, c.hidden_dropout_prob)? + &h)?;
            let x = l.ln_after.forward(&h)?;
            let m = ops::gelu_erf(&l.intermediate.forward(&x)?)?;
            h = (drop(ctx, &l.output.forward(&m)?, c.hidden_dropout_prob)? + &h)?;
        }
        match &self.ln {
            Some(ln) => ln.forward(&h),
            None => Ok(h),
        }
    }

    fn drop_final_norm(&mut self) -> Result<()> {
        self.ln = None;
        crate::drop_named(&mut self.common.named, "layernorm.");
        Ok(())
    }

    fn config(&self) -> crate::Config {
        crate::Config::new(self.config.clone())
    }

    crate::backbone_common!(layers, num_hidden_layers, hidden_size);
}

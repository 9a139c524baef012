//! GPT-2 (Radford et al. 2019) as an FPT backbone: learned positions added to the input
//! embeddings, pre-LayerNorm blocks of causal self-attention and a `gelu_new` MLP, the
//! three GPT-2 dropouts (embedding, attention, residual), and the final `ln_f`.
//!
//! Follows Hugging Face `transformers`' `modeling_gpt2.py` (`GPT2Model` called with
//! `inputs_embeds` and no attention mask, as the FPT reference code does). Checkpoints use
//! the Hub's tensor names (`wte`, `wpe`, `h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2,
//! mlp.c_fc, mlp.c_proj}`, `ln_f`), with or without a `transformer.` prefix; their Conv1D
//! weights are `[in, out]` and are transposed to `[out, in]` on load (and back on save).

use crate::{role_by_rules, Arch, Backbone, BackboneError, Common, Naming, ParamSpec, ParamTaker, Result};
use candle_core::{Device, Tensor};
use fpt_nn::{ops, BranchMid, Ctx, LayerNorm, Linear, NormAt, Param, ResidualBranch, Rng};
use fpt_spec::{ResidualInit, Role, ShapeOverrides, TrainGroups};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The reference code's freezing rule for GPT-2 names, first match wins.
pub const ROLE_RULES: &[(&str, Role)] = &[
    ("ln", Role::LayerNorm),
    ("wpe", Role::Positions),
    ("mlp", Role::FeedForward),
    ("attn", Role::Attention),
];

fn default_true() -> bool {
    true
}
fn default_act() -> String {
    "gelu_new".into()
}
fn default_pdrop() -> f64 {
    0.1
}

/// A GPT-2 `config.json` (the fields this implementation reads).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpt2Config {
    /// Token vocabulary size (the `wte` table; unused with input embeddings).
    pub vocab_size: usize,
    /// Size of the learned position table.
    pub n_positions: usize,
    /// Hidden width.
    pub n_embd: usize,
    /// Number of blocks.
    pub n_layer: usize,
    /// Attention heads.
    pub n_head: usize,
    /// MLP width; `null` means 4 * n_embd.
    #[serde(default)]
    pub n_inner: Option<usize>,
    /// MLP activation; only `gelu_new` (alias `gelu_pytorch_tanh`) is supported.
    #[serde(default = "default_act")]
    pub activation_function: String,
    /// Residual dropout.
    #[serde(default = "default_pdrop")]
    pub resid_pdrop: f64,
    /// Embedding dropout.
    #[serde(default = "default_pdrop")]
    pub embd_pdrop: f64,
    /// Attention-probability dropout.
    #[serde(default = "default_pdrop")]
    pub attn_pdrop: f64,
    /// LayerNorm epsilon.
    pub layer_norm_epsilon: f64,
    /// Divide attention scores by sqrt(head_dim).
    #[serde(default = "default_true")]
    pub scale_attn_weights: bool,
    /// Also divide attention scores by (layer index + 1).
    #[serde(default)]
    pub scale_attn_by_inverse_layer_idx: bool,
    /// Always `gpt2`.
    #[serde(default)]
    pub model_type: Option<String>,
}

impl Gpt2Config {
    /// The config of a Hub GPT-2 size (`gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl`),
    /// built in so random-init runs need no files.
    pub fn builtin(name: &str) -> Option<Self> {
        let (n_layer, n_embd, n_head) = match name {
            "gpt2" | "openai-community/gpt2" => (12, 768, 12),
            "gpt2-medium" | "openai-community/gpt2-medium" => (24, 1024, 16),
            "gpt2-large" | "openai-community/gpt2-large" => (36, 1280, 20),
            "gpt2-xl" | "openai-community/gpt2-xl" => (48, 1600, 25),
            _ => return None,
        };
        Some(Self {
            vocab_size: 50257,
            n_positions: 1024,
            n_embd,
            n_layer,
            n_head,
            n_inner: None,
            activation_function: "gelu_new".into(),
            resid_pdrop: 0.1,
            embd_pdrop: 0.1,
            attn_pdrop: 0.1,
            layer_norm_epsilon: 1e-5,
            scale_attn_weights: true,
            scale_attn_by_inverse_layer_idx: false,
            model_type: Some("gpt2".into()),
        })
    }

    /// Reads and checks a `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| BackboneError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text, path)
    }

    /// Parses and checks a `config.json` text (`path` names it in errors).
    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        crate::parse_config(text, path, Self::validate)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        if let Some(t) = &self.model_type {
            if t != "gpt2" {
                return Err(format!("model_type is `{t}`, this loader reads `gpt2`"));
            }
        }
        use fpt_spec::limits::*;
        crate::check_sizes(&[
            ("n_embd", self.n_embd, MAX_HIDDEN),
            ("n_layer", self.n_layer, MAX_LAYERS),
            ("n_head", self.n_head, MAX_HEADS),
            ("n_positions", self.n_positions, MAX_POSITIONS),
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            ("n_inner", self.inner(), MAX_FFN),
        ])?;
        crate::check_heads(("n_embd", self.n_embd), ("n_head", self.n_head))?;
        if !matches!(self.activation_function.as_str(), "gelu_new" | "gelu_pytorch_tanh") {
            return Err(format!(
                "activation_function `{}` is not supported (gelu_new only)",
                self.activation_function
            ));
        }
        Ok(())
    }

    /// Applies shape overrides (random init).
    pub fn with_overrides(mut self, o: &ShapeOverrides) -> Result<Self> {
        if let Some(l) = o.layers {
            self.n_layer = l;
        }
        if let Some(h) = o.hidden {
            self.n_embd = h;
            self.n_inner = None;
        }
        if let Some(h) = o.heads {
            self.n_head = h;
        }
        if let Some(p) = o.positions {
            self.n_positions = p;
        }
        if let Some(v) = o.vocab {
            self.vocab_size = v;
        }
        self.validate()
            .map_err(|m| BackboneError::Unsupported(format!("invalid GPT-2 shape: {m}")))?;
        Ok(self)
    }

    /// MLP width.
    pub fn inner(&self) -> usize {
        self.n_inner.unwrap_or(4 * self.n_embd)
    }

    /// Every parameter, in checkpoint order, with our `[out, in]` shapes.
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        let (c, f) = (self.n_embd, self.inner());
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
        push("wte.weight".into(), vec![self.vocab_size, c], false);
        push("wpe.weight".into(), vec![self.n_positions, c], true);
        for i in 0..self.n_layer {
            let p = format!("h.{i}.");
            push(format!("{p}ln_1.weight"), vec![c], true);
            push(format!("{p}ln_1.bias"), vec![c], true);
            push(format!("{p}attn.c_attn.weight"), vec![3 * c, c], true);
            push(format!("{p}attn.c_attn.bias"), vec![3 * c], true);
            push(format!("{p}attn.c_proj.weight"), vec![c, c], true);
            push(format!("{p}attn.c_proj.bias"), vec![c], true);
            push(format!("{p}ln_2.weight"), vec![c], true);
            push(format!("{p}ln_2.bias"), vec![c], true);
            push(format!("{p}mlp.c_fc.weight"), vec![f, c], true);
            push(format!("{p}mlp.c_fc.bias"), vec![f], true);
            push(format!("{p}mlp.c_proj.weight"), vec![c, f], true);
            push(format!("{p}mlp.c_proj.bias"), vec![c], true);
        }
        push("ln_f.weight".into(), vec![c], true);
        push("ln_f.bias".into(), vec![c], true);
        v
    }
}

/// Whether a checkpoint tensor is a Conv1D weight stored `[in, out]`.
fn is_conv1d_weight(name: &str) -> bool {
    name.ends_with(".weight") && (name.contains(".c_attn.") || name.contains(".c_proj.") || name.contains(".c_fc."))
}

struct Block {
    ln_1: LayerNorm,
    c_attn: Linear,
    attn_proj: Linear,
    ln_2: LayerNorm,
    c_fc: Linear,
    mlp_proj: Linear,
}

/// A GPT-2 backbone.
pub struct Gpt2 {
    config: Gpt2Config,
    wpe: Param,
    blocks: Vec<Block>,
    /// `None` after [`Backbone::drop_final_norm`].
    ln_f: Option<LayerNorm>,
    common: Common,
}

/// GPT-2's entry in [`crate::ARCHITECTURES`].
pub const REGISTRATION: crate::Registration = crate::Registration {
    names: &["GPT-2"],
    model_types: &["gpt2"],
    builtin: |name| Gpt2Config::builtin(name).map(crate::Config::new),
    read: |v, text, path| {
        (crate::model_type(v) == Some("gpt2")).then(|| Gpt2Config::from_json(text, path).map(crate::Config::new))
    },
    gguf: None,
};

impl crate::ArchConfig for Gpt2Config {
    crate::arch_config_common!(Gpt2Config, Gpt2, |c| (c.n_layer, c.n_head, c.n_embd), custom random);

    fn architecture(&self) -> &'static str {
        "gpt2"
    }

    fn summary(&self) -> String {
        format!(
            "gpt2: {} layers, hidden {}, {} heads, mlp {}, {} positions, causal, eps {:e}",
            self.n_layer,
            self.n_embd,
            self.n_head,
            self.inner(),
            self.n_positions,
            self.layer_norm_epsilon
        )
    }

    fn random(
        &self,
        spec: &fpt_spec::BackboneSpec,
        groups: &TrainGroups,
        device: &Device,
        rng: &mut Rng,
    ) -> Result<Box<dyn Backbone>> {
        Ok(Box::new(Gpt2::random(self, spec.residual_init, groups, device, rng)?))
    }

    fn saved_as(&self) -> Option<crate::SavedAs> {
        Some(crate::SavedAs {
            model_type: "gpt2",
            class: "GPT2Model",
            naming: Gpt2::NAMING,
        })
    }
}

impl Arch for Gpt2 {
    type Config = Gpt2Config;
    const NAMING: Naming = Naming {
        prefixes: &["transformer."],
        alias: str::to_string,
        transposed: is_conv1d_weight,
        quiet: &[".attn.bias", ".attn.masked_bias", "lm_head."],
    };
    const ROLE_RULES: &'static [(&'static str, Role)] = ROLE_RULES;

    fn specs(config: &Self::Config) -> Vec<ParamSpec> {
        config.param_specs()
    }

    fn assemble(config: &Gpt2Config, mut t: ParamTaker, origin: String) -> candle_core::Result<Self> {
        let eps = config.layer_norm_epsilon;
        let wpe = t.take("wpe.weight".into())?;
        let mut blocks = Vec::with_capacity(config.n_layer);
        for i in 0..config.n_layer {
            let p = format!("h.{i}.");
            blocks.push(Block {
                ln_1: t.layer_norm(&format!("{p}ln_1"), eps)?,
                c_attn: t.linear(&format!("{p}attn.c_attn"))?,
                attn_proj: t.linear(&format!("{p}attn.c_proj"))?,
                ln_2: t.layer_norm(&format!("{p}ln_2"), eps)?,
                c_fc: t.linear(&format!("{p}mlp.c_fc"))?,
                mlp_proj: t.linear(&format!("{p}mlp.c_proj"))?,
            });
        }
        let ln_f = t.layer_norm("ln_f", eps)?;
        Ok(Self {
            config: config.clone(),
            wpe,
            blocks,
            ln_f: Some(ln_f),
            common: t.finish(origin),
        })
    }
}

impl Gpt2 {
    /// Loads `model.safetensors` (f32, f16 or bf16; converted to f32), checking that every
    /// tensor the config implies is present with its shape. `wte` is shape-checked but not
    /// loaded (FPT feeds input embeddings).
    pub fn load(config: &Gpt2Config, weights: &Path, groups: &TrainGroups, device: &Device) -> Result<Self> {
        <Self as Arch>::load_checkpoint(config, weights, groups, device)
    }

    /// GPT-2's default random init: weights N(0, 0.02), biases 0, LayerNorm 1/0; with
    /// [`ResidualInit::Scaled`] the `c_proj` weights use std 0.02 / sqrt(2 * n_layer).
    pub fn random(
        config: &Gpt2Config,
        residual: ResidualInit,
        groups: &TrainGroups,
        device: &Device,
        rng: &mut Rng,
    ) -> Result<Self> {
        let proj_std = match residual {
            ResidualInit::Scaled => 0.02 / (2.0 * config.n_layer as f64).sqrt(),
            ResidualInit::Unscaled => 0.02,
        };
        let std = |n: &str| if n.ends_with("c_proj.weight") { proj_std } else { 0.02 };
        let origin = format!(
            "random init ({} c_proj, {} layers x {} wide x {} heads)",
            match residual {
                ResidualInit::Scaled => "scaled",
                ResidualInit::Unscaled => "unscaled",
            },
            config.n_layer,
            config.n_embd,
            config.n_head
        );
        Self::random_init(config, &std, origin, groups, device, rng)
    }

    /// The config this model was built from.
    pub fn config(&self) -> &Gpt2Config {
        &self.config
    }

    /// Positions, dropout and the blocks; with `last = Some(n)` the last block (and the
    /// final norm) runs for the last `n` positions only.
    fn run(&self, embeds: &Tensor, ctx: &mut Ctx, last: Option<usize>) -> candle_core::Result<Tensor> {
        let t = crate::check_embeds(self, embeds)?;
        let pos = self.wpe.get().narrow(0, 0, t)?;
        let mut h = embeds.broadcast_add(&pos)?;
        if self.common.dropout {
            h = ctx.dropout(&h, self.config.embd_pdrop)?;
        }
        let n = self.blocks.len();
        for (i, b) in self.blocks.iter().enumerate() {
            h = self.block_forward(i, b, &h, ctx, last.filter(|_| i + 1 == n))?;
        }
        match &self.ln_f {
            Some(ln) => ln.forward(&h),
            None => Ok(h),
        }
    }

    /// Block `i`; with `last = Some(n)`, only the last `n` positions come out (attention
    /// queries, projection and feed-forward run on those; all positions are keys/values).
    fn block_forward(
        &self,
        i: usize,
        b: &Block,
        h: &Tensor,
        ctx: &mut Ctx,
        last: Option<usize>,
    ) -> candle_core::Result<Tensor> {
        let c = &self.config;
        let width = h.dim(2)?;
        let (nh, hd) = (c.n_head, width / c.n_head);
        // The residual dropout's (p, seed), drawn where `Ctx::dropout_add` would draw it.
        let resid = |ctx: &mut Ctx| {
            (self.common.dropout && ctx.train && c.resid_pdrop > 0.0).then(|| (c.resid_pdrop, ctx.rng.next_u64()))
        };
        let mut scale = if c.scale_attn_weights {
            1.0 / (hd as f64).sqrt()
        } else {
            1.0
        };
        if c.scale_attn_by_inverse_layer_idx {
            scale /= (i + 1) as f64;
        }
        let dropout = self.common.dropout.then_some(c.attn_pdrop);

        let h = if last.is_none() && ctx.attention.is_none() {
            // The attention half as one branch (fused when its layers are frozen).
            let spec = crate::attention_spec(nh, scale, ops::Mask::Causal, ctx, dropout);
            let branch = ResidualBranch {
                norm: &b.ln_1,
                norm_at: NormAt::Input,
                input: &b.c_attn,
                mid: BranchMid::Attention(spec),
                output: &b.attn_proj,
            };
            let r = resid(ctx);
            branch.forward(h, r)?
        } else {
            let a = b.ln_1.forward(h)?;
            let qkv = b.c_attn.forward(&a)?; // [b, t, 3c]
            let o = crate::attention_packed(&qkv, nh, scale, ops::Mask::Causal, ctx, dropout, last)?;
            let h = match last {
                Some(n) => h.narrow(1, h.dim(1)? - n, n)?,
                None => h.clone(),
            };
            let o = b.attn_proj.forward(&o)?;
            // h + dropout(branch), fused (the mask is redrawn in backward, not stored).
            match resid(ctx) {
                Some((p, seed)) => ops::dropout_add(&h, &o, p, seed)?,
                None => (h + o)?,
            }
        };
        let branch = ResidualBranch {
            norm: &b.ln_2,
            norm_at: NormAt::Input,
            input: &b.c_fc,
            mid: BranchMid::GeluNew,
            output: &b.mlp_proj,
        };
        let r = resid(ctx);
        branch.forward(&h, r)
    }
}

impl Backbone for Gpt2 {
    fn architecture(&self) -> &'static str {
        "gpt2"
    }
    fn max_positions(&self) -> usize {
        self.config.n_positions
    }
    fn is_causal(&self) -> bool {
        true
    }

    fn forward(&self, embeds: &Tensor, ctx: &mut Ctx) -> candle_core::Result<Tensor> {
        self.run(embeds, ctx, None)
    }

    fn forward_last(&self, embeds: &Tensor, ctx: &mut Ctx, last: usize) -> candle_core::Result<Tensor> {
        let t = crate::check_embeds(self, embeds)?;
        // Recording attention maps needs every query; degenerate requests need no care.
        if ctx.attention.is_some() || last == 0 || last >= t {
            let h = self.run(embeds, ctx, None)?;
            return h.narrow(1, t.saturating_sub(last), last.min(t));
        }
        self.run(embeds, ctx, Some(last))
    }

    fn drop_final_norm(&mut self) -> Result<()> {
        self.ln_f = None;
        crate::drop_named(&mut self.common.named, "ln_f.");
        Ok(())
    }

    fn config(&self) -> crate::Config {
        crate::Config::new(self.config.clone())
    }

    crate::backbone_common!(blocks, n_layer, n_embd);
}

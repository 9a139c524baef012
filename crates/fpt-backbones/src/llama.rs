//! Llama-family decoders (Llama, Mistral, Qwen2; SmolLM2) as FPT backbones: RMSNorm,
//! rotary positions on queries and keys, grouped-query causal attention, a SwiGLU
//! feed-forward, the final RMSNorm.
//!
//! Follows Hugging Face `transformers`' `modeling_llama.py` (`LlamaModel` called with
//! `inputs_embeds`). Weights come from a `config.json` + safetensors with the Hub's names
//! (`model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
//! mlp.{gate,up,down}_proj}`, `model.norm`), or from a GGUF file (llama.cpp's names,
//! `blk.N.attn_q` ...; its query and key rows permuted back from llama.cpp's rotary layout,
//! as `transformers`' GGUF loader does), dequantized to f32.
//!
//! Rotary positions have no table to train, so fpt adds its own learned position table
//! (`fpt.position_embeddings`, [`FPT_POSITIONS`] rows, N(0, 0.02) like GPT-2's `wpe`) to the input
//! embeddings: the positions group trains it, as the reference code trains ViT's. Its init
//! is not zero: with a zero table and the zero-bias input layer, an all-zero input row
//! (MNIST's blank patches) would enter the first RMSNorm as an exact zero vector.

use crate::{role_by_rules, Arch, Backbone, BackboneError, Common, Naming, ParamSpec, ParamTaker, Result};
use candle_core::{Device, Tensor};
use fpt_nn::{Ctx, Linear, Param, Rng};
use fpt_spec::{Role, ShapeOverrides, TrainGroups};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// Rows of fpt's learned position table.
pub const FPT_POSITIONS: usize = 1024;

/// The FPT groups of Llama-family names, first match wins (RMSNorm scales are the
/// LayerNorm group).
pub const ROLE_RULES: &[(&str, Role)] = &[
    ("norm", Role::LayerNorm),
    ("position_embeddings", Role::Positions),
    ("mlp", Role::FeedForward),
    ("self_attn", Role::Attention),
];

/// SmolLM2-135M on the Hub (the id its cache entry is kept under).
pub const SMOLLM2_NAMES: &[&str] = &[
    "smollm2",
    "HuggingFaceTB/SmolLM2-135M",
    "HuggingFaceTB/SmolLM2-135M-Instruct",
];

fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    10000.0
}
fn default_act() -> String {
    "silu".into()
}
fn default_positions() -> usize {
    2048
}

/// A Llama-family `config.json` (the fields this implementation reads).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    /// Token vocabulary (the unused `embed_tokens` table).
    pub vocab_size: usize,
    /// Hidden width.
    pub hidden_size: usize,
    /// SwiGLU width.
    pub intermediate_size: usize,
    /// Blocks.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); `null`: as many as query heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Width of a head; `null`: hidden / heads.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Rotary base.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// Rotary scaling; only `null` (plain RoPE) is supported.
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// transformers 5's form of the rotary settings (`{"rope_theta": ..., "rope_type":
    /// "default"}`); read into `rope_theta`, and only the default type is supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<serde_json::Value>,
    /// The checkpoint's context length (fpt's table has [`FPT_POSITIONS`] rows).
    #[serde(default = "default_positions")]
    pub max_position_embeddings: usize,
    /// Only `silu` is supported.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Biases on q, k, v and o (Llama's `attention_bias`).
    #[serde(default)]
    pub attention_bias: bool,
    /// Biases on the feed-forward projections.
    #[serde(default)]
    pub mlp_bias: bool,
    /// `llama`, `mistral` or `qwen2` (Qwen2: biases on q, k and v only).
    #[serde(default)]
    pub model_type: Option<String>,
    /// Mistral's sliding window; inputs longer than it are refused.
    #[serde(default)]
    pub sliding_window: Option<usize>,
}

impl LlamaConfig {
    /// SmolLM2-135M's config (`smollm2`), built in so random-init runs need no files.
    pub fn builtin(name: &str) -> Option<Self> {
        SMOLLM2_NAMES.contains(&name).then(|| Self {
            vocab_size: 49152,
            hidden_size: 576,
            intermediate_size: 1536,
            num_hidden_layers: 30,
            num_attention_heads: 9,
            num_key_value_heads: Some(3),
            head_dim: None,
            rms_norm_eps: 1e-5,
            rope_theta: 100000.0,
            rope_scaling: None,
            rope_parameters: None,
            max_position_embeddings: 8192,
            hidden_act: "silu".into(),
            attention_bias: false,
            mlp_bias: false,
            model_type: Some("llama".into()),
            sliding_window: None,
        })
    }

    /// Parses and checks a `config.json` text (`path` names it in errors).
    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        let mut c: Self = crate::parse_config(text, path, |_: &Self| Ok(()))?;
        let bad = |msg: String| BackboneError::Config {
            path: path.to_path_buf(),
            msg,
        };
        if let Some(p) = c.rope_parameters.take() {
            match p.get("rope_type").and_then(|t| t.as_str()) {
                None | Some("default") => {}
                Some(t) => {
                    return Err(bad(format!(
                        "rope_parameters.rope_type `{t}` is not supported (default only)"
                    )))
                }
            }
            if let Some(theta) = p.get("rope_theta") {
                c.rope_theta = theta
                    .as_f64()
                    .ok_or_else(|| bad(format!("rope_parameters.rope_theta is {theta}, not a number")))?;
            }
        }
        c.validate().map_err(bad)?;
        Ok(c)
    }

    /// The config in a GGUF file's metadata (`llama.*` keys; the vocabulary from the token
    /// table's shape).
    pub fn from_gguf(file: &crate::gguf::GgufFile) -> Result<Self> {
        let arch = file.architecture().unwrap_or("llama").to_string();
        let key = |k: &str| format!("{arch}.{k}");
        let heads = file.need(&key("attention.head_count"))?;
        let hidden = file.need(&key("embedding_length"))?;
        let vocab = match file.shape("token_embd.weight") {
            Some(s) if s.len() == 2 => s[0],
            _ => file.need(&key("vocab_size"))?,
        };
        let c = Self {
            vocab_size: vocab,
            hidden_size: hidden,
            intermediate_size: file.need(&key("feed_forward_length"))?,
            num_hidden_layers: file.need(&key("block_count"))?,
            num_attention_heads: heads,
            num_key_value_heads: file.usize(&key("attention.head_count_kv"))?,
            head_dim: file
                .usize(&key("attention.key_length"))?
                .filter(|&d| d != hidden / heads.max(1)),
            rms_norm_eps: file.f64(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
            rope_theta: file.f64(&key("rope.freq_base"))?.unwrap_or(10000.0),
            rope_scaling: None,
            rope_parameters: None,
            max_position_embeddings: file.usize(&key("context_length"))?.unwrap_or(2048),
            hidden_act: "silu".into(),
            attention_bias: false,
            mlp_bias: false,
            model_type: Some("llama".into()),
            sliding_window: None,
        };
        c.validate().map_err(|msg| BackboneError::Config {
            path: file.path().to_path_buf(),
            msg,
        })?;
        Ok(c)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        use fpt_spec::limits::*;
        if let Some(t) = self.model_type.as_deref() {
            if !matches!(t, "llama" | "mistral" | "qwen2") {
                return Err(format!(
                    "model_type is `{t}`, this loader reads llama, mistral and qwen2"
                ));
            }
        }
        crate::check_sizes(&[
            ("hidden_size", self.hidden_size, MAX_HIDDEN),
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            ("num_attention_heads", self.num_attention_heads, MAX_HEADS),
            ("num_key_value_heads", self.kv_heads(), MAX_HEADS),
            ("intermediate_size", self.intermediate_size, MAX_FFN),
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            ("head_dim", self.head_dim(), MAX_HIDDEN),
        ])?;
        if self.head_dim.is_none() {
            crate::check_heads(
                ("hidden_size", self.hidden_size),
                ("num_attention_heads", self.num_attention_heads),
            )?;
        }
        if !self.num_attention_heads.is_multiple_of(self.kv_heads()) {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.kv_heads()
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(format!(
                "head_dim {} is odd (rotary positions rotate pairs)",
                self.head_dim()
            ));
        }
        if self.hidden_act != "silu" {
            return Err(format!("hidden_act `{}` is not supported (silu only)", self.hidden_act));
        }
        if self.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return Err("rope_scaling is not supported (plain rotary positions only)".into());
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return Err(format!(
                "rope_theta {} must be a finite number above 1",
                self.rope_theta
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(format!(
                "rms_norm_eps {} must be a finite non-negative number",
                self.rms_norm_eps
            ));
        }
        Ok(())
    }

    /// Applies shape overrides (random init); `positions` does not apply (fpt's table has
    /// [`FPT_POSITIONS`] rows).
    pub fn with_overrides(mut self, o: &ShapeOverrides) -> Result<Self> {
        if o.positions.is_some() {
            return Err(BackboneError::Unsupported(format!(
                "a Llama-family backbone's fpt position table has {FPT_POSITIONS} rows (a `positions` override does not apply)"
            )));
        }
        if let Some(l) = o.layers {
            self.num_hidden_layers = l;
        }
        if let Some(h) = o.hidden {
            self.hidden_size = h;
            self.intermediate_size = 4 * h;
            self.head_dim = None;
        }
        if let Some(h) = o.heads {
            self.num_attention_heads = h;
            self.num_key_value_heads = None;
        }
        if let Some(v) = o.vocab {
            self.vocab_size = v;
        }
        self.validate()
            .map_err(|m| BackboneError::Unsupported(format!("invalid Llama shape: {m}")))?;
        Ok(self)
    }

    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads).max(1)
    }

    /// Width of a head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    fn qkv_bias(&self) -> bool {
        self.attention_bias || self.model_type.as_deref() == Some("qwen2")
    }

    /// Every parameter with our `[out, in]` shapes.
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        let (c, f, d) = (self.hidden_size, self.intermediate_size, self.head_dim());
        let (q, kv) = (self.num_attention_heads * d, self.kv_heads() * d);
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
        push("embed_tokens.weight".into(), vec![self.vocab_size, c], false);
        push("fpt.position_embeddings.weight".into(), vec![FPT_POSITIONS, c], true);
        for i in 0..self.num_hidden_layers {
            let p = format!("layers.{i}.");
            push(format!("{p}input_layernorm.weight"), vec![c], true);
            for (name, out, bias) in [
                ("q_proj", q, self.qkv_bias()),
                ("k_proj", kv, self.qkv_bias()),
                ("v_proj", kv, self.qkv_bias()),
            ] {
                push(format!("{p}self_attn.{name}.weight"), vec![out, c], true);
                if bias {
                    push(format!("{p}self_attn.{name}.bias"), vec![out], true);
                }
            }
            push(format!("{p}self_attn.o_proj.weight"), vec![c, q], true);
            if self.attention_bias {
                push(format!("{p}self_attn.o_proj.bias"), vec![c], true);
            }
            push(format!("{p}post_attention_layernorm.weight"), vec![c], true);
            for (name, shape, out) in [
                ("gate_proj", vec![f, c], f),
                ("up_proj", vec![f, c], f),
                ("down_proj", vec![c, f], c),
            ] {
                push(format!("{p}mlp.{name}.weight"), shape, true);
                if self.mlp_bias {
                    push(format!("{p}mlp.{name}.bias"), vec![out], true);
                }
            }
        }
        push("norm.weight".into(), vec![c], true);
        v
    }
}

/// GGUF tensor names (llama.cpp's) of fpt's names; `None` for fpt's own tensors.
fn gguf_name(name: &str) -> Option<String> {
    if name == "embed_tokens.weight" {
        return Some("token_embd.weight".into());
    }
    if name == "norm.weight" {
        return Some("output_norm.weight".into());
    }
    let rest = name.strip_prefix("layers.")?;
    let (i, part) = rest.split_once('.')?;
    let g = match part {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.o_proj.bias" => "attn_output.bias",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        _ => return None,
    };
    Some(format!("blk.{i}.{g}"))
}

/// llama.cpp stores each head's query (and key) rows with the two rotary halves
/// interleaved; the rows back in `transformers`' order: row `h*d + j*d/2 + i` is stored row
/// `h*d + 2*i + j`.
fn unpermute_rows(w: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (out, inp) = w.dims2()?;
    let d = out / heads;
    w.reshape((heads, d / 2, 2, inp))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((out, inp))
}

/// Reads the tensors `specs` names from a GGUF file under fpt's names.
fn read_gguf(config: &LlamaConfig, path: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
    let file = crate::gguf::GgufFile::open(path)?;
    let mut out = HashMap::new();
    for s in config.param_specs().iter().filter(|s| s.used) {
        let Some(g) = gguf_name(&s.name) else {
            continue;
        };
        let t = file.tensor(&g, &s.shape, device)?;
        let t = if s.name.ends_with("q_proj.weight") {
            unpermute_rows(&t, config.num_attention_heads)?
        } else if s.name.ends_with("k_proj.weight") {
            unpermute_rows(&t, config.kv_heads())?
        } else {
            t
        };
        out.insert(s.name.clone(), t);
    }
    Ok(out)
}

/// Llama-family's entry in [`crate::ARCHITECTURES`].
pub const REGISTRATION: crate::Registration = crate::Registration {
    names: &["Llama", "SmolLM2"],
    model_types: &["llama", "mistral", "qwen2"],
    builtin: |name| LlamaConfig::builtin(name).map(crate::Config::new),
    read: |v, text, path| {
        matches!(crate::model_type(v), Some("llama" | "mistral" | "qwen2"))
            .then(|| LlamaConfig::from_json(text, path).map(crate::Config::new))
    },
    gguf: Some(crate::gguf::GgufReader {
        architectures: &["llama"],
        config: |f| LlamaConfig::from_gguf(f).map(crate::Config::new),
    }),
};

impl crate::ArchConfig for LlamaConfig {
    crate::arch_config_common!(LlamaConfig, Llama, |c| (
        c.num_hidden_layers,
        c.num_attention_heads,
        c.hidden_size
    ));

    fn architecture(&self) -> &'static str {
        "llama"
    }

    fn summary(&self) -> String {
        let c = self;
        format!(
            "{}: {} layers, hidden {}, {} query heads / {} key-value heads x {}, swiglu {}, rotary base {}, fpt's {} learned positions (N(0, 0.02)), causal, RMS norm eps {:e}",
            c.model_type.as_deref().unwrap_or("llama"),
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.kv_heads(),
            c.head_dim(),
            c.intermediate_size,
            c.rope_theta,
            FPT_POSITIONS,
            c.rms_norm_eps
        )
    }
}

struct Block {
    ln_attn: Param,
    q: Linear,
    k: Linear,
    v: Linear,
    /// `q`, `k` and `v` stacked (one product), when all three are frozen.
    qkv: Option<Linear>,
    o: Linear,
    ln_ff: Param,
    gate: Linear,
    up: Linear,
    /// `gate` and `up` stacked (one product), when both are frozen.
    gate_up: Option<Linear>,
    down: Linear,
}

/// A Llama-family backbone.
pub struct Llama {
    config: LlamaConfig,
    wpe: Param,
    blocks: Vec<Block>,
    /// `None` after [`Backbone::drop_final_norm`].
    norm: Option<Param>,
    common: Common,
}

fn optional(t: &mut ParamTaker, name: String, present: bool) -> candle_core::Result<Option<Param>> {
    if present {
        t.take(name).map(Some)
    } else {
        Ok(None)
    }
}

impl Arch for Llama {
    type Config = LlamaConfig;
    const NAMING: Naming = Naming {
        prefixes: &["model."],
        quiet: &["lm_head.", "rotary_emb."],
        ..Naming::PLAIN
    };
    const ROLE_RULES: &'static [(&'static str, Role)] = ROLE_RULES;

    fn specs(config: &Self::Config) -> Vec<ParamSpec> {
        config.param_specs()
    }

    fn read(config: &LlamaConfig, weights: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
        if weights.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            return read_gguf(config, weights, device);
        }
        let specs: Vec<ParamSpec> = config
            .param_specs()
            .into_iter()
            .filter(|s| !s.name.starts_with("fpt."))
            .collect();
        crate::read_checked(weights, &specs, &Self::NAMING, device)
    }

    fn fpt_tensors(config: &LlamaConfig, device: &Device, rng: &mut Rng) -> Result<HashMap<String, Tensor>> {
        let t = fpt_nn::init::normal(&[FPT_POSITIONS, config.hidden_size], 0.0, 0.02, rng, device)?;
        Ok(HashMap::from([("fpt.position_embeddings.weight".to_string(), t)]))
    }

    fn assemble(config: &LlamaConfig, mut t: ParamTaker, origin: String) -> candle_core::Result<Self> {
        let wpe = t.take("fpt.position_embeddings.weight".into())?;
        let (qkv_bias, o_bias, mlp_bias) = (config.qkv_bias(), config.attention_bias, config.mlp_bias);
        let lin = |t: &mut ParamTaker, name: String, bias: bool| -> candle_core::Result<Linear> {
            let w = t.weight(format!("{name}.weight"))?;
            Ok(Linear::new(w, optional(t, format!("{name}.bias"), bias)?))
        };
        let mut blocks = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("layers.{i}.");
            let ln_attn = t.take(format!("{p}input_layernorm.weight"))?;
            let (qn, kn, vn) = (
                format!("{p}self_attn.q_proj"),
                format!("{p}self_attn.k_proj"),
                format!("{p}self_attn.v_proj"),
            );
            let mut q = lin(&mut t, qn.clone(), qkv_bias)?;
            let mut k = lin(&mut t, kn.clone(), qkv_bias)?;
            let mut v = lin(&mut t, vn.clone(), qkv_bias)?;
            let qkv = t.stacked(&mut [(&qn, &mut q), (&kn, &mut k), (&vn, &mut v)])?;
            let o = lin(&mut t, format!("{p}self_attn.o_proj"), o_bias)?;
            let ln_ff = t.take(format!("{p}post_attention_layernorm.weight"))?;
            let (gn, un) = (format!("{p}mlp.gate_proj"), format!("{p}mlp.up_proj"));
            let mut gate = lin(&mut t, gn.clone(), mlp_bias)?;
            let mut up = lin(&mut t, un.clone(), mlp_bias)?;
            let gate_up = t.stacked(&mut [(&gn, &mut gate), (&un, &mut up)])?;
            blocks.push(Block {
                ln_attn,
                q,
                k,
                v,
                qkv,
                o,
                ln_ff,
                gate,
                up,
                gate_up,
                down: lin(&mut t, format!("{p}mlp.down_proj"), mlp_bias)?,
            });
        }
        let norm = t.take("norm.weight".into())?;
        Ok(Self {
            config: config.clone(),
            wpe,
            blocks,
            norm: Some(norm),
            common: t.finish(origin),
        })
    }
}

impl Llama {
    /// The usual Llama init: weights N(0, 0.02), biases 0, RMSNorm scales 1, fpt's position
    /// table N(0, 0.02).
    pub fn random(config: &LlamaConfig, groups: &TrainGroups, device: &Device, rng: &mut Rng) -> Result<Self> {
        let origin = crate::random_origin(config.num_hidden_layers, config.hidden_size, config.num_attention_heads);
        Self::random_init(config, &|_| 0.02, origin, groups, device, rng)
    }

    /// The config this model was built from.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// `cos` and `sin` of the rotary angles, `[t, head_dim]` each (the frequencies repeated
    /// for the two halves, as `transformers` builds them).
    fn rotary(&self, t: usize, device: &Device) -> candle_core::Result<(Tensor, Tensor)> {
        let d = self.config.head_dim();
        let theta = self.config.rope_theta;
        // Made once per (length, head width, base) and device: a constant, not a per-step upload.
        let key = format!("rotary:{t}:{d}:{theta:e}");
        let table = fpt_nn::transfer::constant(key, device, || {
            let inv: Vec<f32> = (0..d / 2)
                .map(|i| (1.0 / theta.powf((2 * i) as f64 / d as f64)) as f32)
                .collect();
            let mut cs = Vec::with_capacity(2 * t * d);
            for want_sin in [false, true] {
                for p in 0..t {
                    for _half in 0..2 {
                        for &f in &inv {
                            // The angle in f32, as torch's outer product of positions and
                            // inverse frequencies computes it.
                            let a = p as f32 * f;
                            cs.push(if want_sin { a.sin() } else { a.cos() });
                        }
                    }
                }
            }
            fpt_nn::transfer::upload(cs, (2, t, d), device)
        })?;
        Ok((table.get(0)?, table.get(1)?))
    }

    fn block_forward(
        &self,
        b: &Block,
        h: &Tensor,
        rot: &(Tensor, Tensor),
        ctx: &mut Ctx,
    ) -> candle_core::Result<Tensor> {
        let c = &self.config;
        let (bs, t, _) = h.dims3()?;
        let (nh, nkv, d) = (c.num_attention_heads, c.kv_heads(), c.head_dim());
        let a = crate::t5::rms_norm(h, &b.ln_attn.get(), c.rms_norm_eps)?;
        let rope = |x: Tensor, heads: usize| fpt_nn::ops::rotary(&x, &rot.0, &rot.1, heads);
        let (q, k, v) = match &b.qkv {
            // One product, then the three column blocks of its output.
            Some(qkv) => {
                let y = qkv.forward(&a)?;
                (
                    y.narrow(2, 0, nh * d)?,
                    y.narrow(2, nh * d, nkv * d)?,
                    y.narrow(2, (nh + nkv) * d, nkv * d)?,
                )
            }
            None => (b.q.forward(&a)?, b.k.forward(&a)?, b.v.forward(&a)?),
        };
        let q = rope(q.contiguous()?, nh)?;
        let k = rope(k.contiguous()?, nkv)?.reshape((bs, t, nkv, d))?;
        let v = v.contiguous()?.reshape((bs, t, nkv, d))?;
        // Each key/value head serves nh / nkv query heads, adjacent ones.
        let repeat = |x: Tensor| -> candle_core::Result<Tensor> {
            if nkv == nh {
                return x.reshape((bs, t, nh * d));
            }
            x.unsqueeze(3)?
                .broadcast_as((bs, t, nkv, nh / nkv, d))?
                .contiguous()?
                .reshape((bs, t, nh * d))
        };
        let (k, v) = (repeat(k)?, repeat(v)?);
        let scale = 1.0 / (d as f64).sqrt();
        let o = crate::attention(&q, &k, &v, nh, scale, fpt_nn::ops::Mask::Causal, None, ctx, None)?;
        let h = (h + b.o.forward(&o)?)?;
        let m = crate::t5::rms_norm(&h, &b.ln_ff.get(), c.rms_norm_eps)?;
        let (g, u) = match &b.gate_up {
            Some(gu) => {
                let y = gu.forward(&m)?;
                let f = c.intermediate_size;
                (y.narrow(2, 0, f)?, y.narrow(2, f, f)?)
            }
            None => (b.gate.forward(&m)?, b.up.forward(&m)?),
        };
        let m = b.down.forward(&fpt_nn::ops::swiglu(&g, &u)?)?;
        h + m
    }
}

impl Backbone for Llama {
    fn architecture(&self) -> &'static str {
        "llama"
    }
    fn max_positions(&self) -> usize {
        match self.config.sliding_window {
            Some(w) => w.min(FPT_POSITIONS),
            None => FPT_POSITIONS,
        }
    }
    fn is_causal(&self) -> bool {
        true
    }

    fn forward(&self, embeds: &Tensor, ctx: &mut Ctx) -> candle_core::Result<Tensor> {
        let t = crate::check_embeds(self, embeds)?;
        let pos = self.wpe.get().narrow(0, 0, t)?;
        let mut h = embeds.broadcast_add(&pos)?;
        let rot = self.rotary(t, embeds.device())?;
        for b in &self.blocks {
            h = self.block_forward(b, &h, &rot, ctx)?;
        }
        match &self.norm {
            Some(n) => crate::t5::rms_norm(&h, &n.get(), self.config.rms_norm_eps),
            None => Ok(h),
        }
    }

    fn drop_final_norm(&mut self) -> Result<()> {
        self.norm = None;
        self.common.named.retain(|(n, _, _)| n != "norm.weight");
        Ok(())
    }

    fn config(&self) -> crate::Config {
        crate::Config::new(self.config.clone())
    }

    crate::backbone_common!(blocks, num_hidden_layers, hidden_size);
}

//! A backbone's config by architecture ([`Config`]): built in, or read from `config.json`.

#[allow(unused_imports)]
use super::*;

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

//! A backbone's config ([`Config`]) and the registry of architectures
//! ([`ARCHITECTURES`]): each architecture implements [`ArchConfig`] in its own file and
//! adds one [`Registration`] line here, and nothing else in the crate names it.

#[allow(unused_imports)]
use super::*;
use std::any::Any;
use std::sync::Arc;

/// Every architecture fpt builds, in the order a `config.json` is offered to them. Adding
/// a backbone: its file (a config type implementing [`ArchConfig`], a model implementing
/// [`Backbone`]) and one line here.
pub const ARCHITECTURES: &[Registration] = &[
    gpt2::REGISTRATION,
    bert::REGISTRATION,
    t5::REGISTRATION,
    vit::REGISTRATION,
    lstm::REGISTRATION,
    llama::REGISTRATION,
];

/// How an architecture makes itself known: its names, its built-in configs, and which
/// `config.json` files are its.
#[derive(Debug, Clone, Copy)]
pub struct Registration {
    /// How documents name it (`GPT-2`, `BERT`, `Longformer`, ...): the crate facade's docs
    /// name each (a tidy test checks).
    pub names: &'static [&'static str],
    /// The `model_type`s of the `config.json` files it reads, for error messages.
    pub model_types: &'static [&'static str],
    /// The built-in config of a known model name, if it is one of this architecture's.
    pub builtin: fn(&str) -> Option<Config>,
    /// The config of a parsed `config.json` (`text` as read, `path` for errors), or `None`
    /// when the file is not this architecture's.
    pub read: fn(&serde_json::Value, &str, &Path) -> Option<Result<Config>>,
    /// How it reads GGUF files, if it does.
    pub gguf: Option<gguf::GgufReader>,
}

/// What the loader, `fpt inspect` and `save_pretrained` ask of an architecture's config.
pub trait ArchConfig: std::fmt::Debug + Send + Sync + 'static {
    /// The architecture's name, e.g. `gpt2` (`longformer` for a BERT config with a window).
    fn architecture(&self) -> &'static str;
    /// Number of blocks.
    fn layers(&self) -> usize;
    /// Attention heads per block (0 for an LSTM).
    fn heads(&self) -> usize;
    /// Hidden width.
    fn hidden_size(&self) -> usize;
    /// Every parameter the config implies.
    fn param_specs(&self) -> Vec<ParamSpec>;
    /// One line: layers, width, heads, MLP width, positions, attention pattern.
    fn summary(&self) -> String;
    /// The config as JSON (for reports and `save_pretrained`).
    fn to_json(&self) -> serde_json::Value;
    /// The config with shape overrides applied (random init).
    fn with_overrides(&self, o: &ShapeOverrides) -> Result<Config>;
    /// A randomly initialised model (`spec` for settings such as GPT-2's residual init).
    fn random(
        &self,
        spec: &BackboneSpec,
        groups: &TrainGroups,
        device: &Device,
        rng: &mut Rng,
    ) -> Result<Box<dyn Backbone>>;
    /// The model from the checkpoint at `weights`, its tensors passed through `prep`; `rng`
    /// draws what fpt adds to a checkpoint (a Llama's position table).
    fn checkpoint(
        &self,
        weights: &Path,
        groups: &TrainGroups,
        device: &Device,
        origin: String,
        prep: &mut Prep<'_>,
        rng: &mut Rng,
    ) -> Result<Box<dyn Backbone>>;
    /// Whether pretrained weights of this architecture exist anywhere (the built-in LSTM
    /// baseline has none: asking the Hub for them would only fail later).
    fn has_pretrained_weights(&self) -> bool {
        true
    }
    /// How [`save_pretrained`] writes it (`model_type`, the `architectures` class, the
    /// tensor naming), or `None` where it is not written.
    fn saved_as(&self) -> Option<SavedAs> {
        None
    }
    /// The concrete config, for [`Config::get`].
    fn as_any(&self) -> &dyn Any;
}

/// A pass over a checkpoint's tensors as read (statistics-only init redraws them with the
/// generator it is given).
pub type Prep<'a> = dyn FnMut(Tensors, &mut Rng) -> Result<Tensors> + 'a;

/// Tensors by fpt's names.
pub type Tensors = std::collections::HashMap<String, Tensor>;

/// How a backbone is written by [`save_pretrained`].
pub struct SavedAs {
    /// `config.json`'s `model_type`.
    pub model_type: &'static str,
    /// `config.json`'s `architectures` entry (the `transformers` class).
    pub class: &'static str,
    /// How the checkpoint names and lays out the tensors.
    pub(crate) naming: Naming,
}

/// A backbone's config: one architecture's [`ArchConfig`], built in or read from
/// `config.json`.
#[derive(Debug, Clone)]
pub struct Config(Arc<dyn ArchConfig>);

impl PartialEq for Config {
    fn eq(&self, other: &Self) -> bool {
        self.architecture() == other.architecture() && self.to_json() == other.to_json()
    }
}

impl Config {
    /// Wraps an architecture's config.
    pub fn new(config: impl ArchConfig) -> Self {
        Self(Arc::new(config))
    }

    /// The concrete config, when it is a `T` (e.g. `config.get::<bert::BertConfig>()`).
    pub fn get<T: ArchConfig>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref::<T>()
    }

    /// The built-in config of a known model name (`gpt2`..`gpt2-xl`, `bert-base-uncased`,
    /// `sentence-transformers/all-MiniLM-L6-v2`, `t5-base`, ...).
    pub fn builtin(name: &str) -> Option<Self> {
        ARCHITECTURES.iter().find_map(|r| (r.builtin)(name))
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
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| BackboneError::Config {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        if let Some(read) = ARCHITECTURES.iter().find_map(|r| (r.read)(&v, text, path)) {
            return read;
        }
        let known: Vec<&str> = ARCHITECTURES
            .iter()
            .flat_map(|r| r.model_types.iter().copied())
            .collect();
        let msg = match v.get("model_type").and_then(|t| t.as_str()) {
            Some(other) => format!(
                "model_type `{other}` is not supported (supported: {})",
                known.join(", ")
            ),
            None => format!(
                "missing field `model_type` (expected one of {}; or a timm `architecture` vit_*)",
                known.join(", ")
            ),
        };
        Err(BackboneError::Config {
            path: path.to_path_buf(),
            msg,
        })
    }

    /// Applies shape overrides (random init). Attention-only blocks are built for the
    /// BERT family only: elsewhere they are an error naming the architecture.
    pub fn with_overrides(self, o: &ShapeOverrides) -> Result<Self> {
        if o.attention_only == Some(true) && self.architecture() != "bert" {
            return Err(BackboneError::Unsupported(format!(
                "attention-only blocks (`attention_only`, the critics' LLM2Attn) are built for BERT-family backbones; `{}` has none",
                self.architecture()
            )));
        }
        self.0.with_overrides(o)
    }

    /// `gpt2`, `bert`, `longformer`, `t5`, `vit`, `lstm`.
    pub fn architecture(&self) -> &'static str {
        self.0.architecture()
    }

    /// Number of blocks.
    pub fn layers(&self) -> usize {
        self.0.layers()
    }

    /// Attention heads per block (0 for an LSTM).
    pub fn heads(&self) -> usize {
        self.0.heads()
    }

    /// Hidden width.
    pub fn hidden_size(&self) -> usize {
        self.0.hidden_size()
    }

    /// Every parameter from the config.
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        self.0.param_specs()
    }

    /// One line: layers, width, heads, MLP width, positions, causal or not.
    pub fn summary(&self) -> String {
        self.0.summary()
    }

    /// The config as JSON (for reports).
    pub fn to_json(&self) -> serde_json::Value {
        self.0.to_json()
    }

    /// The architecture's config trait object.
    pub(crate) fn arch(&self) -> &dyn ArchConfig {
        self.0.as_ref()
    }
}

/// The [`ArchConfig`] methods every architecture implements the same way, for a config
/// type `$config` with `param_specs` and `with_overrides` of its own and a model `$model`
/// implementing `Arch<Config = $config>`: `arch_config_common!(Config, Model, |c| (layers,
/// heads, hidden width))`, the sizes as expressions of the config `c`. Without `custom
/// random` it also builds the random model with `Model::random(config, groups, device,
/// rng)`.
macro_rules! arch_config_common {
    ($config:ty, $model:ty, |$c:ident| ($layers:expr, $heads:expr, $hidden:expr)) => {
        $crate::arch_config_common!($config, $model, |$c| ($layers, $heads, $hidden), custom random);

        fn random(
            &self,
            _spec: &fpt_spec::BackboneSpec,
            groups: &fpt_spec::TrainGroups,
            device: &candle_core::Device,
            rng: &mut fpt_nn::Rng,
        ) -> $crate::Result<Box<dyn $crate::Backbone>> {
            Ok(Box::new(<$model>::random(self, groups, device, rng)?))
        }
    };
    ($config:ty, $model:ty, |$c:ident| ($layers:expr, $heads:expr, $hidden:expr), custom random) => {
        fn layers(&self) -> usize {
            let $c = self;
            $layers
        }

        fn heads(&self) -> usize {
            #[allow(unused_variables)]
            let $c = self;
            $heads
        }

        fn hidden_size(&self) -> usize {
            let $c = self;
            $hidden
        }

        fn param_specs(&self) -> Vec<$crate::ParamSpec> {
            <$config>::param_specs(self)
        }

        fn to_json(&self) -> serde_json::Value {
            serde_json::to_value(self).expect("config serialises")
        }

        fn with_overrides(&self, o: &fpt_spec::ShapeOverrides) -> $crate::Result<$crate::Config> {
            Ok($crate::Config::new(<$config>::with_overrides(self.clone(), o)?))
        }

        fn checkpoint(
            &self,
            weights: &std::path::Path,
            groups: &fpt_spec::TrainGroups,
            device: &candle_core::Device,
            origin: String,
            prep: &mut $crate::Prep<'_>,
            rng: &mut fpt_nn::Rng,
        ) -> $crate::Result<Box<dyn $crate::Backbone>> {
            let mut tensors = prep(<$model as $crate::Arch>::read(self, weights, device)?, rng)?;
            tensors.extend(<$model as $crate::Arch>::fpt_tensors(self, device, rng)?);
            Ok(Box::new(<$model as $crate::Arch>::from_tensors(
                self, tensors, groups, origin,
            )?))
        }

        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    };
}
pub(crate) use arch_config_common;

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
    let cfg: T = serde_json::from_str(text).map_err(|e| err(with_key(text, &e)))?;
    validate(&cfg).map_err(err)?;
    Ok(cfg)
}

/// A typed parse error of a JSON `text` with the key whose value it is about, where one
/// precedes the error's position: ``field `hidden_size`: invalid type: string "abc",
/// expected usize at line 1 column 225``.
pub(crate) fn with_key(text: &str, e: &serde_json::Error) -> String {
    let msg = e.to_string();
    // The byte offset of the error's line and column (1-based; columns count bytes).
    let Some(line) = text.split_inclusive('\n').nth(e.line().saturating_sub(1)) else {
        return msg;
    };
    let start: usize = text
        .split_inclusive('\n')
        .take(e.line().saturating_sub(1))
        .map(str::len)
        .sum();
    let at = (start + e.column().min(line.len())).min(text.len());
    // The last `"key":` before it.
    let Some(before) = text.get(..at) else {
        return msg;
    };
    let Some(colon) = before.rfind("\":") else {
        return msg;
    };
    let Some(open) = before[..colon].rfind('"') else {
        return msg;
    };
    let key = &before[open + 1..colon];
    if key.is_empty() || key.contains(['{', '}', ',']) {
        return msg;
    }
    format!("field `{key}`: {msg}")
}

/// The `model_type` of a parsed `config.json`, if it has one.
pub(crate) fn model_type(v: &serde_json::Value) -> Option<&str> {
    v.get("model_type").and_then(|t| t.as_str())
}

#[cfg(test)]
mod key_tests {
    /// A config.json whose value has the wrong type is said with its key.
    #[test]
    fn a_type_error_names_its_key() {
        let text = "{\n  \"model_type\": \"bert\",\n  \"hidden_size\": \"abc\",\n  \"num_hidden_layers\": 2\n}";
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct C {
            model_type: String,
            hidden_size: usize,
            num_hidden_layers: usize,
        }
        let e = serde_json::from_str::<C>(text).unwrap_err();
        let m = super::with_key(text, &e);
        assert!(m.starts_with("field `hidden_size`: invalid type"), "{m}");
        // Non-ASCII before the error does not break it.
        let text = "{\"model_type\": \"bérť\", \"hidden_size\": -1, \"num_hidden_layers\": 2}";
        let e = serde_json::from_str::<C>(text).unwrap_err();
        let m = super::with_key(text, &e);
        assert!(m.contains("hidden_size") || m.contains("invalid value"), "{m}");
    }
}

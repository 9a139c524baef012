//! Transformer backbones for fpt, loaded from Hugging Face checkpoints and fed input
//! embeddings (no token lookup), as the FPT recipe needs (paper §2.2).
//!
//! - [`gpt2`]: GPT-2 (all sizes), from `config.json` + `model.safetensors` with the Hub's
//!   tensor names, or randomly initialised at any shape.
//! - [`hub`]: resolves a model id or a local directory to files, using the standard Hugging
//!   Face cache (so a cache filled by Python tools is reused).
//!
//! Every backbone reports its parameters with their [`Role`]; which roles train is
//! decided at construction ([`TrainGroups`]), and frozen tensors are plain tensors, never
//! `Var`s.

pub mod gpt2;
pub mod hub;

use candle_core::{Device, Tensor};
use fpt_nn::{Ctx, Param, Rng};
use fpt_spec::{BackboneSpec, Init, Role, TrainGroups};
use std::path::PathBuf;

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
    /// Every materialised parameter with its checkpoint name and role.
    fn params(&self) -> Vec<(String, Role, &Param)>;
    /// Every parameter of the architecture (materialised or not) from the config.
    fn param_specs(&self) -> Vec<ParamSpec>;
    /// Turns the backbone's own dropouts on or off during training (evaluation never
    /// drops). The reference code keeps them on.
    fn set_dropout(&mut self, on: bool);
    /// Where the weights came from: a checkpoint path, or a description of the random init.
    fn origin(&self) -> &str;
}

/// Builds the backbone a spec names: a known architecture name (`gpt2`, `gpt2-medium`,
/// `gpt2-large`, `gpt2-xl`), a local directory, or a Hugging Face model id. Random init
/// needs only a config (known names have theirs built in); pretrained needs weights.
pub fn load(spec: &BackboneSpec, groups: &TrainGroups, device: &Device, rng: &mut Rng) -> Result<Box<dyn Backbone>> {
    let config = match gpt2::Gpt2Config::builtin(&spec.source) {
        Some(c) if spec.init == Init::Random => c,
        _ => {
            let files = hub::resolve(&spec.source, spec.init == Init::Pretrained)?;
            let config = gpt2::Gpt2Config::from_file(&files.config)?;
            if spec.init == Init::Pretrained {
                let weights = files.weights.as_ref().expect("resolve returns weights when asked");
                return Ok(Box::new(gpt2::Gpt2::load(&config, weights, groups, device)?));
            }
            config
        }
    };
    let config = config.with_overrides(&spec.shape)?;
    Ok(Box::new(gpt2::Gpt2::random(
        &config,
        spec.residual_init,
        groups,
        device,
        rng,
    )?))
}

/// The parameter specs of the backbone a spec names, without materialising weights
/// (only its config is read), for `fpt inspect`.
pub fn param_specs(spec: &BackboneSpec) -> Result<(gpt2::Gpt2Config, Vec<ParamSpec>)> {
    let config = match gpt2::Gpt2Config::builtin(&spec.source) {
        Some(c) => c,
        None => gpt2::Gpt2Config::from_file(&hub::resolve(&spec.source, false)?.config)?,
    };
    let config = config.with_overrides(&spec.shape)?;
    let specs = config.param_specs();
    Ok((config, specs))
}

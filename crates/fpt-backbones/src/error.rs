//! The crate's errors: every variant names the file or tensor at fault.

#[allow(unused_imports)]
use super::*;

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
    /// A spec field is invalid for this backbone (the field is named; kept as the source so
    /// callers can find it).
    #[error("{0}")]
    Spec(#[source] fpt_spec::SpecError),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, BackboneError>;

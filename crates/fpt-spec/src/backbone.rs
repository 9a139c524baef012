//! Which backbone a run uses and how it is initialised.

use crate::{Result, SpecError};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How the backbone's weights are initialised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Init {
    /// Load the pretrained checkpoint.
    Pretrained,
    /// The architecture's default random initialisation (GPT-2: N(0, 0.02) weights, zero
    /// biases, unit LayerNorm).
    Random,
    /// Every tensor drawn from a Gaussian with the mean and standard deviation of the
    /// corresponding pretrained tensor, LayerNorm and positions included (paper Table 9).
    StatsOnly,
    /// The architecture's random init, then every parameter trained on Bit Memory
    /// ([`BitPretrainSpec`]), then frozen like a pretrained checkpoint (paper Table 2's "Bit"
    /// row).
    BitPretrained,
}

impl Init {
    /// Whether the pretrained weights are read (pretrained and statistics-only).
    pub fn needs_weights(self) -> bool {
        matches!(self, Init::Pretrained | Init::StatsOnly)
    }
}

impl FromStr for Init {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "pretrained" => Ok(Init::Pretrained),
            "random" => Ok(Init::Random),
            "stats-only" => Ok(Init::StatsOnly),
            "bit-pretrained" => Ok(Init::BitPretrained),
            other => Err(SpecError::UnknownInit(other.to_string())),
        }
    }
}

impl fmt::Display for Init {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Init::Pretrained => "pretrained",
            Init::Random => "random",
            Init::StatsOnly => "stats-only",
            Init::BitPretrained => "bit-pretrained",
        })
    }
}

/// GPT-2's residual-projection init for random backbones. Current `transformers` draws
/// every `c_proj.weight` from N(0, 0.02 / sqrt(2 * n_layer)); transformers 4.1.1, which the
/// paper used, drew them from N(0, 0.02) like every other weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ResidualInit {
    /// `c_proj` weights scaled by 1/sqrt(2 * n_layer) (GPT-2 paper, current transformers).
    Scaled,
    /// All weights N(0, 0.02) (transformers 4.1.1, the FPT paper's random rows): the default.
    #[default]
    Unscaled,
}

impl ResidualInit {
    fn is_default(&self) -> bool {
        *self == ResidualInit::default()
    }
}

impl FromStr for ResidualInit {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "scaled" => Ok(Self::Scaled),
            "unscaled" => Ok(Self::Unscaled),
            other => Err(SpecError::Invalid {
                field: "residual_init",
                msg: format!("`{other}` (expected `scaled` or `unscaled`)"),
            }),
        }
    }
}

/// The number format of the products with the frozen weights. `bf16`: each frozen weight
/// matrix is stored in bf16 once at load (half the bytes), and its products (forward, and the
/// backward through the activations) take bf16 operands with f32 sums; trained parameters,
/// norms, softmax, the loss and the optimizer stay f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    /// Everything in f32: the default (left out of `spec.json`).
    #[default]
    F32,
    /// Frozen weight matrices in bf16, their products with bf16 operands and f32 sums.
    Bf16,
}

impl Precision {
    /// Whether this is the default, `f32`.
    pub fn is_f32(&self) -> bool {
        *self == Precision::F32
    }

    /// The name as flags and `spec.json` spell it.
    pub fn name(&self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            other => Err(SpecError::Invalid {
                field: "precision",
                msg: format!("`{other}` (expected `f32` or `bf16`)"),
            }),
        }
    }
}

optional_settings! {
    /// Shape overrides for a randomly initialised backbone, so that small models train on a CPU.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
    pub struct ShapeOverrides {
        /// Number of transformer blocks.
        layers: usize,
        /// Hidden (model) width.
        hidden: usize,
        /// Attention heads.
        heads: usize,
        /// Maximum positions (size of the learned position table).
        positions: usize,
        /// Token vocabulary (GPT-2's `wte` rows; `fpt pretrain` sets it to the corpus's).
        vocab: usize,
        /// LSTM only: residual connections around each layer (paper Table 5).
        lstm_residual: bool,
        /// LSTM only: a learned, zero-initialised position table added to the inputs (Table 5).
        lstm_positions: bool,
        /// Blocks without their feed-forward half: attention (with its LayerNorm) only. The
        /// critics' "LLM2Attn" row: one such block, randomly initialised and trained, in
        /// place of the language model (BERT-family backbones).
        attention_only: bool,
    }
}

/// How a `bit-pretrained` backbone is made: the random backbone, every parameter trained
/// on Bit Memory (with a fresh input and output layer) for `steps`, then saved and loaded
/// frozen. Backbones are cached by this spec and the architecture, so every run that asks
/// for the same one shares it (as the paper's Bit row shares one model across tasks).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BitPretrainSpec {
    /// Training steps on Bit Memory.
    pub steps: usize,
    /// Batch size.
    pub batch_size: usize,
    /// Adam learning rate.
    pub lr: f64,
    /// Seed of the pretraining run (independent of the downstream run's seed).
    pub seed: u64,
    /// Train until the held-out bit accuracy reaches this (`steps` is then the cap): the
    /// paper's Bit backbone solves Bit Memory. The backbone counts as having learned its task
    /// only when it got there ([`BIT_SOLVED`] when unset). Not written when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_accuracy: Option<f64>,
}

/// The bit accuracy at which a Bit backbone counts as having solved Bit Memory, where its
/// spec names no target.
pub const BIT_SOLVED: f64 = 0.99;

impl Default for BitPretrainSpec {
    fn default() -> Self {
        Self {
            steps: 2000,
            batch_size: 8,
            lr: 1e-3,
            seed: 0,
            until_accuracy: None,
        }
    }
}

/// Which backbone, and how it is initialised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackboneSpec {
    /// A known name (`gpt2`, `gpt2-medium`, ...), a Hugging Face model id, or a local
    /// directory holding `config.json` and `model.safetensors`.
    pub source: String,
    /// Pretrained or random weights.
    pub init: Init,
    /// Shape overrides (random init only).
    #[serde(default)]
    pub shape: ShapeOverrides,
    /// Residual-projection init for random GPT-2 backbones (not written when it is the
    /// default, the paper's `unscaled`).
    #[serde(default, skip_serializing_if = "ResidualInit::is_default")]
    pub residual_init: ResidualInit,
    /// Use only the first `depth` blocks (paper Tables 11-12).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<usize>,
    /// With a depth cut, keep the final norm (GPT-2's `ln_f`, T5's final RMS norm, ViT's
    /// `norm`) on top of the kept blocks (the default) or drop it.
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub final_norm: bool,
    /// How a `bit-pretrained` backbone is trained (defaults when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bit_pretrain: Option<BitPretrainSpec>,
    /// The frozen weights' number format (not written when `f32`, the default).
    #[serde(default, skip_serializing_if = "Precision::is_f32")]
    pub precision: Precision,
}

impl BackboneSpec {
    /// `source` with `init` and every other setting at its default: no shape overrides, the
    /// paper's residual init, no depth cut, and for `bit-pretrained` the default Bit
    /// Memory pretraining.
    pub fn new(source: impl Into<String>, init: Init) -> Self {
        Self {
            source: source.into(),
            init,
            shape: ShapeOverrides::default(),
            residual_init: ResidualInit::default(),
            depth: None,
            final_norm: true,
            bit_pretrain: (init == Init::BitPretrained).then(BitPretrainSpec::default),
            precision: Precision::F32,
        }
    }
}

fn default_true() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

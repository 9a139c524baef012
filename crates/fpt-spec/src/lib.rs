//! Serde types that describe an fpt run: which task, which backbone and how it is
//! initialised, which parameter groups train, and how the trainer runs.
//!
//! This crate has no candle dependency: the CLI, the trainer and (later) the ablation
//! harness all speak these types, and a [`RunSpec`] serialised to JSON is the effective
//! config saved next to every result. Names follow the paper (Lu et al. 2021, §2.2 and
//! App. C): `TrainGroups { input, output, layer_norm, positions, attention, feed_forward }`.

pub mod files;
pub mod limits;

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Errors from parsing spec values given as text (CLI flags, table files).
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A `--train` list named a group that does not exist.
    #[error("unknown parameter group `{0}` (expected a comma-separated list of: in, out, ln, pos, attn, ff, rec, last-attn, or `all` / `fpt` / `none`)")]
    UnknownGroup(String),
    /// An unknown task name.
    #[error("unknown task `{0}` (known tasks: {known})", known = TaskName::ALL.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(", "))]
    UnknownTask(String),
    /// An unknown init mode.
    #[error("unknown init `{0}` (expected `pretrained`, `random`, `stats-only` or `bit-pretrained`)")]
    UnknownInit(String),
    /// A value that is out of its valid range.
    #[error("invalid value for `{field}`: {msg}")]
    Invalid {
        /// The field (or flag) name.
        field: &'static str,
        /// What is wrong.
        msg: String,
    },
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, SpecError>;

/// The role of a parameter tensor in the FPT recipe (paper §2.2). Every backbone tensor
/// has exactly one role; the input and output layers have their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The new input layer (Linear or Embedding).
    Input,
    /// The new output layer.
    Output,
    /// LayerNorm scales and biases.
    LayerNorm,
    /// Learned positional embeddings.
    Positions,
    /// Self-attention weights and biases.
    Attention,
    /// Feed-forward (MLP) weights and biases.
    FeedForward,
    /// Recurrent-cell weights (the LSTM baselines' input-to-hidden and hidden-to-hidden
    /// maps): frozen in the FPT setting, trained with `all` or `rec`.
    Recurrent,
    /// Anything else (e.g. GPT-2's token embedding `wte`, unused with input embeddings);
    /// always frozen.
    Other,
}

impl Role {
    /// All roles, in report order.
    pub const ALL: [Role; 8] = [
        Role::Input,
        Role::Output,
        Role::LayerNorm,
        Role::Positions,
        Role::Attention,
        Role::FeedForward,
        Role::Recurrent,
        Role::Other,
    ];

    /// The short name used in `--train` lists and reports.
    pub fn short(self) -> &'static str {
        match self {
            Role::Input => "in",
            Role::Output => "out",
            Role::LayerNorm => "ln",
            Role::Positions => "pos",
            Role::Attention => "attn",
            Role::FeedForward => "ff",
            Role::Recurrent => "rec",
            Role::Other => "other",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Role::Input => "input",
            Role::Output => "output",
            Role::LayerNorm => "layer_norm",
            Role::Positions => "positions",
            Role::Attention => "attention",
            Role::FeedForward => "feed_forward",
            Role::Recurrent => "recurrent",
            Role::Other => "other",
        };
        f.write_str(s)
    }
}

/// Which parameter groups are trained; everything else is frozen (plain tensors, never
/// `Var`s). The default is the paper's FPT setting: input, output, LayerNorm, positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainGroups {
    /// Train the input layer.
    pub input: bool,
    /// Train the output layer.
    pub output: bool,
    /// Train the LayerNorm parameters.
    pub layer_norm: bool,
    /// Train the positional embeddings.
    pub positions: bool,
    /// Train the self-attention weights.
    pub attention: bool,
    /// Train the feed-forward weights.
    pub feed_forward: bool,
    /// Train recurrent-cell weights (LSTM baselines).
    #[serde(default, skip_serializing_if = "is_false")]
    pub recurrent: bool,
    /// Train the attention weights of the last block only (paper Table 14's "+ last attn
    /// layer"); "last" is the backbone's last block after any depth cut.
    #[serde(default, skip_serializing_if = "is_false")]
    pub last_attention: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Default for TrainGroups {
    fn default() -> Self {
        Self::fpt()
    }
}

impl TrainGroups {
    /// The paper's frozen pretrained transformer: in, out, ln, pos.
    pub fn fpt() -> Self {
        Self {
            input: true,
            output: true,
            layer_norm: true,
            positions: true,
            attention: false,
            feed_forward: false,
            recurrent: false,
            last_attention: false,
        }
    }

    /// Every group trains (full training / fine-tuning).
    pub fn all() -> Self {
        Self {
            input: true,
            output: true,
            layer_norm: true,
            positions: true,
            attention: true,
            feed_forward: true,
            recurrent: true,
            last_attention: false,
        }
    }

    /// Nothing trains.
    pub fn none() -> Self {
        Self {
            input: false,
            output: false,
            layer_norm: false,
            positions: false,
            attention: false,
            feed_forward: false,
            recurrent: false,
            last_attention: false,
        }
    }

    /// Whether tensors of `role` train. [`Role::Other`] never does.
    pub fn trains(&self, role: Role) -> bool {
        match role {
            Role::Input => self.input,
            Role::Output => self.output,
            Role::LayerNorm => self.layer_norm,
            Role::Positions => self.positions,
            Role::Attention => self.attention,
            Role::FeedForward => self.feed_forward,
            Role::Recurrent => self.recurrent,
            Role::Other => false,
        }
    }

    /// Whether a tensor trains: the tensor of `role` in block `block` (`None` outside the
    /// blocks) of a backbone whose last block is `last_block`. Its role's group trains, or
    /// it belongs to the last block's attention under `last_attention`. The one trainable
    /// predicate: the backbones build their `Var`s with it and every count (inspect,
    /// `result.json`, reports) derives from it.
    pub fn trains_tensor(&self, role: Role, block: Option<usize>, last_block: Option<usize>) -> bool {
        self.trains(role) || (self.last_attention && role == Role::Attention && block.is_some() && block == last_block)
    }

    fn set(&mut self, role: Role, on: bool) {
        match role {
            Role::Input => self.input = on,
            Role::Output => self.output = on,
            Role::LayerNorm => self.layer_norm = on,
            Role::Positions => self.positions = on,
            Role::Attention => self.attention = on,
            Role::FeedForward => self.feed_forward = on,
            Role::Recurrent => self.recurrent = on,
            Role::Other => {}
        }
    }
}

impl FromStr for TrainGroups {
    type Err = SpecError;

    /// Parses `in,out,ln,pos,attn,ff,rec,last-attn` (any subset, any order), `all`, `fpt`
    /// or `none`.
    /// Long names (`input`, `layer_norm`, `feed_forward`, ...) are accepted too.
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        match s {
            "all" => return Ok(Self::all()),
            "fpt" | "default" => return Ok(Self::fpt()),
            "none" | "" => return Ok(Self::none()),
            _ => {}
        }
        let mut g = Self::none();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let role = match part {
                "in" | "input" => Role::Input,
                "out" | "output" => Role::Output,
                "ln" | "layer_norm" | "layernorm" => Role::LayerNorm,
                "pos" | "positions" => Role::Positions,
                "attn" | "attention" => Role::Attention,
                "ff" | "mlp" | "feed_forward" => Role::FeedForward,
                "rec" | "recurrent" => Role::Recurrent,
                "last-attn" | "last_attention" => {
                    g.last_attention = true;
                    continue;
                }
                other => return Err(SpecError::UnknownGroup(other.to_string())),
            };
            g.set(role, true);
        }
        Ok(g)
    }
}

impl fmt::Display for TrainGroups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Role::ALL
            .iter()
            .filter(|r| self.trains(**r))
            .map(|r| r.short())
            .collect();
        let mut names = names;
        if self.last_attention && !self.attention {
            names.push("last-attn");
        }
        if names.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&names.join(","))
        }
    }
}

/// The tasks fpt knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskName {
    /// Bit XOR (paper §2.1): XOR of two n-bit strings, one bit per token.
    BitXor,
    /// Bit Memory (paper §2.1): recall one of five 1000-bit strings from a masked copy.
    BitMemory,
    /// ListOps (Long Range Arena): the value (0-9) of a nested MAX/MIN/MED/SM expression.
    #[serde(rename = "listops")]
    ListOps,
    /// MNIST digits, 4x4 patches.
    Mnist,
    /// Fashion-MNIST (an extra task with MNIST's loader and shapes).
    FashionMnist,
    /// CIFAR-10, 4x4 RGB patches (64 tokens of width 48).
    Cifar10,
    /// CIFAR-10 LRA: grayscale, one pixel per token (1024 tokens of width 1).
    Cifar10Lra,
    /// Remote homology (TAPE): the SCOP fold (1195 classes) of a protein sequence.
    Homology,
    /// Your own sequence-classification data (`custom:PATH`, JSONL).
    Custom,
    /// Causal language modelling on a corpus (`text:austen`, `text:uniform`, `text:zipf`,
    /// `text:parens`, `text:DIR`): what `fpt pretrain` trains.
    Text,
}

impl TaskName {
    /// Every task, in the order the CLI lists them.
    pub const ALL: [TaskName; 10] = [
        TaskName::BitXor,
        TaskName::BitMemory,
        TaskName::ListOps,
        TaskName::Mnist,
        TaskName::FashionMnist,
        TaskName::Cifar10,
        TaskName::Cifar10Lra,
        TaskName::Homology,
        TaskName::Custom,
        TaskName::Text,
    ];

    /// The name used on the command line and in files.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskName::BitXor => "bit-xor",
            TaskName::BitMemory => "bit-memory",
            TaskName::ListOps => "listops",
            TaskName::Mnist => "mnist",
            TaskName::FashionMnist => "fashion-mnist",
            TaskName::Cifar10 => "cifar10",
            TaskName::Cifar10Lra => "cifar10-lra",
            TaskName::Homology => "homology",
            TaskName::Custom => "custom",
            TaskName::Text => "text",
        }
    }

    /// Whether the task generates fresh data for every batch (the bit tasks) rather than
    /// reading a dataset.
    pub fn is_generated(self) -> bool {
        matches!(self, TaskName::BitXor | TaskName::BitMemory)
    }
}

impl FromStr for TaskName {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self> {
        let alias = match s {
            "c10" | "cifar-10" => "cifar10",
            "c10-lra" | "cifar-10-lra" => "cifar10-lra",
            "remote-homology" => "homology",
            "list-ops" => "listops",
            other => other,
        };
        TaskName::ALL
            .iter()
            .copied()
            .find(|t| t.as_str() == alias || t.as_str().replace('-', "_") == alias)
            .ok_or_else(|| SpecError::UnknownTask(s.to_string()))
    }
}

impl fmt::Display for TaskName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// ListOps tokenization (REFERENCE.md §Tasks): the reference code's tokenizer dropped every
/// bracket (LRA issues #6/#14); LRA's maintainers say brackets are required.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Brackets {
    /// Drop `(`, `)`, `[` and `]`: 14 tokens + padding = 15 ids (the reference code).
    #[default]
    Drop,
    /// Keep the operators' `[` and the closing `]` (LRA's current pipeline): 16 ids.
    Keep,
}

impl FromStr for Brackets {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "drop" => Ok(Self::Drop),
            "keep" => Ok(Self::Keep),
            _ => Err(SpecError::Invalid {
                field: "brackets",
                msg: format!("`{s}` (expected drop or keep)"),
            }),
        }
    }
}

/// MNIST image size: the reference code feeds 28x28 (49 patches), the paper says 32x32
/// (64 patches, zero padding of 2 pixels on each side).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ImageSize {
    /// The images as stored (MNIST 28x28; the reference code).
    #[default]
    Native,
    /// Zero-padded to 32x32 (the paper's text).
    Pad32,
}

impl FromStr for ImageSize {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "native" | "28" => Ok(Self::Native),
            "pad32" | "32" => Ok(Self::Pad32),
            _ => Err(SpecError::Invalid {
                field: "image_size",
                msg: format!("`{s}` (expected native or pad32)"),
            }),
        }
    }
}

/// Dataset switches. Every default is the reference code's behaviour (the one that produced
/// the paper's numbers); the README lists each switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct DataOptions {
    /// ListOps tokenization.
    #[serde(default)]
    pub brackets: Brackets,
    /// MNIST / Fashion-MNIST image size.
    #[serde(default)]
    pub image_size: ImageSize,
    /// Training augmentation for CIFAR-10 and CIFAR-10 LRA (random crop 32 with padding 4,
    /// horizontal flip, rotation up to 20 degrees). `None` = on (the reference code).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub augment: Option<bool>,
    /// Maximum tokens per sequence (ListOps 512, homology 1024, custom: the longest record;
    /// text: the window, 128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_len: Option<usize>,
    /// Vocabulary of the artificial text corpora (`text:uniform|zipf|parens`; 4096).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<usize>,
}

impl DataOptions {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// A task and its size parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Which task.
    pub name: TaskName,
    /// Bits per string (bit tasks). `None` = the paper's value (XOR 5, Memory 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_bits: Option<usize>,
    /// Bits per input token (bit tasks). `None` = the paper's value (XOR 1, Memory 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<usize>,
    /// Number of held-out examples evaluated. Bit tasks draw them once per seed; dataset
    /// tasks take a fixed seeded sample of the evaluation split, 0 = the whole split.
    pub eval_examples: usize,
    /// Where the data is: the `custom:PATH` file or directory, or a directory overriding
    /// `$FPT_HOME/data/<task>` for the other dataset tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<std::path::PathBuf>,
    /// Use only a fixed seeded sample of this many training examples (`None` = all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_examples: Option<usize>,
    /// Which split evaluation runs on (`None` = the reference code's choice: ListOps `val`,
    /// homology `valid`, the others `test`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_split: Option<String>,
    /// Dataset switches.
    #[serde(default, skip_serializing_if = "DataOptions::is_default")]
    pub data: DataOptions,
}

impl TaskSpec {
    /// The paper's task with default sizes; 512 held-out examples for the generated bit
    /// tasks, the whole evaluation split for datasets.
    pub fn new(name: TaskName) -> Self {
        Self {
            name,
            n_bits: None,
            patch: None,
            eval_examples: if name.is_generated() { 512 } else { 0 },
            path: None,
            train_examples: None,
            eval_split: None,
            data: DataOptions::default(),
        }
    }

    /// Parses a task as written on the command line: a name (`mnist`), or `custom:PATH`.
    pub fn parse(s: &str) -> Result<Self> {
        if let Some(path) = s.strip_prefix("custom:") {
            if path.is_empty() {
                return Err(SpecError::Invalid {
                    field: "task",
                    msg: "`custom:` needs a path: custom:FILE.jsonl or custom:DIR".into(),
                });
            }
            let mut t = Self::new(TaskName::Custom);
            t.path = Some(path.into());
            return Ok(t);
        }
        if let Some(corpus) = s.strip_prefix("text:") {
            if corpus.is_empty() {
                return Err(SpecError::Invalid {
                    field: "task",
                    msg: "`text:` needs a corpus: text:austen, text:uniform, text:zipf, text:parens or text:DIR".into(),
                });
            }
            let mut t = Self::new(TaskName::Text);
            t.path = Some(corpus.into());
            return Ok(t);
        }
        let name: TaskName = s.parse()?;
        if name == TaskName::Text {
            return Err(SpecError::Invalid {
                field: "task",
                msg: "write the text task as text:CORPUS (austen, uniform, zipf, parens, or a directory)".into(),
            });
        }
        if name == TaskName::Custom {
            return Err(SpecError::Invalid {
                field: "task",
                msg: "write the custom task as custom:PATH (a JSONL file or a directory of them)".into(),
            });
        }
        Ok(Self::new(name))
    }

    /// The task as written on the command line (`custom:PATH` for custom data).
    pub fn label(&self) -> String {
        match (&self.name, &self.path) {
            (TaskName::Custom, Some(p)) => format!("custom:{}", p.display()),
            (TaskName::Text, Some(p)) => format!("text:{}", p.display()),
            (n, _) => n.to_string(),
        }
    }
}

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

/// Shape overrides for a randomly initialised backbone, so that small models train on a CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ShapeOverrides {
    /// Number of transformer blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<usize>,
    /// Hidden (model) width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<usize>,
    /// Attention heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<usize>,
    /// Maximum positions (size of the learned position table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub positions: Option<usize>,
    /// Token vocabulary (GPT-2's `wte` rows; `fpt pretrain` sets it to the corpus's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<usize>,
    /// LSTM only: residual connections around each layer (paper Table 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lstm_residual: Option<bool>,
    /// LSTM only: a learned, zero-initialised position table added to the inputs (Table 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lstm_positions: Option<bool>,
}

impl ShapeOverrides {
    /// Whether any override is set.
    pub fn any(&self) -> bool {
        self.layers.is_some()
            || self.hidden.is_some()
            || self.heads.is_some()
            || self.positions.is_some()
            || self.vocab.is_some()
            || self.lstm_residual.is_some()
            || self.lstm_positions.is_some()
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
}

impl Default for BitPretrainSpec {
    fn default() -> Self {
        Self {
            steps: 2000,
            batch_size: 8,
            lr: 1e-3,
            seed: 0,
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
        }
    }
}

fn default_true() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// Learning-rate schedule. The paper uses a constant rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case", tag = "kind", deny_unknown_fields)]
pub enum LrSchedule {
    /// `lr` at every step (the paper's setting).
    #[default]
    Constant,
    /// Linear warm-up from 0 over `warmup_steps`, then linear decay to 0 at the last step.
    Linear {
        /// Warm-up steps.
        warmup_steps: usize,
    },
    /// Linear warm-up over `warmup_steps`, then cosine decay to 0 at the last step.
    Cosine {
        /// Warm-up steps.
        warmup_steps: usize,
    },
}

impl LrSchedule {
    /// The learning rate at 1-based `step` of `total` for base rate `lr`.
    pub fn lr_at(&self, lr: f64, step: usize, total: usize) -> f64 {
        let warm = |w: usize| {
            if w > 0 && step <= w {
                Some(lr * step as f64 / w as f64)
            } else {
                None
            }
        };
        match *self {
            LrSchedule::Constant => lr,
            LrSchedule::Linear { warmup_steps } => warm(warmup_steps).unwrap_or_else(|| {
                let rest = total.saturating_sub(warmup_steps).max(1) as f64;
                lr * (1.0 - (step - warmup_steps) as f64 / rest).max(0.0)
            }),
            LrSchedule::Cosine { warmup_steps } => warm(warmup_steps).unwrap_or_else(|| {
                let rest = total.saturating_sub(warmup_steps).max(1) as f64;
                let t = ((step - warmup_steps) as f64 / rest).min(1.0);
                lr * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
            }),
        }
    }
}

impl FromStr for LrSchedule {
    type Err = SpecError;
    /// `constant`, `linear:WARMUP` or `cosine:WARMUP` (warm-up steps, default 0).
    fn from_str(s: &str) -> Result<Self> {
        let (kind, warm) = s.split_once(':').unwrap_or((s, "0"));
        let warmup_steps = warm.parse().map_err(|_| SpecError::Invalid {
            field: "lr_schedule",
            msg: format!("bad warm-up steps `{warm}` in `{s}`"),
        })?;
        match kind {
            "constant" => Ok(LrSchedule::Constant),
            "linear" => Ok(LrSchedule::Linear { warmup_steps }),
            "cosine" => Ok(LrSchedule::Cosine { warmup_steps }),
            _ => Err(SpecError::Invalid {
                field: "lr_schedule",
                msg: format!("`{s}` (expected constant, linear:WARMUP or cosine:WARMUP)"),
            }),
        }
    }
}

/// When accuracy on the training split is measured (Table 7 of the paper reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum TrainEval {
    /// Never.
    Never,
    /// At the final evaluation only.
    #[default]
    Final,
    /// At every evaluation.
    Every,
}

impl FromStr for TrainEval {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "never" => Ok(Self::Never),
            "final" => Ok(Self::Final),
            "every" => Ok(Self::Every),
            _ => Err(SpecError::Invalid {
                field: "train_eval",
                msg: format!("`{s}` (expected never, final or every)"),
            }),
        }
    }
}

fn default_tolerance() -> f64 {
    0.01
}

/// A step whose loss exceeds this multiple of the run's first step's loss marks the run
/// diverged (as does a non-finite loss or gradient).
pub const DEFAULT_DIVERGENCE_FACTOR: f64 = 100.0;

/// Dropout after the input layer: the reference code's 0.1.
pub const DEFAULT_INPUT_DROPOUT: f64 = 0.1;

/// Gain of the input layer's orthogonal init: the reference code's 1.41.
pub const DEFAULT_ORTH_GAIN: f64 = 1.41;

fn default_divergence_factor() -> f64 {
    DEFAULT_DIVERGENCE_FACTOR
}

fn is_default_divergence_factor(f: &f64) -> bool {
    *f == DEFAULT_DIVERGENCE_FACTOR
}

/// Trainer settings (paper App. C defaults: Adam 1e-3, no weight decay, constant LR,
/// gradient-norm clipping at 1.0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSpec {
    /// Optimizer steps.
    pub steps: usize,
    /// Examples per optimizer step.
    pub batch_size: usize,
    /// Examples per forward/backward pass; `batch_size` must be a multiple of it. Gradients
    /// of the micro-batches are averaged (gradient accumulation).
    pub micro_batch_size: usize,
    /// Adam learning rate (constant).
    pub lr: f64,
    /// Maximum global gradient norm (PyTorch `clip_grad_norm_`); `None` = no clipping.
    pub clip_norm: Option<f64>,
    /// Evaluate every this many steps (and at the end).
    pub eval_every: usize,
    /// Seed for every random number in the run (init, data, dropout).
    pub seed: u64,
    /// Learning-rate schedule.
    #[serde(default)]
    pub lr_schedule: LrSchedule,
    /// When to measure accuracy on the training split.
    #[serde(default)]
    pub train_eval: TrainEval,
    /// Write a checkpoint every this many steps (one is always written at the end).
    #[serde(default)]
    pub checkpoint_every: Option<usize>,
    /// Steps to convergence: the first evaluation whose test accuracy is within this
    /// (absolute) tolerance of the run's best and stays within it at every later evaluation.
    #[serde(default = "default_tolerance")]
    pub convergence_tolerance: f64,
    /// Stop when this many consecutive evaluations fail to improve the best test accuracy
    /// by more than `convergence_tolerance`; `None` = never stop early.
    #[serde(default)]
    pub early_stop_patience: Option<usize>,
    /// Output-only training on cached features (paper Table 10, reservoir computing): the
    /// frozen model's read-out features are computed once for the training set, then the
    /// output layer is trained on them for this many epochs (`steps` is then ignored).
    /// Needs `train_groups` = `out`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_epochs: Option<usize>,
    /// Divergence: a step's loss above this multiple of the first step's loss (or a
    /// non-finite loss or gradient) stops the run as diverged; the result keeps the best
    /// evaluation before it. Default [`DEFAULT_DIVERGENCE_FACTOR`] (not written to spec.json
    /// when default, so existing run hashes stand).
    #[serde(
        default = "default_divergence_factor",
        skip_serializing_if = "is_default_divergence_factor"
    )]
    pub divergence_factor: f64,
}

impl Default for TrainSpec {
    fn default() -> Self {
        Self {
            steps: 1000,
            batch_size: 32,
            micro_batch_size: 32,
            lr: 1e-3,
            clip_norm: Some(1.0),
            eval_every: 250,
            seed: 0,
            lr_schedule: LrSchedule::Constant,
            train_eval: TrainEval::Final,
            checkpoint_every: None,
            convergence_tolerance: 0.01,
            early_stop_patience: None,
            cached_epochs: None,
            divergence_factor: DEFAULT_DIVERGENCE_FACTOR,
        }
    }
}

/// Everything that defines a run. Serialised as the run's `spec.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// The task.
    pub task: TaskSpec,
    /// The backbone.
    pub backbone: BackboneSpec,
    /// Which parameter groups train.
    pub train_groups: TrainGroups,
    /// Trainer settings.
    pub train: TrainSpec,
    /// Dropout after the input layer (the reference code's 0.1).
    pub input_dropout: f64,
    /// Gain of the orthogonal init of the input layer (the reference code's 1.41).
    pub orth_gain: f64,
    /// Whether the backbone's own dropouts (GPT-2: embd/attn/resid 0.1) are on in training.
    pub backbone_dropout: bool,
}

impl RunSpec {
    /// A run of `task` on `backbone` with the paper's FPT recipe and every default in one
    /// place: the FPT groups trained (input, output, LayerNorms, positions),
    /// [`TrainSpec::default`], [`DEFAULT_INPUT_DROPOUT`], [`DEFAULT_ORTH_GAIN`], the
    /// backbone's own dropouts on. Change fields after (`RunSpec { train, ..RunSpec::new(..) }`).
    pub fn new(task: TaskSpec, backbone: BackboneSpec) -> Self {
        Self {
            task,
            backbone,
            train_groups: TrainGroups::fpt(),
            train: TrainSpec::default(),
            input_dropout: DEFAULT_INPUT_DROPOUT,
            orth_gain: DEFAULT_ORTH_GAIN,
            backbone_dropout: true,
        }
    }

    /// 16 hex digits of the SHA-256 of the spec's JSON: a run directory's name in the
    /// harness (`results/runs/<key>`) and a self-trained backbone's cache key.
    pub fn key(&self) -> String {
        let json = serde_json::to_vec(self).expect("a run spec serialises");
        files::sha256_hex(&json)[..16].to_string()
    }

    /// Checks value ranges; returns the first problem with the field it is in.
    pub fn validate(&self) -> Result<()> {
        let t = &self.train;
        let bad = |field: &'static str, msg: &str| {
            Err(SpecError::Invalid {
                field,
                msg: msg.to_string(),
            })
        };
        let size = |field: &'static str, value: usize, max: usize| -> Result<()> {
            limits::check_positive(field, value, max).map_err(|msg| SpecError::Invalid { field, msg })
        };
        size("batch_size", t.batch_size, limits::MAX_BATCH)?;
        size("steps", t.steps, limits::MAX_STEPS)?;
        if t.micro_batch_size == 0 || !t.batch_size.is_multiple_of(t.micro_batch_size) {
            return Err(SpecError::Invalid {
                field: "micro_batch_size",
                msg: format!("{} does not divide batch_size {}", t.micro_batch_size, t.batch_size),
            });
        }
        if !(t.lr.is_finite() && t.lr > 0.0) {
            return bad("lr", "must be a positive finite number");
        }
        if let Some(c) = t.clip_norm {
            if !(c.is_finite() && c > 0.0) {
                return bad("clip_norm", "must be a positive finite number");
            }
        }
        size("eval_every", t.eval_every, limits::MAX_STEPS)?;
        if t.checkpoint_every == Some(0) {
            return bad("checkpoint_every", "must be at least 1");
        }
        if t.early_stop_patience == Some(0) {
            return bad("early_stop_patience", "must be at least 1");
        }
        if !(t.divergence_factor.is_finite() && t.divergence_factor > 1.0) {
            return bad("divergence_factor", "must be a finite number above 1");
        }
        if !(t.convergence_tolerance.is_finite() && t.convergence_tolerance >= 0.0) {
            return bad("convergence_tolerance", "must be a non-negative finite number");
        }
        if !(0.0..1.0).contains(&self.input_dropout) {
            return bad("input_dropout", "must be in [0, 1)");
        }
        if self.task.eval_examples == 0 && self.task.name.is_generated() {
            return bad("eval_examples", "must be at least 1 for the generated bit tasks");
        }
        limits::check("eval_examples", self.task.eval_examples, limits::MAX_EXAMPLES).map_err(|msg| {
            SpecError::Invalid {
                field: "eval_examples",
                msg,
            }
        })?;
        if let Some(n) = self.task.train_examples {
            size("train_examples", n, limits::MAX_EXAMPLES)?;
        }
        if let Some(n) = self.task.n_bits {
            size("n_bits", n, limits::MAX_BITS)?;
        }
        if let Some(n) = self.task.patch {
            size("patch", n, limits::MAX_BITS)?;
        }
        if let Some(n) = self.task.data.max_len {
            size("max_len", n, limits::MAX_POSITIONS)?;
        }
        if let Some(n) = self.task.data.vocab {
            size("vocab", n, limits::MAX_VOCAB)?;
        }
        let shape = &self.backbone.shape;
        for (field, value, max) in [
            ("layers", shape.layers, limits::MAX_LAYERS),
            ("hidden", shape.hidden, limits::MAX_HIDDEN),
            ("heads", shape.heads, limits::MAX_HEADS),
            ("positions", shape.positions, limits::MAX_POSITIONS),
            ("vocab", shape.vocab, limits::MAX_VOCAB),
            ("depth", self.backbone.depth, limits::MAX_LAYERS),
        ] {
            if let Some(v) = value {
                size(field, v, max)?;
            }
        }
        if let Some(bp) = &self.backbone.bit_pretrain {
            size("bit_pretrain.steps", bp.steps, limits::MAX_STEPS)?;
            size("bit_pretrain.batch_size", bp.batch_size, limits::MAX_BATCH)?;
            if !(bp.lr.is_finite() && bp.lr > 0.0) {
                return bad("bit_pretrain.lr", "must be a positive finite number");
            }
        }
        if self.task.name == TaskName::Custom && self.task.path.is_none() {
            return bad("task.path", "the custom task needs a path (custom:PATH)");
        }
        if let Some(e) = t.cached_epochs {
            if e == 0 {
                return bad("cached_epochs", "must be at least 1");
            }
            let out_only = TrainGroups {
                output: true,
                ..TrainGroups::none()
            };
            if self.train_groups != out_only {
                return bad(
                    "cached_epochs",
                    "output-only training on cached features trains the output layer alone (--train out)",
                );
            }
        }
        if self.backbone.depth.is_some() && self.train_groups.last_attention {
            return bad(
                "train_groups.last_attention",
                "`last-attn` trains the checkpoint's last block, which a depth cut removes; use one or the other",
            );
        }
        if !self.backbone.final_norm && self.backbone.depth.is_none() {
            return bad(
                "final_norm",
                "dropping the final norm is a depth-cut option; set depth too",
            );
        }
        if self.backbone.bit_pretrain.is_some() && self.backbone.init != Init::BitPretrained {
            return bad("bit_pretrain", "only applies to init `bit-pretrained`");
        }
        if self.backbone.init.needs_weights() && self.backbone.shape.any() {
            return bad(
                "shape",
                "--layers/--hidden/--heads/--positions only apply to --init random (a pretrained checkpoint fixes its shape)",
            );
        }
        Ok(())
    }
}

impl RunSpec {
    /// The fields (as JSON paths) where `other` differs from `self`, e.g. `train.lr`.
    pub fn differences(&self, other: &RunSpec) -> Vec<String> {
        fn walk(prefix: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
            match (a, b) {
                (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
                    let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
                    keys.sort();
                    keys.dedup();
                    for k in keys {
                        let p = if prefix.is_empty() {
                            k.clone()
                        } else {
                            format!("{prefix}.{k}")
                        };
                        let null = serde_json::Value::Null;
                        walk(&p, x.get(k).unwrap_or(&null), y.get(k).unwrap_or(&null), out);
                    }
                }
                _ if a != b => out.push(format!("{prefix}: {a} -> {b}")),
                _ => {}
            }
        }
        let a = serde_json::to_value(self).expect("spec serialises");
        let b = serde_json::to_value(other).expect("spec serialises");
        let mut out = Vec::new();
        walk("", &a, &b, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn train_groups_parse_and_print() {
        let g: TrainGroups = "in,out,ln,pos".parse().unwrap();
        assert_eq!(g, TrainGroups::fpt());
        assert_eq!(g.to_string(), "in,out,ln,pos");
        let g: TrainGroups = "attn, ff".parse().unwrap();
        assert!(g.attention && g.feed_forward && !g.input);
        assert_eq!("all".parse::<TrainGroups>().unwrap(), TrainGroups::all());
        let e = "in,bogus".parse::<TrainGroups>().unwrap_err().to_string();
        assert!(e.contains("`bogus`"), "{e}");
    }

    #[test]
    fn task_names_round_trip() {
        for t in TaskName::ALL {
            assert_eq!(t.as_str().parse::<TaskName>().unwrap(), t);
        }
        assert_eq!(TaskSpec::parse("c10").unwrap().name, TaskName::Cifar10);
        let t = TaskSpec::parse("custom:data/x.jsonl").unwrap();
        assert_eq!(
            (t.name, t.label()),
            (TaskName::Custom, "custom:data/x.jsonl".to_string())
        );
        assert!(TaskSpec::parse("custom").is_err() && TaskSpec::parse("custom:").is_err());
        assert_eq!(TaskSpec::parse("mnist").unwrap().eval_examples, 0);
        let e = "mnsit".parse::<TaskName>().unwrap_err().to_string();
        assert!(e.contains("mnsit") && e.contains("bit-xor"), "{e}");
    }

    #[test]
    fn validate_names_the_field() {
        let mut spec = RunSpec {
            task: TaskSpec::new(TaskName::BitXor),
            backbone: BackboneSpec {
                source: "gpt2".into(),
                init: Init::Random,
                shape: ShapeOverrides::default(),
                residual_init: ResidualInit::Scaled,
                depth: None,
                final_norm: true,
                bit_pretrain: None,
            },
            train_groups: TrainGroups::fpt(),
            train: TrainSpec::default(),
            input_dropout: 0.1,
            orth_gain: 1.41,
            backbone_dropout: true,
        };
        spec.validate().unwrap();
        spec.train.micro_batch_size = 5;
        let e = spec.validate().unwrap_err().to_string();
        assert!(e.contains("micro_batch_size"), "{e}");
        let json = serde_json::to_string(&spec).unwrap();
        let back: RunSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back, spec);
        let mut other = spec.clone();
        other.train.lr = 0.5;
        other.train.lr_schedule = "cosine:10".parse().unwrap();
        let d = spec.differences(&other);
        assert_eq!(d.len(), 3, "{d:?}"); // lr, and the schedule's kind and warm-up
        assert!(d[0].starts_with("train.lr: 0.001 -> 0.5"), "{d:?}");

        // Sizes: zero and absurd values are refused before anything is allocated.
        for (edit, field) in [
            (&(|s: &mut RunSpec| s.train.steps = 0) as &dyn Fn(&mut RunSpec), "steps"),
            (&|s: &mut RunSpec| s.train.batch_size = 1 << 40, "batch_size"),
            (
                &|s: &mut RunSpec| s.backbone.shape.layers = Some(1_000_000_000),
                "layers",
            ),
            (&|s: &mut RunSpec| s.backbone.shape.hidden = Some(1 << 31), "hidden"),
            (&|s: &mut RunSpec| s.backbone.shape.heads = Some(0), "heads"),
            (&|s: &mut RunSpec| s.task.data.max_len = Some(0), "max_len"),
            (&|s: &mut RunSpec| s.task.n_bits = Some(1 << 40), "n_bits"),
        ] {
            let mut bad = spec.clone();
            bad.train.micro_batch_size = bad.train.batch_size;
            edit(&mut bad);
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
    }

    /// spec.json is read strictly: an unknown or misspelt key, or a key given twice, is an
    /// error naming it (a misspelt optional key once silently turned early stopping off).
    #[test]
    fn spec_json_refuses_unknown_and_duplicate_keys() {
        let spec = RunSpec {
            task: TaskSpec::new(TaskName::BitXor),
            backbone: BackboneSpec {
                source: "gpt2".into(),
                init: Init::Random,
                shape: ShapeOverrides::default(),
                residual_init: ResidualInit::Scaled,
                depth: None,
                final_norm: true,
                bit_pretrain: None,
            },
            train_groups: TrainGroups::fpt(),
            train: TrainSpec::default(),
            input_dropout: 0.1,
            orth_gain: 1.41,
            backbone_dropout: true,
        };
        let json = serde_json::to_string(&spec).unwrap();
        let misspelt = json.replace("\"train\":{", "\"train\":{\"early_stop_patiense\":3,");
        let e = serde_json::from_str::<RunSpec>(&misspelt).unwrap_err().to_string();
        assert!(e.contains("early_stop_patiense"), "{e}");
        let twice = json.replace("\"train\":{", "\"train\":{\"lr\":0.5,");
        let e = serde_json::from_str::<RunSpec>(&twice).unwrap_err().to_string();
        assert!(e.contains("duplicate field `lr`"), "{e}");
        let top = json.replacen('{', "{\"seeds\":3,", 1);
        assert!(serde_json::from_str::<RunSpec>(&top)
            .unwrap_err()
            .to_string()
            .contains("seeds"));
    }

    #[test]
    fn schedules() {
        let c = LrSchedule::Cosine { warmup_steps: 10 };
        assert!((c.lr_at(1.0, 5, 110) - 0.5).abs() < 1e-12);
        assert!((c.lr_at(1.0, 10, 110) - 1.0).abs() < 1e-12);
        assert!((c.lr_at(1.0, 60, 110) - 0.5).abs() < 1e-12);
        assert!(c.lr_at(1.0, 110, 110).abs() < 1e-12);
        let l: LrSchedule = "linear:0".parse().unwrap();
        assert!((l.lr_at(2.0, 50, 100) - 1.0).abs() < 1e-12);
        assert_eq!(LrSchedule::Constant.lr_at(0.3, 7, 9), 0.3);
        assert!("warm".parse::<LrSchedule>().is_err());
    }
}

/// Tables and figures of the paper as data (`data/tables/<id>.toml`), and the scales they
/// run at (`data/tables/scales.toml`). The ablation harness (`fpt-ablate`) expands a table
/// into one cell per (row, column): the table's `defaults`, then the row's settings, then
/// the column's; no table has code of its own.
pub mod table {
    use super::ShapeOverrides;
    use serde::{Deserialize, Serialize};
    use std::collections::BTreeMap;

    /// What a table's cells hold.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
    #[serde(rename_all = "kebab-case")]
    pub enum Metric {
        /// Accuracy on the evaluation split, in percent.
        #[default]
        TestAccuracy,
        /// Accuracy on the training split, in percent.
        TrainAccuracy,
        /// Steps to convergence (see `TrainSpec::convergence_tolerance`).
        StepsToConvergence,
        /// Backbone parameters (counted from the config; nothing trains).
        ParamsTotal,
        /// Trained parameters, input and output layers included (counted).
        ParamsTrained,
        /// Trained parameters counted as the paper's Table 8 did: position rows only for the
        /// tokens the task uses, the input layer at the cell's `input_width` when set.
        ParamsTrainedUsed,
        /// Blocks of the backbone (from its config).
        ConfigLayers,
        /// Hidden width (from its config).
        ConfigHidden,
        /// Attention heads (from its config).
        ConfigHeads,
        /// Per-epoch speedup of output-only training on cached features over FPT training
        /// (Table 10), as a factor.
        Speedup,
        /// A number only the paper gives (a hyperparameter, a citation): shown, not run.
        PaperOnly,
    }

    /// The settings of a cell; unset fields inherit (table defaults, row, column).
    #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct CellSettings {
        /// Task name as on the command line.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub task: Option<String>,
        /// Backbone as named in the paper (`gpt2`, `gpt2-medium`, `gpt2-large`,
        /// `bert-base-uncased`, `t5-base`, `allenai/longformer-base-4096`, `vit`); scales may
        /// substitute it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub backbone: Option<String>,
        /// `pretrained`, `random`, `stats-only` or `bit-pretrained`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub init: Option<String>,
        /// Trained groups (`--train` syntax).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub train: Option<String>,
        /// Depth cut: the first N blocks.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub depth: Option<usize>,
        /// `transformer` (default), `lstm`, `output-only` (cached features), or `literature`
        /// (a number the paper cites from other work).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub model: Option<String>,
        /// LSTM layers.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub lstm_layers: Option<usize>,
        /// LSTM with residual connections.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub lstm_residual: Option<bool>,
        /// LSTM with learned positional embeddings.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub lstm_positions: Option<bool>,
        /// Train the last attention layer too (Table 14).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub last_attention: Option<bool>,
        /// What the cell reports.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub metric: Option<Metric>,
        /// Learning rate (paper: 1e-3; homology 1e-4; LSTMs 3e-4).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub lr: Option<f64>,
        /// For counted cells: the input layer's width the paper counted with (Table 8: 16).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub input_width: Option<usize>,
    }

    impl Metric {
        /// Whether the metric is read off the backbone's config (nothing trains).
        pub fn is_counted(self) -> bool {
            matches!(
                self,
                Metric::ParamsTotal
                    | Metric::ParamsTrained
                    | Metric::ParamsTrainedUsed
                    | Metric::ConfigLayers
                    | Metric::ConfigHidden
                    | Metric::ConfigHeads
            )
        }
    }

    impl CellSettings {
        /// `self` with every field `over` sets replaced.
        pub fn merged(&self, over: &CellSettings) -> CellSettings {
            macro_rules! pick {
                ($($f:ident),*) => { CellSettings { $($f: over.$f.clone().or_else(|| self.$f.clone())),* } };
            }
            pick!(
                task,
                backbone,
                init,
                train,
                depth,
                model,
                lstm_layers,
                lstm_residual,
                lstm_positions,
                last_attention,
                metric,
                lr,
                input_width
            )
        }
    }

    /// A row or a column: a label and the settings it contributes.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Axis {
        /// As printed in the paper.
        pub label: String,
        /// Its settings.
        #[serde(flatten)]
        pub set: CellSettings,
    }

    /// Settings for one cell, on top of its row and column (e.g. Table 1's CIFAR-10 FPT
    /// number comes from GPT-2 large).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct CellOverride {
        /// Row label.
        pub row: String,
        /// Column label.
        pub col: String,
        /// Its settings.
        #[serde(flatten)]
        pub set: CellSettings,
    }

    /// What kind of artefact a spec describes.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
    #[serde(rename_all = "kebab-case")]
    pub enum Kind {
        /// A table of numbers.
        #[default]
        Table,
        /// Grouped bars of a table's cells (Figure 1).
        Bars,
        /// First-layer attention maps of a trained run (Figures 3-5).
        AttentionMap,
        /// Standard deviation of parameters by layer (Figure 6).
        ParamStd,
    }

    /// One table or figure of the paper.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct TableSpec {
        /// `table1` ... `table22`, `fig1`, `fig3` ... `fig6`.
        pub id: String,
        /// Short title.
        pub title: String,
        /// The paper's caption.
        pub caption: String,
        /// Section of the paper.
        #[serde(default)]
        pub section: String,
        /// Table or figure kind.
        #[serde(default)]
        pub kind: Kind,
        /// For figures drawn from a table's cells: that table's id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub from_table: Option<String>,
        /// Settings every cell starts from.
        #[serde(default)]
        pub defaults: CellSettings,
        /// Rows.
        #[serde(default)]
        pub rows: Vec<Axis>,
        /// Columns.
        #[serde(default)]
        pub cols: Vec<Axis>,
        /// The paper's numbers as printed, `paper[row][col]` (`-` where the paper has none).
        #[serde(default)]
        pub paper: Vec<Vec<String>>,
        /// Per-cell settings.
        #[serde(default)]
        pub cells: Vec<CellOverride>,
        /// Notes shown under the report.
        #[serde(default)]
        pub notes: Vec<String>,
        /// Per-scale overrides of `scales.toml` for this table.
        #[serde(default)]
        pub scales: BTreeMap<String, ScaleSettings>,
        /// The paper's claims this table tests, as checks over its cells.
        #[serde(default)]
        pub claims: Vec<Claim>,
    }

    /// Cells of a table: every cell of `row`, of `col`, or the one at both.
    #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Select {
        /// A row label.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub row: Option<String>,
        /// A column label.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub col: Option<String>,
    }

    /// How a claim compares its cells.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum ClaimKind {
        /// `a` exceeds `b` by more than `by` points, on the mean of paired differences.
        #[default]
        Greater,
        /// `a` exceeds every selection in `among` (paired the same way).
        Best,
    }

    /// A claim of the paper, checked over a table's cells: `a` and `b` (or each of `among`)
    /// select the same number of cells, paired in order (a row against a row pairs by
    /// column).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Claim {
        /// The claim, as the paper makes it.
        pub text: String,
        /// How the cells compare.
        #[serde(default)]
        pub kind: ClaimKind,
        /// The cells that should be ahead.
        pub a: Select,
        /// What they are compared with (`greater`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub b: Option<Select>,
        /// What they are compared with (`best`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub among: Vec<Select>,
        /// The margin, in the cells' unit (points of accuracy, steps).
        #[serde(default)]
        pub by: f64,
    }

    /// A backbone standing in for another at a scale.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Substitute {
        /// What loads instead (a name, Hub id or directory).
        pub source: String,
        /// Shape overrides (random init only).
        #[serde(default)]
        pub shape: ShapeOverrides,
        /// Why, printed beside every cell it affects.
        pub note: String,
    }

    /// Per-task overrides at a scale.
    #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct TaskOverrides {
        /// Optimizer steps.
        #[serde(default)]
        pub steps: Option<usize>,
        /// Batch size.
        #[serde(default)]
        pub batch_size: Option<usize>,
        /// Micro-batch size.
        #[serde(default)]
        pub micro_batch_size: Option<usize>,
        /// Evaluate every N steps.
        #[serde(default)]
        pub eval_every: Option<usize>,
        /// Held-out examples (0 = all).
        #[serde(default)]
        pub eval_examples: Option<usize>,
        /// Training examples (sample).
        #[serde(default)]
        pub train_examples: Option<usize>,
        /// Bits per string (bit tasks).
        #[serde(default)]
        pub n_bits: Option<usize>,
        /// Bits per token (bit tasks).
        #[serde(default)]
        pub patch: Option<usize>,
        /// Maximum sequence length.
        #[serde(default)]
        pub max_len: Option<usize>,
        /// Learning rate.
        #[serde(default)]
        pub lr: Option<f64>,
        /// Epochs of output-only training on cached features (Table 10).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cached_epochs: Option<usize>,
        /// Training examples whose features output-only training caches (datasets; `None`:
        /// `train_examples`, else the whole split).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cached_examples: Option<usize>,
        /// Accuracy on the training split (`never`, `final`, `every`); cells that report
        /// training accuracy always measure it. `None`: `final`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub train_eval: Option<super::TrainEval>,
        /// Runs per cell, each with its own seed (the cell's seed, then the next ones): the
        /// cell reports their mean and spread, and claims use it. `None`: one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub seeds: Option<usize>,
    }

    impl TaskOverrides {
        /// `self` with every field `over` sets replaced.
        pub fn merged(&self, over: &TaskOverrides) -> TaskOverrides {
            macro_rules! pick {
                ($($f:ident),*) => { TaskOverrides { $($f: over.$f.or(self.$f)),* } };
            }
            pick!(
                steps,
                batch_size,
                micro_batch_size,
                eval_every,
                eval_examples,
                train_examples,
                n_bits,
                patch,
                max_len,
                lr,
                cached_epochs,
                cached_examples,
                train_eval,
                seeds
            )
        }
    }

    /// A scale: what every cell runs with, per task, and which backbones stand in.
    #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct ScaleSettings {
        /// One line on what the scale is for.
        #[serde(default)]
        pub description: String,
        /// Settings for every task.
        #[serde(default)]
        pub all: TaskOverrides,
        /// Per-task settings (keys: task names).
        #[serde(default)]
        pub tasks: BTreeMap<String, TaskOverrides>,
        /// Backbone substitutions (keys: the paper's backbone names; `lstm` for the LSTM
        /// baselines).
        #[serde(default)]
        pub backbones: BTreeMap<String, Substitute>,
        /// How `bit-pretrained` backbones are trained at this scale (defaults when absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub bit_pretrain: Option<super::BitPretrainSpec>,
        /// Where this scale's settings still differ from the paper's, printed beside every
        /// cell they concern (the `paper` scale: what fpt cannot or does not copy). Keys: `all`,
        /// a task name, `init:<init>` or `model:<model>`.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        pub differs: BTreeMap<String, Vec<String>>,
    }

    impl ScaleSettings {
        /// `self` overridden by `over` (task settings merged key by key).
        pub fn merged(&self, over: &ScaleSettings) -> ScaleSettings {
            let mut tasks = self.tasks.clone();
            for (k, v) in &over.tasks {
                let base = tasks.get(k).cloned().unwrap_or_default();
                tasks.insert(k.clone(), base.merged(v));
            }
            let mut backbones = self.backbones.clone();
            backbones.extend(over.backbones.clone());
            ScaleSettings {
                description: if over.description.is_empty() {
                    self.description.clone()
                } else {
                    over.description.clone()
                },
                all: self.all.merged(&over.all),
                tasks,
                backbones,
                bit_pretrain: over.bit_pretrain.or(self.bit_pretrain),
                differs: {
                    let mut d = self.differs.clone();
                    d.extend(over.differs.clone());
                    d
                },
            }
        }

        /// The settings for `task`: `all`, then the task's own.
        pub fn for_task(&self, task: &str) -> TaskOverrides {
            match self.tasks.get(task) {
                Some(t) => self.all.merged(t),
                None => self.all.clone(),
            }
        }
    }
}

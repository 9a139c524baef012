//! Task datasets for fpt. A [`Task`] knows its input kind and width, its sequence length,
//! how many read-out tokens and labels an example has, and produces [`Batch`]es; it has no
//! model code.
//!
//! Every example's labels are a `[labels_per_example]` row of class ids: 1 label for
//! sequence classification, one per bit for the bit tasks (whose loss is a 2-way
//! cross-entropy per bit, paper §2.1 and the reference code's `loss_fn`).

pub mod baseline;
pub mod bits;
pub mod custom;
pub mod data;
pub mod fetch;
pub mod homology;
pub mod idx;
pub mod images;
pub mod listops;
pub mod paths;
pub mod text;

use candle_core::{Device, Tensor};
use fpt_nn::Rng;
use fpt_spec::{TaskName, TaskSpec};
use std::path::{Path, PathBuf};

pub use baseline::{Baseline, BaselineKind};
pub use bits::{BitMemory, BitXor};
pub use data::{Cursor, Dataset, DatasetTask, Encoding, Examples};

/// Errors from building tasks and batches.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// A size parameter is invalid.
    #[error("task `{task}`: {msg}")]
    Invalid {
        /// The task.
        task: &'static str,
        /// What is wrong.
        msg: String,
    },
    /// A data file is malformed: which file, where in it, and what is wrong.
    #[error("{}: {msg}", path.display())]
    Data {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the record and field.
        msg: String,
    },
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A dataset is not on this machine.
    #[error("{task}: no data in {} ({what}); {hint}", dir.display())]
    Missing {
        /// The task.
        task: String,
        /// Where it was looked for.
        dir: PathBuf,
        /// What is missing.
        what: String,
        /// How to get it.
        hint: String,
    },
    /// A download failed or gave the wrong bytes.
    #[error("fetching {what}: {msg}")]
    Fetch {
        /// What was fetched.
        what: String,
        /// What went wrong.
        msg: String,
    },
    /// An error inside candle.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// A read error on line `line` of `path`: text that is not UTF-8 is named by its line.
pub(crate) fn line_error(path: &Path, line: usize, e: std::io::Error) -> TaskError {
    if e.kind() == std::io::ErrorKind::InvalidData {
        TaskError::data(path, format!("line {line}: not UTF-8 text"))
    } else {
        TaskError::io(path)(e)
    }
}

impl TaskError {
    pub(crate) fn data(path: &Path, msg: impl Into<String>) -> Self {
        TaskError::Data {
            path: path.to_path_buf(),
            msg: msg.into(),
        }
    }
    pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| TaskError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, TaskError>;

/// What a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum InputKind {
    /// A real vector of this width per token (through a Linear input layer).
    Vectors {
        /// Width of each token vector.
        width: usize,
    },
    /// A token id below `vocab` (through an Embedding input layer).
    Tokens {
        /// Vocabulary size, padding included.
        vocab: usize,
    },
}

/// The shapes a task implies for the model around the backbone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TaskDims {
    /// Input kind and width.
    pub input: InputKind,
    /// Tokens per example.
    pub seq_len: usize,
    /// How many final tokens the output layer reads (the reference code's `ratio`).
    pub readout_tokens: usize,
    /// Labels per example.
    pub labels_per_example: usize,
    /// Classes per label.
    pub classes: usize,
}

impl TaskDims {
    /// Width of the output layer: the logits of all labels, spread over the read-out
    /// tokens (`readout_tokens * output_dim = labels_per_example * classes`).
    pub fn output_dim(&self) -> usize {
        self.labels_per_example * self.classes / self.readout_tokens
    }
}

/// The inputs of a batch.
#[derive(Debug, Clone)]
pub enum Inputs {
    /// `[batch, tokens, width]` f32.
    Vectors(Tensor),
    /// `[batch, tokens]` u32.
    Tokens(Tensor),
}

impl Inputs {
    /// Number of examples.
    pub fn batch_size(&self) -> usize {
        match self {
            Inputs::Vectors(t) | Inputs::Tokens(t) => t.dims()[0],
        }
    }
}

/// A batch of examples.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Model inputs.
    pub inputs: Inputs,
    /// `[batch, labels_per_example]` u32 class ids.
    pub labels: Tensor,
}

/// Which fixed example set an evaluation runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// The held-out (test) set.
    Test,
    /// The training set (for generated tasks: a fixed sample of the training distribution).
    Train,
}

/// A task: shapes, fresh training batches, and fixed evaluation sets.
pub trait Task: Send {
    /// The task's name.
    fn name(&self) -> TaskName;
    /// Its shapes.
    fn dims(&self) -> TaskDims;
    /// A training batch of `n` examples drawn with `rng`.
    fn train_batch(&mut self, n: usize, rng: &mut Rng, device: &Device) -> Result<Batch>;
    /// Number of examples in an evaluation split.
    fn eval_len(&self, split: Split) -> usize;
    /// Examples `start..start + n` (clamped to the split) of an evaluation split.
    fn eval_batch(&self, split: Split, start: usize, n: usize, device: &Device) -> Result<Batch>;
    /// The trivial baseline on an evaluation split ([`baseline`]): by default the split's
    /// majority class; Bit Memory copies the visible bits.
    fn baseline(&self, split: Split) -> Result<Baseline> {
        baseline::majority_of(self, split)
    }
    /// Where the training order stands, for tasks that walk a stored dataset (checkpoints
    /// save it so that a resumed run sees the same batches). `None` for generated tasks.
    fn cursor(&self) -> Option<Cursor> {
        None
    }
    /// Puts the training order back where a checkpoint left it.
    fn set_cursor(&mut self, _cursor: Cursor) -> Result<()> {
        Ok(())
    }
    /// The stored splits (name, data), for reports; empty for generated tasks.
    fn splits(&self) -> Vec<(&'static str, &Dataset)> {
        Vec::new()
    }
    /// Checks that `data`, examples from outside the task (`fpt predict`), fit what the
    /// task feeds its model (their kind, width, image size, token ids): an error naming the
    /// first that does not. Tasks that generate their examples take none.
    fn check_external(&self, data: &Dataset) -> Result<()> {
        let _ = data;
        Err(TaskError::Invalid {
            task: "predict",
            msg: format!(
                "{} generates its examples: predictions on new inputs take runs of dataset tasks (custom:, images, ListOps, ...)",
                self.name()
            ),
        })
    }
    /// The model-input batch of examples `start..start + n` (clamped) of `data`, checked by
    /// [`Task::check_external`], encoded as the task encodes its evaluation split.
    fn encode_external(&self, data: &Dataset, start: usize, n: usize, device: &Device) -> Result<Batch> {
        let _ = (start, n, device);
        self.check_external(data)?;
        Err(TaskError::Invalid {
            task: "predict",
            msg: "this task encodes no outside examples".into(),
        })
    }
}

/// Builds the task a spec names. Named forks of the run's `root` generator (the one
/// `Rng::new(seed)` every random stream of a run descends from) fix the evaluation set and,
/// for datasets, the training order and any sampling. Dataset tasks read `spec.path` or
/// `$FPT_HOME/data/<task>` ([`paths::data_dir`]).
pub fn build(spec: &TaskSpec, root: &Rng) -> Result<Box<dyn Task>> {
    let dir = || spec.path.clone().unwrap_or_else(|| paths::data_dir(spec.name));
    if !spec.name.is_generated() && spec.name != TaskName::Custom {
        // Fetched data is re-checked against the sha256 recorded when it was fetched.
        fetch::verify_dir(&dir(), false)?;
    }
    Ok(match spec.name {
        TaskName::ListOps => Box::new(listops::task(&dir(), spec, root)?),
        TaskName::Mnist | TaskName::FashionMnist => Box::new(images::mnist_task(&dir(), spec, root)?),
        TaskName::Cifar10 | TaskName::Cifar10Lra => Box::new(images::cifar_task(&dir(), spec, root)?),
        TaskName::Homology => Box::new(homology::task(&dir(), spec, root)?),
        TaskName::Custom => Box::new(custom::task(&dir(), spec, root)?),
        TaskName::Text => Box::new(text::TextTask::new(spec, root)?),
        TaskName::BitXor => Box::new(BitXor::new(
            spec.n_bits.unwrap_or(5),
            spec.patch.unwrap_or(1),
            spec.eval_examples,
            root,
        )?),
        TaskName::BitMemory => Box::new(BitMemory::new(
            spec.n_bits.unwrap_or(1000),
            5,
            spec.patch.unwrap_or(50),
            spec.eval_examples,
            root,
        )?),
    })
}

/// A task of given shapes with random inputs and labels, for benchmarks: its numbers mean
/// nothing, its tensors have exactly the shapes of the real task.
pub struct Synthetic {
    dims: TaskDims,
}

impl Synthetic {
    /// Random data of shapes `dims`.
    pub fn new(dims: TaskDims) -> Self {
        Self { dims }
    }
}

impl Task for Synthetic {
    fn name(&self) -> TaskName {
        TaskName::BitXor
    }
    fn dims(&self) -> TaskDims {
        self.dims
    }
    fn train_batch(&mut self, n: usize, rng: &mut Rng, device: &Device) -> Result<Batch> {
        let d = self.dims;
        let inputs = match d.input {
            InputKind::Vectors { width } => Inputs::Vectors(fpt_nn::transfer::upload(
                rng.normal_vec(n * d.seq_len * width, 0.0, 1.0),
                (n, d.seq_len, width),
                device,
            )?),
            InputKind::Tokens { vocab } => {
                let ids: Vec<u32> = (0..n * d.seq_len).map(|_| rng.below(vocab as u64) as u32).collect();
                Inputs::Tokens(fpt_nn::transfer::upload(ids, (n, d.seq_len), device)?)
            }
        };
        let labels: Vec<u32> = (0..n * d.labels_per_example)
            .map(|_| rng.below(d.classes as u64) as u32)
            .collect();
        Ok(Batch {
            inputs,
            labels: fpt_nn::transfer::upload(labels, (n, d.labels_per_example), device)?,
        })
    }
    fn eval_len(&self, _split: Split) -> usize {
        0
    }
    fn eval_batch(&self, split: Split, _start: usize, _n: usize, _device: &Device) -> Result<Batch> {
        Err(TaskError::Invalid {
            task: "synthetic",
            msg: format!("has no {split:?} split (benchmark data only)"),
        })
    }
}

/// A task's shapes from its spec alone, without reading data: what the model around the
/// backbone needs (parameter counts, benchmarks). `None` for custom data (its shapes come
/// from the files).
pub fn dims_of(spec: &TaskSpec) -> Option<TaskDims> {
    let one = |input, seq_len, classes| TaskDims {
        input,
        seq_len,
        readout_tokens: 1,
        labels_per_example: 1,
        classes,
    };
    let v = |width| InputKind::Vectors { width };
    Some(match spec.name {
        TaskName::BitXor | TaskName::BitMemory => {
            let (n, patch, strings) = match spec.name {
                TaskName::BitXor => (spec.n_bits.unwrap_or(5), spec.patch.unwrap_or(1), 2),
                _ => (spec.n_bits.unwrap_or(1000), spec.patch.unwrap_or(50), 6),
            };
            TaskDims {
                input: v(patch),
                seq_len: strings * n / patch.max(1),
                readout_tokens: n / patch.max(1),
                labels_per_example: n,
                classes: 2,
            }
        }
        TaskName::ListOps => one(
            InputKind::Tokens {
                vocab: listops::vocab_size(spec.data.brackets),
            },
            spec.data.max_len.unwrap_or(512),
            10,
        ),
        TaskName::Mnist | TaskName::FashionMnist => match spec.data.image_size {
            fpt_spec::ImageSize::Native => one(v(16), 49, 10),
            fpt_spec::ImageSize::Pad32 => one(v(16), 64, 10),
        },
        TaskName::Cifar10 => one(v(48), 64, 10),
        TaskName::Cifar10Lra => one(v(1), 1024, 10),
        TaskName::Homology => one(
            InputKind::Tokens { vocab: homology::VOCAB },
            spec.data.max_len.unwrap_or(1024),
            homology::CLASSES,
        ),
        TaskName::Custom => return None,
        TaskName::Text => {
            let corpus = spec.path.as_deref()?;
            let t = spec.data.max_len.unwrap_or(text::DEFAULT_SEQ_LEN);
            let vocab = if text::ARTIFICIAL.iter().any(|k| Path::new(k) == corpus) {
                spec.data.vocab.unwrap_or(text::DEFAULT_VOCAB)
            } else {
                text::corpus_vocab(&text::corpus_dir(corpus)).ok()?
            };
            TaskDims {
                input: InputKind::Tokens { vocab },
                seq_len: t,
                readout_tokens: t,
                labels_per_example: t,
                classes: vocab,
            }
        }
    })
}

/// Checks that a dataset task's files are where [`build`] will look, without reading them
/// (the harness uses it to say which cells cannot run here). Generated tasks always pass.
pub fn check_present(spec: &TaskSpec) -> Result<()> {
    let dir = spec.path.clone().unwrap_or_else(|| paths::data_dir(spec.name));
    let missing = |what: String| TaskError::Missing {
        task: spec.name.to_string(),
        dir: dir.clone(),
        what,
        hint: match spec.name {
            TaskName::Custom => "give custom:PATH".into(),
            TaskName::Text => "run `fpt fetch austen`, or give text:DIR of a prepared corpus".into(),
            n => format!("run `fpt fetch {n}`"),
        },
    };
    let files: Vec<PathBuf> = match spec.name {
        TaskName::BitXor | TaskName::BitMemory => Vec::new(),
        TaskName::Text => match spec.path.as_deref() {
            Some(c) if text::ARTIFICIAL.iter().any(|k| Path::new(k) == c) => Vec::new(),
            Some(c) => {
                let d = text::corpus_dir(c);
                return match [text::CORPUS_JSON, text::TRAIN_IDS, text::TEST_IDS]
                    .iter()
                    .find(|f| !d.join(f).is_file())
                {
                    Some(f) => Err(TaskError::Missing {
                        task: "text".into(),
                        dir: d.clone(),
                        what: format!("{f} not found"),
                        hint: "run `fpt fetch austen`, or give text:DIR of a prepared corpus".into(),
                    }),
                    None => Ok(()),
                };
            }
            None => return Err(missing("no corpus named (text:CORPUS)".into())),
        },
        TaskName::ListOps => vec![listops::split_file(&dir, "train")],
        TaskName::Mnist | TaskName::FashionMnist => {
            for stem in ["train-images", "train-labels", "t10k-images", "t10k-labels"] {
                if images::find_idx(&dir, stem).is_none() {
                    return Err(missing(format!("{stem}-idx*-ubyte[.gz] not found")));
                }
            }
            Vec::new()
        }
        TaskName::Cifar10 | TaskName::Cifar10Lra => {
            let d = images::cifar_dir(&dir);
            images::CIFAR_TRAIN_FILES
                .iter()
                .chain(&[images::CIFAR_TEST_FILE])
                .map(|f| d.join(f))
                .collect()
        }
        TaskName::Homology => vec![homology::split_file(&dir, "train"), homology::split_file(&dir, "valid")],
        TaskName::Custom => vec![dir.clone()],
    };
    match files.iter().find(|f| !f.exists()) {
        Some(f) => Err(missing(format!(
            "{} not found",
            f.file_name().and_then(|n| n.to_str()).unwrap_or("")
        ))),
        None => Ok(()),
    }
}

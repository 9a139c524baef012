//! Which task a run trains on and how its data is read.

use crate::{Result, SpecError};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

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
/// the paper's numbers); docs/usage.md lists each switch.
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

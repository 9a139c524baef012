//! What a run trains: the FPT model, its output layer alone on cached features, or a
//! linear classifier ([`ModelKind`]).

use crate::SpecError;
use serde::{Deserialize, Serialize};

/// The model a run trains. Each kind runs through the same entry (`fpt_train::train`),
/// with the same run directory, metrics, outcomes and `result.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// The FPT model: a new input layer, the backbone, a new output layer; the run's
    /// `train_groups` say which of them train (the paper's method).
    #[default]
    Fpt,
    /// The output layer alone, trained for `train.cached_epochs` epochs on the frozen
    /// model's features, computed once (paper Table 10); `train_groups` must be `out`.
    OutputOnly,
    /// A linear classifier on the flattened input (token ids one-hot), trained like an FPT
    /// run (same batches, Adam, clipping, steps, evaluation): the floor a transformer has to
    /// beat. The backbone fields are recorded but unused.
    Linear,
}

impl ModelKind {
    /// Every kind, in the order `--help` lists them.
    pub const ALL: [ModelKind; 3] = [ModelKind::Fpt, ModelKind::OutputOnly, ModelKind::Linear];

    /// Whether this is the default kind (then left out of `spec.json`, so the keys of runs
    /// written before the field existed stay the same).
    pub fn is_fpt(&self) -> bool {
        *self == ModelKind::Fpt
    }

    /// Its name in specs and on the command line.
    pub fn as_str(&self) -> &'static str {
        match self {
            ModelKind::Fpt => "fpt",
            ModelKind::OutputOnly => "output-only",
            ModelKind::Linear => "linear",
        }
    }
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ModelKind {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        ModelKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| SpecError::Invalid {
                field: "model",
                msg: format!("unknown model `{s}` (expected fpt, output-only or linear)"),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for k in ModelKind::ALL {
            assert_eq!(k.as_str().parse::<ModelKind>().unwrap(), k);
            assert_eq!(serde_json::to_value(k).unwrap(), serde_json::json!(k.as_str()));
        }
        let e = "lstm".parse::<ModelKind>().unwrap_err().to_string();
        assert!(e.contains("model") && e.contains("lstm"), "{e}");
    }
}

//! How the trainer runs: budget, optimiser settings, evaluation, learning-rate schedule.

use crate::{Result, SpecError};
use serde::{Deserialize, Serialize};
use std::str::FromStr;

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
    /// With `early_stop_patience`: an evaluation improves on the best only by more than its
    /// own noise (1.96 x sqrt(2) standard errors of its accuracy over the held-out
    /// examples, at least `convergence_tolerance`), and a run still at its task's trivial
    /// baseline is never stopped early (a plateau before learning is not convergence).
    /// Not written to spec.json when off, so existing run hashes stand.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub early_stop_within_noise: bool,
    /// With `early_stop_patience = W`: stop only on a plateau, as `result.json`'s
    /// `converged` judges one: the paired per-example test between this evaluation and the
    /// one W evaluations before it finds no gain above the evaluation's noise, and the run
    /// has left its task's trivial baseline. A run still climbing is never stopped, however
    /// little each evaluation adds. Supersedes `early_stop_within_noise`. Not written to
    /// spec.json when off, so existing run hashes stand.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stop_on_plateau: bool,
    /// The first step at which the run may be called converged (and stopped on its
    /// plateau): the paper's Table 6 steps to convergence for its row and task, so that a
    /// slow learner is not called converged before the paper's own count. Not written when
    /// unset, so existing run hashes stand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub converge_floor: Option<usize>,
    /// Stop once the held-out accuracy reaches this (0..1; `steps` is then a cap): what a
    /// task is pretrained until it is solved (the Bit backbone). Not written when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_at_accuracy: Option<f64>,
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
            early_stop_within_noise: false,
            stop_on_plateau: false,
            stop_at_accuracy: None,
            converge_floor: None,
            cached_epochs: None,
            divergence_factor: DEFAULT_DIVERGENCE_FACTOR,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

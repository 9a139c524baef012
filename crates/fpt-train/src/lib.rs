//! The one fpt training loop: builds the task, backbone and model a [`RunSpec`]
//! describes, trains the trainable groups with Adam (paper App. C: lr 1e-3, no weight
//! decay, constant LR, gradient-norm clipping at 1.0, gradient accumulation over
//! micro-batches), evaluates on the task's whole held-out set at a fixed interval, and
//! writes the run directory:
//!
//! - `spec.json`: the effective run spec;
//! - `metrics.jsonl`: one JSON object per evaluation ([`EvalRecord`]);
//! - `checkpoints/`: trainable tensors, optimizer state and loop state ([`checkpoint`]);
//! - `outcomes.json`: the final evaluation's per-example outcomes ([`outcomes::Outcomes`]);
//! - `result.json`: the final numbers ([`RunResult`]), with whether the run left its task's
//!   trivial baseline ([`outcomes::BaselineCheck`]).
//!
//! Every random number comes from streams forked off one seed (init, data, dropout,
//! evaluation sets), and a checkpoint saves the streams' states, so on CPU the same spec
//! gives the same numbers, and a run killed at any point and resumed ends bitwise equal to
//! an unbroken one (wall-clock fields aside).
//!
//! Loading a trained run's tensors over its frozen backbone from Rust:
//!
//! ```no_run
//! use candle_core::Device;
//! use fpt_train::{checkpoint, saved_spec, Trainer};
//! let dir = std::path::Path::new("runs/xor");
//! let mut tr = Trainer::new(&saved_spec(dir)?, &Device::Cpu)?; // rebuilds the frozen backbone
//! let ck = checkpoint::latest(dir)?.expect("the run has a checkpoint");
//! tr.restore(&checkpoint::load(&ck, &Device::Cpu)?, &ck)?; // trainable tensors, optimizer, streams
//! let (loss, accuracy) = tr.evaluate(fpt_tasks::Split::Test)?;
//! # Ok::<(), fpt_train::TrainError>(())
//! ```
//!
//! **Steps to convergence** (paper Table 6): the step of the first evaluation whose test
//! accuracy is within `convergence_tolerance` (default 0.01, absolute) of the run's best
//! and stays within it at every later evaluation.

pub mod bench;
pub mod bench_graph;
pub mod bench_streams;
pub mod checkpoint;
pub mod convergence;
pub mod device_check;
mod evaluate;
mod history;
mod linear_baseline;
pub mod memory;
pub mod optim;
pub mod outcomes;
pub mod output_only;
pub mod pretrain;
pub mod replay_eval;
pub mod replay_step;
mod run_dir;
mod run_loop;
pub mod selfcheck;
pub mod stop;
pub mod tensorboard;
mod trainer;
pub mod trajectory;

pub use evaluate::{device_name, evaluate, evaluate_with, predict_run, tally_with, Predictions, Predictor};
pub use history::Segment;
pub use replay_eval::EvalReplay;
pub use replay_step::ReplayStep;
pub use run_dir::{
    finished_result, in_use_by, pending_call, reopen_reason, respec_run, saved_spec, write_atomic, Holder, Respec,
};
pub(crate) use run_dir::{metrics_append, metrics_truncate, run_dir_err, write_result, RunLock};
pub use run_loop::{evaluate_run, resume, resume_task, train, train_task, RunState};
pub use trainer::{root_rng, StepOutcome, Trainer};

/// The log filter the `fpt` binary and the Python package start from when `FPT_LOG` is
/// unset (`FPT_LOG` takes tracing's `EnvFilter` syntax): warnings from every crate, and
/// the progress lines of pre-training and the output-only fit.
pub const DEFAULT_LOG_FILTER: &str = "warn,fpt_train::pretrain=info,fpt_train::output_only=info";

/// Sends fpt's log (filtered by `FPT_LOG`, else [`DEFAULT_LOG_FILTER`]) to stderr, in colour
/// on a terminal: what the `fpt` binary and the Python package call once at start. False
/// when the process had a global subscriber already (it keeps it).
pub fn log_to_stderr() -> bool {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FPT_LOG").unwrap_or_else(|_| DEFAULT_LOG_FILTER.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init()
        .is_ok()
}

use candle_core::{DType, Device, Tensor, Var};
use fpt_model::{Fpt, HeadConfig};
use fpt_nn::{ops, Ctx, Rng};
use fpt_spec::{ModelKind, RunSpec, TrainEval};
use fpt_tasks::{Split, Task};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Errors from a training run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The spec is invalid.
    #[error("invalid run spec: {0}")]
    Spec(#[from] fpt_spec::SpecError),
    /// The backbone could not be built.
    #[error(transparent)]
    Backbone(#[from] fpt_backbones::BackboneError),
    /// The task could not be built.
    #[error(transparent)]
    Task(#[from] fpt_tasks::TaskError),
    /// The model could not be built or run.
    #[error(transparent)]
    Model(#[from] fpt_model::ModelError),
    /// A file of the run directory could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A checkpoint could not be written, read or used.
    #[error("checkpoint {path}: {msg}")]
    Checkpoint {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// The run directory does not fit the request (already used, nothing to resume, spec
    /// changed).
    #[error("{path}: {msg}")]
    RunDir {
        /// The run directory.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// No parameter group trains.
    #[error("nothing to train: the chosen groups ({0}) select no parameters")]
    NothingToTrain(String),
    /// The run would not fit in this machine's memory.
    #[error("{0}")]
    TooBig(String),
    /// An error inside candle.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// The run stopped before its end because a stop was due ([`stop`]): a deadline or an
    /// interrupt. Its checkpoint at `step` is written; resuming continues from it.
    #[error("{}: stopped at step {step} of {steps} ({why}); its checkpoint is written: resume continues from it", path.display())]
    Stopped {
        /// The run directory.
        path: PathBuf,
        /// Steps done.
        step: usize,
        /// The run's cap.
        steps: usize,
        /// Why.
        why: stop::Why,
    },
}

impl TrainError {
    /// An error that is only its message (candle's `Msg`).
    pub(crate) fn msg(m: impl Into<String>) -> Self {
        TrainError::Candle(candle_core::Error::Msg(m.into()))
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, TrainError>;

/// One evaluation, as written to `metrics.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EvalRecord {
    /// Optimizer steps done.
    pub step: usize,
    /// Mean training loss over the steps since the previous evaluation.
    pub train_loss: f64,
    /// Mean loss on the held-out set.
    pub test_loss: f64,
    /// Accuracy on the whole held-out set (bit-level for the bit tasks).
    pub test_accuracy: f64,
    /// Accuracy on the training split, when measured at this evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_accuracy: Option<f64>,
    /// Learning rate of the last step.
    pub lr: f64,
    /// Global gradient norm before clipping, at the last step.
    pub grad_norm: f64,
    /// Seconds of training so far (summed over resumed segments).
    pub elapsed_s: f64,
    /// Held-out examples evaluated (strings for the bit tasks); absent in lines written
    /// before fpt recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub examples: Option<usize>,
    /// Seconds this evaluation took (the held-out split, and the training split where
    /// measured): with `elapsed_s`, the share of a run's time spent evaluating. Absent in
    /// lines written before fpt recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_s: Option<f64>,
}

/// The final numbers of a run, written to `result.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    /// Task name.
    pub task: String,
    /// Backbone source as given.
    pub backbone: String,
    /// `pretrained` or `random`.
    pub init: String,
    /// Where the backbone weights came from.
    pub weights: String,
    /// Trained groups.
    pub train_groups: String,
    /// The frozen weights' number format (not written when `f32`).
    #[serde(default, skip_serializing_if = "fpt_spec::Precision::is_f32")]
    pub precision: fpt_spec::Precision,
    /// Held-out accuracy at the end, in 0..1.
    pub test_accuracy: f64,
    /// Held-out loss at the end (`null` if not finite).
    pub test_loss: Option<f64>,
    /// Accuracy on the training split at the end (`null` with `train_eval: never`).
    pub train_accuracy: Option<f64>,
    /// Best held-out accuracy over all evaluations.
    pub best_accuracy: f64,
    /// Step of `best_accuracy`.
    pub best_step: usize,
    /// Steps to convergence (see the crate docs).
    pub converged_step: Option<usize>,
    /// Mean training loss over the last evaluation interval (`null` if not finite).
    pub final_train_loss: Option<f64>,
    /// Optimizer steps completed.
    pub steps: usize,
    /// Examples per step.
    pub batch_size: usize,
    /// Held-out examples evaluated.
    pub eval_examples: usize,
    /// Trained parameters.
    pub trainable_params: usize,
    /// All parameters (including unused ones such as GPT-2's `wte`).
    pub total_params: usize,
    /// Seconds of training, summed over resumed segments.
    pub wall_seconds: f64,
    /// Seed.
    pub seed: u64,
    /// Device, e.g. `cpu`.
    pub device: String,
    /// True when the run diverged: its loss or gradient was not finite.
    pub diverged: bool,
    /// The step at which the run diverged; the numbers above are then those of the best
    /// evaluation before it (`test_accuracy` = `best_accuracy`), and the last checkpoint holds
    /// its tensors.
    pub diverged_at_step: Option<usize>,
    /// Why the run was marked diverged (a non-finite loss or gradient, or a loss above
    /// `divergence_factor` times the first step's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diverged_reason: Option<String>,
    /// True when early stopping ended the run before `steps`.
    pub stopped_early: bool,
    /// Whether the run ended on a plateau of its held-out accuracy by the rule
    /// ([`outcomes::convergence`]: flat across the last half of its steps, at or past its
    /// floor). False for a
    /// run that ended at its cap while still rising (its accuracy is then a lower bound of
    /// where it would end), that diverged, or that evaluated once; absent in results
    /// written before fpt recorded it and for the linear baseline and output-only runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub converged: Option<bool>,
    /// The plateau test behind `converged`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plateau: Option<outcomes::Plateau>,
    /// True when the run **ended at its baseline**: at its task's trivial baseline, flat by
    /// the rule across the last half of its steps, at or past its row's Table 6 count (its
    /// floor). It stopped there, as the side of a comparison that did not learn; `converged`
    /// is true with it. False for every other run (and absent in results written before fpt
    /// recorded it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ended_at_baseline: bool,
    /// On a Bit backbone: how its pretraining on Bit Memory ended (did it learn its task?).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bit_backbone: Option<pretrain::BitBackbone>,
    /// The trivial baseline's accuracy on the evaluated examples (see `baseline`).
    pub baseline_accuracy: Option<f64>,
    /// The task's trivial baseline and whether this run left it (absent in results written
    /// before fpt judged runs, and where the final evaluation's outcomes were not at hand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<outcomes::BaselineCheck>,
    /// Output-only training on cached features: its timings and the speedup per epoch
    /// over FPT training (paper Table 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached: Option<output_only::CachedStats>,
    /// The build, kernel path, CPU and self-check behind these numbers (absent in results
    /// written before fpt recorded it and for the linear baseline and output-only runs..
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<selfcheck::Provenance>,
}

impl RunResult {
    /// Whether the run ended at its task's baseline by the rule as it stands
    /// ([`convergence::ended_at_baseline`] on the record's plateau and baseline check), or by
    /// the record's own flag: so a record written before the rule's second way (a run that
    /// never learned at all) reads by it too, without retraining anything.
    pub fn ended_at_baseline_now(&self) -> bool {
        self.ended_at_baseline || convergence::ended_at_baseline(self.plateau.as_ref(), self.baseline.as_ref())
    }
}

/// What the loop reports while it runs.
#[derive(Debug)]
pub enum Event<'a> {
    /// The model is built.
    Started {
        /// Trained parameters.
        trainable: usize,
        /// All parameters.
        total: usize,
        /// Where the backbone's weights came from.
        weights: &'a str,
        /// The step the run starts from (0, or the resumed checkpoint's).
        from_step: usize,
        /// Total steps.
        steps: usize,
    },
    /// A step finished.
    Step {
        /// Steps done.
        step: usize,
        /// Its training loss.
        loss: f64,
    },
    /// An evaluation finished.
    Eval(&'a EvalRecord),
    /// A checkpoint was written.
    Checkpoint(&'a Path),
    /// The run diverged at this step.
    Diverged(usize),
    /// Early stopping ended the run at this step.
    StoppedEarly(usize),
}

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
pub mod checkpoint;
pub mod linear;
pub mod memory;
pub mod optim;
pub mod outcomes;
pub mod parity;
pub mod pretrain;
pub mod reservoir;
pub mod selfcheck;

use candle_core::{DType, Device, Tensor, Var};
use fpt_model::{Fpt, HeadConfig};
use fpt_nn::{ops, Ctx, Rng};
use fpt_spec::{RunSpec, TrainEval};
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
    /// The trivial baseline's accuracy on the evaluated examples (see `baseline`).
    pub baseline_accuracy: Option<f64>,
    /// The task's trivial baseline and whether this run left it (absent in results written
    /// before fpt judged runs, and where the final evaluation's outcomes were not at hand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<outcomes::BaselineCheck>,
    /// Output-only training on cached features: its timings and the speedup per epoch
    /// over FPT training (paper Table 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached: Option<reservoir::CachedStats>,
    /// The build, kernel path, CPU and self-check behind these numbers (absent in results
    /// written before fpt recorded it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<selfcheck::Provenance>,
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

/// Writes `bytes` to `path` atomically (temporary file in the same directory, synced, then
/// renamed), so a reader never sees a half-written file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    fpt_spec::files::write_atomic(path, bytes).map_err(|source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Mean loss and accuracy of `model` over a whole evaluation split. The forward passes
/// record no autograd graph ([`fpt_nn::no_grad`]): each activation is freed once used.
pub fn evaluate(model: &Fpt, task: &dyn Task, split: Split, batch_size: usize, device: &Device) -> Result<(f64, f64)> {
    let mut ctx = Ctx::eval();
    fpt_nn::no_grad(|| {
        evaluate_with(task, split, batch_size, device, &mut |inputs| {
            Ok(fpt_nn::on_pool(|| model.forward(inputs, &mut ctx))?)
        })
    })
}

/// Mean loss and accuracy over a whole evaluation split of any model, given as `forward`
/// from a batch's inputs to logits whose last dimension is the classes.
pub fn evaluate_with(
    task: &dyn Task,
    split: Split,
    batch_size: usize,
    device: &Device,
    forward: &mut dyn FnMut(&fpt_tasks::Inputs) -> Result<Tensor>,
) -> Result<(f64, f64)> {
    Ok(tally_with(task, split, batch_size, device, forward)?.loss_and_accuracy())
}

/// [`evaluate_with`], keeping the per-example outcomes ([`outcomes::Tally`]).
pub fn tally_with(
    task: &dyn Task,
    split: Split,
    batch_size: usize,
    device: &Device,
    forward: &mut dyn FnMut(&fpt_tasks::Inputs) -> Result<Tensor>,
) -> Result<outcomes::Tally> {
    let mut tally = outcomes::Tally::default();
    let per_example = task.dims().labels_per_example;
    let n = task.eval_len(split);
    let mut start = 0;
    while start < n {
        let batch = task.eval_batch(split, start, batch_size, device)?;
        let bsz = batch.inputs.batch_size();
        let logits = forward(&batch.inputs)?;
        let classes = logits.dim(candle_core::D::Minus1)?;
        tally.add(
            &logits.reshape(((), classes))?,
            &batch.labels.flatten_all()?,
            per_example,
        )?;
        start += bsz.max(1);
    }
    Ok(tally)
}

/// Names a device for reports.
pub fn device_name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

/// A run in progress: the task, the model, the optimizer and the random streams.
pub struct Trainer {
    spec: RunSpec,
    device: Device,
    task: Box<dyn Task>,
    model: Fpt,
    vars: Vec<Var>,
    adam: optim::Adam,
    pub(crate) data_rng: Rng,
    pub(crate) ctx: Ctx,
    weights: String,
    step: usize,
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOutcome {
    /// Mean training loss of the step's micro-batches.
    pub loss: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate used.
    pub lr: f64,
    /// False when the loss or gradient was not finite; the update was then skipped.
    pub finite: bool,
}

/// The run's root generator, `Rng::new(spec.train.seed)`: every random stream of a run is a
/// named fork of it, the trainer's `init` (weights), `data` (batches) and `dropout`, and the
/// task's (`fpt_tasks::build`: evaluation sets, samples, the training order).
pub fn root_rng(spec: &RunSpec) -> Rng {
    Rng::new(spec.train.seed)
}

impl Trainer {
    /// Builds everything `spec` describes on `device`.
    pub fn new(spec: &RunSpec, device: &Device) -> Result<Self> {
        spec.validate()?;
        Self::with_task(spec, fpt_tasks::build(&spec.task, &root_rng(spec))?, device)
    }

    /// Builds the run of `spec` on another task than the one it names (benchmarks use
    /// [`fpt_tasks::Synthetic`]).
    pub fn with_task(spec: &RunSpec, task: Box<dyn Task>, device: &Device) -> Result<Self> {
        spec.validate()?;
        let t = &spec.train;
        let master = root_rng(spec);
        let mut init_rng = master.fork("init");
        // Sizes are within fpt's limits (validated); check the whole against this machine
        // before anything is allocated (or a Bit backbone trained).
        let (config, pspecs) = fpt_backbones::param_specs(&spec.backbone)?;
        let estimate = memory::estimate(
            spec,
            &pspecs,
            (config.hidden_size(), config.layers(), config.heads()),
            &task.dims(),
        );
        if device.is_cpu() {
            // (On a GPU the device's memory is what counts; its allocator reports itself.)
            memory::check(&estimate).map_err(TrainError::TooBig)?;
        }
        let source = pretrain::resolve_backbone(&spec.backbone, device)?;
        let mut backbone = fpt_backbones::load(&source, &spec.train_groups, device, &mut init_rng)?;
        backbone.set_dropout(spec.backbone_dropout);
        let weights = backbone.origin().to_string();
        let head = HeadConfig {
            input_dropout: spec.input_dropout,
            orth_gain: spec.orth_gain,
        };
        let model =
            Fpt::new(backbone, task.dims(), spec.train_groups, head, device, &mut init_rng).map_err(|e| match e {
                fpt_model::ModelError::Mismatch(m) => {
                    fpt_model::ModelError::Mismatch(format!("task {}: {m}", spec.task.label()))
                }
                e => e,
            })?;
        let vars: Vec<_> = model.trainable().into_iter().map(|(_, v)| v).collect();
        if vars.is_empty() {
            return Err(TrainError::NothingToTrain(spec.train_groups.to_string()));
        }
        let adam = optim::Adam::new(vars.clone(), t.lr)?;
        Ok(Self {
            spec: spec.clone(),
            device: device.clone(),
            task,
            model,
            vars,
            adam,
            data_rng: master.fork("data"),
            ctx: Ctx {
                train: true,
                rng: master.fork("dropout"),
                attention: None,
            },
            weights,
            step: 0,
        })
    }

    /// The spec this trainer runs.
    pub fn spec(&self) -> &RunSpec {
        &self.spec
    }

    /// The model.
    pub fn model(&self) -> &Fpt {
        &self.model
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &optim::Adam {
        &self.adam
    }

    /// The task.
    pub fn task(&self) -> &dyn Task {
        self.task.as_ref()
    }

    /// Where the backbone's weights came from.
    pub fn weights(&self) -> &str {
        &self.weights
    }

    /// Optimizer steps taken.
    pub fn steps_done(&self) -> usize {
        self.step
    }

    /// Restores parameters, optimizer state and random streams from a checkpoint, after
    /// checking that it belongs to this run's spec.
    pub fn restore(&mut self, loaded: &checkpoint::Loaded, path: &Path) -> Result<()> {
        let diffs = loaded.state.spec.differences(&self.spec);
        if !diffs.is_empty() {
            return Err(TrainError::Checkpoint {
                path: path.to_path_buf(),
                msg: format!("belongs to another run spec ({})", diffs.join("; ")),
            });
        }
        checkpoint::load_trainable(&self.model, &loaded.trainable, path)?;
        let names: Vec<String> = self.model.trainable().into_iter().map(|(n, _)| n).collect();
        let mut m = Vec::new();
        let mut v = Vec::new();
        for (n, var) in names.iter().zip(&self.vars) {
            for (prefix, out) in [("m", &mut m), ("v", &mut v)] {
                let key = format!("{prefix}.{n}");
                let t = loaded.moments.get(&key).ok_or_else(|| TrainError::Checkpoint {
                    path: path.to_path_buf(),
                    msg: format!("optimizer state lacks `{key}`"),
                })?;
                if t.dims() != var.dims() {
                    return Err(TrainError::Checkpoint {
                        path: path.to_path_buf(),
                        msg: format!(
                            "optimizer tensor `{key}` has shape {:?}, expected {:?}",
                            t.dims(),
                            var.dims()
                        ),
                    });
                }
                out.push(t.clone());
            }
        }
        self.adam.restore(loaded.state.adam_t, m, v)?;
        self.data_rng = loaded.state.data_rng.clone();
        self.ctx.rng = loaded.state.dropout_rng.clone();
        if let Some(c) = loaded.state.data_cursor {
            self.task.set_cursor(c)?;
        }
        self.step = loaded.state.step;
        Ok(())
    }

    /// Forward and backward on one fresh training micro-batch; returns its loss and the
    /// gradient store (which holds gradients of trainable tensors only).
    pub fn micro_batch_grads(&mut self) -> Result<(f64, candle_core::backprop::GradStore)> {
        let n = self.spec.train.micro_batch_size;
        let batch = self.task.train_batch(n, &mut self.data_rng, &self.device)?;
        let logits = self.model.forward(&batch.inputs, &mut self.ctx)?;
        let classes = logits.dim(2)?;
        let loss = ops::cross_entropy(&logits.reshape(((), classes))?, &batch.labels.flatten_all()?)?;
        let value = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        Ok((value, loss.backward()?))
    }

    /// One optimizer step: gradients averaged over `batch_size / micro_batch_size`
    /// micro-batches, clipped, then Adam at the scheduled rate. A non-finite loss or
    /// gradient skips the update. Runs on a worker of rayon's pool ([`fpt_nn::on_pool`]).
    pub fn step(&mut self) -> Result<StepOutcome> {
        fpt_nn::on_pool(|| self.step_here())
    }

    fn step_here(&mut self) -> Result<StepOutcome> {
        let t = &self.spec.train;
        let accum = t.batch_size / t.micro_batch_size;
        let clip = t.clip_norm;
        let lr = t.lr_schedule.lr_at(t.lr, self.step + 1, t.steps);
        let mut sums: Vec<Option<Tensor>> = vec![None; self.vars.len()];
        let mut loss = 0f64;
        for _ in 0..accum {
            let (l, grads) = self.micro_batch_grads()?;
            loss += l / accum as f64;
            for (slot, var) in sums.iter_mut().zip(&self.vars) {
                if let Some(g) = grads.get(var.as_tensor()) {
                    *slot = Some(match slot.take() {
                        Some(s) => (s + g)?,
                        None => g.clone(),
                    });
                }
            }
        }
        let mut grads: Vec<Tensor> = sums
            .into_iter()
            .zip(&self.vars)
            .map(|(g, v)| match g {
                Some(g) if accum > 1 => g / accum as f64,
                Some(g) => Ok(g),
                None => v.zeros_like(),
            })
            .collect::<candle_core::Result<_>>()?;
        let grad_norm = match clip {
            Some(c) => optim::clip_grad_norm(&mut grads, c)?,
            None => optim::grad_norm(&grads)?,
        };
        let finite = loss.is_finite() && grad_norm.is_finite();
        if finite {
            self.adam.lr = lr;
            self.adam.step(&grads)?;
            self.step += 1;
        }
        Ok(StepOutcome {
            loss,
            grad_norm,
            lr,
            finite,
        })
    }

    /// Examples per evaluation forward pass: up to 64, fewer for long sequences (a forward
    /// pass keeps every layer's `batch x heads x tokens^2` attention alive while trainable
    /// tensors take part), never fewer than the training micro-batch.
    pub fn eval_batch_size(&self) -> usize {
        let t = self.task.dims().seq_len.max(1);
        (((1usize << 20) / (t * t)).clamp(1, 64)).max(self.spec.train.micro_batch_size)
    }

    /// Loss and accuracy on a whole evaluation split.
    pub fn evaluate(&self, split: Split) -> Result<(f64, f64)> {
        Ok(self.tally(split)?.loss_and_accuracy())
    }

    /// The per-example outcomes of an evaluation of a whole split.
    pub fn tally(&self, split: Split) -> Result<outcomes::Tally> {
        let mut ctx = Ctx::eval();
        let model = &self.model;
        fpt_nn::no_grad(|| {
            tally_with(
                self.task.as_ref(),
                split,
                self.eval_batch_size(),
                &self.device,
                &mut |inputs| Ok(fpt_nn::on_pool(|| model.forward(inputs, &mut ctx))?),
            )
        })
    }
}

/// The training loop's running numbers, saved in every checkpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RunState {
    /// Sum of step losses since the last evaluation.
    pub window_loss: f64,
    /// Steps since the last evaluation.
    pub window_steps: usize,
    /// Every evaluation so far.
    pub evals: Vec<EvalRecord>,
    /// Lines of `metrics.jsonl` written so far.
    pub metrics_lines: usize,
    /// Seconds of training in earlier segments.
    pub elapsed_s: f64,
    /// Consecutive evaluations without improvement (early stopping).
    pub stale_evals: usize,
    /// Learning rate and gradient norm of the last step.
    pub last_lr: f64,
    /// The loss of the run's first step: the reference for divergence (`divergence_factor`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_loss: Option<f64>,
    /// Gradient norm of the last step.
    pub last_grad_norm: f64,
}

impl RunState {
    fn best(&self) -> Option<&EvalRecord> {
        self.evals.iter().fold(None, |b: Option<&EvalRecord>, e| match b {
            Some(b) if b.test_accuracy >= e.test_accuracy => Some(b),
            _ => Some(e),
        })
    }

    /// Steps to convergence (see the crate docs).
    pub fn converged_step(&self, tolerance: f64) -> Option<usize> {
        let best = self.best()?.test_accuracy;
        let mut candidate = None;
        for e in &self.evals {
            if e.test_accuracy >= best - tolerance {
                candidate.get_or_insert(e.step);
            } else {
                candidate = None;
            }
        }
        candidate
    }
}

pub(crate) fn metrics_append(path: &Path, rec: &EvalRecord) -> Result<()> {
    let io = |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    writeln!(f, "{}", serde_json::to_string(rec).expect("record serialises")).map_err(io)?;
    f.flush().map_err(io)
}

/// Keeps the first `lines` lines of `metrics.jsonl` (those a checkpoint accounts for).
fn metrics_truncate(path: &Path, lines: usize) -> Result<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(TrainError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let kept: String = text.lines().take(lines).map(|l| format!("{l}\n")).collect();
    write_atomic(path, kept.as_bytes())
}

fn evaluate_now(
    tr: &Trainer,
    run: &mut RunState,
    with_train: bool,
    started: &Instant,
    metrics: &Path,
) -> Result<(EvalRecord, outcomes::Tally)> {
    let _e = tracing::info_span!("eval", step = tr.steps_done()).entered();
    let tally = tr.tally(Split::Test)?;
    let (test_loss, test_accuracy) = tally.loss_and_accuracy();
    let train_accuracy = if with_train {
        Some(tr.evaluate(Split::Train)?.1)
    } else {
        None
    };
    let train_loss = if run.window_steps > 0 {
        run.window_loss / run.window_steps as f64
    } else {
        run.evals.last().map(|e| e.train_loss).unwrap_or(f64::NAN)
    };
    let rec = EvalRecord {
        step: tr.steps_done(),
        train_loss,
        test_loss,
        test_accuracy,
        train_accuracy,
        lr: run.last_lr,
        grad_norm: run.last_grad_norm,
        elapsed_s: run.elapsed_s + started.elapsed().as_secs_f64(),
    };
    metrics_append(metrics, &rec)?;
    run.metrics_lines += 1;
    run.window_loss = 0.0;
    run.window_steps = 0;
    run.evals.push(rec.clone());
    Ok((rec, tally))
}

fn run_loop(
    mut tr: Trainer,
    mut run: RunState,
    out_dir: &Path,
    device: &Device,
    on_event: &mut dyn FnMut(&Event),
) -> Result<RunResult> {
    let started = Instant::now();
    let spec = tr.spec().clone();
    let t = &spec.train;
    let counts = tr.model().param_counts();
    let weights = tr.weights().to_string();
    on_event(&Event::Started {
        trainable: counts.trainable,
        total: counts.total,
        weights: &weights,
        from_step: tr.steps_done(),
        steps: t.steps,
    });
    let metrics = out_dir.join("metrics.jsonl");
    let every_train = t.train_eval == TrainEval::Every;
    let mut diverged: Option<(usize, String)> = None;
    let mut stopped_early = false;
    // The trained tensors at the best evaluation so far (this segment of the run): what a
    // diverged run keeps.
    let mut best_params: Option<Vec<Tensor>> = None;
    // The latest evaluation's per-example outcomes, with its step.
    let mut last_tally: Option<(usize, outcomes::Tally)> = None;
    // The task's trivial baseline, for stopping within noise (built at the first evaluation).
    let mut stop_baseline: Option<fpt_tasks::Baseline> = None;
    while tr.steps_done() < t.steps {
        let out = tr.step()?;
        let why = if !out.finite {
            // The update was skipped: the step did not happen.
            Some((
                tr.steps_done() + 1,
                format!("non-finite loss ({}) or gradient norm ({})", out.loss, out.grad_norm),
            ))
        } else {
            run.first_loss
                .filter(|&l0| out.loss > t.divergence_factor * l0)
                .map(|l0| {
                    (
                        tr.steps_done(),
                        format!(
                            "loss {:.4e} is above {} x the first step's {l0:.4e}",
                            out.loss, t.divergence_factor
                        ),
                    )
                })
        };
        if let Some((at, reason)) = why {
            on_event(&Event::Diverged(at));
            tracing::warn!(step = at, "diverged: {reason}; keeping the best evaluation before it");
            diverged = Some((at, reason));
            break;
        }
        run.first_loss.get_or_insert(out.loss);
        let step = tr.steps_done();
        run.window_loss += out.loss;
        run.window_steps += 1;
        run.last_lr = out.lr;
        run.last_grad_norm = out.grad_norm;
        on_event(&Event::Step { step, loss: out.loss });
        if step.is_multiple_of(t.eval_every) || step == t.steps {
            let before = run.best().map(|b| b.test_accuracy);
            let with_train = every_train || (step == t.steps && t.train_eval == TrainEval::Final);
            let (rec, tally) = evaluate_now(&tr, &mut run, with_train, &started, &metrics)?;
            last_tally = Some((rec.step, tally));
            on_event(&Event::Eval(&rec));
            if before.is_none_or(|b| rec.test_accuracy > b) {
                best_params = Some(
                    tr.model()
                        .trainable()
                        .iter()
                        .map(|(_, v)| v.as_tensor().copy())
                        .collect::<candle_core::Result<_>>()?,
                );
            }
            let (tolerance, at_baseline) = if t.early_stop_within_noise && t.early_stop_patience.is_some() {
                let tally = &last_tally.as_ref().expect("just evaluated").1;
                let base = match &stop_baseline {
                    Some(b) => b,
                    None => stop_baseline.insert(tr.task().baseline(Split::Test)?),
                };
                let out = outcomes::Outcomes::new(rec.step, tr.task().dims().labels_per_example, tally, base);
                let losses: Vec<f64> = run.evals.iter().map(|e| e.train_loss).collect();
                let noise = 1.96 * std::f64::consts::SQRT_2 * outcomes::standard_error(&out.scores());
                (
                    t.convergence_tolerance.max(noise),
                    !outcomes::judge(base, &out, &losses).left,
                )
            } else {
                (t.convergence_tolerance, false)
            };
            match before {
                _ if at_baseline => run.stale_evals = 0,
                Some(b) if rec.test_accuracy <= b + tolerance => run.stale_evals += 1,
                _ => run.stale_evals = 0,
            }
            if t.early_stop_patience.is_some_and(|p| run.stale_evals >= p) && step < t.steps {
                stopped_early = true;
                on_event(&Event::StoppedEarly(step));
            }
        }
        if t.checkpoint_every.is_some_and(|c| step.is_multiple_of(c)) && step < t.steps && !stopped_early {
            let mut snapshot = run.clone();
            snapshot.elapsed_s += started.elapsed().as_secs_f64();
            let dir = checkpoint::save(out_dir, &tr, &snapshot)?;
            on_event(&Event::Checkpoint(&dir));
        }
        if stopped_early {
            break;
        }
    }
    if diverged.is_some() {
        if let Some(params) = &best_params {
            // Back to the best evaluation's tensors: the checkpoint `fpt eval` reads is then
            // the run's best, never the diverged one.
            for ((_, var), p) in tr.model().trainable().iter().zip(params) {
                var.set(p)?;
            }
        }
    }
    // The last evaluation must describe the final parameters (a diverged run: the best
    // evaluation before divergence, when there is one).
    let need_final =
        (diverged.is_none() || run.evals.is_empty()) && run.evals.last().map(|e| e.step) != Some(tr.steps_done());
    let with_train = t.train_eval != TrainEval::Never && diverged.is_none();
    let last = if need_final || (with_train && run.evals.last().and_then(|e| e.train_accuracy).is_none()) {
        if !need_final {
            // Re-evaluate in place of the last record, now with train accuracy.
            run.evals.pop();
            run.metrics_lines -= 1;
            metrics_truncate(&metrics, run.metrics_lines)?;
        }
        let (rec, tally) = evaluate_now(&tr, &mut run, with_train, &started, &metrics)?;
        last_tally = Some((rec.step, tally));
        on_event(&Event::Eval(&rec));
        rec
    } else if diverged.is_some() {
        run.best().cloned().expect("an evaluation exists")
    } else {
        run.evals.last().cloned().expect("an evaluation exists")
    };
    // The outcomes of the evaluation the result reports: this segment's, or (a run resumed
    // after its last evaluation, a diverged run put back to its best tensors) a fresh one of
    // the same tensors; none for a diverged run whose best tensors are not at hand.
    let tally = match last_tally {
        Some((step, tally)) if step == last.step && diverged.is_none() => Some(tally),
        _ if diverged.is_none() || best_params.is_some() => Some(tr.tally(Split::Test)?),
        _ => None,
    };
    let baseline = match tally {
        Some(tally) => {
            let base = tr.task().baseline(Split::Test)?;
            let out = outcomes::Outcomes::new(last.step, tr.task().dims().labels_per_example, &tally, &base);
            outcomes::write(out_dir, &out)?;
            let losses: Vec<f64> = run.evals.iter().map(|e| e.train_loss).collect();
            Some(outcomes::judge(&base, &out, &losses))
        }
        None => None,
    };
    if let Some(b) = baseline.as_ref().filter(|b| !b.left) {
        tracing::warn!("the run is at its task's trivial baseline: {}", b.reasons.join("; "));
    }
    if let Some(b) = baseline.as_ref().filter(|b| !b.classes_only_in_eval.is_empty()) {
        tracing::warn!(
            "classes {:?} occur in the evaluated split but never in training: they cannot be learned, and count against the accuracy",
            b.classes_only_in_eval
        );
    }
    let mut snapshot = run.clone();
    snapshot.elapsed_s += started.elapsed().as_secs_f64();
    let best = run.best().cloned().expect("an evaluation exists");
    let result = RunResult {
        task: spec.task.name.to_string(),
        backbone: spec.backbone.source.clone(),
        init: spec.backbone.init.to_string(),
        weights,
        train_groups: spec.train_groups.to_string(),
        test_accuracy: last.test_accuracy,
        test_loss: last.test_loss.is_finite().then_some(last.test_loss),
        train_accuracy: last.train_accuracy,
        best_accuracy: best.test_accuracy,
        best_step: best.step,
        converged_step: run.converged_step(t.convergence_tolerance),
        final_train_loss: last.train_loss.is_finite().then_some(last.train_loss),
        steps: tr.steps_done(),
        batch_size: t.batch_size,
        eval_examples: tr.task().eval_len(Split::Test),
        trainable_params: counts.trainable,
        total_params: counts.total,
        wall_seconds: snapshot.elapsed_s,
        seed: t.seed,
        device: device_name(device),
        diverged: diverged.is_some(),
        diverged_at_step: diverged.as_ref().map(|d| d.0),
        diverged_reason: diverged.as_ref().map(|d| d.1.clone()),
        stopped_early,
        baseline_accuracy: baseline.as_ref().map(|b| b.accuracy),
        baseline,
        cached: None,
        provenance: Some(selfcheck::provenance()),
    };
    // The result first: a run that trained to the end keeps its numbers even when its last
    // checkpoint cannot be written (a full disk); the error is still reported.
    write_result(out_dir, &result)?;
    if diverged.is_none() || best_params.is_some() || checkpoint::latest(out_dir)?.is_none() {
        let dir = checkpoint::save(out_dir, &tr, &snapshot)?;
        on_event(&Event::Checkpoint(&dir));
    }
    Ok(result)
}

/// Writes `result.json` atomically.
pub(crate) fn write_result(out_dir: &Path, result: &RunResult) -> Result<()> {
    write_atomic(
        &out_dir.join("result.json"),
        serde_json::to_string_pretty(result)
            .expect("result serialises")
            .as_bytes(),
    )
}

pub(crate) fn run_dir_err(path: &Path, msg: impl Into<String>) -> TrainError {
    TrainError::RunDir {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// Runs `spec` from scratch in `out_dir`, which must not hold another run.
pub fn train(spec: &RunSpec, out_dir: &Path, device: &Device, on_event: &mut dyn FnMut(&Event)) -> Result<RunResult> {
    let _span = tracing::info_span!("run", task = %spec.task.name, backbone = %spec.backbone.source).entered();
    if out_dir.join("spec.json").exists() || checkpoint::root(out_dir).exists() {
        return Err(run_dir_err(
            out_dir,
            "already holds a run; continue it with `fpt train --resume DIR`, or choose a new --out",
        ));
    }
    // Build (and so validate) everything before touching the run directory: a run that
    // cannot start leaves nothing behind.
    let tr = Trainer::new(spec, device)?;
    let created = !out_dir.exists();
    std::fs::create_dir_all(out_dir).map_err(|source| TrainError::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let lock = RunLock::acquire(out_dir)?;
    let started = (|| {
        write_atomic(
            &out_dir.join("spec.json"),
            serde_json::to_string_pretty(spec).expect("spec serialises").as_bytes(),
        )?;
        metrics_truncate(&out_dir.join("metrics.jsonl"), 0)?;
        if spec.train.cached_epochs.is_some() {
            return reservoir::run(tr, out_dir, device, on_event);
        }
        run_loop(tr, RunState::default(), out_dir, device, on_event)
    })();
    if started.is_err() && failed_at_start(out_dir) {
        // Nothing to resume (no evaluation, no checkpoint, no result): leave the directory
        // as it was, so the same --out can be used again.
        for f in ["spec.json", "metrics.jsonl"] {
            let _ = std::fs::remove_file(out_dir.join(f));
        }
        drop(lock);
        if created {
            let _ = std::fs::remove_dir(out_dir);
        }
    }
    started
}

/// Whether a run that stopped with an error left nothing worth resuming: no evaluation in
/// `metrics.jsonl`, no checkpoint, no result.
fn failed_at_start(out_dir: &Path) -> bool {
    let metrics_empty = std::fs::metadata(out_dir.join("metrics.jsonl")).map_or(true, |m| m.len() == 0);
    metrics_empty && !checkpoint::root(out_dir).exists() && !out_dir.join("result.json").exists()
}

/// The lock a run or resume holds on its directory (`.lock`, holding the process id), so
/// two processes never write one run; removed when dropped. A lock left by a process that
/// no longer runs (killed) is taken over.
struct RunLock {
    path: PathBuf,
}

impl RunLock {
    fn acquire(dir: &Path) -> Result<Self> {
        let path = dir.join(".lock");
        let io = |source| TrainError::Io {
            path: path.clone(),
            source,
        };
        for _ in 0..3 {
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    write!(f, "{}", std::process::id()).map_err(io)?;
                    return Ok(Self { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(&path)
                        .ok()
                        .and_then(|s| s.trim().parse::<u32>().ok());
                    match holder {
                        Some(pid) if pid != std::process::id() && process_alive(pid) => {
                            return Err(run_dir_err(
                                dir,
                                format!("is in use by process {pid} (another fpt run or resume of it); wait for it to end or stop it"),
                            ))
                        }
                        // A lock its process left behind (killed): take it over.
                        _ => {
                            let _ = std::fs::remove_file(&path);
                        }
                    }
                }
                Err(e) => return Err(io(e)),
            }
        }
        Err(run_dir_err(dir, "could not take its lock (.lock keeps reappearing)"))
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether process `pid` is running (Linux: `/proc/<pid>`; elsewhere assumed so, and a
/// stale `.lock` is then removed by hand, as the error says).
fn process_alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new(&format!("/proc/{pid}")).exists()
    } else {
        true
    }
}

/// Reads the run spec saved in a run directory.
pub fn saved_spec(out_dir: &Path) -> Result<RunSpec> {
    let p = out_dir.join("spec.json");
    let text = std::fs::read_to_string(&p).map_err(|source| TrainError::Io {
        path: p.clone(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| run_dir_err(&p, format!("not a valid run spec: {e}")))
}

/// Continues the run in `out_dir` from its latest checkpoint. If `spec` is given it must
/// equal the saved spec (a resume never silently changes a run). The resumed run ends
/// with the same numbers as an unbroken one.
pub fn resume(
    out_dir: &Path,
    spec: Option<&RunSpec>,
    device: &Device,
    on_event: &mut dyn FnMut(&Event),
) -> Result<RunResult> {
    let saved = saved_spec(out_dir)?;
    if let Some(s) = spec {
        let diffs = saved.differences(s);
        if !diffs.is_empty() {
            return Err(run_dir_err(
                out_dir,
                format!(
                    "resume with a changed spec is refused ({}); start a new run instead",
                    diffs.join("; ")
                ),
            ));
        }
    }
    let _span = tracing::info_span!("run", task = %saved.task.name, backbone = %saved.backbone.source).entered();
    let mut tr = Trainer::new(&saved, device)?;
    let _lock = RunLock::acquire(out_dir)?;
    if saved.train.cached_epochs.is_some() {
        // Output-only runs keep no checkpoints (their state is one small layer): rerun.
        metrics_truncate(&out_dir.join("metrics.jsonl"), 0)?;
        return reservoir::run(tr, out_dir, device, on_event);
    }
    let run = match checkpoint::latest(out_dir)? {
        Some(dir) => {
            let loaded = checkpoint::load(&dir, device)?;
            tr.restore(&loaded, &dir)?;
            loaded.state.run
        }
        // Killed before its first checkpoint: start over.
        None => RunState::default(),
    };
    metrics_truncate(&out_dir.join("metrics.jsonl"), run.metrics_lines)?;
    let _ = std::fs::remove_file(out_dir.join("result.json"));
    run_loop(tr, run, out_dir, device, on_event)
}

/// Loads a finished (or checkpointed) run's trainable tensors over its backbone and
/// evaluates them on the test split and the training split: `(test_loss, test_accuracy,
/// train_accuracy, step)`.
pub fn evaluate_run(out_dir: &Path, device: &Device) -> Result<(f64, f64, f64, usize)> {
    let spec = saved_spec(out_dir)?;
    let mut tr = Trainer::new(&spec, device)?;
    let dir = checkpoint::latest(out_dir)?.ok_or_else(|| run_dir_err(out_dir, "has no checkpoint to evaluate"))?;
    let loaded = checkpoint::load(&dir, device)?;
    tr.restore(&loaded, &dir)?;
    let (test_loss, test_acc) = tr.evaluate(Split::Test)?;
    let (_, train_acc) = tr.evaluate(Split::Train)?;
    Ok((test_loss, test_acc, train_acc, tr.steps_done()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run that stopped before its first evaluation or checkpoint left nothing worth
    /// resuming (its directory is cleared); one with an evaluation, a checkpoint or a result
    /// did.
    #[test]
    fn failed_at_start_means_no_evaluation_checkpoint_or_result() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("spec.json"), "{}").unwrap();
        std::fs::write(d.path().join("metrics.jsonl"), "").unwrap();
        assert!(failed_at_start(d.path()));
        std::fs::write(d.path().join("metrics.jsonl"), "{\"step\": 10}\n").unwrap();
        assert!(!failed_at_start(d.path()));
        std::fs::write(d.path().join("metrics.jsonl"), "").unwrap();
        std::fs::create_dir_all(checkpoint::root(d.path())).unwrap();
        assert!(!failed_at_start(d.path()));
    }

    /// The run lock refuses a live holder and takes over a dead one's.
    #[test]
    fn the_run_lock_refuses_a_live_holder_and_takes_over_a_stale_one() {
        let d = tempfile::tempdir().unwrap();
        let first = RunLock::acquire(d.path()).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join(".lock")).unwrap(),
            std::process::id().to_string()
        );
        drop(first);
        assert!(!d.path().join(".lock").exists());
        // pid 1 is alive on Linux; a pid far beyond pid_max is not.
        if cfg!(target_os = "linux") {
            std::fs::write(d.path().join(".lock"), "1").unwrap();
            let e = RunLock::acquire(d.path()).err().unwrap().to_string();
            assert!(e.contains("process 1"), "{e}");
            std::fs::write(d.path().join(".lock"), "999999999").unwrap();
            let _taken = RunLock::acquire(d.path()).unwrap();
        }
    }
}

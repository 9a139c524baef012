//! The one fpt training loop: builds the task, backbone and model a [`RunSpec`]
//! describes, trains the trainable groups with Adam (paper App. C: lr 1e-3, no weight
//! decay, constant LR, gradient-norm clipping at 1.0, gradient accumulation over
//! micro-batches), evaluates on the task's full held-out set at a fixed interval, and
//! writes the run directory:
//!
//! - `spec.json`: the effective run spec;
//! - `metrics.jsonl`: one JSON object per evaluation;
//! - `result.json`: the final numbers ([`RunResult`]).
//!
//! Every random number comes from streams forked off one seed (init, data, dropout,
//! evaluation set), so on CPU the same spec gives the same numbers.

pub mod optim;

use candle_core::{DType, Device, Tensor};
use fpt_model::{Fpt, HeadConfig};
use fpt_nn::{ops, Ctx, Rng};
use fpt_spec::RunSpec;
use fpt_tasks::Task;
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
    /// No parameter group trains.
    #[error("nothing to train: the chosen groups ({0}) select no parameters")]
    NothingToTrain(String),
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
    /// Global gradient norm before clipping, at the last step.
    pub grad_norm: f64,
    /// Seconds since the run started.
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
    /// Best held-out accuracy over all evaluations, and its step.
    pub best_accuracy: f64,
    /// Step of `best_accuracy`.
    pub best_step: usize,
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
    /// Wall-clock seconds of the whole run.
    pub wall_seconds: f64,
    /// Seed.
    pub seed: u64,
    /// Device, e.g. `cpu`.
    pub device: String,
    /// The step whose loss or gradient was not finite, if the run diverged.
    pub diverged_at_step: Option<usize>,
    /// A trivial baseline's accuracy for this task, where one is known.
    pub baseline_accuracy: Option<f64>,
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
    },
    /// An evaluation finished.
    Eval(&'a EvalRecord),
    /// The run diverged at this step.
    Diverged(usize),
}

/// Writes `bytes` to `path` atomically (temporary file in the same directory, then rename),
/// so a reader never sees a half-written file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension(format!(
        "{}.tmp",
        path.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io)
}

/// Mean loss and accuracy of `model` over the task's whole evaluation set.
pub fn evaluate(model: &Fpt, task: &dyn Task, batch_size: usize, device: &Device) -> Result<(f64, f64)> {
    let mut ctx = Ctx::eval();
    let (mut loss_sum, mut correct, mut labels) = (0f64, 0usize, 0usize);
    let n = task.eval_len();
    let mut start = 0;
    while start < n {
        let batch = task.eval_batch(start, batch_size, device)?;
        let bsz = batch.inputs.batch_size();
        let logits = model.forward(&batch.inputs, &mut ctx)?;
        let classes = logits.dim(2)?;
        let logits = logits.reshape(((), classes))?;
        let targets = batch.labels.flatten_all()?;
        let count = targets.elem_count();
        loss_sum += ops::cross_entropy(&logits, &targets)?
            .to_dtype(DType::F64)?
            .to_scalar::<f64>()?
            * count as f64;
        correct += ops::correct(&logits, &targets)?;
        labels += count;
        start += bsz;
    }
    Ok((loss_sum / labels as f64, correct as f64 / labels as f64))
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
    vars: Vec<candle_core::Var>,
    adam: optim::Adam,
    data_rng: Rng,
    ctx: Ctx,
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
    /// False when the loss or gradient was not finite; the update was then skipped.
    pub finite: bool,
}

impl Trainer {
    /// Builds everything `spec` describes on `device`.
    pub fn new(spec: &RunSpec, device: &Device) -> Result<Self> {
        spec.validate()?;
        let t = &spec.train;
        let master = Rng::new(t.seed);
        let mut init_rng = master.fork("init");
        let task = fpt_tasks::build(&spec.task, t.seed)?;
        let mut backbone = fpt_backbones::load(&spec.backbone, &spec.train_groups, device, &mut init_rng)?;
        backbone.set_dropout(spec.backbone_dropout);
        let weights = backbone.origin().to_string();
        let head = HeadConfig {
            input_dropout: spec.input_dropout,
            orth_gain: spec.orth_gain,
        };
        let model = Fpt::new(backbone, task.dims(), spec.train_groups, head, device, &mut init_rng)?;
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
            },
            weights,
            step: 0,
        })
    }

    /// The model.
    pub fn model(&self) -> &Fpt {
        &self.model
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
    /// micro-batches, clipped, then Adam. A non-finite loss or gradient skips the update.
    pub fn step(&mut self) -> Result<StepOutcome> {
        let t = &self.spec.train;
        let accum = t.batch_size / t.micro_batch_size;
        let clip = t.clip_norm;
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
            self.adam.step(&grads)?;
            self.step += 1;
        }
        Ok(StepOutcome {
            loss,
            grad_norm,
            finite,
        })
    }

    /// Loss and accuracy on the task's whole evaluation set.
    pub fn evaluate(&self) -> Result<(f64, f64)> {
        evaluate(
            &self.model,
            self.task.as_ref(),
            self.spec.train.micro_batch_size.max(64),
            &self.device,
        )
    }
}

/// Runs `spec` to completion, writing `spec.json`, `metrics.jsonl` and `result.json` into
/// `out_dir`, and reporting progress through `on_event`.
pub fn train(spec: &RunSpec, out_dir: &Path, device: &Device, on_event: &mut dyn FnMut(&Event)) -> Result<RunResult> {
    let started = Instant::now();
    let _span = tracing::info_span!("run", task = %spec.task.name, backbone = %spec.backbone.source).entered();
    // Build (and so validate) everything before touching the run directory: a run that
    // cannot start leaves nothing behind.
    let mut tr = Trainer::new(spec, device)?;
    std::fs::create_dir_all(out_dir).map_err(|source| TrainError::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    write_atomic(
        &out_dir.join("spec.json"),
        serde_json::to_string_pretty(spec).expect("spec serialises").as_bytes(),
    )?;
    let counts = tr.model().param_counts();
    let weights = tr.weights().to_string();
    on_event(&Event::Started {
        trainable: counts.trainable,
        total: counts.total,
        weights: &weights,
    });

    let metrics_path = out_dir.join("metrics.jsonl");
    let mut metrics = std::fs::File::create(&metrics_path).map_err(|source| TrainError::Io {
        path: metrics_path.clone(),
        source,
    })?;
    let t = &spec.train;
    let (mut window_loss, mut window_steps) = (0f64, 0usize);
    let mut last_train_loss = f64::NAN;
    let mut last_eval: Option<(usize, f64, f64)> = None;
    let (mut best_acc, mut best_step) = (f64::NEG_INFINITY, 0usize);
    let mut diverged = None;
    let mut grad_norm = 0.0;
    let mut record = |step: usize,
                      train_loss: f64,
                      grad_norm: f64,
                      tr: &Trainer,
                      on_event: &mut dyn FnMut(&Event)|
     -> Result<(f64, f64)> {
        let _e = tracing::info_span!("eval", step).entered();
        let (test_loss, test_accuracy) = tr.evaluate()?;
        let rec = EvalRecord {
            step,
            train_loss,
            test_loss,
            test_accuracy,
            grad_norm,
            elapsed_s: started.elapsed().as_secs_f64(),
        };
        let line = serde_json::to_string(&rec).expect("record serialises");
        writeln!(metrics, "{line}")
            .and_then(|_| metrics.flush())
            .map_err(|source| TrainError::Io {
                path: metrics_path.clone(),
                source,
            })?;
        on_event(&Event::Eval(&rec));
        Ok((test_loss, test_accuracy))
    };

    for step in 1..=t.steps {
        let out = tr.step()?;
        if !out.finite {
            diverged = Some(step);
            on_event(&Event::Diverged(step));
            tracing::warn!(
                step,
                loss = out.loss,
                grad_norm = out.grad_norm,
                "non-finite loss or gradient: stopping"
            );
            break;
        }
        grad_norm = out.grad_norm;
        window_loss += out.loss;
        window_steps += 1;
        if step % t.eval_every == 0 || step == t.steps {
            last_train_loss = window_loss / window_steps as f64;
            (window_loss, window_steps) = (0.0, 0);
            let (l, a) = record(step, last_train_loss, grad_norm, &tr, on_event)?;
            if a > best_acc {
                (best_acc, best_step) = (a, step);
            }
            last_eval = Some((step, l, a));
        }
    }
    // After a divergence, report the parameters of the last finite step.
    let steps_done = tr.steps_done();
    let (test_loss, test_acc) = match last_eval {
        Some((s, l, a)) if s == steps_done => (l, a),
        _ => {
            if window_steps > 0 {
                last_train_loss = window_loss / window_steps as f64;
            }
            let (l, a) = record(steps_done, last_train_loss, grad_norm, &tr, on_event)?;
            if a > best_acc {
                (best_acc, best_step) = (a, steps_done);
            }
            (l, a)
        }
    };
    let result = RunResult {
        task: spec.task.name.to_string(),
        backbone: spec.backbone.source.clone(),
        init: spec.backbone.init.to_string(),
        weights,
        train_groups: spec.train_groups.to_string(),
        test_accuracy: test_acc,
        test_loss: test_loss.is_finite().then_some(test_loss),
        best_accuracy: best_acc,
        best_step,
        final_train_loss: last_train_loss.is_finite().then_some(last_train_loss),
        steps: steps_done,
        batch_size: t.batch_size,
        eval_examples: tr.task().eval_len(),
        trainable_params: counts.trainable,
        total_params: counts.total,
        wall_seconds: started.elapsed().as_secs_f64(),
        seed: t.seed,
        device: device_name(device),
        diverged_at_step: diverged,
        baseline_accuracy: tr.task().baseline().map(|b| b.0),
    };
    write_atomic(
        &out_dir.join("result.json"),
        serde_json::to_string_pretty(&result)
            .expect("result serialises")
            .as_bytes(),
    )?;
    Ok(result)
}

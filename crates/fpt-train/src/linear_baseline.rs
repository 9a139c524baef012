//! The linear baseline ([`ModelKind::Linear`](fpt_spec::ModelKind)): a linear classifier
//! on the flattened input (token ids one-hot), trained exactly like an FPT run (same task
//! batches, Adam, clipping, steps and full evaluation), written to the same run directory
//! (`spec.json`, `metrics.jsonl`, `outcomes.json`, `result.json`): the floor a transformer
//! has to beat on a task (`fpt train --model linear`). It keeps no checkpoints: a resumed
//! linear run starts again.

use crate::{
    metrics_append, optim, outcomes, selfcheck, write_result, EvalRecord, Event, Result, RunResult, TrainError,
};
use candle_core::{DType, Device, Tensor, Var};
use fpt_nn::{ops, Rng};
use fpt_spec::RunSpec;
use fpt_tasks::{InputKind, Inputs, Split, Task};
use std::path::Path;
use std::time::Instant;

/// A linear-baseline run, built and ready to train.
pub(crate) struct Linear {
    spec: RunSpec,
    task: Box<dyn Task>,
    device: Device,
    w: Var,
    b: Var,
    data: Rng,
}

fn features(inputs: &Inputs, kind: InputKind, device: &Device) -> Result<Tensor> {
    Ok(match (inputs, kind) {
        (Inputs::Vectors(x), _) => x.flatten_from(1)?,
        (Inputs::Tokens(ids), InputKind::Tokens { vocab }) => {
            let (b, t) = ids.dims2()?;
            let ids: Vec<u32> = ids.flatten_all()?.to_vec1()?;
            let mut hot = vec![0f32; b * t * vocab];
            for (k, &i) in ids.iter().enumerate() {
                hot[k * vocab + (i as usize).min(vocab - 1)] = 1.0;
            }
            Tensor::from_vec(hot, (b, t * vocab), device)?
        }
        (Inputs::Tokens(_), InputKind::Vectors { .. }) => {
            return Err(fpt_tasks::TaskError::Invalid {
                task: "linear baseline",
                msg: "the task gave token ids but declares vector inputs".into(),
            }
            .into())
        }
    })
}

impl Linear {
    /// The classifier for `spec`'s model on `task`, initialised as PyTorch's `nn.Linear`
    /// (U(-1/sqrt(in), 1/sqrt(in))) from the run's `init` stream.
    pub(crate) fn new(spec: &RunSpec, task: Box<dyn Task>, device: &Device) -> Result<Self> {
        spec.validate()?;
        let d = task.dims();
        let width = match d.input {
            InputKind::Vectors { width } => width,
            InputKind::Tokens { vocab } => vocab,
        };
        let inputs = d.seq_len * width;
        let outputs = d.labels_per_example * d.classes;
        let too_big = inputs
            .checked_mul(outputs)
            .is_none_or(|n| n > fpt_spec::limits::MAX_FFN * fpt_spec::limits::MAX_HIDDEN);
        if too_big {
            return Err(TrainError::TooBig(format!(
                "a linear classifier of {inputs} inputs x {outputs} outputs is beyond fpt's limits"
            )));
        }
        let master = crate::root_rng(spec);
        let mut init = master.fork("init");
        let bound = 1.0 / (inputs as f32).sqrt();
        let u = |n: usize, r: &mut Rng| {
            (0..n)
                .map(|_| (2.0 * r.uniform_f32() - 1.0) * bound)
                .collect::<Vec<f32>>()
        };
        let w = Var::from_tensor(&Tensor::from_vec(
            u(outputs * inputs, &mut init),
            (outputs, inputs),
            device,
        )?)?;
        let b = Var::from_tensor(&Tensor::from_vec(u(outputs, &mut init), outputs, device)?)?;
        Ok(Self {
            spec: spec.clone(),
            task,
            device: device.clone(),
            w,
            b,
            data: master.fork("data"),
        })
    }

    pub(crate) fn spec(&self) -> &RunSpec {
        &self.spec
    }

    fn logits(&self, inputs: &Inputs) -> Result<Tensor> {
        let d = self.task.dims();
        let x = features(inputs, d.input, &self.device)?;
        let y = ops::linear(&x, self.w.as_tensor(), Some(self.b.as_tensor()))?;
        Ok(y.reshape(((), d.classes))?)
    }

    fn tally(&self, split: Split) -> Result<outcomes::Tally> {
        crate::tally_with(self.task.as_ref(), split, 256, &self.device, &mut |inputs| {
            self.logits(inputs)
        })
    }

    /// Trains for the spec's steps, evaluating every `eval_every` steps, and writes the
    /// run's metrics, outcomes and result into `out_dir`.
    pub(crate) fn run(mut self, out_dir: &Path, on_event: &mut dyn FnMut(&Event)) -> Result<RunResult> {
        let started = Instant::now();
        let spec = self.spec.clone();
        let t = &spec.train;
        let params = self.w.elem_count() + self.b.elem_count();
        let weights = format!("none: a linear classifier on the flattened input ({params} parameters)");
        on_event(&Event::Started {
            trainable: params,
            total: params,
            weights: &weights,
            from_step: 0,
            steps: t.steps,
        });
        let metrics = out_dir.join("metrics.jsonl");
        let (mut window_loss, mut window_steps) = (0f64, 0usize);
        let mut evals: Vec<EvalRecord> = Vec::new();
        let mut last = None;
        // The per-example scores the convergence rule can still need (as FPT runs keep them).
        let mut recent: Vec<outcomes::EvalScores> = Vec::new();
        let window = crate::run_loop::plateau_window(t);
        let labels_per_example = self.task.dims().labels_per_example;
        let mut adam = optim::Adam::new(vec![self.w.clone(), self.b.clone()], t.lr)?;
        for step in 1..=t.steps {
            let batch = self.task.train_batch(t.batch_size, &mut self.data, &self.device)?;
            let y = self.logits(&batch.inputs)?;
            let loss = ops::cross_entropy(&y, &batch.labels.flatten_all()?)?;
            let g = loss.backward()?;
            let mut grads = vec![
                g.get(self.w.as_tensor())
                    .cloned()
                    .map_or_else(|| self.w.zeros_like(), Ok)?,
                g.get(self.b.as_tensor())
                    .cloned()
                    .map_or_else(|| self.b.zeros_like(), Ok)?,
            ];
            let grad_norm = match t.clip_norm {
                Some(c) => optim::clip_grad_norm(&mut grads, c)?,
                None => optim::grad_norm(&grads)?,
            };
            adam.lr = t.lr_schedule.lr_at(t.lr, step, t.steps);
            adam.step(&grads)?;
            let loss = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            window_loss += loss;
            window_steps += 1;
            on_event(&Event::Step { step, loss });
            if step % t.eval_every == 0 || step == t.steps {
                let eval_started = Instant::now();
                let tally = self.tally(Split::Test)?;
                let (test_loss, test_accuracy) = tally.loss_and_accuracy();
                let rec = EvalRecord {
                    step,
                    train_loss: window_loss / window_steps.max(1) as f64,
                    test_loss,
                    test_accuracy,
                    train_accuracy: None,
                    lr: adam.lr,
                    grad_norm,
                    elapsed_s: started.elapsed().as_secs_f64(),
                    examples: Some(tally.correct.len()),
                    eval_s: Some(eval_started.elapsed().as_secs_f64()),
                };
                (window_loss, window_steps) = (0.0, 0);
                metrics_append(&metrics, &rec)?;
                on_event(&Event::Eval(&rec));
                evals.push(rec.clone());
                recent.push(outcomes::EvalScores::new(step, labels_per_example, &tally));
                outcomes::keep_for_convergence(&mut recent, window);
                last = Some((rec, tally));
            }
        }
        let (last, last_tally) = last.expect("the last step evaluates (steps >= 1)");
        let train_accuracy = match t.train_eval {
            fpt_spec::TrainEval::Never => None,
            _ => Some(self.tally(Split::Train)?.loss_and_accuracy().1),
        };
        let run = crate::RunState {
            evals,
            ..Default::default()
        };
        let best = run.best().expect("at least one evaluation").clone();
        let base = self.task.baseline(Split::Test)?;
        let out = outcomes::Outcomes::new(last.step, self.task.dims().labels_per_example, &last_tally, &base);
        outcomes::write(out_dir, &out)?;
        let losses: Vec<f64> = run.evals.iter().map(|e| e.train_loss).collect();
        let baseline = outcomes::judge(&base, &out, &losses);
        // The same rule as FPT runs': the last half of the run, paired over the examples.
        let plateau = outcomes::convergence(&recent, window, t.converge_floor).filter(|p| p.to_step == last.step);
        let converged = plateau.as_ref().is_some_and(|p| p.converged());
        let converged_step = converged.then(|| run.converged_step(t.convergence_tolerance)).flatten();
        let result = RunResult {
            task: spec.task.name.to_string(),
            backbone: "none (linear baseline)".into(),
            init: "-".into(),
            weights,
            train_groups: "linear".into(),
            precision: fpt_spec::Precision::F32,
            test_accuracy: last.test_accuracy,
            test_loss: last.test_loss.is_finite().then_some(last.test_loss),
            train_accuracy,
            best_accuracy: best.test_accuracy,
            best_step: best.step,
            converged_step,
            final_train_loss: last.train_loss.is_finite().then_some(last.train_loss),
            steps: t.steps,
            batch_size: t.batch_size,
            eval_examples: self.task.eval_len(Split::Test),
            trainable_params: params,
            total_params: params,
            wall_seconds: started.elapsed().as_secs_f64(),
            seed: t.seed,
            device: crate::device_name(&self.device),
            diverged: false,
            diverged_at_step: None,
            diverged_reason: None,
            stopped_early: false,
            converged: Some(converged),
            bit_backbone: None,
            plateau,
            ended_at_baseline: false,
            baseline_accuracy: Some(baseline.accuracy),
            baseline: Some(baseline),
            cached: None,
            provenance: Some(selfcheck::provenance()),
        };
        crate::tensorboard::close(out_dir)?;
        write_result(out_dir, &result)?;
        Ok(result)
    }
}

//! A linear classifier on the flattened input (token ids one-hot), trained exactly like an
//! FPT run (same task batches, Adam, clipping, steps and full evaluation): the floor a
//! transformer has to beat on a task (`fpt train --linear-baseline`).

use crate::{optim, write_atomic, Result, TrainError};
use candle_core::{Device, Tensor, Var};
use fpt_nn::{ops, Rng};
use fpt_spec::RunSpec;
use fpt_tasks::{InputKind, Inputs, Split, Task};
use std::path::Path;

/// The outcome of a linear-baseline run (`result.json`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct LinearResult {
    /// Always `linear`.
    pub model: String,
    /// The task.
    pub task: String,
    /// Optimizer steps.
    pub steps: usize,
    /// Trainable parameters (weights and biases).
    pub params: usize,
    /// Accuracy on the whole evaluation split.
    pub test_accuracy: f64,
    /// Mean loss on it.
    pub test_loss: f64,
    /// Accuracy on the training-split sample.
    pub train_accuracy: f64,
    /// Wall-clock seconds.
    pub wall_seconds: f64,
    /// The run spec (backbone fields unused).
    pub spec: RunSpec,
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

/// Trains a linear classifier on `spec`'s task and writes `result.json` to `out`.
/// `on_eval(step, test_accuracy)` is called at every evaluation.
pub fn train_linear(
    spec: &RunSpec,
    out: &Path,
    device: &Device,
    on_eval: &mut dyn FnMut(usize, f64),
) -> Result<LinearResult> {
    spec.validate()?;
    let t0 = std::time::Instant::now();
    let master = crate::root_rng(spec);
    let mut task = fpt_tasks::build(&spec.task, &master)?;
    let d = task.dims();
    let width = match d.input {
        InputKind::Vectors { width } => width,
        InputKind::Tokens { vocab } => vocab,
    };
    let inputs = d.seq_len * width;
    let outputs = d.labels_per_example * d.classes;
    // PyTorch nn.Linear's default init: U(-1/sqrt(in), 1/sqrt(in)).
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
    let mut adam = optim::Adam::new(vec![w.clone(), b.clone()], spec.train.lr)?;
    let mut data = master.fork("data");
    let logits = |x: &Tensor| -> Result<Tensor> {
        let y = ops::linear(x, w.as_tensor(), Some(b.as_tensor()))?;
        Ok(y.reshape(((), d.classes))?)
    };
    let evaluate = |task: &dyn Task, split: Split| -> Result<(f64, f64)> {
        crate::evaluate_with(task, split, 256, device, &mut |inputs| {
            logits(&features(inputs, d.input, device)?)
        })
    };
    for step in 1..=spec.train.steps {
        let batch = task.train_batch(spec.train.batch_size, &mut data, device)?;
        let y = logits(&features(&batch.inputs, d.input, device)?)?;
        let loss = ops::cross_entropy(&y, &batch.labels.flatten_all()?)?;
        let g = loss.backward()?;
        let mut grads = vec![
            g.get(w.as_tensor()).cloned().unwrap_or(w.zeros_like()?),
            g.get(b.as_tensor()).cloned().unwrap_or(b.zeros_like()?),
        ];
        if let Some(c) = spec.train.clip_norm {
            optim::clip_grad_norm(&mut grads, c)?;
        }
        adam.lr = spec.train.lr_schedule.lr_at(spec.train.lr, step, spec.train.steps);
        adam.step(&grads)?;
        if step % spec.train.eval_every == 0 || step == spec.train.steps {
            on_eval(step, evaluate(task.as_ref(), Split::Test)?.1);
        }
    }
    let (test_loss, test_accuracy) = evaluate(task.as_ref(), Split::Test)?;
    let (_, train_accuracy) = evaluate(task.as_ref(), Split::Train)?;
    let r = LinearResult {
        model: "linear".into(),
        task: spec.task.label(),
        steps: spec.train.steps,
        params: outputs * inputs + outputs,
        test_accuracy,
        test_loss,
        train_accuracy,
        wall_seconds: t0.elapsed().as_secs_f64(),
        spec: spec.clone(),
    };
    std::fs::create_dir_all(out).map_err(|source| TrainError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    write_atomic(
        &out.join("result.json"),
        serde_json::to_string_pretty(&r).expect("serialises").as_bytes(),
    )?;
    Ok(r)
}

//! Training-trajectory parity with PyTorch: replays the 20 steps a trajectory fixture
//! (`data/fixtures/trajectory-*`, `tools/make_trajectory.py`) recorded in PyTorch, through
//! fpt's own [`Trainer`] (the same model assembly, micro-batching, clipping and Adam a run
//! uses), from the same initial values and batches, and compares every step's loss and
//! gradient norm and the trained tensors after the last step. Forward goldens cannot see a
//! wrong gradient that still points roughly the right way, or an optimizer slip; this can.

use crate::{Result, TrainError, Trainer};
use candle_core::{DType, Device, Tensor};
use fpt_nn::Rng;
use fpt_spec::{BackboneSpec, Init, RunSpec, TaskName};
use fpt_tasks::{Batch, InputKind, Inputs, Split, Task, TaskDims};
use std::collections::HashMap;
use std::path::Path;

/// How far fpt's replay is from PyTorch's trajectory.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct ParityDiff {
    /// Steps replayed.
    pub steps: usize,
    /// Largest relative difference of a step's loss.
    pub loss_rel: f64,
    /// Largest relative difference of a step's gradient norm (before clipping).
    pub grad_norm_rel: f64,
    /// Largest absolute difference of a trained tensor after the last step.
    pub tensor_abs: f64,
    /// Trained tensors compared.
    pub tensors: usize,
}

/// The recorded batches, served in order (micro-batch by micro-batch).
struct Replay {
    inputs: Tensor,
    labels: Tensor,
    dims: TaskDims,
    /// Micro-batches served so far.
    served: usize,
}

impl Task for Replay {
    fn name(&self) -> TaskName {
        TaskName::BitXor
    }
    fn dims(&self) -> TaskDims {
        self.dims
    }
    fn train_batch(&mut self, n: usize, _rng: &mut Rng, device: &Device) -> fpt_tasks::Result<Batch> {
        let (steps, batch) = (self.inputs.dim(0)?, self.inputs.dim(1)?);
        let per_step = batch / n.max(1);
        let (step, part) = (self.served / per_step, self.served % per_step);
        if n == 0 || !batch.is_multiple_of(n) || step >= steps {
            return Err(fpt_tasks::TaskError::Invalid {
                task: "trajectory replay",
                msg: format!(
                    "the trajectory holds {steps} steps of {batch}; micro-batch {} of {n} asked for",
                    self.served
                ),
            });
        }
        self.served += 1;
        let x = self.inputs.get(step)?.narrow(0, part * n, n)?;
        let y = self.labels.get(step)?.narrow(0, part * n, n)?;
        Ok(Batch {
            inputs: Inputs::Vectors(x.to_device(device)?),
            labels: y.unsqueeze(1)?.to_dtype(DType::U32)?.to_device(device)?,
        })
    }
    fn eval_len(&self, _split: Split) -> usize {
        0
    }
    fn eval_batch(&self, _split: Split, _start: usize, _n: usize, _device: &Device) -> fpt_tasks::Result<Batch> {
        Err(fpt_tasks::TaskError::Invalid {
            task: "trajectory replay",
            msg: "it has no evaluation split".into(),
        })
    }
}

fn bad(dir: &Path, msg: impl Into<String>) -> TrainError {
    crate::run_dir_err(dir, msg)
}

fn rel(a: f64, b: f64) -> f64 {
    let d = (a - b).abs() / b.abs().max(1e-12);
    if d.is_nan() {
        f64::INFINITY
    } else {
        d
    }
}

/// Replays the trajectory fixture in `dir` (`config.json` and `model.safetensors` of the
/// backbone, `trajectory.safetensors`, `MADE_BY.json` with the settings) on `device`, on
/// the calling thread's kernel path.
pub fn replay(dir: &Path, device: &Device) -> Result<ParityDiff> {
    replay_file(dir, "trajectory.safetensors", device, fpt_spec::Precision::F32)
}

/// [`replay`] of the recorded trajectory `file` in `dir` (e.g.
/// `trajectory-autocast-bf16.safetensors`, PyTorch under `torch.autocast(bfloat16)`), with
/// fpt's frozen weights in `precision`.
pub fn replay_file(dir: &Path, file: &str, device: &Device, precision: fpt_spec::Precision) -> Result<ParityDiff> {
    let meta_path = dir.join("MADE_BY.json");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&meta_path).map_err(|source| TrainError::Io {
            path: meta_path.clone(),
            source,
        })?)
        .map_err(|e| bad(&meta_path, e.to_string()))?;
    let num = |k: &str| {
        meta[k]
            .as_f64()
            .ok_or_else(|| bad(&meta_path, format!("no number `{k}`")))
    };
    let file = dir.join(file);
    let t: HashMap<String, Tensor> =
        candle_core::safetensors::load(&file, device).map_err(|e| bad(&file, e.to_string()))?;
    let get = |k: &str| t.get(k).ok_or_else(|| bad(&file, format!("no tensor `{k}`")));
    let inputs = get("batch.inputs")?.clone();
    let (steps, batch, seq, width) = inputs.dims4()?;
    let classes = num("classes")? as usize;
    let spec = RunSpec {
        train: fpt_spec::TrainSpec {
            steps,
            batch_size: batch,
            micro_batch_size: num("micro_batch_size")? as usize,
            lr: num("lr")?,
            clip_norm: Some(num("clip_norm")?),
            lr_schedule: fpt_spec::LrSchedule::Constant,
            ..Default::default()
        },
        input_dropout: 0.0,
        backbone_dropout: false,
        ..RunSpec::new(
            fpt_spec::TaskSpec::new(TaskName::BitXor),
            BackboneSpec {
                precision,
                ..BackboneSpec::new(dir.display().to_string(), Init::Pretrained)
            },
        )
    };
    let task = Replay {
        inputs,
        labels: get("batch.labels")?.clone(),
        dims: TaskDims {
            input: InputKind::Vectors { width },
            seq_len: seq,
            readout_tokens: 1,
            labels_per_example: 1,
            classes,
        },
        served: 0,
    };
    let mut tr = Trainer::with_task(&spec, Box::new(task), device)?;
    // The recorded initial values of the new layers (the backbone's come from its checkpoint).
    let trainable: Vec<(String, candle_core::Var)> = tr.model().trainable();
    for (name, var) in &trainable {
        if let Some(init) = t.get(&format!("init.{name}")) {
            var.set(init)?;
        }
    }
    let (losses, norms) = (get("losses")?.to_vec1::<f64>()?, get("grad_norms")?.to_vec1::<f64>()?);
    let mut diff = ParityDiff {
        steps,
        ..Default::default()
    };
    for s in 0..steps {
        let out = tr.step()?;
        diff.loss_rel = diff.loss_rel.max(rel(out.loss, losses[s]));
        diff.grad_norm_rel = diff.grad_norm_rel.max(rel(out.grad_norm, norms[s]));
    }
    let finals: Vec<&String> = t.keys().filter(|k| k.starts_with("final.")).collect();
    if finals.len() != trainable.len() {
        let ours: Vec<&String> = trainable.iter().map(|(n, _)| n).collect();
        return Err(bad(
            &file,
            format!(
                "PyTorch trained {} tensors, fpt {}: {finals:?} vs {ours:?}",
                finals.len(),
                ours.len()
            ),
        ));
    }
    for (name, var) in &trainable {
        let want = get(&format!("final.{name}"))
            .map_err(|_| bad(&file, format!("fpt trains `{name}`, which PyTorch did not")))?;
        let d = (var.as_tensor() - want)?
            .abs()?
            .flatten_all()?
            .max(0)?
            .to_dtype(DType::F64)?
            .to_scalar::<f64>()?;
        diff.tensor_abs = diff.tensor_abs.max(if d.is_nan() { f64::INFINITY } else { d });
        diff.tensors += 1;
    }
    Ok(diff)
}

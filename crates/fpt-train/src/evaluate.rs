//! Evaluation over a whole held-out split: mean loss, accuracy and, kept in a
//! [`Tally`](crate::outcomes::Tally), each example's outcome.

#[allow(unused_imports)]
use super::*;

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

/// A trained run's predictions on examples from outside its task ([`predict_run`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Predictions {
    /// The checkpoint's step.
    pub step: usize,
    /// Each example's class: the arg-max of its logits, as evaluation scores it.
    pub classes: Vec<u32>,
    /// Each example's class probabilities (the softmax of its logits).
    pub probabilities: Vec<Vec<f32>>,
}

/// A trained run opened for predictions: its latest checkpoint's tensors over the frozen
/// backbone, and its task to encode examples with.
pub struct Predictor {
    tr: Trainer,
    trained: std::collections::HashMap<String, Tensor>,
}

impl Predictor {
    /// Opens the run in `out_dir` (its spec and latest checkpoint) on `device`.
    pub fn open(out_dir: &Path, device: &Device) -> Result<Self> {
        let spec = saved_spec(out_dir)?;
        let mut tr = Trainer::new(&spec, device)?;
        let dir = checkpoint::latest(out_dir)?
            .ok_or_else(|| run_dir::run_dir_err(out_dir, "has no checkpoint to predict with"))?;
        let loaded = checkpoint::load(&dir, device)?;
        tr.restore(&loaded, &dir)?;
        Ok(Predictor {
            tr,
            trained: loaded.trainable,
        })
    }

    /// The checkpoint's trained tensors, by name.
    pub fn trained(&self) -> &std::collections::HashMap<String, Tensor> {
        &self.trained
    }

    /// The shapes of the run's task (its input kind and width, its classes).
    pub fn dims(&self) -> fpt_tasks::TaskDims {
        self.tr.task().dims()
    }

    /// The size of the images the run's task trained on (`(height, width, channels)`), for
    /// image tasks; `None` otherwise.
    pub fn image_size(&self) -> Option<(usize, usize, usize)> {
        self.tr
            .task()
            .splits()
            .into_iter()
            .find_map(|(_, d)| match &d.examples {
                fpt_tasks::Examples::Images {
                    height,
                    width,
                    channels,
                    ..
                } => Some((*height, *width, *channels)),
                _ => None,
            })
    }

    /// Predictions on `data`, examples in the form the run's task stores them
    /// (`fpt_tasks::custom::read_for_prediction` reads them from JSONL), checked against the
    /// task, encoded as its evaluation split is and run in its evaluation batches.
    pub fn predict(&self, data: &fpt_tasks::Dataset) -> Result<Predictions> {
        let task = self.tr.task();
        task.check_external(data)?;
        if task.dims().labels_per_example != 1 {
            return Err(TrainError::Task(fpt_tasks::TaskError::Invalid {
                task: "predict",
                msg: format!(
                    "{} has {} labels per example: predictions take single-label tasks",
                    task.name(),
                    task.dims().labels_per_example
                ),
            }));
        }
        let model = self.tr.model();
        let device = &self.tr.device;
        let mut ctx = Ctx::eval();
        let (mut classes, mut probabilities) = (Vec::new(), Vec::new());
        let bs = self.tr.eval_batch_size().max(1);
        fpt_nn::no_grad(|| -> Result<()> {
            let mut start = 0;
            while start < data.len() {
                let batch = task.encode_external(data, start, bs, device)?;
                let logits = fpt_nn::on_pool(|| model.forward(&batch.inputs, &mut ctx))?;
                let k = logits.dim(candle_core::D::Minus1)?;
                let logits = logits.reshape(((), k))?;
                classes.extend(fpt_nn::transfer::download_vec::<u32>(
                    &logits.argmax(candle_core::D::Minus1)?,
                )?);
                let host = fpt_nn::transfer::download_vec::<f32>(&logits.to_dtype(candle_core::DType::F32)?)?;
                for (j, row) in host.chunks(k.max(1)).enumerate() {
                    // A score that is not a number is no prediction: refused, with the
                    // example named, never written as a class.
                    if let Some(x) = row.iter().find(|x| !x.is_finite()) {
                        return Err(TrainError::Task(fpt_tasks::TaskError::Invalid {
                            task: "predict",
                            msg: format!(
                                "example {}: the run's scores for it are not finite ({x}): its inputs are outside anything the run can score (very large values?); nothing was written",
                                start + j
                            ),
                        }));
                    }
                    // In f64, from the largest logit down: no overflow, sums exact enough.
                    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                    let e: Vec<f64> = row.iter().map(|&x| (x as f64 - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    probabilities.push(e.iter().map(|v| (v / z) as f32).collect());
                }
                start += bs;
            }
            Ok(())
        })?;
        Ok(Predictions {
            step: self.tr.steps_done(),
            classes,
            probabilities,
        })
    }
}

/// The predictions of the run in `out_dir` (its latest checkpoint) on `data`
/// ([`Predictor::predict`]).
pub fn predict_run(out_dir: &Path, data: &fpt_tasks::Dataset, device: &Device) -> Result<Predictions> {
    Predictor::open(out_dir, device)?.predict(data)
}

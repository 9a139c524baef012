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

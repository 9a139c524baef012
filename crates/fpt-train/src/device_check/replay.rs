//! `fpt gpu-check`'s replay checks: the training step and the evaluation replayed from
//! device memory (CUDA graphs on a GPU) against the eager ones on the same device.

use super::{check, KernelCheck};
use crate::Result;
use candle_core::{Device, Tensor};

/// The training step replayed from device memory ([`crate::ReplayStep`], captured as a CUDA
/// graph on a GPU) against [`crate::Trainer::step`] on the same device: twelve steps of a
/// small random GPT-2, MiniLM (the campaign's family) and SmolLM2 with every dropout on, and
/// of the GPT-2 on token sequences padded to the longest of each batch (TAPE's collate:
/// batches of several shapes, each captured as a graph of its own), the same losses and
/// parameters; then the evaluation replayed ([`crate::EvalReplay`]) against
/// [`crate::Trainer::tally`], before and after replayed steps change the parameters under
/// its graphs: the same losses and per-example outcomes. Each check's name ends with its
/// backbone. An error of either replay (a capture the driver refuses, say) is a failed check
/// that names it.
pub fn replay_agreement(device: &Device) -> Result<Vec<KernelCheck>> {
    let mut out = Vec::new();
    for (source, hidden) in [("gpt2", Some(64)), ("minilm", Some(64)), ("smollm2", None)] {
        let shape = fpt_spec::ShapeOverrides {
            layers: Some(2),
            hidden,
            heads: hidden.map(|_| 4),
            ..Default::default()
        };
        replay_agreement_of(device, source, shape, None, &mut out)?;
    }
    let small = fpt_spec::ShapeOverrides {
        layers: Some(2),
        hidden: Some(64),
        heads: Some(4),
        ..Default::default()
    };
    replay_agreement_of(device, "gpt2", small, Some(&padded_per_batch), &mut out)?;
    Ok(out)
}

/// Token sequences of 3 to 10 tokens, padded to the longest of each batch: training and
/// evaluation batches of several shapes.
fn padded_per_batch() -> Result<Box<dyn fpt_tasks::Task>> {
    use fpt_tasks::data::{Dataset, DatasetTask, Encoding, Examples};
    let data = |n: usize| Dataset {
        examples: Examples::Tokens(
            (0..n)
                .map(|i| (0..3 + i % 8).map(|k| 1 + ((i * 7 + k) % 20) as u32).collect())
                .collect(),
        ),
        labels: (0..n).map(|i| (i % 3) as u32).collect(),
        lengths: (0..n).map(|i| (3 + i % 8) as u32).collect(),
    };
    let encoding = Encoding::Tokens {
        len: 16,
        pad: 0,
        per_batch: true,
        left: false,
    };
    let task = DatasetTask::new(
        fpt_spec::TaskName::Homology,
        data(256),
        data(200),
        encoding,
        3,
        24,
        &fpt_nn::Rng::new(3),
    )?;
    Ok(Box::new(task))
}

/// [`replay_agreement`] for one small random backbone, on Bit XOR or the task `task` makes
/// (then the check's name says `batches of many shapes`, and a GPU must capture more than
/// one shape's step).
fn replay_agreement_of(
    device: &Device,
    source: &str,
    shape: fpt_spec::ShapeOverrides,
    task: Option<&dyn Fn() -> Result<Box<dyn fpt_tasks::Task>>>,
    out: &mut Vec<KernelCheck>,
) -> Result<()> {
    use crate::outcomes;
    use fpt_spec::{BackboneSpec, Init, RunSpec, TaskName, TaskSpec, TrainSpec};
    use fpt_tasks::Split;
    // Batches of many shapes: enough steps that several shapes pass their eager steps.
    let steps = if task.is_some() { 40 } else { 12 };
    let spec = RunSpec {
        train: TrainSpec {
            steps: 100,
            batch_size: 8,
            micro_batch_size: 8,
            seed: 5,
            ..TrainSpec::default()
        },
        ..RunSpec::new(
            TaskSpec {
                eval_examples: 200,
                ..TaskSpec::new(TaskName::BitXor)
            },
            BackboneSpec {
                shape,
                ..BackboneSpec::new(source, Init::Random)
            },
        )
    };
    let params = |t: &crate::Trainer| -> Result<Tensor> {
        let flat = t
            .model()
            .trainable()
            .iter()
            .map(|(_, v)| {
                Ok(fpt_nn::transfer::to_device(
                    &v.as_tensor().flatten_all()?,
                    &Device::Cpu,
                )?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensor::cat(&flat, 0)?)
    };
    let trainer = || match task {
        Some(make) => crate::Trainer::with_task(&spec, make()?, device),
        None => crate::Trainer::new(&spec, device),
    };
    let label = if task.is_some() {
        format!("{source}, batches of many shapes")
    } else {
        source.to_string()
    };
    let source = label.as_str();
    let mut eager = trainer()?;
    let want = (0..steps)
        .map(|_| Ok(eager.step()?.loss))
        .collect::<Result<Vec<f64>>>()?;
    let mut tr = trainer()?;
    let replayed = (|| -> Result<(Vec<f64>, bool)> {
        let mut r = tr.replay_step(steps)?;
        for _ in 0..steps {
            r.step(&mut tr)?;
        }
        let losses = r.drain(&mut tr)?.iter().map(|o| o.loss).collect();
        // Batches of many shapes: the steps must have seen several, and on a GPU captured
        // more than one as a graph of its own.
        if task.is_some() {
            let (seen, graphs) = (r.shapes(), r.captured_shapes());
            if seen < 2 || (device.is_cuda() && graphs < 2) {
                return Err(crate::TrainError::msg(format!(
                    "{steps} steps saw {seen} batch shape(s) and captured {graphs}; the check needs two or more of each (one without a GPU)"
                )));
            }
        }
        Ok((losses, r.captured()))
    })();
    let failed = |name: String| KernelCheck {
        name,
        max_diff: f64::INFINITY,
        allowed: 1e-6,
        passed: false,
    };
    match replayed {
        Err(e) => out.push(failed(format!("replayed step: {e}, {source}"))),
        Ok((_, false)) if device.is_cuda() => {
            out.push(failed(format!("replayed step: not captured on the GPU, {source}")))
        }
        Ok((got, captured)) => {
            let how = if captured { "captured" } else { "eager" };
            let f32s = |v: &[f64]| {
                fpt_nn::transfer::upload(v.iter().map(|&x| x as f32).collect::<Vec<_>>(), v.len(), &Device::Cpu)
            };
            let (got, want) = (f32s(&got)?, f32s(&want)?);
            check(
                out,
                format!("replayed step ({how}) losses, {source}"),
                &got,
                &want,
                1e-6,
            )?;
            check(
                out,
                format!("replayed step ({how}) parameters, {source}"),
                &params(&tr)?,
                &params(&eager)?,
                1e-6,
            )?;
        }
    }
    // The evaluation replayed (captured at its third pass of each batch shape) against the
    // trainer's, three times, then once more after three replayed steps changed the
    // parameters under the graphs.
    let evaluated = (|| -> Result<Vec<(outcomes::Tally, outcomes::Tally)>> {
        let mut ev = crate::EvalReplay::new();
        let mut pairs = Vec::new();
        for _ in 0..3 {
            pairs.push((ev.tally(&tr, Split::Test)?, tr.tally(Split::Test)?));
        }
        let mut r = tr.replay_step(4)?;
        for _ in 0..3 {
            r.step(&mut tr)?;
        }
        r.drain(&mut tr)?;
        pairs.push((ev.tally(&tr, Split::Test)?, tr.tally(Split::Test)?));
        if device.is_cuda() && ev.captured() == 0 {
            return Err(crate::TrainError::msg("not captured on the GPU"));
        }
        Ok(pairs)
    })();
    match evaluated {
        Err(e) => out.push(failed(format!("replayed evaluation: {e}, {source}"))),
        Ok(pairs) => {
            let how = if device.is_cuda() { "captured" } else { "eager" };
            let (mut loss, mut right) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
            for (got, want) in &pairs {
                loss.0.push(got.loss_and_accuracy().0 as f32);
                loss.1.push(want.loss_and_accuracy().0 as f32);
                right.0.extend(got.correct.iter().map(|&c| c as f32));
                right.1.extend(want.correct.iter().map(|&c| c as f32));
            }
            let t = |v: Vec<f32>| fpt_nn::transfer::upload(v.clone(), v.len(), &Device::Cpu);
            check(
                out,
                format!("replayed evaluation ({how}) losses, {source}"),
                &t(loss.0)?,
                &t(loss.1)?,
                1e-6,
            )?;
            check(
                out,
                format!("replayed evaluation ({how}) per-example outcomes, {source}"),
                &t(right.0)?,
                &t(right.1)?,
                0.0,
            )?;
        }
    }
    Ok(())
}

//! A CUDA graph of the training step, as the bench's experiment (`fpt bench --graph`; issue
//! 56 item 1): how fast the step trains when its kernels are launched as one replayed graph
//! instead of one by one, beside the same step launched eagerly.
//!
//! The replayed step is [`crate::ReplayStep`]: each step's batch (drawn as the trainer
//! draws it) uploaded and copied into fixed buffers, its dropout seeds written into slots,
//! Adam's step count, coefficients and non-finite skip decided on the device, nothing read
//! back until the losses are drained at the end; the eager step is [`crate::Trainer::step`].
//! Both train: the losses of the first and last timed replays show the replays learn.
//! Tensors are made without cuda event tracking in this process (one stream: a capture
//! cannot wait on events recorded before it).

use crate::bench::{Shape, Timing};
use crate::Result;
use candle_core::Device;
use fpt_spec::{Precision, TrainGroups};
use serde::Serialize;

/// The step launched eagerly and replayed as a graph, in one process on one batch.
#[derive(Debug, Clone, Serialize)]
pub struct GraphTiming {
    /// [`crate::Trainer::step`] launched kernel by kernel (its batch drawn and uploaded, its
    /// loss and norm read back), the device synchronised around each step.
    pub eager: Timing,
    /// [`crate::ReplayStep::step`] replaying the captured graph (its batch drawn, uploaded
    /// and copied into the graph's buffers, its seeds written), synchronised the same way.
    pub replay: Timing,
    /// The training loss of the first timed replay and of the last (each replay trains on
    /// a fresh batch: a replay that trains lowers it over the run).
    pub loss_first: f64,
    /// See `loss_first`.
    pub loss_last: f64,
    /// Replayed steps whose update the device skipped (a non-finite loss or norm).
    pub skipped: usize,
    /// The mean step of `steps` replays launched back to back with nothing read and no wait
    /// between them (one wait at the end): what a loop that drains the gate every few
    /// steps would get, where the host draws the next batch while the device runs.
    pub pipelined_ms: f64,
    /// Whether the replay was a captured CUDA graph (on a GPU), not the eager replay.
    pub captured: bool,
    /// An evaluation of [`EVAL_BATCHES`] batches of the trainer's evaluation batch size
    /// (synthetic examples) scored as [`crate::tally_with`] scores them: a forward pass
    /// per batch, its loss, predictions and labels read back before the next.
    pub eval_eager: Timing,
    /// The same evaluation through [`crate::EvalReplay`]: each batch copied into fixed
    /// buffers, the forward pass a replayed graph, everything read back once at the end.
    pub eval_replay: Timing,
    /// Examples per evaluation batch.
    pub eval_batch: usize,
    /// Whether the replayed evaluation ran as a captured CUDA graph.
    pub eval_captured: bool,
}

/// Batches per timed evaluation.
pub const EVAL_BATCHES: usize = 8;

/// Times `steps` eager steps and `steps` replayed ones (after `warmup` eager steps and the
/// replay's own first steps) of the FPT (`groups`) model of `shape` on `device`: on a GPU
/// the replay is a captured CUDA graph; elsewhere it runs eagerly through the replay's
/// buffers (the flow, not the graph: `captured` says which).
pub fn time_graph_steps(
    shape: &Shape,
    groups: TrainGroups,
    precision: Precision,
    warmup: usize,
    steps: usize,
    device: &Device,
) -> Result<GraphTiming> {
    use crate::replay_step::WARM_STEPS;
    use crate::Trainer;
    use std::time::Instant;
    let steps = steps.max(1);
    let graph_err = |what: &str, e: &dyn std::fmt::Debug| crate::TrainError::msg(format!("--graph: {what}: {e:?}"));
    // The device (`fpt_nn::device::parse`) has a stream of its own, every step's work on it
    // whichever thread enqueues it, and its event tracking off: what a capture needs.
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = device {
        if cuda.is_event_tracking() {
            return Err(graph_err(
                "the device records cudarc's events (FPT_CUDA_EVENTS=on)",
                &"a capture takes the device as `fpt_nn::device::parse` makes it, without them",
            ));
        }
    }
    let mut spec = shape.spec(groups, precision);
    // The replay's coefficient table covers every step the bench runs.
    spec.train.steps = spec.train.steps.max(warmup + 3 * steps + WARM_STEPS + 4);
    let mut tr = Trainer::with_task(&spec, Box::new(fpt_tasks::Synthetic::new(shape.dims())), device)
        .map_err(|e| graph_err("build the model", &e))?;
    let timed = |f: &mut dyn FnMut() -> Result<()>| timed_rounds(device, steps, f);
    for _ in 0..warmup {
        tr.step().map_err(|e| graph_err("a warm-up step (eager)", &e))?;
    }
    let eager = timed(&mut || tr.step().map(drop)).map_err(|e| graph_err("the eager steps", &e))?;
    let mut replay = tr
        .replay_step(steps + WARM_STEPS + 2)
        .map_err(|e| graph_err("the replay's buffers", &e))?;
    while !replay.captured() && replay.steps() <= WARM_STEPS + 1 {
        replay
            .step(&mut tr)
            .map_err(|e| graph_err("the steps before the capture and the capture", &e))?;
    }
    if device.is_cuda() && !replay.captured() {
        return Err(graph_err("the capture", &"the step was not captured"));
    }
    device.synchronize().map_err(|e| graph_err("the first replay", &e))?;
    let replayed = timed(&mut || replay.step(&mut tr)).map_err(|e| graph_err("the timed replays", &e))?;
    let outcomes = replay
        .drain(&mut tr)
        .map_err(|e| graph_err("read the replays' losses", &e))?;
    let first = outcomes.len() - steps;
    device.synchronize()?;
    let t0 = Instant::now();
    for _ in 0..steps {
        replay
            .step(&mut tr)
            .map_err(|e| graph_err("the back-to-back replays", &e))?;
    }
    device
        .synchronize()
        .map_err(|e| graph_err("the back-to-back replays", &e))?;
    let pipelined_ms = t0.elapsed().as_secs_f64() * 1e3 / steps as f64;
    replay
        .drain(&mut tr)
        .map_err(|e| graph_err("read the back-to-back replays' losses", &e))?;
    let (eval_eager, eval_replay, eval_captured) =
        time_evaluations(&tr, shape, steps.clamp(3, 10), device).map_err(|e| graph_err("the evaluations", &e))?;
    Ok(GraphTiming {
        eager,
        replay: replayed,
        loss_first: outcomes[first].loss,
        loss_last: outcomes[outcomes.len() - 1].loss,
        skipped: outcomes.iter().filter(|o| !o.finite).count(),
        pipelined_ms,
        captured: replay.captured(),
        eval_eager,
        eval_replay,
        eval_batch: tr.eval_batch_size(),
        eval_captured,
    })
}

/// `rounds` runs of `f`, the device synchronised around each.
fn timed_rounds(device: &Device, rounds: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<Timing> {
    use crate::bench::{timing, unix_now};
    let mut ms = Vec::with_capacity(rounds);
    let from = unix_now();
    for _ in 0..rounds {
        device.synchronize()?;
        let t0 = std::time::Instant::now();
        f()?;
        device.synchronize()?;
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(timing(ms, from, unix_now()))
}

/// `rounds` evaluations of [`EVAL_BATCHES`] synthetic batches scored eagerly, then as many
/// replayed (after one untimed evaluation each), the device synchronised around each; the
/// two tallies must agree.
fn time_evaluations(
    tr: &crate::Trainer,
    shape: &Shape,
    rounds: usize,
    device: &Device,
) -> Result<(Timing, Timing, bool)> {
    use crate::outcomes::Tally;
    use fpt_tasks::Task;
    let mut data = fpt_tasks::Synthetic::new(shape.dims());
    let mut rng = fpt_nn::Rng::new(7);
    let per_example = shape.dims().labels_per_example;
    let batches = (0..EVAL_BATCHES)
        .map(|_| Ok(data.train_batch(tr.eval_batch_size(), &mut rng, &tr.device)?))
        .collect::<Result<Vec<_>>>()?;
    let model = tr.model();
    let eager = || -> Result<Tally> {
        let mut t = Tally::default();
        for b in &batches {
            let logits = fpt_nn::no_grad(|| fpt_nn::on_pool(|| model.forward(&b.inputs, &mut fpt_nn::Ctx::eval())))?;
            let classes = logits.dim(candle_core::D::Minus1)?;
            t.add(&logits.reshape(((), classes))?, &b.labels.flatten_all()?, per_example)?;
        }
        Ok(t)
    };
    let mut ev = crate::EvalReplay::new();
    let replayed = |ev: &mut crate::EvalReplay| ev.tally_batches(tr, &mut batches.iter().cloned().map(Ok));
    let (want, got) = (eager()?, replayed(&mut ev)?);
    // Within 1e-5 of the loss (a captured product may take another cuBLAS algorithm), the
    // same outcomes.
    let (lw, lg) = (want.loss_and_accuracy().0, got.loss_and_accuracy().0);
    let same = (lw - lg).abs() <= 1e-5 * lw.abs().max(1.0)
        && (want.correct.as_slice(), want.predicted.as_slice()) == (got.correct.as_slice(), got.predicted.as_slice());
    if !same {
        return Err(crate::TrainError::msg(
            "the replayed evaluation's outcomes differ from the eager evaluation's",
        ));
    }
    let eager_t = timed_rounds(device, rounds, &mut || eager().map(drop))?;
    let replay_t = timed_rounds(device, rounds, &mut || replayed(&mut ev).map(drop))?;
    Ok((eager_t, replay_t, ev.captured() > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the CPU the experiment runs its whole flow with the replay eager (no capture):
    /// both sides train, the replays' losses are read back, nothing is skipped.
    #[test]
    fn the_flow_runs_on_the_cpu() {
        let shape = crate::bench::shape("tiny").expect("a bench shape");
        let r = time_graph_steps(&shape, TrainGroups::fpt(), Precision::F32, 1, 3, &Device::Cpu).unwrap();
        assert!(!r.captured);
        assert!(r.eager.median_ms > 0.0 && r.replay.median_ms > 0.0, "{r:?}");
        assert!(
            r.loss_first.is_finite() && r.loss_last.is_finite() && r.pipelined_ms > 0.0,
            "{r:?}"
        );
        assert_eq!(r.skipped, 0);
        assert!(!r.eval_captured && r.eval_batch > 0, "{r:?}");
        assert!(r.eval_eager.median_ms > 0.0 && r.eval_replay.median_ms > 0.0, "{r:?}");
    }
}

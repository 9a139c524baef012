//! `fpt bench --streams N` (issue 56 item 2): N runs of one shape trained side by side in
//! one process, each on a device of its own, so on a GPU each on a stream of its own
//! (`fpt_nn::device::parse` makes one per call). Their kernels may then overlap on the
//! device, which N processes cannot without MPS (the GPU time-slices their contexts: on an
//! H100, four fpt processes of the campaign's MNIST step made 175 steps a second in all where
//! one made 116, bench/README.md). The runs start their timed steps together once all have
//! warmed up; what counts is the steps a second of all of them over the window they share.

use crate::bench::{timing, unix_now, Shape, Timing};
use crate::{Result, Trainer};
use candle_core::Device;
use fpt_spec::{Precision, TrainGroups};
use fpt_tasks::Synthetic;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What N runs timed at once in one process measured.
#[derive(Debug, Clone, Serialize)]
pub struct StreamsTiming {
    /// How many runs.
    pub runs: usize,
    /// Whether the runs took replayed steps ([`crate::ReplayStep`]: a CUDA graph each on a
    /// GPU, the losses read back every [`crate::replay_step::REPLAY_AHEAD`] steps) instead of
    /// [`Trainer::step`].
    pub replayed: bool,
    /// Each run's timed steps (replayed: the host's time to hand each step to the device,
    /// the waits falling on the steps that read the losses back; `steps_per_s` is the
    /// measure then).
    pub per_run: Vec<Timing>,
    /// Timed steps of all runs over the window from the first start to the last end.
    pub steps_per_s: f64,
    /// The share of that window every run was timing (1: they overlapped throughout).
    pub overlap: f64,
}

/// Times `steps` steps of `runs` FPT models of `shape` (after `warmup` each), one thread and
/// one device from `make_device` per run, their timed steps started together; the steps
/// replayed (captured before the timed ones on a GPU) as `replay` says, or (`None`) as a
/// run of the shape would take them ([`Trainer::takes_replayed_steps`]). A run that fails stops the others at the start line and
/// its error is returned, naming the run.
#[allow(clippy::too_many_arguments)]
pub fn time_streams(
    shape: &Shape,
    groups: TrainGroups,
    precision: Precision,
    warmup: usize,
    steps: usize,
    runs: usize,
    replay: Option<bool>,
    make_device: &(dyn Fn() -> Result<Device> + Sync),
) -> Result<StreamsTiming> {
    use crate::replay_step::{REPLAY_AHEAD, WARM_STEPS};
    let runs = runs.max(1);
    let ready = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let mut spec = shape.spec(groups, precision);
    // The replay's coefficient table covers every step the bench runs.
    spec.train.steps = spec.train.steps.max(warmup + steps + WARM_STEPS + 4);
    let one = |i: usize| -> Result<(Timing, bool)> {
        let at_start = || -> Result<()> {
            ready.fetch_add(1, Ordering::SeqCst);
            while ready.load(Ordering::SeqCst) < runs {
                if failed.load(Ordering::SeqCst) {
                    return Err(crate::TrainError::msg(format!(
                        "run {i}: another run failed before the timed steps"
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(())
        };
        let body = || -> Result<(Timing, bool)> {
            let device = make_device()?;
            let mut tr = Trainer::with_task(&spec, Box::new(Synthetic::new(shape.dims())), &device)?;
            let replay = match replay {
                Some(r) => r,
                None => tr.takes_replayed_steps()?,
            };
            for _ in 0..warmup {
                tr.step()?;
            }
            // The replay's first steps (and on a GPU its capture) before the start line.
            let mut replayed = if replay {
                Some(tr.replay_step_warmed(REPLAY_AHEAD)?)
            } else {
                None
            };
            device.synchronize()?;
            at_start()?;
            let mut ms = Vec::with_capacity(steps.max(1));
            let from = unix_now();
            for k in 0..steps.max(1) {
                let t0 = Instant::now();
                match replayed.as_mut() {
                    Some(r) => {
                        r.step(&mut tr)?;
                        if (k + 1) % REPLAY_AHEAD == 0 {
                            r.drain(&mut tr)?;
                        }
                    }
                    None => drop(tr.step()?),
                }
                ms.push(t0.elapsed().as_secs_f64() * 1e3);
            }
            if let Some(r) = replayed.as_mut() {
                r.drain(&mut tr)?;
            }
            device.synchronize()?;
            Ok((timing(ms, from, unix_now()), replay))
        };
        body().inspect_err(|_| failed.store(true, Ordering::SeqCst))
    };
    let results: Vec<Result<(Timing, bool)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..runs)
            .map(|i| {
                std::thread::Builder::new()
                    .name(format!("fpt-stream-run-{i}"))
                    .stack_size(64 << 20)
                    .spawn_scoped(s, move || one(i))
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(i, h)| match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| Err(crate::TrainError::msg(format!("run {i}: its thread panicked")))),
                Err(e) => Err(crate::TrainError::msg(format!("run {i}: no thread ({e})"))),
            })
            .collect()
    });
    let mut per_run = Vec::with_capacity(runs);
    let mut replayed = false;
    for (i, r) in results.into_iter().enumerate() {
        let (t, r) = r.map_err(|e| crate::TrainError::msg(format!("fpt bench --streams: run {i} of {runs}: {e}")))?;
        // Every run is of the same shape on the same kind of device: one answer.
        replayed = r;
        per_run.push(t);
    }
    let first = per_run.iter().map(|t| t.from_unix).fold(f64::INFINITY, f64::min);
    let last = per_run.iter().map(|t| t.to_unix).fold(f64::NEG_INFINITY, f64::max);
    let shared_from = per_run.iter().map(|t| t.from_unix).fold(f64::NEG_INFINITY, f64::max);
    let shared_to = per_run.iter().map(|t| t.to_unix).fold(f64::INFINITY, f64::min);
    let window = (last - first).max(1e-9);
    Ok(StreamsTiming {
        runs,
        replayed,
        steps_per_s: (runs * steps.max(1)) as f64 / window,
        overlap: ((shared_to - shared_from) / window).clamp(0.0, 1.0),
        per_run,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two runs of the smallest shape side by side on the CPU: both timed, their steps a
    /// second in all counted over the shared window; a device that cannot be made fails the
    /// measurement naming the run, without leaving the other waiting.
    #[test]
    fn runs_side_by_side_are_timed_together_and_a_failure_is_named() {
        let shape = crate::bench::shape("tiny").expect("the tiny shape");
        for replay in [false, true] {
            // Replayed: more steps than the gate's ring, so the loop must drain on the way.
            let steps = if replay {
                crate::replay_step::REPLAY_AHEAD + 3
            } else {
                2
            };
            let t = time_streams(
                &shape,
                TrainGroups::fpt(),
                Precision::F32,
                1,
                steps,
                2,
                Some(replay),
                &|| Ok(Device::Cpu),
            )
            .unwrap();
            assert_eq!((t.per_run.len(), t.replayed), (2, replay));
            assert!(t.steps_per_s > 0.0 && t.overlap > 0.0 && t.overlap <= 1.0, "{t:?}");
        }
        let made = AtomicUsize::new(0);
        let e = time_streams(
            &shape,
            TrainGroups::fpt(),
            Precision::F32,
            1,
            2,
            2,
            Some(false),
            &|| {
                if made.fetch_add(1, Ordering::SeqCst) == 1 {
                    Err(crate::TrainError::msg("no such device"))
                } else {
                    Ok(Device::Cpu)
                }
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("fpt bench --streams: run") && e.contains("of 2"), "{e}");
    }
}

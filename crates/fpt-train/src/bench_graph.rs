//! A CUDA graph of the training step, as the bench's experiment (`fpt bench --graph`; issue
//! 56 item 1): how fast the step runs when its kernels are launched as one replayed graph
//! instead of one by one, beside the same step launched eagerly.
//!
//! The step captured is [`crate::Trainer::step_queued`] on one batch uploaded beforehand (a capture
//! takes no host copies): forward, backward, clip and Adam, nothing read back. Replays
//! repeat it exactly, the same batch and the same dropout masks (their seeds were kernel
//! arguments at the capture) and Adam's coefficients of the captured step, updating the
//! parameters in place each time: a measurement of the launches saved, not training. The
//! loss is copied into a tensor made before the capture, so it can be read after a replay
//! (the graph's own allocations are freed at its next launch). Tensors are made without
//! cuda event tracking in this process (one stream: a capture cannot wait on events
//! recorded before it). What stops a training run from replaying its step is listed in
//! bench/README.md.

use crate::bench::{Shape, Timing};
use crate::Result;
use candle_core::Device;
use fpt_spec::{Precision, TrainGroups};
use serde::Serialize;

/// The step launched eagerly and replayed as a graph, in one process on one batch.
#[derive(Debug, Clone, Serialize)]
pub struct GraphTiming {
    /// [`crate::Trainer::step_queued`] launched kernel by kernel, the device synchronised around
    /// each step.
    pub eager: Timing,
    /// The captured graph launched once per step, synchronised the same way.
    pub replay: Timing,
    /// The loss after the first replay and after the last (the same batch each time: a
    /// replay that trains lowers it).
    pub loss_first: f64,
    /// See `loss_first`.
    pub loss_last: f64,
}

/// Times `steps` eager queued steps and `steps` replays of their captured graph after
/// `warmup` ordinary steps of the FPT (`groups`) model of `shape` on `device` (a GPU).
pub fn time_graph_steps(
    shape: &Shape,
    groups: TrainGroups,
    precision: Precision,
    warmup: usize,
    steps: usize,
    device: &Device,
) -> Result<GraphTiming> {
    let Device::Cuda(cuda) = device else {
        return Err(crate::TrainError::Candle(candle_core::Error::Msg(format!(
            "--graph: a CUDA graph of the step needs a GPU (--device cuda:N), not {device:?}"
        ))));
    };
    capture_and_time(cuda, shape, groups, precision, warmup, steps.max(1))
}

#[cfg(feature = "cuda")]
fn capture_and_time(
    cuda: &candle_core::CudaDevice,
    shape: &Shape,
    groups: TrainGroups,
    precision: Precision,
    warmup: usize,
    steps: usize,
) -> Result<GraphTiming> {
    use crate::bench::{timing, unix_now};
    use crate::Trainer;
    use candle_core::cuda_backend::cudarc::driver::sys;
    use std::time::Instant;
    let device = Device::Cuda(cuda.clone());
    let graph_err = |what: &str, e: &dyn std::fmt::Debug| {
        crate::TrainError::Candle(candle_core::Error::Msg(format!("--graph: {what}: {e:?}")))
    };
    // The device (`fpt_nn::device::parse`) has a stream of its own, every step's work on it
    // whichever thread enqueues it, and its event tracking off: what a capture needs.
    if cuda.is_event_tracking() {
        return Err(graph_err(
            "the device records cudarc's events (FPT_CUDA_EVENTS=on)",
            &"a capture takes the device as `fpt_nn::device::parse` makes it, without them",
        ));
    }
    let mut tr = Trainer::with_task(
        &shape.spec(groups, precision),
        Box::new(fpt_tasks::Synthetic::new(shape.dims())),
        &device,
    )?;
    for _ in 0..warmup {
        tr.step().map_err(|e| graph_err("a warm-up step (eager)", &e))?;
    }
    let batch = tr.draw_batch()?;
    let timed = |f: &mut dyn FnMut() -> Result<()>| -> Result<Timing> {
        let mut ms = Vec::with_capacity(steps);
        let from = unix_now();
        for _ in 0..steps {
            device.synchronize()?;
            let t0 = Instant::now();
            f()?;
            device.synchronize()?;
            ms.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        Ok(timing(ms, from, unix_now()))
    };
    let eager =
        timed(&mut || tr.step_queued(&batch).map(drop)).map_err(|e| graph_err("the queued step (eager)", &e))?;
    let loss_out = candle_core::Var::zeros(1, candle_core::DType::F64, &device)?;
    let stream = cuda.cuda_stream();
    device.synchronize()?;
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .map_err(|e| graph_err("begin the capture", &e))?;
    let captured = tr.step_queued(&batch).and_then(|loss| Ok(loss_out.set(&loss)?));
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    captured.map_err(|e| graph_err("the step under capture", &e))?;
    let graph = graph
        .map_err(|e| graph_err("end the capture", &e))?
        .ok_or_else(|| graph_err("end the capture", &"no graph was captured"))?;
    graph.upload().map_err(|e| graph_err("upload the graph", &e))?;
    let read = || -> Result<f64> { Ok(fpt_nn::transfer::download_vec::<f64>(loss_out.as_tensor())?[0]) };
    graph.launch().map_err(|e| graph_err("launch the graph", &e))?;
    // A fault of the replay itself (a pointer the capture took to memory freed since, say)
    // surfaces here, named so.
    device.synchronize().map_err(|e| graph_err("the first replay", &e))?;
    let loss_first = read()?;
    let replay = timed(&mut || graph.launch().map_err(|e| graph_err("launch the graph", &e)))?;
    let loss_last = read()?;
    Ok(GraphTiming {
        eager,
        replay,
        loss_first,
        loss_last,
    })
}

#[cfg(not(feature = "cuda"))]
fn capture_and_time(
    _: &candle_core::CudaDevice,
    _: &Shape,
    _: TrainGroups,
    _: Precision,
    _: usize,
    _: usize,
) -> Result<GraphTiming> {
    Err(crate::TrainError::Candle(candle_core::Error::Msg(
        "--graph: this fpt was built without the `cuda` feature".into(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the CPU the experiment is refused, naming what it needs.
    #[test]
    fn a_graph_needs_a_gpu() {
        let shape = crate::bench::shape("minilm-bitxor").expect("a bench shape");
        let err = time_graph_steps(&shape, TrainGroups::fpt(), Precision::F32, 0, 1, &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--graph") && err.contains("GPU"), "{err}");
    }
}

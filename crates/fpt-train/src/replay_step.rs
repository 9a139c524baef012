//! The training step replayed from device memory (issue 56 item 1): what a CUDA graph of
//! the step needs to train, not just to be timed.
//!
//! A captured graph replays its kernels with the pointers and arguments of the capture.
//! So a [`ReplayStep`] keeps everything a step reads that changes from step to step in
//! device memory the graph points at: the batch in fixed buffers, one set per batch shape
//! (each step's batch is drawn as [`Trainer::step`] draws it, uploaded and copied into its
//! shape's), the dropout seeds in
//! slots ([`fpt_nn::replay::SeedSlots`], written before each step from the run's dropout
//! stream in the order the step draws them), and Adam's step count, coefficient table and
//! the non-finite skip in a gate ([`fpt_nn::ops::AdamGate`]), which also keeps the last
//! steps' losses and norms. A step reads nothing back; [`ReplayStep::drain`] reads the
//! gate once for every step since the last drain.
//!
//! On a GPU (the `cuda` feature), after a shape's first steps run eagerly (the very first
//! learns how many seeds a step draws; the next ones fill candle's cache of small uploads,
//! which a capture cannot take), that shape's step is captured once and replayed (batches
//! padded to their longest sequence, TAPE's, see many shapes: at most [`MAX_STEP_GRAPHS`]
//! are captured, the rest run eagerly through their buffers). Everywhere else the
//! step runs eagerly through the same buffers, slots and gate, with the slots bound (every
//! seed the step draws must be the slot's), and equals [`Trainer::step`] to the last bit
//! (`tests/replay_step.rs`): what this checks on the CPU is everything but the capture.

use crate::replay_eval::EvalReplay;
use crate::{Result, StepOutcome, TrainError, Trainer};
use candle_core::{DType, Tensor, Var};
use fpt_nn::ops::AdamGate;
use fpt_nn::replay::SeedSlots;
use fpt_nn::Rng;
use fpt_tasks::{Batch, Inputs};

/// Eager steps on a GPU before the capture: one to count the seeds, then these, each
/// filling candle's upload cache ([`fpt_nn::replay::with_upload_cache`]).
pub const WARM_STEPS: usize = 2;

/// The most batch shapes whose step is captured as a graph; the steps of shapes beyond
/// them run eagerly through their buffers (as exact, only slower). Tasks whose batches are
/// padded to their longest sequence (TAPE's) see many shapes; the common ones reach their
/// capture first.
pub const MAX_STEP_GRAPHS: usize = 64;

/// A batch's shape as the replay keys it: the inputs' ([`crate::replay_eval::inputs_key`]),
/// then the labels' dims and dtype.
type ShapeKey = ((Vec<usize>, DType, bool), Vec<usize>, DType);

/// One batch shape's fixed buffers (the batch the step reads, and the variables that
/// hold its storage) and, on a GPU, the graph of its step.
struct ShapeEntry {
    key: ShapeKey,
    fixed: Batch,
    vars: Vec<Var>,
    /// Steps of this shape so far.
    runs: usize,
    #[cfg(feature = "cuda")]
    graph: Option<candle_core::cuda_backend::cudarc::driver::CudaGraph>,
}

/// A trainer's step replayed from device memory; see the module's documentation.
pub struct ReplayStep {
    gate: AdamGate,
    /// Per batch shape, in the order first seen.
    shapes: Vec<ShapeEntry>,
    seeds: Option<SeedSlots>,
    /// Adam's step count and the steps recorded at the last drain.
    t: usize,
    recorded: usize,
    /// Steps run since the replay began.
    steps: usize,
}

impl Trainer {
    /// Why this run cannot take replayed steps, if anything stops it: a batch in
    /// micro-batches, a backbone that draws on the host ([`fpt_backbones::Backbone::host_draws`]).
    /// Batches of different shapes replay, each shape with its own buffers and graph.
    pub fn replay_blocker(&self) -> Option<String> {
        if let Some(why) = accumulates(&self.spec.train) {
            return Some(why);
        }
        if let Some(what) = self.model.backbone().host_draws() {
            return Some(format!("it draws {what}"));
        }
        None
    }

    /// Whether this run takes replayed steps: as `FPT_STEP` asks ([`step_kind`], [`replays`]),
    /// given what stops it ([`Trainer::replay_blocker`]). An explicit `replay` that the run
    /// cannot take is an error naming why. The one rule for runs and the bench alike.
    pub fn takes_replayed_steps(&self) -> Result<bool> {
        let kind = step_kind()?;
        let blocker = self.replay_blocker();
        if let (StepKind::Replay, Some(why)) = (kind, &blocker) {
            return Err(TrainError::msg(format!(
                "FPT_STEP=replay: this run cannot replay its steps: {why}"
            )));
        }
        Ok(replays(kind, self.device.is_cuda(), blocker.as_deref()))
    }

    /// A replayed step for this trainer, its gate keeping the last `ring` steps (drain at
    /// least that often). The whole batch must be one micro-batch.
    pub fn replay_step(&self, ring: usize) -> Result<ReplayStep> {
        let t = &self.spec.train;
        if let Some(why) = accumulates(t) {
            return Err(TrainError::msg(format!("replay: {why}")));
        }
        if self.adam.t != self.step {
            return Err(TrainError::msg(format!(
                "replay: Adam has taken {} steps and the trainer {}; they must agree",
                self.adam.t, self.step
            )));
        }
        let rows = t.steps.saturating_sub(self.step).max(1);
        let (lr, schedule, total) = (t.lr, &t.lr_schedule, t.steps);
        let gate = AdamGate::new(
            self.step,
            rows,
            ring,
            |n| self.adam.coefs_at(n, schedule.lr_at(lr, n, total)),
            &self.device,
        )?;
        Ok(ReplayStep {
            gate,
            shapes: Vec::new(),
            seeds: None,
            t: self.step,
            recorded: 0,
            steps: 0,
        })
    }

    /// A replayed step ([`Trainer::replay_step`], its gate keeping `ring` steps) with its
    /// first steps taken (on a GPU: the eager ones and the capture) and read back: what a
    /// timing starts from, so that no capture falls inside the timed steps.
    pub fn replay_step_warmed(&mut self, ring: usize) -> Result<ReplayStep> {
        let mut r = self.replay_step(ring)?;
        while !r.captured() && r.steps() <= WARM_STEPS + 1 {
            r.step(self)?;
        }
        r.drain(self)?;
        Ok(r)
    }

    /// One step on `batch` queued on the device, its update decided by `gate`: forward,
    /// backward, clip, the gate's record, then Adam through the gate. Nothing read back.
    fn step_gated(&mut self, batch: &Batch, gate: &AdamGate) -> Result<()> {
        let clip = self.spec.train.clip_norm;
        let loss = self.loss_on(batch)?;
        let g = loss.backward()?;
        let mut grads: Vec<Tensor> = self
            .vars
            .iter()
            .map(|v| g.get(v.as_tensor()).cloned().map_or_else(|| v.zeros_like(), Ok))
            .collect::<candle_core::Result<_>>()?;
        drop(g);
        let norm = crate::optim::clip_grad_norm_in_place(&mut grads, clip)?;
        gate.record(&loss.detach(), &norm)?;
        let (m, v) = self.adam.moments();
        for (((var, g), m), v) in self.vars.iter().zip(&grads).zip(m).zip(v) {
            gate.update(var, m, v, g)?;
        }
        Ok(())
    }
}

/// Why a step of `t` cannot be replayed as one micro-batch, if it cannot.
fn accumulates(t: &fpt_spec::TrainSpec) -> Option<String> {
    (t.batch_size != t.micro_batch_size).then(|| {
        format!(
            "a batch of {} in micro-batches of {} accumulates; a replayed step takes the whole batch",
            t.batch_size, t.micro_batch_size
        )
    })
}

/// How many draws took `from` to `to` (at most `limit`).
fn draws_between(from: &Rng, to: &Rng, limit: usize) -> Option<usize> {
    let mut r = from.clone();
    for k in 0..=limit {
        if &r == to {
            return Some(k);
        }
        r.next_u64();
    }
    None
}

/// `b`'s shape as the replay keys it.
fn shape_key(b: &Batch) -> ShapeKey {
    (
        crate::replay_eval::inputs_key(&b.inputs),
        b.labels.dims().to_vec(),
        b.labels.dtype(),
    )
}

/// The tensors of `b` with storage of their own: the buffers replays read.
fn fixed_copy(b: &Batch) -> Result<(Batch, Vec<Var>)> {
    let fix = |t: &Tensor| -> Result<(Tensor, Var)> {
        let v = Var::from_tensor(&t.copy()?)?;
        Ok((v.as_tensor().detach(), v))
    };
    let (inputs, vi) = match &b.inputs {
        Inputs::Vectors(t) => {
            let (t, v) = fix(t)?;
            (Inputs::Vectors(t), v)
        }
        Inputs::Tokens(t) => {
            let (t, v) = fix(t)?;
            (Inputs::Tokens(t), v)
        }
    };
    let (labels, vl) = fix(&b.labels)?;
    Ok((Batch { inputs, labels }, vec![vi, vl]))
}

impl ReplayStep {
    /// Steps run so far.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Whether some batch shape's step is now a captured graph (always false without a GPU).
    pub fn captured(&self) -> bool {
        self.captured_shapes() > 0
    }

    /// How many batch shapes' steps are captured graphs (always 0 without a GPU).
    pub fn captured_shapes(&self) -> usize {
        #[cfg(feature = "cuda")]
        return self.shapes.iter().filter(|e| e.graph.is_some()).count();
        #[cfg(not(feature = "cuda"))]
        0
    }

    /// How many batch shapes the steps have seen (each has its own buffers).
    pub fn shapes(&self) -> usize {
        self.shapes.len()
    }

    /// Copies `batch` into its shape's fixed buffers (made at the shape's first batch) and
    /// counts the step; the shape's index.
    fn load(&mut self, batch: &Batch) -> Result<usize> {
        let key = shape_key(batch);
        let i = match self.shapes.iter().position(|e| e.key == key) {
            Some(i) => i,
            None => {
                let (fixed, vars) = fixed_copy(batch)?;
                self.shapes.push(ShapeEntry {
                    key,
                    fixed,
                    vars,
                    runs: 0,
                    #[cfg(feature = "cuda")]
                    graph: None,
                });
                self.shapes.len() - 1
            }
        };
        let e = &mut self.shapes[i];
        let src = match &batch.inputs {
            Inputs::Vectors(t) | Inputs::Tokens(t) => t,
        };
        e.vars[0].set(&src.contiguous()?)?;
        e.vars[1].set(&batch.labels.contiguous()?)?;
        e.runs += 1;
        Ok(i)
    }

    /// One training step: the next batch (drawn as [`Trainer::step`] draws it), its seeds,
    /// then the step, eager or replayed. Nothing is read back.
    pub fn step(&mut self, tr: &mut Trainer) -> Result<()> {
        let batch = tr.draw_batch()?;
        let shape = self.load(&batch)?;
        let fixed = self.shapes[shape].fixed.clone();
        self.steps += 1;
        let Some(slots) = &self.seeds else {
            // The first step: it learns how many seeds a step draws.
            let before = tr.ctx.rng.clone();
            let gate = &self.gate;
            fpt_nn::on_pool(|| tr.step_gated(&fixed, gate))?;
            let k = draws_between(&before, &tr.ctx.rng, 1 << 20)
                .ok_or_else(|| TrainError::msg("replay: the step drew more than 2^20 dropout seeds"))?;
            self.seeds = Some(SeedSlots::new(k, &tr.device)?);
            return Ok(());
        };
        let mut after = tr.ctx.rng.clone();
        let seeds: Vec<u64> = (0..slots.len()).map(|_| after.next_u64()).collect();
        slots.write(&seeds)?;
        #[cfg(feature = "cuda")]
        if let candle_core::Device::Cuda(cuda) = &tr.device {
            return self.step_on_gpu(tr, cuda.clone(), shape, &seeds, after);
        }
        let gate = &self.gate;
        fpt_nn::on_pool(|| slots.bind(&seeds, || tr.step_gated(&fixed, gate)))??;
        if tr.ctx.rng != after {
            return Err(TrainError::msg(
                "replay: the step drew a different number of dropout seeds than its first",
            ));
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn step_on_gpu(
        &mut self,
        tr: &mut Trainer,
        cuda: candle_core::CudaDevice,
        shape: usize,
        seeds: &[u64],
        after: Rng,
    ) -> Result<()> {
        let stage = |what: &'static str| {
            move |e: &dyn std::fmt::Debug| TrainError::msg(format!("replay on a GPU: {what}: {e:?}"))
        };
        let graphs = self.captured_shapes();
        let e = &mut self.shapes[shape];
        if let Some(graph) = &e.graph {
            tr.ctx.rng = after;
            return graph.launch().map_err(|e| stage("launch the graph")(&e));
        }
        let slots = self.seeds.as_ref().expect("made at the first step");
        let gate = &self.gate;
        // Small uploads of the step (a strided op's dims, constants) are kept on the device
        // from the shape's eager steps on, so its capture finds them there.
        let device = tr.device.clone();
        fpt_nn::replay::with_upload_cache(&device, || -> Result<()> {
            if e.runs <= 1 + WARM_STEPS || graphs >= MAX_STEP_GRAPHS {
                slots.bind(seeds, || tr.step_gated(&e.fixed, gate))??;
            } else {
                let fixed = &e.fixed;
                e.graph = Some(capture(&cuda, "replay on a GPU", || {
                    slots.bind(seeds, || tr.step_gated(fixed, gate))?
                })?);
            }
            Ok(())
        })?;
        if tr.ctx.rng != after {
            return Err(TrainError::msg(
                "replay: the step drew a different number of dropout seeds than its first",
            ));
        }
        Ok(())
    }

    /// The outcomes of the steps since the last drain, read from the gate (one download),
    /// and the trainer's step counts brought up to date.
    pub fn drain(&mut self, tr: &mut Trainer) -> Result<Vec<StepOutcome>> {
        let s = self.gate.read()?;
        let new = s.recorded - self.recorded;
        if new > s.records.len() {
            return Err(TrainError::msg(format!(
                "replay: {new} steps since the last drain overran the gate's ring of {}; drain more often",
                self.gate.ring()
            )));
        }
        let t = &tr.spec.train;
        let mut applied = self.t;
        let mut out = Vec::with_capacity(new);
        for r in &s.records[s.records.len() - new..] {
            if r.past_table {
                return Err(TrainError::msg(format!(
                    "replay: a step ran past the gate's table (the run's {} steps)",
                    t.steps
                )));
            }
            out.push(StepOutcome {
                loss: r.loss,
                grad_norm: r.grad_norm,
                lr: t.lr_schedule.lr_at(t.lr, applied + 1, t.steps),
                finite: r.applied,
            });
            applied += usize::from(r.applied);
        }
        if applied != s.t {
            return Err(TrainError::msg(format!(
                "replay: the gate counts {} updates, its records {applied}",
                s.t
            )));
        }
        (self.t, self.recorded) = (s.t, s.recorded);
        tr.step = s.t;
        tr.adam.t = s.t;
        Ok(out)
    }
}

/// Captures `f`'s work on `cuda`'s stream as a CUDA graph, uploads the graph and launches
/// it once: a capture records the work without running it, so that launch is the work's
/// first run. Each failure names its stage after `what`.
#[cfg(feature = "cuda")]
pub(crate) fn capture(
    cuda: &candle_core::CudaDevice,
    what: &'static str,
    f: impl FnOnce() -> Result<()>,
) -> Result<candle_core::cuda_backend::cudarc::driver::CudaGraph> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let stage = |s: &'static str| move |e: &dyn std::fmt::Debug| TrainError::msg(format!("{what}: {s}: {e:?}"));
    let stream = cuda.cuda_stream();
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .map_err(|e| stage("begin the capture")(&e))?;
    let captured = f();
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    captured.map_err(|e| stage("the work under capture")(&e))?;
    let graph = graph
        .map_err(|e| stage("end the capture")(&e))?
        .ok_or_else(|| stage("end the capture")(&"no graph was captured"))?;
    graph.upload().map_err(|e| stage("upload the graph")(&e))?;
    graph.launch().map_err(|e| stage("the first replay")(&e))?;
    Ok(graph)
}

/// How a run takes its steps and evaluations: [`Trainer::step`] and [`Trainer::tally`], or
/// ([`replays`]: by default on a GPU) the replayed step and [`EvalReplay`] (on a GPU captured as CUDA
/// graphs after their first passes). The replayed step runs up to the run's
/// next evaluation, checkpoint or end (at most [`REPLAY_AHEAD`] steps) before it reads the
/// gate back once, then hands the loop each step's outcome as the eager step gives it.
/// The loop acts on the trainer's state only where the replay has settled (evaluations,
/// checkpoints and stops fall there), so a replayed run ends as the eager run does. One
/// that diverges stops at the same step with the steps after it in its chunk already
/// applied; it keeps its best evaluation's parameters as the eager run does, and before its
/// first evaluation (where a diverged run is evaluated as it stands) the replay reads the
/// gate after every step, so nothing runs past a divergence there. The diverged run's last
/// checkpoint holds Adam's moments of its chunk's end (it is not resumed: it has a result).
pub enum Stepper {
    /// [`Trainer::step`].
    Eager,
    /// [`ReplayStep`] and the outcomes read back but not yet handed out, each with Adam's
    /// step count after it; the run's evaluations replayed too ([`EvalReplay`]).
    Replay(
        Box<ReplayStep>,
        std::collections::VecDeque<(StepOutcome, usize)>,
        EvalReplay,
    ),
}

/// The most steps a replayed run takes before reading the gate back.
pub const REPLAY_AHEAD: usize = 32;

/// What the `FPT_STEP` variable asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// `eager`: [`Trainer::step`] everywhere.
    Eager,
    /// `replay`: the replayed step, or an error naming why the run cannot take it.
    Replay,
    /// `auto` (the default): replayed on a GPU where the run can replay, eager elsewhere.
    Auto,
}

/// The `FPT_STEP` variable: `auto` (unset or empty: the default), `eager` or `replay`.
pub fn step_kind() -> Result<StepKind> {
    parse_step_kind(std::env::var("FPT_STEP").ok().as_deref())
}

/// `FPT_STEP`'s value `v` (`None`: unset), as [`step_kind`] reads it.
pub fn parse_step_kind(v: Option<&str>) -> Result<StepKind> {
    match v.map(str::trim) {
        None | Some("") | Some("auto") => Ok(StepKind::Auto),
        Some("eager") => Ok(StepKind::Eager),
        Some("replay") => Ok(StepKind::Replay),
        Some(other) => Err(TrainError::msg(format!(
            "FPT_STEP={other}: expected `auto` (the default), `eager` or `replay`"
        ))),
    }
}

/// Whether steps on a device are replayed: as `kind` asks, and under `auto` on a GPU
/// (`on_gpu`) when nothing stops the run replaying (`blocker`, [`Trainer::replay_blocker`]).
/// A CPU gains nothing from the replay (it runs it eagerly, to check it), so `auto` keeps
/// the eager step there.
pub fn replays(kind: StepKind, on_gpu: bool, blocker: Option<&str>) -> bool {
    match kind {
        StepKind::Eager => false,
        StepKind::Replay => true,
        StepKind::Auto => on_gpu && blocker.is_none(),
    }
}

/// Steps from `done` to the next multiple of `every` (or of nothing).
fn to_next(done: usize, every: Option<usize>) -> usize {
    every.filter(|&e| e > 0).map_or(usize::MAX, |e| e - done % e)
}

impl Stepper {
    /// The stepper `FPT_STEP` asks for, for `tr` ([`replays`]): an explicit `replay` that
    /// the run cannot take is an error naming why; under `auto` on a GPU, a run that cannot
    /// replay says why it steps eagerly.
    pub fn for_run(tr: &Trainer) -> Result<Self> {
        let kind = step_kind()?;
        if !tr.takes_replayed_steps()? {
            if let (StepKind::Auto, true, Some(why)) = (kind, tr.device.is_cuda(), tr.replay_blocker()) {
                tracing::info!("steps taken eagerly on the GPU (a replayed step cannot take this run: {why})");
            }
            return Ok(Stepper::Eager);
        }
        let r = tr.replay_step(REPLAY_AHEAD)?;
        tracing::info!(
            device = ?tr.device,
            "FPT_STEP={}: steps replayed from device memory (captured as a CUDA graph on a GPU)",
            if kind == StepKind::Replay { "replay" } else { "auto" }
        );
        Ok(Stepper::Replay(Box::new(r), Default::default(), EvalReplay::new()))
    }

    /// Whether steps are replayed.
    pub fn replayed(&self) -> bool {
        matches!(self, Stepper::Replay(..))
    }

    /// The per-example outcomes of an evaluation of `tr`'s whole `split`: [`Trainer::tally`],
    /// or (steps replayed) the same replayed from device memory.
    pub fn tally(&mut self, tr: &Trainer, split: fpt_tasks::Split) -> Result<crate::outcomes::Tally> {
        match self {
            Stepper::Eager => tr.tally(split),
            Stepper::Replay(_, _, eval) => eval.tally(tr, split),
        }
    }

    /// Whether every step taken has been handed out: the trainer's state is the last
    /// handed-out step's (always, for eager steps).
    pub fn settled(&self) -> bool {
        match self {
            Stepper::Eager => true,
            Stepper::Replay(_, ahead, _) => ahead.is_empty(),
        }
    }

    /// The next step's outcome, for a run with settings `t`: replayed steps run up to the
    /// next evaluation, checkpoint or the run's end when none is waiting (one at a time
    /// while the run has `no_evaluation` yet).
    pub fn step(&mut self, tr: &mut Trainer, t: &fpt_spec::TrainSpec, no_evaluation: bool) -> Result<StepOutcome> {
        let (r, ahead) = match self {
            Stepper::Eager => return tr.step(),
            Stepper::Replay(r, ahead, _) => (r, ahead),
        };
        if ahead.is_empty() {
            let done = tr.step;
            let n = to_next(done, Some(t.eval_every))
                .min(to_next(done, t.checkpoint_every))
                .min(t.steps.saturating_sub(done))
                .clamp(1, if no_evaluation { 1 } else { REPLAY_AHEAD });
            for _ in 0..n {
                r.step(tr)?;
            }
            let mut applied = done;
            for o in r.drain(tr)? {
                applied += usize::from(o.finite);
                ahead.push_back((o, applied));
            }
        }
        let (o, applied) = ahead
            .pop_front()
            .ok_or_else(|| TrainError::msg("replay: the steps gave no outcome"))?;
        tr.step = applied;
        Ok(o)
    }
}

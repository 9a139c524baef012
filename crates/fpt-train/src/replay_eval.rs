//! Evaluation replayed from device memory (issue 56 item 1: "evaluation batches the same
//! way" as the replayed step).
//!
//! An evaluation is a run of forward passes over a split's fixed batches. On a GPU each is
//! a few hundred small launches for the MiniLM, and [`crate::tally_with`] reads each
//! batch's loss, predictions and labels back before the next. An [`EvalReplay`] instead
//! keeps, per batch shape, a fixed input buffer and a fixed output buffer; a batch is
//! copied in, the forward pass (on a GPU a CUDA graph of it, captured after
//! [`WARM_RUNS`] eager passes of that shape) writes its logits into the output buffer, and
//! a copy of them is kept on the device. Nothing is read back until the split's last batch:
//! then every batch's loss (each batch's own mean, as [`crate::tally_with`] takes it),
//! the predictions and the labels come back in three downloads, and the [`Tally`] is the
//! one [`crate::Trainer::tally`] gives, to the last bit (`tests/replay_eval.rs`).
//!
//! The graph reads the trained parameters where they live, so it sees each update the
//! replayed step (or Adam, or a restore) writes into them in place; it must not outlive
//! the trainer whose model it captured ([`EvalReplay::tally`] takes that trainer, and a
//! run keeps one `EvalReplay` per trainer). Off a GPU the same flow runs eagerly through
//! the same buffers: what it checks on the CPU is everything but the capture.

use crate::outcomes::Tally;
use crate::{Result, TrainError, Trainer};
use candle_core::{DType, Tensor, Var};
use fpt_nn::Ctx;
use fpt_tasks::{Inputs, Split};

/// Eager passes of a batch shape before its capture on a GPU (they fill candle's cache of
/// small uploads, which a capture cannot take, and make any per-shape choice such as
/// [`fpt_nn::ops::bf16_choice`]'s timing outside the capture).
pub const WARM_RUNS: usize = 2;

/// The most bytes of logits kept on the device before they are read back (a language
/// model's logits over its vocabulary would otherwise fill the device).
pub const KEPT_BYTES: usize = 64 << 20;

/// One batch shape's buffers and, on a GPU, its graph.
struct Entry {
    /// The inputs' shape, dtype and kind (tokens or vectors).
    key: (Vec<usize>, DType, bool),
    /// The fixed input buffer, and the inputs the forward pass reads (a view of it).
    input: Var,
    inputs: Inputs,
    /// The fixed output buffer, made at the shape's first pass.
    logits: Option<Var>,
    /// Passes of this shape so far.
    runs: usize,
    #[cfg(feature = "cuda")]
    graph: Option<candle_core::cuda_backend::cudarc::driver::CudaGraph>,
}

/// A trainer's evaluation replayed from device memory; see the module's documentation.
pub struct EvalReplay {
    entries: Vec<Entry>,
    kept_bytes: usize,
}

impl Default for EvalReplay {
    fn default() -> Self {
        EvalReplay {
            entries: Vec::new(),
            kept_bytes: KEPT_BYTES,
        }
    }
}

impl EvalReplay {
    /// An evaluation with nothing captured yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same, reading the logits back whenever `bytes` of them are kept (at least one
    /// batch each time; [`KEPT_BYTES`] by default).
    pub fn reading_back_every(bytes: usize) -> Self {
        EvalReplay {
            kept_bytes: bytes,
            ..Self::default()
        }
    }

    /// How many batch shapes run as a captured graph (always 0 without a GPU).
    pub fn captured(&self) -> usize {
        #[cfg(feature = "cuda")]
        return self.entries.iter().filter(|e| e.graph.is_some()).count();
        #[cfg(not(feature = "cuda"))]
        0
    }

    /// The per-example outcomes of an evaluation of `tr`'s whole `split`, in
    /// [`Trainer::eval_batch_size`] batches: [`Trainer::tally`]'s, with one read-back.
    pub fn tally(&mut self, tr: &Trainer, split: Split) -> Result<Tally> {
        let task = tr.task();
        let (n, bs) = (task.eval_len(split), tr.eval_batch_size());
        let mut start = 0;
        let mut batches = std::iter::from_fn(|| {
            (start < n).then(|| {
                let b = task.eval_batch(split, start, bs, &tr.device)?;
                start += b.inputs.batch_size().max(1);
                Ok(b)
            })
        });
        self.tally_batches(tr, &mut batches)
    }

    /// The tally of `batches` (each as [`Tally::add`] scores it, read back once at the
    /// end) under `tr`'s model in evaluation mode.
    pub fn tally_batches(
        &mut self,
        tr: &Trainer,
        batches: &mut dyn Iterator<Item = Result<fpt_tasks::Batch>>,
    ) -> Result<Tally> {
        let per_example = tr.task().dims().labels_per_example;
        let mut tally = Tally::default();
        let (mut kept, mut bytes) = (Vec::new(), 0);
        for batch in batches {
            let batch = batch?;
            let logits = self.forward(tr, &batch.inputs)?;
            let classes = logits.dim(candle_core::D::Minus1)?;
            bytes += logits.elem_count() * logits.dtype().size_in_bytes();
            kept.push((logits.reshape(((), classes))?, batch.labels.flatten_all()?));
            // Logits over a large vocabulary add up: read back every KEPT_BYTES.
            if bytes >= self.kept_bytes {
                tally.add_batches(&kept, per_example)?;
                (kept, bytes) = (Vec::new(), 0);
            }
        }
        tally.add_batches(&kept, per_example)?;
        Ok(tally)
    }

    /// The entry of `inputs`' shape, made at its first use.
    fn entry(&mut self, inputs: &Inputs) -> Result<&mut Entry> {
        let key = inputs_key(inputs);
        let (t, tokens) = match inputs {
            Inputs::Vectors(t) => (t, false),
            Inputs::Tokens(t) => (t, true),
        };
        if let Some(i) = self.entries.iter().position(|e| e.key == key) {
            return Ok(&mut self.entries[i]);
        }
        let input = Var::from_tensor(&t.copy()?)?;
        let view = input.as_tensor().detach();
        self.entries.push(Entry {
            key,
            inputs: if tokens {
                Inputs::Tokens(view)
            } else {
                Inputs::Vectors(view)
            },
            input,
            logits: None,
            runs: 0,
            #[cfg(feature = "cuda")]
            graph: None,
        });
        Ok(self.entries.last_mut().expect("just pushed"))
    }

    /// The logits of one batch, a tensor of their own on the device: the batch copied into
    /// its shape's input buffer, the pass (eager, or the shape's graph) writing the output
    /// buffer, and a copy of that.
    fn forward(&mut self, tr: &Trainer, inputs: &Inputs) -> Result<Tensor> {
        let e = self.entry(inputs)?;
        let src = match inputs {
            Inputs::Vectors(t) | Inputs::Tokens(t) => t,
        };
        e.input.set(&src.contiguous()?)?;
        e.runs += 1;
        #[cfg(feature = "cuda")]
        if let candle_core::Device::Cuda(cuda) = &tr.device {
            return forward_on_gpu(e, tr, cuda);
        }
        pass(e, tr)?;
        Ok(e.logits.as_ref().expect("written by the pass").as_tensor().copy()?)
    }
}

/// `inputs`' shape as the replays key it: dims, dtype and kind (tokens or vectors).
pub(crate) fn inputs_key(inputs: &Inputs) -> (Vec<usize>, DType, bool) {
    let (t, tokens) = match inputs {
        Inputs::Vectors(t) => (t, false),
        Inputs::Tokens(t) => (t, true),
    };
    (t.dims().to_vec(), t.dtype(), tokens)
}

/// One eager pass of `e`'s shape: the forward pass on its input buffer, its logits written
/// into the output buffer (made at the first pass).
fn pass(e: &mut Entry, tr: &Trainer) -> Result<()> {
    let model = tr.model();
    let inputs = &e.inputs;
    let out = fpt_nn::no_grad(|| fpt_nn::on_pool(|| model.forward(inputs, &mut Ctx::eval())))?;
    match &e.logits {
        Some(buf) if buf.shape() == out.shape() && buf.dtype() == out.dtype() => buf.set(&out)?,
        Some(buf) => {
            return Err(TrainError::msg(format!(
                "replayed evaluation: the logits of a batch of {:?} are {:?} {:?}, its first pass's {:?} {:?}",
                e.key.0,
                out.dtype(),
                out.shape(),
                buf.dtype(),
                buf.shape()
            )))
        }
        None => e.logits = Some(Var::from_tensor(&out.copy()?)?),
    }
    Ok(())
}

#[cfg(feature = "cuda")]
fn forward_on_gpu(e: &mut Entry, tr: &Trainer, cuda: &candle_core::CudaDevice) -> Result<Tensor> {
    // Small uploads of the pass are kept on the device from the eager passes on, so the
    // capture finds them there.
    // The pass runs on rayon's pool (`pass`), where this scope goes along.
    fpt_nn::replay::with_upload_cache(&tr.device, || -> Result<()> {
        if let Some(graph) = &e.graph {
            graph
                .launch()
                .map_err(|err| TrainError::msg(format!("replayed evaluation on a GPU: launch the graph: {err:?}")))?;
        } else if e.runs <= WARM_RUNS {
            pass(e, tr)?;
        } else {
            let graph = crate::replay_step::capture(cuda, "replayed evaluation", || pass(e, tr))?;
            e.graph = Some(graph);
        }
        Ok(())
    })?;
    Ok(e.logits
        .as_ref()
        .expect("written by the first pass")
        .as_tensor()
        .copy()?)
}

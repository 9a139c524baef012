//! Custom candle ops with hand-written backward passes.
//!
//! Each public function picks the fused CPU kernel when its input lives on the CPU and a
//! composition of stock candle ops otherwise (the `*_composed` twin, which has correct
//! gradients on every device and is the reference the fused kernel is tested against).
//! [`linear`] is a custom op on every device: its forward uses the backend's own
//! matmul, its backward computes only the gradients of
//! arguments that take part in backprop, so a frozen weight never gets one.

/// The CPU half of a three-input custom op that only GPUs run (its CPU twin is another
/// op, or fused into the forward): an error that names the op.
macro_rules! gpu_only_cpu_fwd3 {
    ($msg:expr) => {
        fn cpu_fwd(
            &self,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
        ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
            candle_core::bail!($msg)
        }
    };
}

mod adam;
mod adam_gate;
mod attention;
mod attention_dispatch;
mod attention_recomputed;
pub(crate) mod attention_rows;
pub(crate) mod attention_tiled;
pub mod bf16;
pub mod bf16_choice;
pub(crate) mod branch_node;
pub(crate) mod dropout;
pub(crate) mod fastmath;
mod gelu;
mod layer_norm;
mod linear;
mod loss;
mod lstm;
pub(crate) mod lstm_grid;
pub(crate) mod residual_branch;
mod rotary;
pub(crate) mod sgemm;
pub use sgemm::packed_bytes;
mod softmax;
mod swiglu;

pub use adam::{adam_update, adam_update_composed, AdamCoefs};
pub use adam_gate::{AdamGate, GateRecord, GateState};
pub use attention::{attention_composed, attention_probs, dropout_mask as attention_dropout_mask, AttentionSpec};
pub(crate) use attention_dispatch::attention_packed_detached;
pub use attention_dispatch::{attention, attention_packed, attention_packed_last, tiled_requested};
pub use attention_recomputed::{attention_packed_recomputed, attention_recomputed};
pub use attention_tiled::{attention_tiled, attention_tiled_packed, attention_tiled_packed_with, TiledKernels};
pub use dropout::{dropout, dropout_add, dropout_mask_values};
pub use gelu::{gelu_erf, gelu_erf_composed, gelu_new, gelu_new_composed};
pub use layer_norm::{layer_norm, layer_norm_composed, rms_norm, rms_norm_composed};
pub(crate) use linear::linear_prepacked;
pub use linear::{epilogue_requested, linear, linear_composed, linear_epilogue};
pub use loss::{correct, cross_entropy, cross_entropy_composed};
pub use lstm::{ln_lstm, ln_lstm_as, ln_lstm_composed, ln_lstm_seeded, ln_lstm_seeded_as, LnLstmParams};
pub use lstm_grid::{LstmChoice, LstmDrop};
pub use rotary::{rotary, rotary_composed};
pub use softmax::{masked_softmax, masked_softmax_composed, Mask};
pub use swiglu::{swiglu, swiglu_composed};

use candle_core::{
    CpuStorage, CudaStorage, CustomOp3, DType, Error, Layout, Result, Shape, Storage, Tensor, WithDType,
};

/// An opt-in switch from the environment (`FPT_ATTENTION=tiled`):
/// `on` gives true; unset, empty or `auto` false; anything else an error naming `var`, `on`
/// and `what` it turns on.
pub(crate) fn parse_switch(var: &str, value: Option<&str>, on: &str, what: &str) -> std::result::Result<bool, String> {
    match value.map(str::trim) {
        None | Some("") | Some("auto") => Ok(false),
        Some(v) if v == on => Ok(true),
        Some(other) => Err(format!(
            "{var}=`{other}`: the choices are `{on}` ({what}) and `auto` (the default)"
        )),
    }
}

/// `n` uninitialised slots for a kernel output: cheaper than `vec![0; n]`, whose zero-fill
/// is a sequential pass over memory before the (parallel) kernel writes it again.
pub(crate) fn uninit<T>(n: usize) -> Vec<std::mem::MaybeUninit<T>> {
    let mut v = Vec::with_capacity(n);
    // SAFETY: MaybeUninit needs no initialisation.
    unsafe { v.set_len(n) };
    v
}

/// The vector once every slot has been written.
///
/// # Safety
/// Every element of `v` must have been initialised.
pub(crate) unsafe fn assume_init<T>(v: Vec<std::mem::MaybeUninit<T>>) -> Vec<T> {
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: same allocation, layout and length; MaybeUninit<T> has T's layout, and the
    // caller guarantees initialisation.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr() as *mut T, v.len(), v.capacity()) }
}

/// Float types the fused CPU kernels support.
pub(crate) trait Float:
    WithDType + num_traits::Float + num_traits::NumAssign + Send + Sync + std::iter::Sum
{
}
impl Float for f32 {}
impl Float for f64 {}

/// Below this many elements a kernel runs on the calling thread: handing a job to the
/// rayon pool costs a cross-thread wake-up (tens of microseconds), more than small
/// kernels take.
pub(crate) const PAR_MIN: usize = 1 << 15;

/// Whether a kernel over `len` elements should run in parallel.
pub(crate) fn use_par(len: usize) -> bool {
    len >= PAR_MIN && crate::num_threads() > 1
}

/// Number of rows per rayon task: enough work (~32k elements) to amortise scheduling.
pub(crate) fn rows_per_task(row_len: usize) -> usize {
    (32_768 / row_len.max(1)).max(1)
}

/// The contiguous slice a CPU storage + layout describes.
pub(crate) fn cpu_slice<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout, op: &'static str) -> Result<&'a [T]> {
    let data = T::cpu_storage_as_slice(s)?;
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => Err(Error::Msg(format!("{op}: input must be contiguous")).bt()),
    }
}

/// Runs `f` on the contiguous CPU data of `t`.
pub(crate) fn with_cpu_slice<T: WithDType, R>(
    t: &Tensor,
    op: &'static str,
    f: impl FnOnce(&[T]) -> Result<R>,
) -> Result<R> {
    let t = t.contiguous()?;
    let (st, l) = t.storage_and_layout();
    match &*st {
        Storage::Cpu(cs) => f(cpu_slice::<T>(cs, l, op)?),
        _ => Err(Error::Msg(format!("{op}: expected a CPU tensor")).bt()),
    }
}

/// A custom op of three tensors, its operands as arrays; [`Three`] makes it candle's
/// `CustomOp3`. The one home of candle's six-argument forward signatures and tuple backward.
pub(crate) trait ThreeOperands: Send + Sync + 'static {
    /// The op's name in candle's errors.
    fn name(&self) -> &'static str;
    /// The forward pass on CPU storage: the result and its shape.
    fn forward_cpu(&self, args: [(&CpuStorage, &Layout); 3]) -> Result<(CpuStorage, Shape)>;
    /// The forward pass on CUDA storage; without one, candle's error naming the op.
    fn forward_cuda(&self, args: [(&CudaStorage, &Layout); 3]) -> Result<(CudaStorage, Shape)> {
        let _ = args;
        Err(Error::Cuda(
            format!("no cuda implementation for {}", self.name()).into(),
        ))
    }
    /// The operands' gradients from the output's `dy` (`res` is the output), `None` for an
    /// operand that does not take part in backprop; called when at least one does.
    fn gradients(&self, args: [&Tensor; 3], res: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 3]>;
}

/// candle's `CustomOp3` of a [`ThreeOperands`] op: `a.apply_op3(b, c, Three(op))`.
pub(crate) struct Three<T>(pub T);

impl<T: ThreeOperands> CustomOp3 for Three<T> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.0.forward_cpu([(s1, l1), (s2, l2), (s3, l3)])
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.0.forward_cuda([(s1, l1), (s2, l2), (s3, l3)])
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        c: &Tensor,
        res: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        if ![a, b, c].iter().any(|t| tracks(t)) {
            return Ok((None, None, None));
        }
        let [ga, gb, gc] = self.0.gradients([a, b, c], res, dy)?;
        Ok((ga, gb, gc))
    }
}

/// Whether an op's fused version runs for `x`: f32 or f64 on the CPU (the fused CPU
/// kernels), f32 on a GPU (fpt's CUDA kernels, with the `cuda` feature); otherwise the op's
/// `*_composed` twin runs.
pub(crate) fn fused_here(x: &Tensor) -> bool {
    if x.device().is_cpu() {
        matches!(x.dtype(), DType::F32 | DType::F64)
    } else {
        cfg!(feature = "cuda") && x.device().is_cuda() && x.dtype() == DType::F32
    }
}

/// Whether `t` takes part in backprop (a `Var` or computed from one). Custom-op backward
/// passes return `None` for arguments that do not, so no gradient of a frozen tensor is
/// ever computed or stored.
pub(crate) fn tracks(t: &Tensor) -> bool {
    t.track_op()
}

/// An op's result computed before the op is applied (by other ops, on detached operands)
/// and handed to candle once, so the op is one node of the graph whose backward is its
/// own ([`attention_recomputed`], [`branch_node`]).
pub(crate) struct Computed {
    op: &'static str,
    out: std::sync::Mutex<Option<Tensor>>,
}

impl Computed {
    pub(crate) fn new(op: &'static str, t: Tensor) -> Self {
        Computed {
            op,
            out: std::sync::Mutex::new(Some(t)),
        }
    }

    /// The result's storage (a copy, the size of the op's output), for the op's forward;
    /// the op keeps nothing after.
    pub(crate) fn take<S: candle_core::backend::BackendStorage>(
        &self,
        get: impl Fn(&Storage) -> Option<&S>,
    ) -> Result<(S, Shape)> {
        let op = self.op;
        let t = self
            .out
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| Error::Msg(format!("{op}: the op's forward ran twice")))?;
        let t = t.contiguous()?;
        let (storage, layout) = t.storage_and_layout();
        let s =
            get(&storage).ok_or_else(|| Error::Msg(format!("{op}: the result is on another device than the op")))?;
        if layout.start_offset() != 0 {
            candle_core::bail!("{op}: the result does not start its storage")
        }
        Ok((s.try_clone(layout)?, t.shape().clone()))
    }
}

/// A storage's CPU half, for [`Computed::take`].
pub(crate) fn computed_cpu(s: &Storage) -> Option<&CpuStorage> {
    match s {
        Storage::Cpu(c) => Some(c),
        _ => None,
    }
}

/// A storage's CUDA half, for [`Computed::take`].
#[cfg(feature = "cuda")]
pub(crate) fn computed_cuda(s: &Storage) -> Option<&CudaStorage> {
    match s {
        Storage::Cuda(c) => Some(c),
        _ => None,
    }
}

/// Without the `cuda` feature no storage is on a GPU.
#[cfg(not(feature = "cuda"))]
pub(crate) fn computed_cuda(_: &Storage) -> Option<&CudaStorage> {
    None
}

/// An op's backward kept beside its detached forward: the input's gradient from the
/// output's (what [`branch_node`] chains by hand).
pub(crate) type InputGrad = Box<dyn Fn(&Tensor) -> Result<Tensor> + Send + Sync>;

/// `x`'s gradient through `f` for the output gradient `dy`, by candle's backprop over a
/// copy of `x` made a `Var` (the vector-Jacobian product; `sum(f(x) * dy)`'s gradient is
/// `dy` pulled back exactly: the product by the ones of the sum is exact). For the composed
/// ops a hand-chained backward meets where no fused op runs.
pub(crate) fn vjp(x: &Tensor, dy: &Tensor, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let var = candle_core::Var::from_tensor(&x.detach())?;
    let grads = (f(var.as_tensor())? * dy)?.sum_all()?.backward()?;
    grads
        .get(var.as_tensor())
        .cloned()
        .ok_or_else(|| Error::Msg("vjp: the output does not depend on the input".into()))
}

/// A gradient computed as `v`, shaped like the operand `like`, where `keep` (the operand
/// takes part in backprop); `None` otherwise.
pub(crate) fn grad_like<T: WithDType>(v: Vec<T>, like: &Tensor, keep: bool) -> Result<Option<Tensor>> {
    keep.then(|| Tensor::from_vec(v, like.shape(), like.device()))
        .transpose()
}

/// `Ok` when every storage holds f32 (what the f32-only fused kernels take), else the
/// error naming `op` and the first other dtype.
pub(crate) fn f32_only(storages: &[&candle_core::CpuStorage], op: &'static str) -> Result<()> {
    use candle_core::backend::BackendStorage;
    match storages.iter().find(|s| s.dtype() != DType::F32) {
        Some(s) => Err(unsupported(op, s.dtype())),
        None => Ok(()),
    }
}

pub(crate) fn unsupported(op: &'static str, dtype: DType) -> Error {
    Error::Msg(format!(
        "{op}: unsupported dtype {dtype:?} (the fused kernels take f32 or f64)"
    ))
    .bt()
}

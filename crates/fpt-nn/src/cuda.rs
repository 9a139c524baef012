//! fpt's own CUDA kernels (`kernels/fpt_kernels.cu`, compiled to PTX by `build.rs` with the
//! `cuda` feature), launched from the `cuda_fwd` of fpt's custom ops: dropout drawn on the
//! device (the mask never crosses from the host), the masked softmax (with attention's dropout:
//! `cuda/attn_rows.rs`) and its backward, and
//! Adam's in-place updates. Their arithmetic is `kernels/fpt_ops.h`, which the tests also
//! run on the host (`kernels/host_grid.c`) against the CPU ops.
//!
//! Every kernel takes contiguous f32 buffers; the callers check the dtype and make their
//! operands contiguous, and name the op in the error otherwise.

use crate::ops::dropout::mask_params;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{CudaStorage, DType, Layout, Result};

/// The PTX of `kernels/fpt_kernels.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/fpt_kernels.ptx"));
/// The name the module is cached under in candle's device.
const MODULE: &str = "fpt_kernels";
/// Threads per block.
const THREADS: u32 = 256;
/// The most blocks a grid-stride launch uses (enough to fill an H100's 132 SMs many times).
const MAX_BLOCKS: u64 = 132 * 32;

/// The contiguous f32 elements of a storage and layout, or the error naming `op`.
pub(crate) fn f32_view<'a>(s: &'a CudaStorage, l: &Layout, op: &'static str) -> Result<CudaView<'a, f32>> {
    if s.dtype() != DType::F32 {
        candle_core::bail!("{op}: the CUDA kernel takes f32, got {:?}", s.dtype())
    }
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{op}: the CUDA kernel takes a contiguous input")))?;
    Ok(s.as_cuda_slice::<f32>()?.slice(a..b))
}

/// A grid-stride launch over `n` elements.
fn elementwise(n: usize) -> LaunchConfig {
    let blocks = (n as u64).div_ceil(THREADS as u64).clamp(1, MAX_BLOCKS);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A launch of one warp per row over `rows` rows.
fn per_row(rows: usize) -> LaunchConfig {
    let warps_per_block = (THREADS / 32) as u64;
    let blocks = (rows as u64).div_ceil(warps_per_block).clamp(1, MAX_BLOCKS);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The kernel `name` of fpt's module, loaded into `dev` at its first use.
macro_rules! func {
    ($dev:expr, $name:expr) => {
        $dev.get_or_load_custom_func($name, MODULE, PTX)
    };
}

pub(crate) mod attn;
pub(crate) mod attn_rows;
pub(crate) mod lstm;

/// Uninitialised device memory for `n` f32 results (every kernel writes all of them).
fn output(dev: &CudaDevice, n: usize) -> Result<CudaSlice<f32>> {
    // SAFETY: the kernel the caller launches next writes every element.
    unsafe { dev.alloc::<f32>(n.max(1)) }
}

/// Runs `launch` with the device address of `seed`'s slot when a replayed step is bound
/// on this thread (see [`crate::replay`]; the kernels read their seed from there), null
/// otherwise (they take the argument).
fn with_seed_at<R>(seed: u64, launch: impl FnOnce(u64) -> Result<R>) -> Result<R> {
    let Some((buf, i)) = crate::replay::seed_slot(seed) else {
        return launch(0);
    };
    let (st, l) = buf.storage_and_layout();
    let candle_core::Storage::Cuda(cs) = &*st else {
        candle_core::bail!("seed slots: the slots live on {:?}, the kernel on a GPU", buf.device())
    };
    let slots = cs.as_cuda_slice::<i64>()?;
    let at = l.start_offset() + i;
    if at >= slots.len() {
        candle_core::bail!("seed slots: slot {i} is outside the buffer of {}", slots.len())
    }
    let (ptr, _sync) = candle_core::cuda_backend::cudarc::driver::DevicePtr::device_ptr(slots, slots.stream());
    launch(ptr + (at * std::mem::size_of::<i64>()) as u64)
}

/// `x * mask` with the mask of blocks of `block` elements drawn from `seed` on the device.
pub(crate) fn dropout_mul(x: &CudaStorage, l: &Layout, p: f64, seed: u64, block: usize) -> Result<CudaStorage> {
    let dev = x.device().clone();
    let xs = f32_view(x, l, "dropout")?;
    let n = l.shape().elem_count();
    let out = output(&dev, n)?;
    let (thr, keep) = mask_params(p);
    let f = func!(dev, "fpt_dropout_mul_f32")?;
    let (n64, block64) = (n as u64, block as u64);
    with_seed_at(seed, |seed_at| {
        let mut b = f.builder();
        b.arg(&xs)
            .arg(&out)
            .arg(&n64)
            .arg(&seed)
            .arg(&block64)
            .arg(&thr)
            .arg(&keep)
            .arg(&seed_at);
        // SAFETY: the kernel reads n elements of x and writes n of out, both that long;
        // seed_at is null or the address of a live slot of the bound step's buffer.
        unsafe { b.launch(elementwise(n)) }.w()
    })?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// `a + y * mask`: the residual branch `x + dropout(y)` in one pass.
pub(crate) fn dropout_add(
    a: (&CudaStorage, &Layout),
    y: (&CudaStorage, &Layout),
    p: f64,
    seed: u64,
    block: usize,
) -> Result<CudaStorage> {
    let dev = a.0.device().clone();
    let (av, yv) = (f32_view(a.0, a.1, "dropout_add")?, f32_view(y.0, y.1, "dropout_add")?);
    let n = a.1.shape().elem_count();
    let out = output(&dev, n)?;
    let (thr, keep) = mask_params(p);
    let f = func!(dev, "fpt_dropout_add_f32")?;
    let (n64, block64) = (n as u64, block as u64);
    with_seed_at(seed, |seed_at| {
        let mut b = f.builder();
        b.arg(&av)
            .arg(&yv)
            .arg(&out)
            .arg(&n64)
            .arg(&seed)
            .arg(&block64)
            .arg(&thr)
            .arg(&keep)
            .arg(&seed_at);
        // SAFETY: a, y and out hold n elements each (same shapes, checked by the caller);
        // seed_at is null or the address of a live slot of the bound step's buffer.
        unsafe { b.launch(elementwise(n)) }.w()
    })?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// The softmax's backward: `scale * y * (dy - sum(dy * y))` per row of `tk`.
pub(crate) fn softmax_bwd(y: (&CudaStorage, &Layout), dy: (&CudaStorage, &Layout), scale: f64) -> Result<CudaStorage> {
    let dev = y.0.device().clone();
    let (yv, gv) = (
        f32_view(y.0, y.1, "masked_softmax backward")?,
        f32_view(dy.0, dy.1, "masked_softmax backward")?,
    );
    let tk = y.1.dims().last().copied().unwrap_or(1).max(1);
    let n = y.1.shape().elem_count();
    let rows = n / tk;
    let out = output(&dev, n)?;
    let f = func!(dev, "fpt_softmax_bwd_f32")?;
    let mut b = f.builder();
    let (rows64, tk64, scale32) = (rows as u64, tk as i64, scale as f32);
    b.arg(&yv).arg(&gv).arg(&out).arg(&rows64).arg(&tk64).arg(&scale32);
    // SAFETY: y, dy and out hold rows * tk elements.
    unsafe { b.launch(per_row(rows)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// The whole (offset 0, every element) f32 slice of a storage, for an in-place update;
/// the caller checked that the layout covers all of it.
fn whole_mut<'a>(s: &'a mut CudaStorage, op: &'static str) -> Result<&'a mut CudaSlice<f32>> {
    if s.dtype() != DType::F32 {
        candle_core::bail!("{op}: the CUDA kernel takes f32, got {:?}", s.dtype())
    }
    s.as_cuda_slice_mut::<f32>()
}

/// Adam's moment in place: `x = x decay + g rest` (`g^2` when `square`).
pub(crate) fn moment(
    x: &mut CudaStorage,
    g: (&CudaStorage, &Layout),
    decay: f32,
    rest: f32,
    square: bool,
    gate: Option<&CudaView<'_, f64>>,
) -> Result<()> {
    let dev = x.device().clone();
    let gv = f32_view(g.0, g.1, "adam_update")?;
    let n = g.1.shape().elem_count();
    let xs = whole_mut(x, "adam_update")?;
    if xs.len() != n {
        candle_core::bail!("adam_update: {} moment values for {n} gradient values", xs.len())
    }
    let f = match gate {
        None => func!(dev, "fpt_moment_f32")?,
        Some(_) => func!(dev, "fpt_moment_gated_f32")?,
    };
    let mut b = f.builder();
    let (n64, sq) = (n as u64, i32::from(square));
    b.arg(xs).arg(&gv).arg(&n64).arg(&decay).arg(&rest).arg(&sq);
    if let Some(state) = gate {
        b.arg(state);
    }
    // SAFETY: x and g hold n elements each; a gate's state holds its head (fpt_ops.h).
    unsafe { b.launch(elementwise(n)) }.w()?;
    Ok(())
}

/// Where Adam's parameter update takes `inv_sqrt_bc2` and the step size from.
pub(crate) enum StepCoefs<'a> {
    /// Kernel arguments.
    Args(f32, f32),
    /// A replayed step's gate: its state and coefficient table (`ops/adam_gate.rs`).
    Gate(CudaView<'a, f64>, CudaView<'a, f32>),
}

/// A replayed step's gate: records `loss` and `norm` (one f64 each) in `state` and decides
/// there whether the step's update applies.
pub(crate) fn step_gate(
    state: &mut CudaStorage,
    loss: (&CudaStorage, &Layout),
    norm: (&CudaStorage, &Layout),
) -> Result<()> {
    let dev = state.device().clone();
    fn one<'a>(s: &'a CudaStorage, l: &Layout, what: &str) -> Result<CudaView<'a, f64>> {
        match l.contiguous_offsets() {
            Some((a, b)) if b == a + 1 => Ok(s.as_cuda_slice::<f64>()?.slice(a..b)),
            _ => candle_core::bail!("step gate: the {what} must be one contiguous f64, got {:?}", l.shape()),
        }
    }
    let (lv, nv) = (one(loss.0, loss.1, "loss")?, one(norm.0, norm.1, "norm")?);
    let st = state.as_cuda_slice_mut::<f64>()?;
    let f = func!(dev, "fpt_step_gate_f64")?;
    let mut b = f.builder();
    b.arg(&lv).arg(&nv).arg(st);
    // SAFETY: loss and norm hold one f64 each; the state its head and ring (the caller
    // made it so: ops/adam_gate.rs).
    unsafe { b.launch(LaunchConfig::for_num_elems(1)) }.w()?;
    Ok(())
}

/// Adam's parameter update in place from the updated moments.
pub(crate) fn adam_step(
    p: &mut CudaStorage,
    m: (&CudaStorage, &Layout),
    v: (&CudaStorage, &Layout),
    eps: f32,
    coefs: StepCoefs<'_>,
) -> Result<()> {
    let dev = p.device().clone();
    let (mv, vv) = (f32_view(m.0, m.1, "adam_update")?, f32_view(v.0, v.1, "adam_update")?);
    let n = m.1.shape().elem_count();
    let ps = whole_mut(p, "adam_update")?;
    if ps.len() != n || v.1.shape().elem_count() != n {
        candle_core::bail!("adam_update: moments of {n} values for {}", ps.len())
    }
    let n64 = n as u64;
    match coefs {
        StepCoefs::Args(inv_sqrt_bc2, step_size) => {
            let f = func!(dev, "fpt_adam_step_f32")?;
            let mut b = f.builder();
            b.arg(ps)
                .arg(&mv)
                .arg(&vv)
                .arg(&n64)
                .arg(&inv_sqrt_bc2)
                .arg(&eps)
                .arg(&step_size);
            // SAFETY: p, m and v hold n elements each.
            unsafe { b.launch(elementwise(n)) }.w()?;
        }
        StepCoefs::Gate(state, table) => {
            let f = func!(dev, "fpt_adam_step_gated_f32")?;
            let mut b = f.builder();
            b.arg(ps).arg(&mv).arg(&vv).arg(&n64).arg(&eps).arg(&state).arg(&table);
            // SAFETY: p, m and v hold n elements each; the gate's table has a row for every
            // step its state lets through (fpt_step_gate refuses the others).
            unsafe { b.launch(elementwise(n)) }.w()?;
        }
    }
    Ok(())
}

/// LayerNorm (`b` given) or RMSNorm (`b` none) over rows of `w`'s length.
pub(crate) fn norm_fwd(
    x: (&CudaStorage, &Layout),
    w: (&CudaStorage, &Layout),
    b: Option<(&CudaStorage, &Layout)>,
    eps: f64,
) -> Result<CudaStorage> {
    let dev = x.0.device().clone();
    let op = if b.is_some() { "layer_norm" } else { "rms_norm" };
    let (xv, wv) = (f32_view(x.0, x.1, op)?, f32_view(w.0, w.1, op)?);
    let bv = b.map(|(s, l)| f32_view(s, l, op)).transpose()?;
    let d = w.1.shape().elem_count().max(1);
    let n = x.1.shape().elem_count();
    let rows = n / d;
    let out = output(&dev, n)?;
    let f = func!(dev, "fpt_norm_fwd_f32")?;
    let mut builder = f.builder();
    let (rows64, d64, eps32, centered) = (rows as u64, d as i64, eps as f32, i32::from(b.is_some()));
    // RMSNorm passes a null bias: the kernel's `b ? ... : ...`.
    let null: u64 = 0;
    builder.arg(&xv).arg(&wv);
    match &bv {
        Some(bv) => builder.arg(bv),
        None => builder.arg(&null),
    };
    builder.arg(&out).arg(&rows64).arg(&d64).arg(&eps32).arg(&centered);
    // SAFETY: x and out hold rows * d elements, w and b d each.
    unsafe { builder.launch(per_row(rows)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// The norms' backward: `[dx, dy * xhat]` stacked (`2 * n` elements).
pub(crate) fn norm_bwd(
    x: (&CudaStorage, &Layout),
    w: (&CudaStorage, &Layout),
    dy: (&CudaStorage, &Layout),
    eps: f64,
    centered: bool,
) -> Result<CudaStorage> {
    let dev = x.0.device().clone();
    let op = "norm backward";
    let (xv, wv, gv) = (
        f32_view(x.0, x.1, op)?,
        f32_view(w.0, w.1, op)?,
        f32_view(dy.0, dy.1, op)?,
    );
    let d = w.1.shape().elem_count().max(1);
    let n = x.1.shape().elem_count();
    let rows = n / d;
    let mut out = output(&dev, 2 * n)?;
    {
        let (mut dx, mut dyxhat) = out.split_at_mut(n);
        let f = func!(dev, "fpt_norm_bwd_f32")?;
        let mut builder = f.builder();
        let (rows64, d64, eps32, c) = (rows as u64, d as i64, eps as f32, i32::from(centered));
        builder
            .arg(&xv)
            .arg(&wv)
            .arg(&gv)
            .arg(&mut dx)
            .arg(&mut dyxhat)
            .arg(&rows64)
            .arg(&d64)
            .arg(&eps32)
            .arg(&c);
        // SAFETY: x, dy, dx and dyxhat hold rows * d elements, w d.
        unsafe { builder.launch(per_row(rows)) }.w()?;
    }
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// GELU (`kind` 0: tanh form, 1: erf form) forward.
pub(crate) fn gelu_fwd(x: &CudaStorage, l: &Layout, kind: i32) -> Result<CudaStorage> {
    let dev = x.device().clone();
    let xv = f32_view(x, l, "gelu")?;
    let n = l.shape().elem_count();
    let out = output(&dev, n)?;
    let f = func!(dev, "fpt_gelu_fwd_f32")?;
    let mut b = f.builder();
    let n64 = n as u64;
    b.arg(&xv).arg(&out).arg(&n64).arg(&kind);
    // SAFETY: x and out hold n elements.
    unsafe { b.launch(elementwise(n)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// GELU backward: `dy * gelu'(x)`.
pub(crate) fn gelu_bwd(x: (&CudaStorage, &Layout), dy: (&CudaStorage, &Layout), kind: i32) -> Result<CudaStorage> {
    let dev = x.0.device().clone();
    let (xv, gv) = (
        f32_view(x.0, x.1, "gelu backward")?,
        f32_view(dy.0, dy.1, "gelu backward")?,
    );
    let n = x.1.shape().elem_count();
    let out = output(&dev, n)?;
    let f = func!(dev, "fpt_gelu_bwd_f32")?;
    let mut b = f.builder();
    let n64 = n as u64;
    b.arg(&xv).arg(&gv).arg(&out).arg(&n64).arg(&kind);
    // SAFETY: x, dy and out hold n elements.
    unsafe { b.launch(elementwise(n)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// SwiGLU forward: `silu(g) * u` (equal shapes).
pub(crate) fn swiglu_fwd(g: (&CudaStorage, &Layout), u: (&CudaStorage, &Layout)) -> Result<CudaStorage> {
    let dev = g.0.device().clone();
    let (gv, uv) = (f32_view(g.0, g.1, "swiglu")?, f32_view(u.0, u.1, "swiglu")?);
    let n = g.1.shape().elem_count();
    let out = output(&dev, n)?;
    let f = func!(dev, "fpt_swiglu_fwd_f32")?;
    let mut b = f.builder();
    let n64 = n as u64;
    b.arg(&gv).arg(&uv).arg(&out).arg(&n64);
    // SAFETY: g, u and out hold n elements (the caller checked the shapes are equal).
    unsafe { b.launch(elementwise(n)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// SwiGLU backward: `dg` then `du` in one buffer of twice the elements.
pub(crate) fn swiglu_bwd(
    g: (&CudaStorage, &Layout),
    u: (&CudaStorage, &Layout),
    dy: (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let dev = g.0.device().clone();
    let what = "swiglu backward";
    let (gv, uv, yv) = (
        f32_view(g.0, g.1, what)?,
        f32_view(u.0, u.1, what)?,
        f32_view(dy.0, dy.1, what)?,
    );
    let n = g.1.shape().elem_count();
    let out = output(&dev, 2 * n)?;
    let f = func!(dev, "fpt_swiglu_bwd_f32")?;
    let mut b = f.builder();
    let n64 = n as u64;
    b.arg(&gv).arg(&uv).arg(&yv).arg(&out).arg(&n64);
    // SAFETY: g, u and dy hold n elements, out 2n.
    unsafe { b.launch(elementwise(n)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// Rotary positions on `x` (`[rows, w]`, row r at position r % t; the `[t, d]` tables), or
/// with `transpose` the rotation's transpose (the backward).
pub(crate) fn rotary(
    x: (&CudaStorage, &Layout),
    cos: (&CudaStorage, &Layout),
    sin: (&CudaStorage, &Layout),
    (t, w, d): (usize, usize, usize),
    transpose: bool,
) -> Result<CudaStorage> {
    let dev = x.0.device().clone();
    let (xv, cv, sv) = (
        f32_view(x.0, x.1, "rotary")?,
        f32_view(cos.0, cos.1, "rotary")?,
        f32_view(sin.0, sin.1, "rotary")?,
    );
    let n = x.1.shape().elem_count();
    let out = output(&dev, n)?;
    let f = func!(dev, "fpt_rotary_f32")?;
    let mut b = f.builder();
    let (n64, t64, w64, d64, tr) = (n as u64, t as i64, w as i64, d as i64, i32::from(transpose));
    b.arg(&xv)
        .arg(&cv)
        .arg(&sv)
        .arg(&out)
        .arg(&n64)
        .arg(&t64)
        .arg(&w64)
        .arg(&d64)
        .arg(&tr);
    // SAFETY: x and out hold n elements, a multiple of w whose rows sit at positions below
    // t; the tables hold t * d (the caller checked both shapes).
    unsafe { b.launch(elementwise(n)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// Class targets as the cross-entropy kernels take them: contiguous u32.
pub(crate) fn u32_view<'a>(s: &'a CudaStorage, l: &Layout, op: &'static str) -> Result<CudaView<'a, u32>> {
    if s.dtype() != DType::U32 {
        candle_core::bail!("{op}: the CUDA kernel takes u32 targets, got {:?}", s.dtype())
    }
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{op}: the CUDA kernel takes contiguous targets")))?;
    Ok(s.as_cuda_slice::<u32>()?.slice(a..b))
}

/// Cross-entropy per row of `[rows, c]` logits against `[rows]` targets: `[rows]` losses.
pub(crate) fn ce_fwd(x: (&CudaStorage, &Layout), t: (&CudaStorage, &Layout)) -> Result<CudaStorage> {
    let dev = x.0.device().clone();
    let (rows, c) = x.1.shape().dims2()?;
    let (xv, tv) = (
        f32_view(x.0, x.1, "cross_entropy")?,
        u32_view(t.0, t.1, "cross_entropy")?,
    );
    if t.1.shape().elem_count() != rows {
        candle_core::bail!("cross_entropy: {} targets for {rows} rows", t.1.shape().elem_count())
    }
    let out = output(&dev, rows)?;
    let f = func!(dev, "fpt_ce_fwd_f32")?;
    let mut b = f.builder();
    let (rows64, c64) = (rows as u64, c as i64);
    b.arg(&xv).arg(&tv).arg(&out).arg(&rows64).arg(&c64);
    // SAFETY: x holds rows * c elements, t and out rows.
    unsafe { b.launch(per_row(rows)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// Its backward for the rows' upstream gradients `g` (`[rows]`): `[rows, c]`.
pub(crate) fn ce_bwd(
    x: (&CudaStorage, &Layout),
    t: (&CudaStorage, &Layout),
    g: (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let dev = x.0.device().clone();
    let (rows, c) = x.1.shape().dims2()?;
    let what = "cross_entropy backward";
    let (xv, tv, gv) = (
        f32_view(x.0, x.1, what)?,
        u32_view(t.0, t.1, what)?,
        f32_view(g.0, g.1, what)?,
    );
    if t.1.shape().elem_count() != rows || g.1.shape().elem_count() != rows {
        candle_core::bail!("{what}: targets and gradients must hold one value per row ({rows})")
    }
    let out = output(&dev, rows * c)?;
    let f = func!(dev, "fpt_ce_bwd_f32")?;
    let mut b = f.builder();
    let (rows64, c64) = (rows as u64, c as i64);
    b.arg(&xv).arg(&tv).arg(&gv).arg(&out).arg(&rows64).arg(&c64);
    // SAFETY: x and out hold rows * c elements, t and g rows.
    unsafe { b.launch(per_row(rows)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// cuBLASLt's handles, one per device (each with its workspace on that device's stream),
/// made at their first use.
fn blas_lt(dev: &CudaDevice) -> Result<std::sync::Arc<candle_core::cuda_backend::cudarc::cublaslt::CudaBlasLT>> {
    use candle_core::cuda_backend::cudarc::cublaslt::CudaBlasLT;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    type Handles = Mutex<HashMap<candle_core::cuda_backend::DeviceId, Arc<CudaBlasLT>>>;
    static LT: OnceLock<Handles> = OnceLock::new();
    let mut handles = LT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(h) = handles.get(&dev.id()) {
        return Ok(h.clone());
    }
    let h = Arc::new(
        CudaBlasLT::new(dev.cuda_stream())
            .map_err(|e| candle_core::Error::Cuda(format!("cuBLASLt: no handle: {e:?}").into()))?,
    );
    handles.insert(dev.id(), h.clone());
    Ok(h)
}

/// A cuBLASLt handle whose f32 products compute in f32. cudarc's own `Matmul<f32>` asks for
/// `CUBLAS_COMPUTE_32F_FAST_TF32`: inputs rounded to TF32's 10-bit mantissa, 1.8e-2 off
/// candle's f32 product on an H100 (`fpt gpu-check`, 2026-11-27), and not what PyTorch's f32
/// step computes (its TF32 is off by default). Same handle, workspace and stream.
struct F32Lt(std::sync::Arc<candle_core::cuda_backend::cudarc::cublaslt::CudaBlasLT>);

impl candle_core::cuda_backend::cudarc::cublaslt::MatmulShared for F32Lt {
    fn handle(&self) -> &candle_core::cuda_backend::cudarc::cublaslt::sys::cublasLtHandle_t {
        self.0.handle()
    }
    fn workspace(&self) -> &candle_core::cuda_backend::cudarc::cublaslt::Workspace {
        self.0.workspace()
    }
    fn stream(&self) -> &std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream> {
        self.0.stream()
    }
}

impl candle_core::cuda_backend::cudarc::cublaslt::Matmul<f32> for F32Lt {
    fn matrix_type() -> candle_core::cuda_backend::cudarc::cublaslt::sys::cudaDataType {
        candle_core::cuda_backend::cudarc::cublaslt::sys::cudaDataType_t::CUDA_R_32F
    }
    fn compute_type() -> candle_core::cuda_backend::cudarc::cublaslt::sys::cublasComputeType_t {
        candle_core::cuda_backend::cudarc::cublaslt::sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
    }
}

/// `x W^T + b` for `x: [m, k]`, `W: [n, k]`, `b: [n]` (f32, contiguous) in one cuBLASLt
/// product computed in f32, the bias added by its epilogue: `[m, n]`.
pub(crate) fn linear_bias_lt(
    x: (&CudaStorage, &Layout),
    w: (&CudaStorage, &Layout),
    b: (&CudaStorage, &Layout),
    (m, n, k): (usize, usize, usize),
) -> Result<CudaStorage> {
    use candle_core::cuda_backend::cudarc::cublaslt::{Matmul, MatmulConfig};
    let dev = x.0.device().clone();
    let (xv, wv, bv) = (
        f32_view(x.0, x.1, "linear (cuBLASLt)")?,
        f32_view(w.0, w.1, "linear (cuBLASLt)")?,
        f32_view(b.0, b.1, "linear (cuBLASLt)")?,
    );
    if xv.len() != m * k || wv.len() != n * k || bv.len() != n {
        candle_core::bail!(
            "linear (cuBLASLt): operands of {}, {} and {} values for [{m}, {k}] x [{n}, {k}]^T + [{n}]",
            xv.len(),
            wv.len(),
            bv.len()
        )
    }
    let mut y = output(&dev, m * n)?;
    // Column-major, as cuBLAS reads: y^T [n x m] = W [n x k] (row-major W read as its
    // transpose) times x^T [k x m], the bias (length n) added to every column.
    let cfg = MatmulConfig {
        transa: true,
        transb: false,
        transc: false,
        m: n as u64,
        n: m as u64,
        k: k as u64,
        alpha: 1.0,
        lda: k as i64,
        ldb: k as i64,
        beta: 0.0,
        ldc: n as i64,
        stride_a: None,
        stride_b: None,
        stride_c: None,
        stride_bias: None,
        batch_size: None,
    };
    let lt = F32Lt(blas_lt(&dev)?);
    // SAFETY: W holds n * k, x m * k, b n and y m * n f32 values (checked above), with the
    // leading dimensions of those row-major shapes; beta is 0, so y's uninitialised values
    // are never read.
    unsafe { lt.matmul(cfg, &wv, &xv, &mut y, Some(&bv), None) }
        .map_err(|e| candle_core::Error::Cuda(format!("cuBLASLt: the product failed: {e:?}").into()))?;
    Ok(CudaStorage::wrap_cuda_slice(y, dev))
}

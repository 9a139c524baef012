//! Attention tiled in blocks (issue 56 item 5): the probabilities are never stored. A block
//! of 256 lanes owns a tile of query rows of one (example, head) in shared memory and walks
//! their keys a tile at a time with an online softmax (a running maximum and sum, the output
//! rescaled as the maximum grows), keeping only each row's log-sum-exp; each key tile is
//! loaded once for all the block's rows. The backward recomputes each probability from it,
//! a first pass per query tile (D = dO . O and dQ), a second per key tile (dK and dV), so no
//! gradient is accumulated across blocks. Causal, band and padding masks (each example's
//! valid key count: the keys past it are hidden from every query) and dropout on the
//! probabilities (the composed op's mask, drawn from its seed in both passes).
//!
//! Two families of kernels ([`TiledKernels`]): the SIMT ones of `kernels/fpt_attn.h` (a
//! block of 256 lanes, FMAs on CUDA cores) and the tensor-core ones of
//! `kernels/fpt_attn_mma.h` (`FPT_ATTENTION=mma`: 4 warps, mma.sync on TF32 operands split
//! in three, heads up to 64 dims), each in three CUDA kernels (`fpt_kernels.cu`) and,
//! block by block and lane by lane, on the host (`host_grid.c`, `host_mma.c`): the CPU runs
//! the same bodies, so this op has a path on every device and its tests here check the
//! kernels' indexing, tiles and numbers against the composed ops, forward and backward. On
//! the CPU it is a reference (one thread), not the fast path: the fused CPU op of
//! `attention.rs` is.
//!
//! Q, K and V are read in place from one packed `[b, t, 3c]` tensor (GPT-2's `c_attn`
//! output; separate Q, K, V are concatenated first), and the gradient is one tensor of
//! that shape.

use super::attention::AttentionSpec;
use super::{cpu_slice, tracks};
use candle_core::backend::BackendStorage as _;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor};
use std::sync::{Arc, Mutex};

/// The widest head the kernels take (`fpt_attn_plan` finds tiles up to 176 dims; 128 is the
/// widest a model here uses).
pub const MAX_HEAD_DIM: usize = 128;

/// The kernels' geometry, fpt_ops.h's `fpt_attn_geom` field for field (every field 8 bytes,
/// so `#[repr(C)]` lays it out as C does).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AttnGeom {
    pub(crate) batch: i64,
    pub(crate) heads: i64,
    pub(crate) tq: i64,
    pub(crate) tk: i64,
    pub(crate) d: i64,
    pub(crate) sq: i64,
    pub(crate) sk: i64,
    pub(crate) sv: i64,
    pub(crate) so: i64,
    pub(crate) sg: i64,
    pub(crate) kind: i64,
    pub(crate) band: i64,
    pub(crate) seed: u64,
    pub(crate) thr: i64,
    pub(crate) keep: f64,
    pub(crate) scale: f64,
    pub(crate) has_len: i64,
}

/// Which kernels run the tiled attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TiledKernels {
    /// `kernels/fpt_attn.h`: a block of 256 lanes, each row's dot products on CUDA cores.
    Simt,
    /// `kernels/fpt_attn_mma.h`: 4 warps a block, the products on the tensor cores
    /// (mma.sync m16n8k8, TF32 operands split in three: f32's accuracy); heads up to
    /// [`MMA_MAX_HEAD_DIM`] dims.
    Mma,
    /// The same kernels with one TF32 product each (operands rounded to 10 bits of
    /// mantissa, sums in f32: about 2^-11 relative, finer than bf16's 2^-8), a third of the
    /// tensor-core work: for runs whose frozen products are bf16's (`FPT_ATTENTION=mma-tf32`).
    MmaTf32,
}

/// The widest head the tensor-core kernels take (`fpt_attn_mma.h`'s FPT_MB_MAX_D).
pub const MMA_MAX_HEAD_DIM: usize = 64;

impl AttnGeom {
    /// Self-attention over `qkv: [b, t, 3c]` with `spec`'s heads, scale, mask and dropout.
    fn packed(
        b: usize,
        t: usize,
        c: usize,
        spec: &AttentionSpec,
        has_len: bool,
        kernels: TiledKernels,
    ) -> Result<Self> {
        let h = spec.heads;
        if h == 0 || !c.is_multiple_of(h) {
            candle_core::bail!("attention_tiled: a width of {c} does not split into {h} heads")
        }
        let d = c / h;
        if d > MAX_HEAD_DIM {
            candle_core::bail!("attention_tiled: heads of {d} dims exceed the kernel's {MAX_HEAD_DIM}")
        }
        for k in [AttnKernel::Forward, AttnKernel::BackwardQ, AttnKernel::BackwardKv] {
            match kernels {
                TiledKernels::Simt => plan(k, d).map(|_| ())?,
                TiledKernels::Mma | TiledKernels::MmaTf32 => mma_smem(k, d).map(|_| ())?,
            }
        }
        let (kind, band) = spec.mask.kernel_kind();
        let (kind, band) = (kind as i64, band as i64);
        let (seed, thr, keep) = match spec.dropout {
            Some((p, seed)) if p > 0.0 => {
                let (thr, keep) = super::dropout::mask_params(p);
                (seed, thr as i64, keep as f64)
            }
            _ => (0, 0, 1.0),
        };
        let (b, t, c, h, d) = (b as i64, t as i64, c as i64, h as i64, d as i64);
        Ok(AttnGeom {
            batch: b,
            heads: h,
            tq: t,
            tk: t,
            d,
            sq: 3 * c,
            sk: 3 * c,
            sv: 3 * c,
            so: c,
            sg: 3 * c,
            kind,
            band,
            seed,
            thr,
            keep,
            scale: spec.scale,
            has_len: i64::from(has_len),
        })
    }

    fn width(&self) -> usize {
        (self.heads * self.d) as usize
    }

    fn rows(&self) -> usize {
        (self.batch * self.heads * self.tq) as usize
    }

    fn shape(&self) -> Shape {
        Shape::from((self.batch as usize, self.tq as usize, self.width()))
    }
}

/// The tiles of one of the three kernels for heads of `d` dims: (own rows, inner-tile rows,
/// bytes of shared memory), from `fpt_attn.h`'s `fpt_attn_plan`, which the kernels' layouts
/// and the host grid follow too.
pub(crate) fn plan(kernel: AttnKernel, d: usize) -> Result<(u32, u32, u32)> {
    let (mut rows, mut cols) = (0i64, 0i64);
    // SAFETY: rows and cols are valid for writes; the function reads nothing else.
    let bytes = unsafe { fpt_host_attn_plan(kernel as i32, d as i64, &mut rows, &mut cols) };
    if bytes <= 0 {
        candle_core::bail!("attention_tiled: no tile of the {kernel:?} kernel fits heads of {d} dims")
    }
    Ok((rows as u32, cols as u32, bytes as u32))
}

/// The bytes of shared memory one of the tensor-core kernels takes for heads of `d` dims
/// (`fpt_attn_mma.h`'s `fpt_mb_smem_bytes`), or an error past the widest head.
pub(crate) fn mma_smem(kernel: AttnKernel, d: usize) -> Result<u32> {
    // SAFETY: a pure function of its two integers.
    let bytes = unsafe { fpt_host_attn_mma_smem(kernel as i32, d as i64) };
    if bytes <= 0 {
        candle_core::bail!(
            "attention_tiled (FPT_ATTENTION=mma): heads of {d} dims exceed the tensor-core kernels' {MMA_MAX_HEAD_DIM}"
        )
    }
    Ok(bytes as u32)
}

/// The three kernels (fpt_attn.h's FPT_AB_FWD, FPT_AB_BWD_Q, FPT_AB_BWD_KV).
#[derive(Debug, Clone, Copy)]
pub(crate) enum AttnKernel {
    Forward = 0,
    BackwardQ = 1,
    BackwardKv = 2,
}

/// A host-grid forward: (q, k, v, o, lse, keylen, geometry) -> 0, or 1 on failure.
type HostFwd =
    unsafe extern "C" fn(*const f32, *const f32, *const f32, *mut f32, *mut f32, *const u32, *const AttnGeom) -> i32;
/// A host-grid backward: (q, k, v, o, dout, lse, dd, dq, dk, dv, keylen, geometry).
type HostBwd = unsafe extern "C" fn(
    *const f32,
    *const f32,
    *const f32,
    *const f32,
    *const f32,
    *const f32,
    *mut f32,
    *mut f32,
    *mut f32,
    *mut f32,
    *const u32,
    *const AttnGeom,
) -> i32;

extern "C" {
    fn fpt_host_attn_plan(kind: i32, d: i64, rows: *mut i64, cols: *mut i64) -> i64;
    fn fpt_host_attn_mma_smem(kind: i32, d: i64) -> i64;
}

/// Declares each family's host-grid forward and backward (kernels/host_grid.c, kernels/host_mma.c), whose
/// signatures are [`HostFwd`] and [`HostBwd`].
macro_rules! host_bodies {
    ($(($fwd:ident, $bwd:ident)),* $(,)?) => {
        extern "C" {
            $(
                fn $fwd(
                    q: *const f32,
                    k: *const f32,
                    v: *const f32,
                    o: *mut f32,
                    lse: *mut f32,
                    keylen: *const u32,
                    g: *const AttnGeom,
                ) -> i32;
                fn $bwd(
                    q: *const f32,
                    k: *const f32,
                    v: *const f32,
                    o: *const f32,
                    dout: *const f32,
                    lse: *const f32,
                    dd: *mut f32,
                    dq: *mut f32,
                    dk: *mut f32,
                    dv: *mut f32,
                    keylen: *const u32,
                    g: *const AttnGeom,
                ) -> i32;
            )*
        }
    };
}

host_bodies!(
    (fpt_host_attn_fwd_f32, fpt_host_attn_bwd_f32),
    (fpt_host_attn_mma_fwd_f32, fpt_host_attn_mma_bwd_f32),
    (fpt_host_attn_mma1_fwd_f32, fpt_host_attn_mma1_bwd_f32),
);

/// Notes the dropout seed the kernels draw their masks from (in a replayed step it must be
/// one of the step's slots: `crate::replay`; on a GPU the kernels read it from there).
fn note_seed(g: &AttnGeom) {
    if g.thr != 0 {
        crate::replay::seed_slot(g.seed);
    }
}

/// The host-grid bodies of a family.
fn host_fns(kernels: TiledKernels) -> (HostFwd, HostBwd) {
    match kernels {
        TiledKernels::Simt => (fpt_host_attn_fwd_f32, fpt_host_attn_bwd_f32),
        TiledKernels::Mma => (fpt_host_attn_mma_fwd_f32, fpt_host_attn_mma_bwd_f32),
        TiledKernels::MmaTf32 => (fpt_host_attn_mma1_fwd_f32, fpt_host_attn_mma1_bwd_f32),
    }
}

/// Each row's log-sum-exp, kept by the forward for the backward.
enum Lse {
    Cpu(Vec<f32>),
    #[cfg(feature = "cuda")]
    Cuda(candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>),
}

type Saved = Arc<Mutex<Option<Lse>>>;

/// The op's inputs checked: `qkv`'s f32 elements, contiguous, holding the geometry's rows.
fn packed_f32<'a>(s: &'a CpuStorage, l: &Layout, g: &AttnGeom, op: &'static str) -> Result<&'a [f32]> {
    if s.dtype() != DType::F32 {
        candle_core::bail!("{op}: takes f32, got {:?}", s.dtype())
    }
    let x = cpu_slice::<f32>(s, l, op)?;
    if x.len() != (g.batch * g.tq) as usize * g.width() * 3 {
        candle_core::bail!(
            "{op}: {} values where [{}, {}, {}] was expected",
            x.len(),
            g.batch,
            g.tq,
            3 * g.width()
        )
    }
    Ok(x)
}

/// The key lengths on the CPU (a null pointer when there are none).
fn host_keylen(keylen: &Option<Tensor>, g: &AttnGeom) -> Result<Option<Vec<u32>>> {
    let Some(t) = keylen else { return Ok(None) };
    let (s, l) = t.storage_and_layout();
    match &*s {
        Storage::Cpu(c) => {
            let v = cpu_slice::<u32>(c, l, "attention_tiled (key lengths)")?.to_vec();
            if v.len() != g.batch as usize {
                candle_core::bail!("attention_tiled: {} key lengths for a batch of {}", v.len(), g.batch)
            }
            Ok(Some(v))
        }
        _ => candle_core::bail!("attention_tiled: the key lengths are on another device than the activations"),
    }
}

/// `f` of the key lengths' device storage (none without lengths), held while it runs.
#[cfg(feature = "cuda")]
fn with_device_keylen<R>(
    keylen: &Option<Tensor>,
    f: impl FnOnce(Option<(&CudaStorage, &Layout)>) -> Result<R>,
) -> Result<R> {
    let Some(t) = keylen else { return f(None) };
    let (st, l) = t.storage_and_layout();
    match &*st {
        Storage::Cuda(c) => f(Some((c, l))),
        _ => candle_core::bail!("attention_tiled: the key lengths are on another device than the activations"),
    }
}

/// The graph's node: the forward on `qkv`, its backward through [`TiledBackward`].
struct Tiled {
    g: AttnGeom,
    kernels: TiledKernels,
    keylen: Option<Tensor>,
    lse: Saved,
}

impl CustomOp1 for Tiled {
    fn name(&self) -> &'static str {
        "fpt-attention-tiled"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let g = &self.g;
        let x = packed_f32(s, l, g, self.name())?;
        let lens = host_keylen(&self.keylen, g)?;
        let c = g.width();
        let mut o = vec![0f32; (g.batch * g.tq) as usize * c];
        let mut lse = vec![0f32; g.rows()];
        let kl = lens.as_ref().map_or(std::ptr::null(), |v| v.as_ptr());
        note_seed(g);
        // SAFETY: x holds batch * t rows of 3c (checked), read as Q, K, V at offsets 0, c,
        // 2c with stride 3c (g.sq = sk = sv); o holds batch * t * c (stride g.so = c), lse
        // g.rows(); kl is null with g.has_len = 0, else batch values (host_keylen checked).
        let failed = unsafe {
            host_fns(self.kernels).0(
                x.as_ptr(),
                x.as_ptr().add(c),
                x.as_ptr().add(2 * c),
                o.as_mut_ptr(),
                lse.as_mut_ptr(),
                kl,
                g,
            )
        };
        if failed != 0 {
            candle_core::bail!("{}: the host grid could not allocate its tiles", self.name())
        }
        *self.lse.lock().unwrap_or_else(|e| e.into_inner()) = Some(Lse::Cpu(lse));
        Ok((CpuStorage::F32(o), g.shape()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let (o, lse) = with_device_keylen(&self.keylen, |kl| {
            crate::cuda::attn::attn_fwd((s, l), kl, &self.g, self.kernels)
        })?;
        *self.lse.lock().unwrap_or_else(|e| e.into_inner()) = Some(Lse::Cuda(lse));
        Ok((o, self.g.shape()))
    }

    fn bwd(&self, qkv: &Tensor, res: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        if !tracks(qkv) {
            return Ok(None);
        }
        let op = TiledBackward {
            g: self.g,
            kernels: self.kernels,
            keylen: self.keylen.clone(),
            lse: self.lse.clone(),
        };
        let g = qkv
            .detach()
            .apply_op3_no_bwd(&res.detach(), &dy.detach().contiguous()?, &op)?;
        Ok(Some(g))
    }
}

/// The backward: `(qkv, o, dO)` -> the packed gradient `[b, t, 3c]`.
struct TiledBackward {
    g: AttnGeom,
    kernels: TiledKernels,
    keylen: Option<Tensor>,
    lse: Saved,
}

impl CustomOp3 for TiledBackward {
    fn name(&self) -> &'static str {
        "fpt-attention-tiled-backward"
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
        let g = &self.g;
        let x = packed_f32(s1, l1, g, self.name())?;
        let (o, dout) = (
            cpu_slice::<f32>(s2, l2, self.name())?,
            cpu_slice::<f32>(s3, l3, self.name())?,
        );
        let c = g.width();
        let n = (g.batch * g.tq) as usize * c;
        if o.len() != n || dout.len() != n {
            candle_core::bail!(
                "{}: the output or its gradient is not [{}, {}, {c}]",
                self.name(),
                g.batch,
                g.tq
            )
        }
        let lens = host_keylen(&self.keylen, g)?;
        let saved = self.lse.lock().unwrap_or_else(|e| e.into_inner());
        let Some(Lse::Cpu(lse)) = &*saved else {
            candle_core::bail!("{}: no forward on the CPU kept its log-sum-exp", self.name())
        };
        let mut dd = vec![0f32; g.rows()];
        let mut grad = vec![0f32; 3 * n];
        let kl = lens.as_ref().map_or(std::ptr::null(), |v| v.as_ptr());
        note_seed(g);
        let gp = grad.as_mut_ptr();
        // SAFETY: as the forward's, and o, dout hold batch * t * c (stride so = c), lse and
        // dd g.rows(), grad batch * t * 3c written as dQ, dK, dV at 0, c, 2c with stride
        // g.sg = 3c (the three never overlap: each row's thirds are disjoint).
        let failed = unsafe {
            host_fns(self.kernels).1(
                x.as_ptr(),
                x.as_ptr().add(c),
                x.as_ptr().add(2 * c),
                o.as_ptr(),
                dout.as_ptr(),
                lse.as_ptr(),
                dd.as_mut_ptr(),
                gp,
                gp.add(c),
                gp.add(2 * c),
                kl,
                g,
            )
        };
        if failed != 0 {
            candle_core::bail!("{}: the host grid could not allocate its tiles", self.name())
        }
        Ok((
            CpuStorage::F32(grad),
            Shape::from((g.batch as usize, g.tq as usize, 3 * c)),
        ))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let saved = self.lse.lock().unwrap_or_else(|e| e.into_inner());
        let Some(Lse::Cuda(lse)) = &*saved else {
            candle_core::bail!("{}: no forward on this GPU kept its log-sum-exp", self.name())
        };
        let grad = with_device_keylen(&self.keylen, |kl| {
            crate::cuda::attn::attn_bwd((s1, l1), (s2, l2), (s3, l3), lse, kl, &self.g, self.kernels)
        })?;
        let c = self.g.width();
        Ok((grad, Shape::from((self.g.batch as usize, self.g.tq as usize, 3 * c))))
    }
}

/// Multi-head self-attention of Q, K and V packed in `qkv: [b, t, 3c]` (f32), tiled over
/// keys: `[b, t, c]`, equal to [`super::attention_composed`] on the thirds within rounding
/// (the online softmax sums in another order), with the same dropout mask. `keylen`
/// (`[b]`, u32, on `qkv`'s device): each example's valid keys, the rest hidden from every
/// query (a count above `t` counts as `t`; 0 leaves the example's output 0). The gradient
/// is one `[b, t, 3c]` tensor.
pub fn attention_tiled_packed(qkv: &Tensor, spec: AttentionSpec, keylen: Option<&Tensor>) -> Result<Tensor> {
    attention_tiled_packed_with(qkv, spec, keylen, TiledKernels::Simt)
}

/// [`attention_tiled_packed`] on the chosen family of kernels.
pub fn attention_tiled_packed_with(
    qkv: &Tensor,
    spec: AttentionSpec,
    keylen: Option<&Tensor>,
    kernels: TiledKernels,
) -> Result<Tensor> {
    qkv.contiguous()?.apply_op1(tiled_op(qkv, spec, keylen, kernels)?)
}

/// [`attention_tiled_packed`] (no key lengths) on a detached `qkv`, its backward kept
/// beside it (the forward's log-sum-exp and output, as the op's own backward reads them).
pub(super) fn attention_tiled_packed_detached(
    qkv: &Tensor,
    spec: AttentionSpec,
    kernels: TiledKernels,
) -> Result<(Tensor, super::InputGrad)> {
    let qkv = qkv.detach().contiguous()?;
    let op = tiled_op(&qkv, spec, None, kernels)?;
    let (g, lse) = (op.g, op.lse.clone());
    let out = qkv.apply_op1_no_bwd(&op)?;
    let o = out.clone();
    let grad = move |dy: &Tensor| {
        let back = TiledBackward {
            g,
            kernels,
            keylen: None,
            lse: lse.clone(),
        };
        qkv.apply_op3_no_bwd(&o, &dy.detach().contiguous()?, &back)
    };
    Ok((out, Box::new(grad)))
}

/// The tiled op for `qkv` (its shape, dtype and key lengths checked).
fn tiled_op(qkv: &Tensor, spec: AttentionSpec, keylen: Option<&Tensor>, kernels: TiledKernels) -> Result<Tiled> {
    let (b, t, w) = qkv.dims3()?;
    if w % 3 != 0 {
        candle_core::bail!("attention_tiled: a packed qkv of width {w} is not three equal parts")
    }
    if qkv.dtype() != DType::F32 {
        candle_core::bail!("attention_tiled: takes f32, got {:?}", qkv.dtype())
    }
    let keylen = match keylen {
        Some(k) => {
            if k.dims1()? != b {
                candle_core::bail!("attention_tiled: {} key lengths for a batch of {b}", k.dims1()?)
            }
            if !k.device().same_device(qkv.device()) {
                candle_core::bail!("attention_tiled: the key lengths are on another device than the activations")
            }
            Some(k.to_dtype(DType::U32)?.contiguous()?)
        }
        None => None,
    };
    let g = AttnGeom::packed(b, t, w / 3, &spec, keylen.is_some(), kernels)?;
    Ok(Tiled {
        g,
        kernels,
        keylen,
        lse: Arc::new(Mutex::new(None)),
    })
}

/// [`attention_tiled_packed`] of separate `q, k, v: [b, t, c]` (concatenated into one
/// packed tensor first; their gradients come back through the concatenation).
pub fn attention_tiled(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    spec: AttentionSpec,
    keylen: Option<&Tensor>,
) -> Result<Tensor> {
    attention_tiled_packed(&Tensor::cat(&[q, k, v], 2)?, spec, keylen)
}

#[cfg(test)]
#[path = "attention_tiled_tests.rs"]
mod tests;

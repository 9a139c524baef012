//! The attention tiled in blocks, three kernels of each family: the SIMT ones
//! (`kernels/fpt_attn.h`: a block of 256 lanes per tile of rows of one (example, head), the
//! tiles `fpt_attn_plan` picks for the head's width) and the tensor-core ones
//! (`kernels/fpt_attn_mma.h`: 4 warps per 64 rows, compiled for heads of 32 and 64 dims);
//! the op around them is `ops/attention_tiled.rs`.

use super::{f32_view, output, u32_view, WrapErr, MODULE, PTX};
use crate::ops::attention_tiled::{mma_smem, plan, AttnGeom, AttnKernel, TiledKernels};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaSlice, CudaView, LaunchConfig, PushKernelArg};
use candle_core::{CudaStorage, Layout, Result};

// SAFETY: AttnGeom is #[repr(C)] of 8-byte integers and floats only, laid out as
// fpt_ops.h's fpt_attn_geom, which the attention kernels take by value.
unsafe impl candle_core::cuda_backend::cudarc::driver::DeviceRepr for AttnGeom {}

/// The most blocks a launch uses (the kernels stride over the rest).
const MAX_BLOCKS: i64 = 65_535;

/// A kernel's launch over the tiles of `t` rows (queries, or keys for the dK, dV pass):
/// the config and the name of the kernel compiled for the plan's tiles
/// (`fpt_kernels.cu`'s `FPT_ATTN_KERNELS`: `fpt_attn_fwd_f32_64x32`, ...), or for the
/// tensor-core families the head width's and the terms' (`FPT_MB_KERNELS`:
/// `fpt_attn_mma3_fwd_f32_d64`, `fpt_attn_mma1_...`).
fn tiles(g: &AttnGeom, kernel: AttnKernel, t: i64, kernels: TiledKernels) -> Result<(LaunchConfig, String)> {
    let base = match kernel {
        AttnKernel::Forward => "fwd_f32",
        AttnKernel::BackwardQ => "bwd_q_f32",
        AttnKernel::BackwardKv => "bwd_kv_f32",
    };
    let (rows, threads, bytes, name) = match kernels {
        TiledKernels::Simt => {
            let (rows, cols, bytes) = plan(kernel, g.d as usize)?;
            (rows, 256, bytes, format!("fpt_attn_{base}_{rows}x{cols}"))
        }
        TiledKernels::Mma | TiledKernels::MmaTf32 => {
            let bytes = mma_smem(kernel, g.d as usize)?;
            let dk = if g.d <= 32 { 32 } else { 64 };
            let terms = if kernels == TiledKernels::Mma { 3 } else { 1 };
            (64, 128, bytes, format!("fpt_attn_mma{terms}_{base}_d{dk}"))
        }
    };
    let blocks = g.batch * g.heads * ((t + rows as i64 - 1) / rows as i64);
    let cfg = LaunchConfig {
        grid_dim: (blocks.clamp(1, MAX_BLOCKS) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: bytes,
    };
    Ok((cfg, name))
}

/// The shared memory a block may take without opting in.
const SMEM_DEFAULT: u32 = 48 * 1024;

/// Opts kernel `name` (loaded as `f` on `dev`) in to `bytes` of dynamic shared memory when
/// that is past the 48 KiB any block may take (the tensor-core backward's passes: ~104 KiB
/// at 64 dims; an H100 or H200 gives a block up to 227 KiB, and the driver refuses more,
/// naming it). Once per kernel and device: the call can wait on the device's copies, which
/// a step being captured into a graph must not, so the first (eager) call sets it.
fn opt_in(dev: &candle_core::CudaDevice, name: &str, f: &CudaFunction, bytes: u32) -> Result<()> {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static DONE: Mutex<Option<HashSet<(candle_core::cuda_backend::DeviceId, String, u32)>>> = Mutex::new(None);
    if bytes <= SMEM_DEFAULT {
        return Ok(());
    }
    let key = (dev.id(), name.to_string(), bytes);
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if done.as_ref().is_some_and(|d| d.contains(&key)) {
        return Ok(());
    }
    use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        bytes as i32,
    )
    .w()?;
    done.get_or_insert_with(HashSet::new).insert(key);
    Ok(())
}

/// The examples' valid key counts as the kernels read them, or a null pointer.
fn keylen_view<'a>(k: Option<(&'a CudaStorage, &'a Layout)>) -> Result<Option<CudaView<'a, u32>>> {
    k.map(|(s, l)| u32_view(s, l, "attention_tiled (key lengths)"))
        .transpose()
}

/// Runs `launch` with the address of the dropout seed's slot in a replayed step (the
/// kernels read the seed from there, so each replay draws new masks), null otherwise or
/// without dropout (they take the geometry's).
fn seeded<R>(g: &AttnGeom, launch: impl FnOnce(u64) -> Result<R>) -> Result<R> {
    if g.thr == 0 {
        return launch(0);
    }
    super::with_seed_at(g.seed, launch)
}

/// Attention tiled in blocks on Q, K, V read in place from `qkv` ([b, t, 3c], `g`'s
/// strides): the output [b, t, c] and each row's log-sum-exp [b * heads * t].
pub(crate) fn attn_fwd(
    qkv: (&CudaStorage, &Layout),
    keylen: Option<(&CudaStorage, &Layout)>,
    g: &AttnGeom,
    kernels: TiledKernels,
) -> Result<(CudaStorage, CudaSlice<f32>)> {
    let dev = qkv.0.device().clone();
    let x = f32_view(qkv.0, qkv.1, "attention_tiled")?;
    let c = (g.heads * g.d) as usize;
    let (q, k, v) = (x.slice(..), x.slice(c..), x.slice(2 * c..));
    let lens = keylen_view(keylen)?;
    let o = output(&dev, (g.batch * g.tq) as usize * c)?;
    let lse = output(&dev, (g.batch * g.heads * g.tq) as usize)?;
    let (cfg, name) = tiles(g, AttnKernel::Forward, g.tq, kernels)?;
    let f = dev.get_or_load_custom_func(&name, MODULE, PTX)?;
    opt_in(&dev, &name, &f, cfg.shared_mem_bytes)?;
    seeded(g, |seed_at| {
        let mut b = f.builder();
        let null = 0u64;
        b.arg(&q).arg(&k).arg(&v).arg(&o).arg(&lse);
        match &lens {
            Some(l) => b.arg(l),
            None => b.arg(&null),
        };
        b.arg(g).arg(&seed_at);
        // SAFETY: qkv holds batch * t rows of stride 3c (= sq = sk = sv) with Q, K, V at 0,
        // c, 2c (the caller built `g` from its shape); o holds batch * t * c (stride so = c)
        // and lse batch * heads * t; keylen, when given, holds batch values (null otherwise,
        // with has_len 0); seed_at is null or a live slot of the bound step; the shared
        // memory is what fpt_attn_plan (or fpt_mb_smem_bytes) sized for these tiles, and the
        // block has the lanes the kernel's tiles divide among (256; 128).
        unsafe { b.launch(cfg) }.w()
    })?;
    Ok((CudaStorage::wrap_cuda_slice(o, dev), lse))
}

/// The backward of [`attn_fwd`]: the packed gradient [b, t, 3c] of `qkv` from the output
/// `o`, its gradient `dout` and the forward's log-sum-exp.
pub(crate) fn attn_bwd(
    qkv: (&CudaStorage, &Layout),
    o: (&CudaStorage, &Layout),
    dout: (&CudaStorage, &Layout),
    lse: &CudaSlice<f32>,
    keylen: Option<(&CudaStorage, &Layout)>,
    g: &AttnGeom,
    kernels: TiledKernels,
) -> Result<CudaStorage> {
    let dev = qkv.0.device().clone();
    let x = f32_view(qkv.0, qkv.1, "attention_tiled backward")?;
    let ov = f32_view(o.0, o.1, "attention_tiled backward")?;
    let gv = f32_view(dout.0, dout.1, "attention_tiled backward")?;
    let c = (g.heads * g.d) as usize;
    let (q, k, v) = (x.slice(..), x.slice(c..), x.slice(2 * c..));
    let lens = keylen_view(keylen)?;
    let rows_all = (g.batch * g.heads * g.tq) as usize;
    let dd = output(&dev, rows_all)?;
    let dqkv = output(&dev, (g.batch * g.tq) as usize * 3 * c)?;
    let null = 0u64;
    let (cfg_q, name_q) = tiles(g, AttnKernel::BackwardQ, g.tq, kernels)?;
    let (cfg_kv, name_kv) = tiles(g, AttnKernel::BackwardKv, g.tk, kernels)?;
    let f_q = dev.get_or_load_custom_func(&name_q, MODULE, PTX)?;
    let f_kv = dev.get_or_load_custom_func(&name_kv, MODULE, PTX)?;
    opt_in(&dev, &name_q, &f_q, cfg_q.shared_mem_bytes)?;
    opt_in(&dev, &name_kv, &f_kv, cfg_kv.shared_mem_bytes)?;
    seeded(g, |seed_at| {
        let mut b = f_q.builder();
        b.arg(&q).arg(&k).arg(&v).arg(&ov).arg(&gv).arg(lse).arg(&dd).arg(&dqkv);
        match &lens {
            Some(l) => b.arg(l),
            None => b.arg(&null),
        };
        b.arg(g).arg(&seed_at);
        // SAFETY: as attn_fwd's, and o, dout hold batch * t * c (stride so = c), lse and dd
        // batch * heads * t, dqkv batch * t * 3c (stride sg = 3c; this pass writes its dQ
        // third and every dd).
        unsafe { b.launch(cfg_q) }.w()?;
        let mut b = f_kv.builder();
        b.arg(&q).arg(&k).arg(&v).arg(&gv).arg(lse).arg(&dd).arg(&dqkv);
        match &lens {
            Some(l) => b.arg(l),
            None => b.arg(&null),
        };
        b.arg(g).arg(&seed_at);
        // SAFETY: as above; this pass reads the first pass's dd (the same stream orders
        // them) and writes the dK and dV thirds of dqkv, every row of each.
        unsafe { b.launch(cfg_kv) }.w()
    })?;
    Ok(CudaStorage::wrap_cuda_slice(dqkv, dev))
}

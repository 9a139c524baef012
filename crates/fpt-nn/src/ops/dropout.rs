//! Inverted dropout whose mask comes from a seed drawn from the run's [`Rng`], so dropout
//! is reproducible from the run's seed (candle's own CPU random numbers cannot be seeded).
//!
//! A mask is counter-based: it is cut into blocks ([`CHUNK`] elements for [`dropout`] and
//! [`dropout_add`], one `t x t` matrix per (example, head) for attention); block `b` takes a
//! 32-bit key from [`Rng::stream`]`(seed, b)`, and element `j` of the block is dropped when a
//! 32-bit hash of (key, j) falls below `p * 2^24` (vectorized, no sequential generator). So
//! a mask is a pure function of (seed, block size, index): drawn in parallel, drawn again in
//! backward instead of stored, and drawn on a GPU by the same function in a kernel
//! (`kernels/fpt_ops.h`), never copied from the host, the same mask as on the CPU.

use super::{cpu_slice, tracks, unsupported, use_par};
use crate::kernels::KernelPath;
use crate::Rng;
use candle_core::backend::BackendStorage as _;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// Elements per mask block of [`dropout`] and [`dropout_add`] (one random stream each).
pub(crate) const CHUNK: usize = 16_384;

/// The dropout mask's parameters as fpt's kernels take them (fpt_ops.h's
/// `fpt_dropout_mult`): the threshold on the hash's top 24 bits and the kept elements'
/// multiplier (as `fastmath::dropout_multipliers` draws them).
pub(crate) fn mask_params(p: f64) -> (i32, f32) {
    let thr = (p * (1u32 << 24) as f64).round().clamp(0.0, (1u32 << 24) as f64) as i32;
    (thr, (1.0 / (1.0 - p)) as f32)
}

/// The hash key of block `block` of a mask seeded by `seed`.
pub(crate) fn chunk_key(seed: u64, block: usize) -> u32 {
    (Rng::stream(seed, block as u64).next_u64() >> 32) as u32
}

/// Calls `f(start, multipliers)` for consecutive pieces covering elements `from..to` of a
/// mask of blocks of `block` elements drawn from `(p, seed)`: 0 with probability `p`, else
/// `1 / (1 - p)`.
fn for_mask_pieces(from: usize, to: usize, block: usize, p: f64, seed: u64, mut f: impl FnMut(usize, &[f32])) {
    const PIECE: usize = 1024;
    let path = KernelPath::active();
    let block = block.max(1);
    let mut m = [0f32; PIECE];
    let mut start = from;
    while start < to {
        let b = start / block;
        let j = start - b * block;
        let len = PIECE.min(block - j).min(to - start);
        super::fastmath::dropout_multipliers(path, &mut m[..len], chunk_key(seed, b), j as u32, p);
        f(start, &m[..len]);
        start += len;
    }
}

/// Writes `out[i] = g(i, multiplier of i)` for every element, in parallel pieces of
/// [`CHUNK`] when large.
fn fill_with_mask<T: Send>(
    out: &mut [std::mem::MaybeUninit<T>],
    block: usize,
    p: f64,
    seed: u64,
    g: impl Fn(usize, f32) -> T + Send + Sync,
) {
    crate::replay::seed_slot(seed);
    let fill = |c: usize, o: &mut [std::mem::MaybeUninit<T>]| {
        let first = c * CHUNK;
        for_mask_pieces(first, first + o.len(), block, p, seed, |s, m| {
            for (k, (slot, &mv)) in o[s - first..s - first + m.len()].iter_mut().zip(m).enumerate() {
                slot.write(g(s + k, mv));
            }
        });
    };
    if use_par(out.len()) {
        out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, o)| fill(c, o));
    } else {
        out.chunks_mut(CHUNK).enumerate().for_each(|(c, o)| fill(c, o));
    }
}

/// The dropout multipliers (0 or `1 / (1 - p)`) of `n` elements for `seed` (the same on
/// every kernel path and device).
pub fn dropout_mask_values(n: usize, p: f64, seed: u64) -> Vec<f32> {
    mask_values(n, CHUNK, p, seed)
}

/// The multipliers of a mask of blocks of `block` elements.
pub(crate) fn mask_values(n: usize, block: usize, p: f64, seed: u64) -> Vec<f32> {
    let mut out = super::uninit::<f32>(n);
    fill_with_mask(&mut out, block, p, seed, |_, m| m);
    // SAFETY: fill_with_mask writes every element.
    unsafe { super::assume_init(out) }
}

/// `x * mask`, the mask of blocks of `block` elements drawn from `(p, seed)` where the
/// tensor lives (a kernel on a GPU). Backward multiplies by the same mask, drawn again.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DropoutMul {
    pub(crate) p: f64,
    pub(crate) seed: u64,
    pub(crate) block: usize,
}

impl DropoutMul {
    pub(crate) fn host<T: super::Float>(&self, x: &[T]) -> Vec<T> {
        let mut out = super::uninit::<T>(x.len());
        fill_with_mask(&mut out, self.block, self.p, self.seed, |i, m| {
            x[i] * T::from(m).expect("f32 converts")
        });
        // SAFETY: fill_with_mask writes every element.
        unsafe { super::assume_init(out) }
    }

    /// `x * mask` for a tensor on any device: f32 and f64 on the CPU, f32 on a GPU (its
    /// kernel, nothing copied); another dtype on a GPU multiplies by the mask drawn on the
    /// host and uploaded (a counted copy, see [`crate::transfer`]).
    pub(crate) fn apply(&self, x: &Tensor) -> Result<Tensor> {
        if !x.device().is_cpu() && x.dtype() != DType::F32 {
            if crate::replay::bound() {
                candle_core::bail!(
                    "dropout: a {:?} tensor on a GPU gets a mask drawn on the host, which a replayed step cannot redraw",
                    x.dtype()
                )
            }
            let m = mask_values(x.elem_count(), self.block, self.p, self.seed);
            let m = crate::transfer::upload(m, x.shape(), x.device())?.to_dtype(x.dtype())?;
            return x.mul(&m);
        }
        x.contiguous()?.apply_op1(*self)
    }
}

impl CustomOp1 for DropoutMul {
    fn name(&self) -> &'static str {
        "fpt-dropout"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = match s.dtype() {
            DType::F32 => CpuStorage::F32(self.host(cpu_slice::<f32>(s, l, "dropout")?)),
            DType::F64 => CpuStorage::F64(self.host(cpu_slice::<f64>(s, l, "dropout")?)),
            dt => return Err(unsupported("dropout", dt)),
        };
        Ok((out, l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((
            crate::cuda::dropout_mul(s, l, self.p, self.seed, self.block)?,
            l.shape().clone(),
        ))
    }

    fn bwd(&self, _x: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(self.apply(dy)?))
    }
}

/// Zeroes each element with probability `p` and scales the rest by `1 / (1 - p)`; the mask
/// is drawn from a seed taken from `rng`, where `x` lives.
pub fn dropout(x: &Tensor, p: f64, rng: &mut Rng) -> Result<Tensor> {
    if p <= 0.0 {
        return Ok(x.clone());
    }
    if p >= 1.0 {
        return x.zeros_like();
    }
    let seed = rng.next_u64();
    DropoutMul { p, seed, block: CHUNK }.apply(x)
}

/// `x + y * mask`, the mask redrawn from `(p, seed)` in backward instead of stored.
pub(super) struct DropoutAdd {
    pub(super) p: f64,
    pub(super) seed: u64,
}

impl DropoutAdd {
    /// `out[i] = a[i] + b[i] * m[i]` (or `b[i] * m[i]` without `a`).
    pub(super) fn run(&self, a: Option<&[f32]>, b: &[f32]) -> Vec<f32> {
        let mut out = super::uninit::<f32>(b.len());
        match a {
            Some(a) => fill_with_mask(&mut out, CHUNK, self.p, self.seed, |i, m| a[i] + b[i] * m),
            None => fill_with_mask(&mut out, CHUNK, self.p, self.seed, |i, m| b[i] * m),
        }
        // SAFETY: fill_with_mask writes every element.
        unsafe { super::assume_init(out) }
    }
}

impl CustomOp2 for DropoutAdd {
    fn name(&self) -> &'static str {
        "fpt-dropout-add"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        if s1.dtype() != DType::F32 {
            return Err(unsupported("dropout_add", s1.dtype()));
        }
        let (a, b) = (
            cpu_slice::<f32>(s1, l1, "dropout_add")?,
            cpu_slice::<f32>(s2, l2, "dropout_add")?,
        );
        Ok((CpuStorage::F32(self.run(Some(a), b)), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((
            crate::cuda::dropout_add((s1, l1), (s2, l2), self.p, self.seed, CHUNK)?,
            l1.shape().clone(),
        ))
    }

    fn bwd(&self, x: &Tensor, y: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dyv = if tracks(y) {
            Some(dropout_add_grad(dy, self.p, self.seed)?)
        } else {
            None
        };
        Ok((tracks(x).then(|| dy.clone()), dyv))
    }
}

/// The gradient of [`dropout_add`]`(x, y, p, seed)`'s `y` from the output's `dy` (`x`'s is
/// `dy` itself): `dy` times the mask, as the op's backward computes it.
pub(crate) fn dropout_add_grad(dy: &Tensor, p: f64, seed: u64) -> Result<Tensor> {
    if p <= 0.0 {
        return Ok(dy.clone());
    }
    DropoutMul { p, seed, block: CHUNK }.apply(dy)
}

/// `x + dropout(y)` (a residual branch), with the mask drawn from `seed`: one fused op for
/// f32 on the CPU and on a GPU (the mask is never stored; backward redraws it), composed of
/// [`DropoutMul`] and an addition for f64. The mask equals
/// [`dropout_mask_values`]`(n, p, seed)`.
pub fn dropout_add(x: &Tensor, y: &Tensor, p: f64, seed: u64) -> Result<Tensor> {
    if p <= 0.0 {
        return x + y;
    }
    if x.shape() != y.shape() {
        candle_core::bail!("dropout_add: shapes {:?} and {:?} differ", x.shape(), y.shape())
    }
    if x.dtype() == DType::F32 && y.dtype() == DType::F32 {
        return x.contiguous()?.apply_op2(&y.contiguous()?, DropoutAdd { p, seed });
    }
    x + DropoutMul { p, seed, block: CHUNK }.apply(y)?
}

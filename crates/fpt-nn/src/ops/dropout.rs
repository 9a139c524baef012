//! Inverted dropout whose mask comes from a seed drawn from the run's [`Rng`], so dropout
//! is reproducible from the run's seed (candle's own CPU random numbers cannot be seeded).
//!
//! The mask is drawn in chunks of [`CHUNK`] elements: chunk `i` takes a 32-bit key from
//! [`Rng::stream`]`(seed, i)`, and element `j` of the chunk is dropped when a 32-bit hash of
//! (key, j) falls below `p * 2^24` (vectorized, no sequential generator), so the mask is
//! drawn in parallel and can be drawn again identically: [`dropout_add`] (the residual
//! branch `x + dropout(y)`) stores no mask and redraws it in backward.

use super::{cpu_slice, tracks, unsupported, use_par};
use crate::kernels::KernelPath;
use crate::Rng;
use candle_core::backend::BackendStorage as _;
use candle_core::{CpuStorage, CudaStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// Elements per mask chunk (one random stream each).
const CHUNK: usize = 16_384;

/// Calls `f(chunk_index, chunk)` for each [`CHUNK`]-sized piece of `buf`, in parallel when
/// large.
fn for_chunks<T: Send>(buf: &mut [T], f: impl Fn(usize, &mut [T]) + Send + Sync) {
    if use_par(buf.len()) {
        buf.par_chunks_mut(CHUNK).enumerate().for_each(|(c, o)| f(c, o));
    } else {
        buf.chunks_mut(CHUNK).enumerate().for_each(|(c, o)| f(c, o));
    }
}

/// The hash key of chunk `chunk` of a mask seeded by `seed`.
fn chunk_key(seed: u64, chunk: usize) -> u32 {
    (Rng::stream(seed, chunk as u64).next_u64() >> 32) as u32
}

/// Draws one chunk's multipliers: 0 with probability `p`, else `1 / (1 - p)`.
fn draw(path: KernelPath, out: &mut [f32], seed: u64, chunk: usize, p: f64) {
    super::fastmath::dropout_multipliers(path, out, chunk_key(seed, chunk), 0, p);
}

/// The dropout multipliers (0 or `1 / (1 - p)`) of `n` elements for `seed` (the same on
/// every kernel path).
pub fn dropout_mask_values(n: usize, p: f64, seed: u64) -> Vec<f32> {
    let path = KernelPath::active();
    let mut m = vec![0f32; n];
    for_chunks(&mut m, |c, out| draw(path, out, seed, c, p));
    m
}

/// Multiplies by a constant mask; the mask gets no gradient.
struct MaskMul;

impl CustomOp2 for MaskMul {
    fn name(&self) -> &'static str {
        "fpt-dropout"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = match s1.dtype() {
            DType::F32 => {
                let (x, m) = (
                    cpu_slice::<f32>(s1, l1, "dropout")?,
                    cpu_slice::<f32>(s2, l2, "dropout")?,
                );
                CpuStorage::F32(x.iter().zip(m).map(|(a, b)| a * b).collect())
            }
            DType::F64 => {
                let (x, m) = (
                    cpu_slice::<f64>(s1, l1, "dropout")?,
                    cpu_slice::<f64>(s2, l2, "dropout")?,
                );
                CpuStorage::F64(x.iter().zip(m).map(|(a, b)| a * b).collect())
            }
            dt => return Err(unsupported("dropout", dt)),
        };
        Ok((out, l1.shape().clone()))
    }

    fn cuda_fwd(&self, s1: &CudaStorage, l1: &Layout, s2: &CudaStorage, l2: &Layout) -> Result<(CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        let out = s1.binary_impl::<candle_core::op::Mul>(s2, l1, l2)?;
        Ok((out, l1.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, mask: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(dy.mul(mask)?), None))
    }
}

/// Zeroes each element with probability `p` and scales the rest by `1 / (1 - p)`; the mask
/// is drawn from a seed taken from `rng`.
pub fn dropout(x: &Tensor, p: f64, rng: &mut Rng) -> Result<Tensor> {
    if p <= 0.0 {
        return Ok(x.clone());
    }
    if p >= 1.0 {
        return x.zeros_like();
    }
    let seed = rng.next_u64();
    let mask =
        Tensor::from_vec(dropout_mask_values(x.elem_count(), p, seed), x.shape(), x.device())?.to_dtype(x.dtype())?;
    x.contiguous()?.apply_op2(&mask, MaskMul)
}

/// `x + y * mask`, the mask redrawn from `(p, seed)` in backward instead of stored.
pub(super) struct DropoutAdd {
    pub(super) p: f64,
    pub(super) seed: u64,
}

impl DropoutAdd {
    /// `out[i] = a[i] + b[i] * m[i]` (or `b[i] * m[i]` without `a`), chunk by chunk, the
    /// multipliers drawn as [`draw`] draws them.
    pub(super) fn run(&self, a: Option<&[f32]>, b: &[f32]) -> Vec<f32> {
        const BLOCK: usize = 1024;
        let path = KernelPath::active();
        let n = b.len();
        let mut out = super::uninit::<f32>(n);
        for_chunks(&mut out, |c, o| {
            let start = c * CHUNK;
            let key = chunk_key(self.seed, c);
            let mut m = [0f32; BLOCK];
            for (bi, ob) in o.chunks_mut(BLOCK).enumerate() {
                let j0 = bi * BLOCK;
                let m = &mut m[..ob.len()];
                super::fastmath::dropout_multipliers(path, m, key, j0 as u32, self.p);
                let bs = &b[start + j0..start + j0 + ob.len()];
                match a {
                    Some(a) => {
                        let xs = &a[start + j0..start + j0 + ob.len()];
                        for (((o, &x), &y), &mv) in ob.iter_mut().zip(xs).zip(bs).zip(m.iter()) {
                            o.write(x + y * mv);
                        }
                    }
                    None => {
                        for ((o, &y), &mv) in ob.iter_mut().zip(bs).zip(m.iter()) {
                            o.write(y * mv);
                        }
                    }
                }
            }
        });
        // SAFETY: the chunks cover `out` and each writes all of its slots.
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

    fn bwd(&self, x: &Tensor, y: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dyv = if tracks(y) {
            let v = super::with_cpu_slice::<f32, _>(dy, "dropout_add", |g| Ok(self.run(None, g)))?;
            Some(Tensor::from_vec(v, y.shape(), y.device())?)
        } else {
            None
        };
        Ok((tracks(x).then(|| dy.clone()), dyv))
    }
}

/// `x + dropout(y)` (a residual branch), with the mask drawn from `seed`: fused on CPU for
/// f32 (the mask is never stored; backward redraws it), composed elsewhere. The mask equals
/// [`dropout_mask_values`]`(n, p, seed)`.
pub fn dropout_add(x: &Tensor, y: &Tensor, p: f64, seed: u64) -> Result<Tensor> {
    if p <= 0.0 {
        return x + y;
    }
    if x.shape() != y.shape() {
        candle_core::bail!("dropout_add: shapes {:?} and {:?} differ", x.shape(), y.shape())
    }
    if x.device().is_cpu() && x.dtype() == DType::F32 && y.dtype() == DType::F32 {
        return x.contiguous()?.apply_op2(&y.contiguous()?, DropoutAdd { p, seed });
    }
    let mask =
        Tensor::from_vec(dropout_mask_values(y.elem_count(), p, seed), y.shape(), y.device())?.to_dtype(y.dtype())?;
    x + y.mul(&mask)?
}

//! Rotary position embedding (Llama's, in `transformers`' "rotate half" layout), fused on
//! CPU with a hand-written backward. Per head of width d (h = d / 2), at position t:
//! `y1 = x1 cos1 - x2 sin1`, `y2 = x2 cos2 + x1 sin2` (x1, x2: the head's two halves; cos
//! and sin: `[t, d]` tables), so `dx1 = dy1 cos1 + dy2 sin2`, `dx2 = dy2 cos2 - dy1 sin1`.
//!
//! Composed of candle ops, a rotation is two `narrow`s, a `neg`, a `cat`, two broadcast
//! products and a sum, each a tensor the backward keeps or rebuilds; fused it is one pass
//! each way that stores nothing (the tables are constants: no gradient).

use super::{cpu_slice, tracks, unsupported, use_par, with_cpu_slice, Float};
use candle_core::backend::BackendStorage as _;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

struct Rotary {
    heads: usize,
    d: usize,
    t: usize,
    cos: Vec<f64>,
    sin: Vec<f64>,
}

/// Elements per parallel task (whole rows of it): 64 KiB of f32, as the other element-wise ops.
const TASK_ELEMS: usize = 1 << 14;

/// Rotates every head of `x` (`[rows = batch * t, heads * d]`, row r at position r % t), or
/// with `transpose` applies the rotation's transpose (the backward).
fn rotate<T: Float>(op: &Rotary, x: &[T], transpose: bool) -> Vec<T> {
    let (d, h, w) = (op.d, op.d / 2, op.heads * op.d);
    let cos: Vec<T> = op.cos.iter().map(|&c| T::from(c).unwrap()).collect();
    let sin: Vec<T> = op.sin.iter().map(|&s| T::from(s).unwrap()).collect();
    let mut y = vec![T::zero(); x.len()];
    let rows_per_task = TASK_ELEMS / w.max(1) + 1;
    let body = |(r0, (yc, xc)): (usize, (&mut [T], &[T]))| {
        for (k, (yr, xr)) in yc.chunks_mut(w).zip(xc.chunks(w)).enumerate() {
            let p = (r0 * rows_per_task + k) % op.t;
            let (c, s) = (&cos[p * d..(p + 1) * d], &sin[p * d..(p + 1) * d]);
            for (yh, xh) in yr.chunks_mut(d).zip(xr.chunks(d)) {
                let (y1, y2) = yh.split_at_mut(h);
                let (x1, x2) = xh.split_at(h);
                if transpose {
                    // dx1 = dy1 cos1 + dy2 sin2, dx2 = dy2 cos2 - dy1 sin1.
                    for i in 0..h {
                        y1[i] = x1[i] * c[i] + x2[i] * s[h + i];
                        y2[i] = x2[i] * c[h + i] - x1[i] * s[i];
                    }
                } else {
                    for i in 0..h {
                        y1[i] = x1[i] * c[i] - x2[i] * s[i];
                        y2[i] = x2[i] * c[h + i] + x1[i] * s[h + i];
                    }
                }
            }
        }
    };
    let chunk = rows_per_task * w;
    if use_par(x.len()) {
        y.par_chunks_mut(chunk)
            .zip(x.par_chunks(chunk))
            .enumerate()
            .for_each(body);
    } else {
        y.chunks_mut(chunk).zip(x.chunks(chunk)).enumerate().for_each(body);
    }
    y
}

/// The input must be `[batch, t, heads * d]`.
fn check_shape(shape: &Shape, t: usize, heads: usize, d: usize) -> Result<()> {
    let dims = shape.dims();
    let ok = dims.len() == 3 && dims[1] == t && dims[2] == heads * d;
    if !ok {
        return Err(candle_core::Error::Msg(format!(
            "rotary: input {dims:?} is not [batch, {t}, {heads} heads x {d}]"
        )));
    }
    Ok(())
}

impl Rotary {
    fn check(&self, shape: &Shape) -> Result<()> {
        check_shape(shape, self.t, self.heads, self.d)
    }
}

impl CustomOp1 for Rotary {
    fn name(&self) -> &'static str {
        "fpt-rotary"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        self.check(l.shape())?;
        let out = match s.dtype() {
            DType::F32 => CpuStorage::F32(rotate(self, cpu_slice::<f32>(s, l, "rotary")?, false)),
            DType::F64 => CpuStorage::F64(rotate(self, cpu_slice::<f64>(s, l, "rotary")?, false)),
            dt => return Err(unsupported("rotary", dt)),
        };
        Ok((out, l.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        if !tracks(x) {
            return Ok(None);
        }
        let dx = match dy.dtype() {
            DType::F32 => Tensor::from_vec(
                with_cpu_slice::<f32, _>(dy, "rotary", |g| Ok(rotate(self, g, true)))?,
                dy.shape(),
                dy.device(),
            )?,
            DType::F64 => Tensor::from_vec(
                with_cpu_slice::<f64, _>(dy, "rotary", |g| Ok(rotate(self, g, true)))?,
                dy.shape(),
                dy.device(),
            )?,
            dt => return Err(unsupported("rotary", dt)),
        };
        Ok(Some(dx))
    }
}

/// Rotary positions on a GPU: `x`, `cos`, `sin` all on the device (the tables are read
/// there, never copied to the host); `transpose` is the backward, never differentiated.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct RotaryDevice {
    heads: usize,
    d: usize,
    t: usize,
    transpose: bool,
}

impl candle_core::CustomOp3 for RotaryDevice {
    fn name(&self) -> &'static str {
        "fpt-rotary-device"
    }

    gpu_only_cpu_fwd3!("rotary: the device op is for GPUs (the CPU's is `Rotary`)");

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        lx: &Layout,
        cos: &candle_core::CudaStorage,
        lc: &Layout,
        sin: &candle_core::CudaStorage,
        ls: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        check_shape(lx.shape(), self.t, self.heads, self.d)?;
        let geom = (self.t, self.heads * self.d, self.d);
        let y = crate::cuda::rotary((x, lx), (cos, lc), (sin, ls), geom, self.transpose)?;
        Ok((y, lx.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, cos: &Tensor, sin: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<BwdOut> {
        if !tracks(x) {
            return Ok((None, None, None));
        }
        let back = RotaryDevice {
            transpose: !self.transpose,
            ..*self
        };
        let dx = dy.contiguous()?.apply_op3_no_bwd(cos, sin, &back)?;
        Ok((Some(dx), None, None))
    }
}

type BwdOut = (Option<Tensor>, Option<Tensor>, Option<Tensor>);

/// Rotary positions on `x` (`[batch, t, heads * d]`, each head's halves rotated by the
/// `[t, d]` tables `cos` and `sin`, as `transformers`' `apply_rotary_pos_emb`). Fused with a
/// hand-written backward on the CPU (f32, f64) and on a GPU (f32: one kernel each way, the
/// tables read on the device), composed of candle ops otherwise; the tables get no
/// gradient.
pub fn rotary(x: &Tensor, cos: &Tensor, sin: &Tensor, heads: usize) -> Result<Tensor> {
    if !super::fused_here(x) {
        return rotary_composed(x, cos, sin, heads);
    }
    let (t, d) = cos.dims2()?;
    if d % 2 != 0 || sin.dims2()? != (t, d) {
        return Err(candle_core::Error::Msg(format!(
            "rotary: cos {:?} and sin {:?} must be equal [t, d] tables with d even",
            cos.shape(),
            sin.shape()
        )));
    }
    if !x.device().is_cpu() {
        let table = |x: &Tensor| x.to_dtype(DType::F32)?.contiguous();
        let op = RotaryDevice {
            heads,
            d,
            t,
            transpose: false,
        };
        return x.contiguous()?.apply_op3(&table(cos)?, &table(sin)?, op);
    }
    let table = |x: &Tensor| -> Result<Vec<f64>> { x.to_dtype(DType::F64)?.flatten_all()?.to_vec1() };
    let op = Rotary {
        heads,
        d,
        t,
        cos: table(cos)?,
        sin: table(sin)?,
    };
    x.contiguous()?.apply_op1(op)
}

/// [`rotary`] composed of stock candle ops (every device; the reference in tests).
pub fn rotary_composed(x: &Tensor, cos: &Tensor, sin: &Tensor, heads: usize) -> Result<Tensor> {
    let (b, t, w) = x.dims3()?;
    let d = w / heads;
    let x = x.reshape((b, t, heads, d))?;
    let x1 = x.narrow(3, 0, d / 2)?;
    let x2 = x.narrow(3, d / 2, d / 2)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], 3)?;
    let cos = cos.reshape((1, t, 1, d))?.to_dtype(x.dtype())?;
    let sin = sin.reshape((1, t, 1, d))?.to_dtype(x.dtype())?;
    (x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?)?.reshape((b, t, w))
}

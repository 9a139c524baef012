//! Inverted dropout whose mask comes from the run's [`Rng`], so dropout is reproducible
//! from the seed (candle's own CPU random numbers cannot be seeded).

use super::{cpu_slice, unsupported};
use crate::Rng;
use candle_core::backend::BackendStorage as _;
use candle_core::{CpuStorage, CudaStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

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

/// Zeroes each element with probability `p` and scales the rest by `1 / (1 - p)`.
pub fn dropout(x: &Tensor, p: f64, rng: &mut Rng) -> Result<Tensor> {
    if p <= 0.0 {
        return Ok(x.clone());
    }
    if p >= 1.0 {
        return x.zeros_like();
    }
    let keep = (1.0 / (1.0 - p)) as f32;
    let pf = p as f32;
    let mask: Vec<f32> = (0..x.elem_count())
        .map(|_| if rng.uniform_f32() < pf { 0.0 } else { keep })
        .collect();
    let mask = Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())?;
    x.contiguous()?.apply_op2(&mask, MaskMul)
}

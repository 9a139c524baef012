//! Weight initialisers drawn from [`Rng`]: Gaussian, and PyTorch's `orthogonal_` (the
//! FPT input layer uses an orthogonal matrix with gain 1.41).

use crate::Rng;
use candle_core::{Device, Result, Tensor};

/// A tensor of N(mean, std) samples.
pub fn normal(shape: &[usize], mean: f64, std: f64, rng: &mut Rng, device: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    Tensor::from_vec(rng.normal_vec(n, mean, std), shape, device)
}

/// A `rows x cols` matrix with orthonormal rows (if rows <= cols) or columns (otherwise),
/// times `gain`: the distribution of PyTorch's `torch.nn.init.orthogonal_` (QR of a
/// Gaussian matrix with the signs of R's diagonal folded in, i.e. Haar-distributed).
pub fn orthogonal(rows: usize, cols: usize, gain: f64, rng: &mut Rng, device: &Device) -> Result<Tensor> {
    // Orthonormalise the shorter side: `k` vectors of length `len`.
    let (k, len) = if rows <= cols { (rows, cols) } else { (cols, rows) };
    let mut v: Vec<Vec<f64>> = (0..k).map(|_| (0..len).map(|_| rng.normal()).collect()).collect();
    // Modified Gram-Schmidt, twice for numerical orthogonality. Gram-Schmidt on Gaussian
    // vectors gives the same (Haar) distribution as sign-corrected QR.
    for _pass in 0..2 {
        for i in 0..k {
            for j in 0..i {
                let d: f64 = v[i].iter().zip(&v[j]).map(|(a, b)| a * b).sum();
                let (head, tail) = v.split_at_mut(i);
                for (a, b) in tail[0].iter_mut().zip(&head[j]) {
                    *a -= d * b;
                }
            }
            let norm = v[i].iter().map(|a| a * a).sum::<f64>().sqrt();
            for a in v[i].iter_mut() {
                *a /= norm;
            }
        }
    }
    let mut out = vec![0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            let x = if rows <= cols { v[r][c] } else { v[c][r] };
            out[r * cols + c] = (gain * x) as f32;
        }
    }
    Tensor::from_vec(out, (rows, cols), device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orthogonal_is_orthogonal_times_gain() -> Result<()> {
        let dev = Device::Cpu;
        for (r, c) in [(8, 3), (3, 8), (5, 5)] {
            let w = orthogonal(r, c, 1.41, &mut Rng::new(1), &dev)?;
            let g = if r <= c { w.matmul(&w.t()?)? } else { w.t()?.matmul(&w)? };
            let k = r.min(c);
            let eye = Tensor::eye(k, candle_core::DType::F32, &dev)?.affine(1.41 * 1.41, 0.0)?;
            let err = (g - eye)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(err < 1e-5, "{r}x{c}: {err}");
        }
        Ok(())
    }
}

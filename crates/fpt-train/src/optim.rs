//! Adam with PyTorch's defaults and no weight decay (paper App. C), and global
//! gradient-norm clipping as `torch.nn.utils.clip_grad_norm_`.

use candle_core::{Result, Tensor, Var};
use fpt_nn::ops::{adam_update, AdamCoefs};

/// Adam (Kingma & Ba), PyTorch's update: bias-corrected first and second moments,
/// `p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`.
pub struct Adam {
    vars: Vec<Var>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Steps taken.
    pub t: usize,
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
}

impl Adam {
    /// Adam over `vars` with betas (0.9, 0.999) and eps 1e-8.
    pub fn new(vars: Vec<Var>, lr: f64) -> Result<Self> {
        let m = vars.iter().map(|v| v.zeros_like()).collect::<Result<Vec<_>>>()?;
        let v = vars.iter().map(|v| v.zeros_like()).collect::<Result<Vec<_>>>()?;
        Ok(Self {
            vars,
            m,
            v,
            t: 0,
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        })
    }

    /// One update with `grads[i]` for `vars[i]` (in place on CPU f32 tensors, see
    /// [`fpt_nn::ops::adam_update`]: the moments [`Adam::moments`] returned before are
    /// then updated too).
    pub fn step(&mut self, grads: &[Tensor]) -> Result<()> {
        self.t += 1;
        let coefs = self.coefs_at(self.t, self.lr);
        for (i, var) in self.vars.iter().enumerate() {
            adam_update(var, &mut self.m[i], &mut self.v[i], &grads[i], &coefs)?;
        }
        Ok(())
    }

    /// The coefficients of update number `t` (counted from 1) at learning rate `lr`.
    pub fn coefs_at(&self, t: usize, lr: f64) -> AdamCoefs {
        let bc1 = 1.0 - self.beta1.powi(t as i32);
        let bc2 = 1.0 - self.beta2.powi(t as i32);
        AdamCoefs {
            beta1: self.beta1,
            beta2: self.beta2,
            step_size: lr / bc1,
            inv_sqrt_bc2: 1.0 / bc2.sqrt(),
            eps: self.eps,
        }
    }

    /// Replaces the step counter and moments (from a checkpoint), in `vars` order.
    /// The moments are copied: later steps update them in place, and must not write
    /// into tensors the caller still holds.
    pub fn restore(&mut self, t: usize, m: Vec<Tensor>, v: Vec<Tensor>) -> Result<()> {
        self.t = t;
        self.m = m.iter().map(Tensor::copy).collect::<Result<_>>()?;
        self.v = v.iter().map(Tensor::copy).collect::<Result<_>>()?;
        Ok(())
    }

    /// The first and second moments, in `vars` order.
    pub fn moments(&self) -> (&[Tensor], &[Tensor]) {
        (&self.m, &self.v)
    }
}

/// Scales `grads` in place so their global L2 norm is at most `max_norm`; returns the norm
/// before clipping (PyTorch: coefficient `max_norm / (norm + 1e-6)`, applied when < 1).
pub fn clip_grad_norm(grads: &mut [Tensor], max_norm: f64) -> Result<f64> {
    let norm = grad_norm(grads)?;
    let coef = max_norm / (norm + 1e-6);
    if coef < 1.0 {
        for g in grads.iter_mut() {
            *g = (&*g * coef)?;
        }
    }
    Ok(norm)
}

/// The global L2 norm of `grads` as a one-element f64 tensor where the gradients live,
/// after scaling them in place so it is at most `max_norm` (PyTorch's coefficient
/// `max_norm / (norm + 1e-6)`, at most 1; `None`: no clipping): [`clip_grad_norm`] without
/// reading anything back to the host, so a GPU step never waits for it. The caller reads
/// the norm when it needs it (the trainer: once per step, with the losses).
pub fn clip_grad_norm_in_place(grads: &mut [Tensor], max_norm: Option<f64>) -> Result<Tensor> {
    let Some(first) = grads.first() else {
        candle_core::bail!("clip_grad_norm_in_place: no gradients")
    };
    let device = first.device().clone();
    let squares = grads
        .iter()
        .map(|g| g.sqr()?.sum_all()?.to_dtype(candle_core::DType::F64))
        .collect::<Result<Vec<_>>>()?;
    let norm = Tensor::stack(&squares, 0)?.sum_all()?.sqrt()?;
    if let Some(c) = max_norm {
        let max = fpt_nn::transfer::constant(format!("clip-max:{c:e}"), &device, || {
            fpt_nn::transfer::upload(vec![c], (), &device)
        })?;
        let coef = max.div(&(&norm + 1e-6)?)?.minimum(1.0)?;
        for g in grads.iter_mut() {
            *g = g.broadcast_mul(&coef.to_dtype(g.dtype())?)?;
        }
    }
    Ok(norm)
}

/// Global L2 norm of `grads`, read back per tensor (the CPU baselines' loops; the trainer
/// uses [`clip_grad_norm_in_place`], which reads nothing back).
pub fn grad_norm(grads: &[Tensor]) -> Result<f64> {
    let mut sq = 0f64;
    for g in grads {
        sq += g
            .sqr()?
            .sum_all()?
            .to_dtype(candle_core::DType::F64)?
            .to_scalar::<f64>()?;
    }
    Ok(sq.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn first_adam_step_moves_each_weight_by_lr() -> Result<()> {
        // With bias correction, step 1 moves every coordinate by lr * g / (|g| + eps') = lr * sign(g).
        let var = Var::from_tensor(&Tensor::new(&[1.0f32, -2.0, 3.0], &Device::Cpu)?)?;
        let mut adam = Adam::new(vec![var.clone()], 0.1)?;
        adam.step(&[Tensor::new(&[0.5f32, -4.0, 0.0], &Device::Cpu)?])?;
        let w = var.as_tensor().to_vec1::<f32>()?;
        assert!(
            (w[0] - 0.9).abs() < 1e-6 && (w[1] + 1.9).abs() < 1e-6 && (w[2] - 3.0).abs() < 1e-6,
            "{w:?}"
        );
        Ok(())
    }

    #[test]
    fn clipping_scales_to_max_norm() -> Result<()> {
        let mut g = vec![
            Tensor::new(&[3.0f32], &Device::Cpu)?,
            Tensor::new(&[4.0f32], &Device::Cpu)?,
        ];
        let n = clip_grad_norm(&mut g, 1.0)?;
        assert!((n - 5.0).abs() < 1e-9);
        assert!((grad_norm(&g)? - 1.0).abs() < 1e-5);
        let mut small = vec![Tensor::new(&[0.3f32], &Device::Cpu)?];
        clip_grad_norm(&mut small, 1.0)?;
        assert_eq!(small[0].to_vec1::<f32>()?, vec![0.3]);
        Ok(())
    }
}

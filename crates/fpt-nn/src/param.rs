//! A model parameter is either frozen (a plain tensor) or trainable (a `Var`).

use candle_core::{Tensor, Var};
use std::cell::Cell;

thread_local! {
    static NO_GRAD: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with every trainable parameter read detached ([`Param::get`]), so the forward
/// passes inside record no autograd graph: each activation is freed as soon as the next
/// is computed, instead of living until the output is dropped. For evaluation; a backward
/// pass of a result computed inside finds no gradient. Applies to this thread.
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    with_grad_disabled(true, f)
}

/// Runs `f` with this thread's [`no_grad`] flag set to `disabled` (either way), restoring
/// it after: how [`crate::on_pool`] hands the caller's flag to a worker thread, which may
/// be inside another caller's `no_grad` when it picks the job up.
pub(crate) fn with_grad_disabled<R>(disabled: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            NO_GRAD.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(NO_GRAD.with(|g| g.replace(disabled)));
    f()
}

/// Whether [`no_grad`] is in effect on this thread.
pub fn grad_disabled() -> bool {
    NO_GRAD.with(|g| g.get())
}

/// A parameter tensor. Frozen parameters are plain tensors: backprop never tracks them, the
/// optimizer never sees them, and layers route them through ops that compute no gradient
/// for them (see [`crate::ops::linear`]).
#[derive(Debug, Clone)]
pub enum Param {
    /// Not trained: a constant tensor.
    Frozen(Tensor),
    /// Trained: a `Var` the optimizer updates in place.
    Trainable(Var),
}

impl Param {
    /// Wraps `t` as trainable or frozen.
    pub fn new(t: Tensor, trainable: bool) -> candle_core::Result<Self> {
        Ok(if trainable {
            Param::Trainable(Var::from_tensor(&t)?)
        } else {
            Param::Frozen(t.detach())
        })
    }

    /// The tensor (for a `Var`, the tensor it updates in place).
    pub fn tensor(&self) -> &Tensor {
        match self {
            Param::Frozen(t) => t,
            Param::Trainable(v) => v.as_tensor(),
        }
    }

    /// The tensor for a forward pass: [`Param::tensor`], detached inside [`no_grad`] (a
    /// cheap handle on the same storage).
    pub fn get(&self) -> Tensor {
        match self {
            Param::Trainable(v) if grad_disabled() => v.as_tensor().detach(),
            p => p.tensor().clone(),
        }
    }

    /// Whether the optimizer updates this parameter.
    pub fn is_trainable(&self) -> bool {
        matches!(self, Param::Trainable(_))
    }

    /// The `Var`, for a trainable parameter.
    pub fn var(&self) -> Option<&Var> {
        match self {
            Param::Frozen(_) => None,
            Param::Trainable(v) => Some(v),
        }
    }

    /// Number of scalars.
    pub fn elem_count(&self) -> usize {
        self.tensor().elem_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Inside `no_grad` a trainable parameter takes no part in backprop (no graph is kept);
    /// outside it does, and the flag is back after `no_grad` returns.
    #[test]
    fn no_grad_records_no_graph_and_restores_the_flag() {
        let dev = Device::Cpu;
        let w = Param::new(Tensor::new(&[1f32, 2.0, 3.0], &dev).unwrap(), true).unwrap();
        let x = Tensor::new(&[4f32, 5.0, 6.0], &dev).unwrap();
        let loss = |p: &Param| (p.get() * &x).unwrap().sum_all().unwrap();
        let tracked = loss(&w);
        let g = tracked.backward().unwrap();
        let got = g.get(w.tensor()).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(got, vec![4.0, 5.0, 6.0]);
        let untracked = no_grad(|| {
            assert!(grad_disabled());
            loss(&w)
        });
        assert!(!grad_disabled());
        assert!(!untracked.track_op());
        assert_eq!(
            untracked.to_scalar::<f32>().unwrap(),
            tracked.to_scalar::<f32>().unwrap()
        );
        let g = untracked.backward().unwrap();
        assert!(g.get(w.tensor()).is_none());
        // A frozen parameter is never tracked, inside or out.
        let f = Param::new(Tensor::new(&[1f32], &dev).unwrap(), false).unwrap();
        assert!(!f.get().track_op());
    }
}

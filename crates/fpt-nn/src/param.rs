//! A model parameter is either frozen (a plain tensor) or trainable (a `Var`).

use candle_core::{Tensor, Var};

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

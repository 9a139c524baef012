//! Layers over [`Param`]s: each picks the op that computes no gradient for what is frozen.

use crate::{ops, Param};

use candle_core::{Result, Tensor};

/// `y = x W^T + b`, `W: [out, in]`.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Param,
    /// `[out]`.
    pub bias: Option<Param>,
}

impl Linear {
    /// A linear layer from its parameters.
    pub fn new(weight: Param, bias: Option<Param>) -> Self {
        Self { weight, bias }
    }

    /// Applies the layer to `x: [.., in]`. The op computes gradients only for what takes
    /// part in backprop: a frozen weight gets none.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::linear(x, self.weight.tensor(), self.bias.as_ref().map(|b| b.tensor()))
    }
}

/// LayerNorm over the last dimension.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// Scale, `[d]`.
    pub weight: Param,
    /// Shift, `[d]`.
    pub bias: Param,
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// Applies the norm.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::layer_norm(x, self.weight.tensor(), self.bias.tensor(), self.eps)
    }
}

/// A lookup table `[vocab, d]`.
#[derive(Debug, Clone)]
pub struct Embedding {
    /// `[vocab, d]`.
    pub weight: Param,
}

impl Embedding {
    /// Looks up `ids: [b, t]` (u32) -> `[b, t, d]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let d = self.weight.tensor().dim(1)?;
        self.weight
            .tensor()
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, d))
    }
}

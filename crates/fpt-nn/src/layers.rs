//! Layers over [`Param`]s: each picks the op that computes no gradient for what is frozen.

use crate::{ops, Param};

use crate::ops::sgemm::{MatRef, PackedB};
use candle_core::{DType, Result, Tensor, TensorId};
use std::sync::{Arc, Mutex};

/// A frozen weight packed for the forward product, with the id of the tensor it was
/// packed from (so a replaced weight is packed again, never read stale).
type PackCache = Arc<Mutex<Option<(TensorId, Arc<PackedB>)>>>;

/// `y = x W^T + b`, `W: [out, in]`.
///
/// On CPUs with AVX-512, a frozen f32 weight is packed for the forward product at the first
/// forward and kept (one more copy of the weight in memory; clones of the layer share it),
/// so the steps after the first skip re-packing it.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Param,
    /// `[out]`.
    pub bias: Option<Param>,
    packed: PackCache,
}

impl Linear {
    /// A linear layer from its parameters.
    pub fn new(weight: Param, bias: Option<Param>) -> Self {
        Self {
            weight,
            bias,
            packed: Arc::default(),
        }
    }

    /// Applies the layer to `x: [.., in]`. The op computes gradients only for what takes
    /// part in backprop: a frozen weight gets none.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let w = self.weight.tensor();
        let packed = if !self.weight.is_trainable()
            && x.dtype() == DType::F32
            && w.dtype() == DType::F32
            && x.device().is_cpu()
            && w.device().is_cpu()
            && crate::ops::sgemm::has_avx512()
        {
            Some(self.packed_weight(w)?)
        } else {
            None
        };
        ops::linear_prepacked(x, w, self.bias.as_ref().map(|b| b.tensor()), packed)
    }

    fn packed_weight(&self, w: &Tensor) -> Result<Arc<PackedB>> {
        let mut cache = self.packed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((id, p)) = cache.as_ref() {
            if *id == w.id() {
                return Ok(p.clone());
            }
        }
        let (n, k) = w.dims2()?;
        let id = w.id();
        let w = w.contiguous()?;
        let (storage, layout) = w.storage_and_layout();
        let ws: &[f32] = match &*storage {
            candle_core::Storage::Cpu(cs) => {
                let data = cs.as_slice::<f32>()?;
                let (a, b) = layout
                    .contiguous_offsets()
                    .ok_or_else(|| candle_core::Error::Msg("linear: weight is not contiguous".into()))?;
                &data[a..b]
            }
            _ => candle_core::bail!("linear: expected a CPU weight"),
        };
        // B = W^T: element (p, j) = w[j * k + p] -> row stride 1, column stride k.
        let p = Arc::new(PackedB::new(MatRef::new(ws.as_ptr(), 1, k), k, n, crate::num_threads()));
        *cache = Some((id, p.clone()));
        Ok(p)
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

//! Cross-entropy from logits, composed of candle ops (all with backward).

use candle_core::{Result, Tensor, D};

/// Mean cross-entropy of `logits: [n, classes]` against `targets: [n]` (u32), as PyTorch's
/// `nn.CrossEntropyLoss` with mean reduction.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?; // [n, 1]
    let picked = shifted.gather(&targets.unsqueeze(1)?, 1)?; // [n, 1]
    (lse - picked)?.mean_all()
}

/// Number of rows whose arg-max equals the target.
pub fn correct(logits: &Tensor, targets: &Tensor) -> Result<usize> {
    let pred = logits.argmax(D::Minus1)?;
    Ok(pred.eq(targets)?.to_dtype(candle_core::DType::U32)?.sum_all()?.to_scalar::<u32>()? as usize)
}

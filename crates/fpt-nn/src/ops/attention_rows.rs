//! Attention's softmax with the dropout on its probabilities in one pass over the scores,
//! and the scores' gradient through both in one more: what the recomputing node
//! ([`super::attention_recomputed`], the GPU's attention) runs for f32.
//!
//! Composed, the node's backward passed over each `[b, heads, t, t]` matrix fourteen times:
//! the softmax recomputed (read, write), the dropout on it (read, write), the dropout on
//! dP (read, write) and the softmax's backward, a row reduction then a product (three); a
//! 2 x 1024-token GPT-2 step spent some 6 ms in those kernels on an H200
//! (bench/HISTORY.md). Here the backward keeps each row's log-sum-exp from its softmax
//! pass and takes `D_i = sum_j P'_ij dP_ij` from the forward's output row instead
//! (`= dO_i . O_i`, since `O = P' V` and `dP = dO V^T`), so the scores' gradient is one
//! pass with no row reduction: `dS_ij = scale * P_ij * (M_ij dP_ij - D_i)`, `P_ij =
//! exp(scale S_ij - lse_i)` recomputed where it is used. The forward's values are the
//! composed ops' to the last bit on both devices (the softmax's pass 3 and the dropout's
//! product, rounded as before, in one loop).
//!
//! The kernels are `kernels/fpt_ops.h`'s `fpt_softmax_lane_finish_drop` and
//! `fpt_attn_ds_lane` (one warp per row; `host_grid.rs` runs them here against the CPU
//! twins below); the first, without dropout, is also [`super::masked_softmax`]'s on a GPU.

use super::dropout::{mask_params, DropoutMul};
use super::{cpu_slice, f32_only, AttentionSpec, Mask};
use candle_core::{CpuStorage, CustomOp1, CustomOp3, Layout, Result, Shape, Tensor};

/// The softmax and dropout of one attention call, over `[.., tq, tk]` scores whose dropout
/// mask has one block of `block` elements per (example, head) matrix.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowSoftmax {
    pub(crate) scale: f64,
    pub(crate) mask: Mask,
    pub(crate) dropout: Option<(f64, u64)>,
    pub(crate) block: usize,
}

impl RowSoftmax {
    /// The softmax of a self-attention over `t` positions.
    pub(crate) fn of(spec: &AttentionSpec, t: usize) -> Self {
        RowSoftmax {
            scale: spec.scale,
            mask: spec.mask,
            dropout: spec.dropout,
            block: (t * t).max(1),
        }
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    /// The mask as the kernels take it ([`Mask::kernel_kind`]).
    pub(crate) fn kind_band(&self) -> (i32, usize) {
        self.mask.kernel_kind()
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    /// The dropout's threshold and multiplier as the kernels take them; `(0, 1)`: none.
    pub(crate) fn thr_keep(&self) -> (i32, f32) {
        self.dropout.map_or((0, 1.0), |(p, _)| mask_params(p))
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    /// The dropout's seed (0 without dropout, which the kernels never read).
    pub(crate) fn seed(&self) -> u64 {
        self.dropout.map_or(0, |(_, s)| s)
    }

    /// `(tq, tk, rows)` of scores of `shape`, or the error: rows must not straddle the
    /// mask's blocks (the kernels draw a block's key once per row).
    fn geometry(&self, shape: &Shape) -> Result<(usize, usize, usize)> {
        let d = shape.dims();
        if d.len() < 2 {
            candle_core::bail!("attention softmax: scores of shape {shape:?}, expected [.., tq, tk]")
        }
        let (tq, tk) = (d[d.len() - 2], d[d.len() - 1].max(1));
        if self.dropout.is_some() && !self.block.is_multiple_of(tk) {
            candle_core::bail!(
                "attention softmax: mask blocks of {} elements split rows of {tk} keys",
                self.block
            )
        }
        Ok((tq, tk, shape.elem_count() / tk))
    }
}

/// One row's log-sum-exp of `scale * s` over the visible keys `lo..hi`.
fn row_lse(s: &[f32], lo: usize, hi: usize, scale: f32) -> f32 {
    let m = s[lo..hi].iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v * scale));
    let sum: f32 = s[lo..hi].iter().map(|&v| (v * scale - m).exp()).sum();
    m + sum.ln()
}

struct SoftmaxDrop {
    rs: RowSoftmax,
    lse: bool,
}

impl CustomOp1 for SoftmaxDrop {
    fn name(&self) -> &'static str {
        "fpt-attention-softmax-dropout"
    }

    /// The probabilities as [`super::masked_softmax`] then the dropout op give them, bit for
    /// bit, then each row's log-sum-exp when asked: `[n + rows]` (or `[n]`).
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        f32_only(&[s], "attention softmax")?;
        let (tq, tk, _) = self.rs.geometry(l.shape())?;
        let sv = cpu_slice::<f32>(s, l, "attention softmax")?;
        let y = super::softmax::fwd_kernel(sv, tq, tk, self.rs.scale, self.rs.mask);
        let mut out = match self.rs.dropout {
            Some((p, seed)) => DropoutMul {
                p,
                seed,
                block: self.rs.block,
            }
            .host(&y),
            None => y,
        };
        if self.lse {
            let scale = self.rs.scale as f32;
            for (r, sr) in sv.chunks(tk).enumerate() {
                let (lo, hi) = self.rs.mask.range(r, tq, tk);
                out.push(row_lse(sr, lo, hi, scale));
            }
        }
        let n = out.len();
        Ok((CpuStorage::F32(out), Shape::from(n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        let (tq, tk, rows) = self.rs.geometry(l.shape())?;
        let n = rows * tk + if self.lse { rows } else { 0 };
        let out = crate::cuda::attn_rows::softmax_drop(s, l, &self.rs, tq, tk, self.lse)?;
        Ok((out, Shape::from(n)))
    }
}

/// `softmax(scale * s)` over the keys `rs.mask` leaves visible, times the dropout mask of
/// `rs` (the values of [`super::masked_softmax`] then the dropout op, to the last bit), for
/// f32 scores `[.., tq, tk]` on the CPU or a GPU; with `lse`, also each row's log-sum-exp
/// of `scale * s`, `[rows]`. Not differentiated: the recomputing node's own passes.
pub(crate) fn softmax_dropout(s: &Tensor, rs: RowSoftmax, lse: bool) -> Result<(Tensor, Option<Tensor>)> {
    let s = s.contiguous()?;
    let (_, tk, rows) = rs.geometry(s.shape())?;
    let out = s.apply_op1_no_bwd(&SoftmaxDrop { rs, lse })?;
    let n = rows * tk;
    let probs = out.narrow(0, 0, n)?.reshape(s.shape())?;
    let lse = lse.then(|| out.narrow(0, n, rows)).transpose()?;
    Ok((probs, lse))
}

struct ScoresGrad {
    rs: RowSoftmax,
}

impl CustomOp3 for ScoresGrad {
    fn name(&self) -> &'static str {
        "fpt-attention-scores-grad"
    }

    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        ls: &Layout,
        dp: &CpuStorage,
        ldp: &Layout,
        stats: &CpuStorage,
        lst: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        f32_only(&[s, dp, stats], "attention scores' gradient")?;
        let (tq, tk, rows) = self.rs.geometry(ls.shape())?;
        let what = "attention scores' gradient";
        let (s, dp, stats) = (
            cpu_slice::<f32>(s, ls, what)?,
            cpu_slice::<f32>(dp, ldp, what)?,
            cpu_slice::<f32>(stats, lst, what)?,
        );
        if dp.len() != s.len() || stats.len() != 2 * rows {
            candle_core::bail!(
                "{what}: {} scores, {} gradients and {} row values for {rows} rows",
                s.len(),
                dp.len(),
                stats.len()
            )
        }
        let (lse, dd) = stats.split_at(rows);
        let mult = match self.rs.dropout {
            Some((p, seed)) => super::dropout::mask_values(s.len(), self.rs.block, p, seed),
            None => vec![1.0; s.len()],
        };
        let scale = self.rs.scale as f32;
        let mut ds = vec![0f32; s.len()];
        for r in 0..rows {
            let (lo, hi) = self.rs.mask.range(r, tq, tk);
            for j in lo..hi {
                let i = r * tk + j;
                ds[i] = scale * (s[i] * scale - lse[r]).exp() * (dp[i] * mult[i] - dd[r]);
            }
        }
        Ok((CpuStorage::F32(ds), ls.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        ls: &Layout,
        dp: &candle_core::CudaStorage,
        ldp: &Layout,
        stats: &candle_core::CudaStorage,
        lst: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (tq, tk, rows) = self.rs.geometry(ls.shape())?;
        if ldp.shape().elem_count() != rows * tk || lst.shape().elem_count() != 2 * rows {
            candle_core::bail!(
                "attention scores' gradient: operands of {:?}, {:?} for {rows} rows",
                ldp.shape(),
                lst.shape()
            )
        }
        let ds = crate::cuda::attn_rows::scores_grad((s, ls), (dp, ldp), (stats, lst), &self.rs, tq, tk)?;
        Ok((ds, ls.shape().clone()))
    }
}

/// The gradient of the scores `s` (`[.., tq, tk]`, f32) of [`softmax_dropout`] from the
/// gradient `dp` of its dropped probabilities, each row's log-sum-exp `lse` and
/// `dd = sum_j P'_j dp_j` (`[rows]` each): `scale * P * (M dp - dd)`, `P` recomputed from
/// `lse`, 0 on the hidden keys.
pub(crate) fn scores_grad(s: &Tensor, dp: &Tensor, lse: &Tensor, dd: &Tensor, rs: RowSoftmax) -> Result<Tensor> {
    let stats = Tensor::cat(&[lse.flatten_all()?, dd.flatten_all()?], 0)?;
    s.contiguous()?
        .apply_op3_no_bwd(&dp.contiguous()?, &stats, &ScoresGrad { rs })
}

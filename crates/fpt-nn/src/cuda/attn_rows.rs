//! Attention's softmax with its dropout, and the scores' gradient through both
//! (`fpt_softmax_drop_f32`, `fpt_attn_ds_f32`: one warp per row); the ops around them are
//! `ops/attention_rows.rs`.

use super::{f32_view, output, per_row, with_seed_at, WrapErr, MODULE, PTX};
use crate::ops::attention_rows::RowSoftmax;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::{CudaStorage, Layout, Result};

/// Runs `launch` with the address of the dropout seed's slot when a replayed step holds it
/// (null otherwise, and without dropout, where the kernels never read the seed).
fn with_dropout_seed<R>(rs: &RowSoftmax, launch: impl FnOnce(u64) -> Result<R>) -> Result<R> {
    match rs.dropout {
        Some((_, seed)) => with_seed_at(seed, launch),
        None => launch(0),
    }
}

/// The probabilities (softmax then dropout) of scores `s` (`rows = n / tk` rows of `tk`,
/// `tq` queries a matrix), followed, when `lse`, by each row's log-sum-exp: `n` or
/// `n + rows` values.
pub(crate) fn softmax_drop(
    s: &CudaStorage,
    l: &Layout,
    rs: &RowSoftmax,
    tq: usize,
    tk: usize,
    lse: bool,
) -> Result<CudaStorage> {
    let dev = s.device().clone();
    let sv = f32_view(s, l, "attention softmax")?;
    let n = l.shape().elem_count();
    let rows = n / tk.max(1);
    let out = output(&dev, n + if lse { rows } else { 0 })?;
    let f = func!(dev, "fpt_softmax_drop_f32")?;
    let (kind, band) = rs.kind_band();
    let (thr, keep) = rs.thr_keep();
    let (rows64, tq64, tk64, band64) = (rows as u64, tq as i64, tk as i64, band as i64);
    let (scale, seed, block) = (rs.scale as f32, rs.seed(), rs.block as u64);
    let launch = |seed_at: u64| {
        let y = out.slice(0..n);
        // The row values follow the probabilities; a null pointer when none are wanted.
        let lse_at = lse.then(|| out.slice(n..n + rows));
        let null = 0u64;
        let mut b = f.builder();
        b.arg(&sv).arg(&y);
        match &lse_at {
            Some(v) => b.arg(v),
            None => b.arg(&null),
        };
        b.arg(&rows64)
            .arg(&tq64)
            .arg(&tk64)
            .arg(&scale)
            .arg(&kind)
            .arg(&band64)
            .arg(&seed)
            .arg(&block)
            .arg(&thr)
            .arg(&keep)
            .arg(&seed_at);
        // SAFETY: s and the output's first n values hold rows * tk elements, its last rows
        // values (when lse) one per row; seed_at is null or a live slot's address
        // (`with_seed_at`); with dropout, block is a multiple of tk (RowSoftmax::geometry),
        // and without it (thr 0) the kernel never reads the mask.
        unsafe { b.launch(per_row(rows)) }.w()
    };
    with_dropout_seed(rs, launch)?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// The scores' gradient `scale * P * (M dp - dd)` from the scores, the dropped
/// probabilities' gradient and `stats`: each row's log-sum-exp, then each row's `dd`.
pub(crate) fn scores_grad(
    s: (&CudaStorage, &Layout),
    dp: (&CudaStorage, &Layout),
    stats: (&CudaStorage, &Layout),
    rs: &RowSoftmax,
    tq: usize,
    tk: usize,
) -> Result<CudaStorage> {
    let what = "attention scores' gradient";
    let dev = s.0.device().clone();
    let (sv, dpv, st) = (
        f32_view(s.0, s.1, what)?,
        f32_view(dp.0, dp.1, what)?,
        f32_view(stats.0, stats.1, what)?,
    );
    let n = s.1.shape().elem_count();
    let rows = n / tk.max(1);
    let out = output(&dev, n)?;
    let f = func!(dev, "fpt_attn_ds_f32")?;
    let (kind, band) = rs.kind_band();
    let (thr, keep) = rs.thr_keep();
    let (rows64, tq64, tk64, band64) = (rows as u64, tq as i64, tk as i64, band as i64);
    let (scale, seed, block) = (rs.scale as f32, rs.seed(), rs.block as u64);
    let (lse, dd) = (st.slice(0..rows), st.slice(rows..2 * rows));
    let launch = |seed_at: u64| {
        let mut b = f.builder();
        b.arg(&sv)
            .arg(&dpv)
            .arg(&lse)
            .arg(&dd)
            .arg(&out)
            .arg(&rows64)
            .arg(&tq64)
            .arg(&tk64)
            .arg(&scale)
            .arg(&kind)
            .arg(&band64)
            .arg(&seed)
            .arg(&block)
            .arg(&thr)
            .arg(&keep)
            .arg(&seed_at);
        // SAFETY: s, dp and out hold rows * tk elements, stats 2 * rows (checked by the
        // op); seed_at is null or a live slot's address; block is a multiple of tk.
        unsafe { b.launch(per_row(rows)) }.w()
    };
    with_dropout_seed(rs, launch)?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

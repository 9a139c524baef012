//! The layer-norm LSTM's two kernels (`kernels/fpt_lstm.h`, `fpt_kernels.cu`): one block
//! of 256 lanes per batch row, the row's whole recurrence in one launch each way; the op
//! around them is `ops/lstm_grid.rs`.

use super::{f32_view, output, WrapErr, MODULE, PTX};
use crate::ops::lstm_grid::{Dims, OutDrop, THREADS};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, LaunchArgs, LaunchConfig, PushKernelArg};
use candle_core::{CudaStorage, DType, Layout, Result, Storage, Tensor};

const WHAT: &str = "layer-norm LSTM (grid)";

/// A storage and its layout on a GPU.
type On<'a> = (&'a CudaStorage, &'a Layout);

/// `f` of the GPU storages of up to four held tensors (read-locked while it runs); an
/// error naming the op when one is elsewhere.
pub(crate) fn with_storages<R>(
    ts: [Option<&Tensor>; 4],
    f: impl FnOnce([Option<On<'_>>; 4]) -> Result<R>,
) -> Result<R> {
    let guards: Vec<_> = ts.iter().map(|t| t.map(|t| t.storage_and_layout())).collect();
    let mut views: [Option<On<'_>>; 4] = [None; 4];
    for (v, g) in views.iter_mut().zip(&guards) {
        if let Some((st, l)) = g {
            match &**st {
                Storage::Cuda(c) => *v = Some((c, *l)),
                _ => candle_core::bail!("{WHAT}: a held operand is not on the GPU the op runs on"),
            }
        }
    }
    f(views)
}

/// A view of `n` f32 values, or the error naming `what` and the lengths.
fn view_of<'a>(s: On<'a>, n: usize, what: &str) -> Result<CudaView<'a, f32>> {
    let v = f32_view(s.0, s.1, WHAT)?;
    if v.len() != n {
        candle_core::bail!("{WHAT}: the {what} holds {} values, not {n}", v.len())
    }
    Ok(v)
}

/// The kernels' five dropout arguments: the masks' view ([T, B, H]) or null, the seeds'
/// view ([T], i64 holding the u64 seeds' bits) or null, and block, thr, keep.
struct DropArgs<'a> {
    masks: Option<CudaView<'a, f32>>,
    seeds: Option<CudaView<'a, i64>>,
    params: (u64, i32, f32),
    null: u64,
}

impl<'a> DropArgs<'a> {
    /// Pushes the five arguments, in the kernels' order.
    fn push<'b>(&'b self, l: &mut LaunchArgs<'b>) {
        match &self.masks {
            Some(m) => l.arg(m),
            None => l.arg(&self.null),
        };
        match &self.seeds {
            Some(v) => l.arg(v),
            None => l.arg(&self.null),
        };
        l.arg(&self.params.0).arg(&self.params.1).arg(&self.params.2);
    }
}

fn drop_args<'a>((drop, on): (&OutDrop, Option<On<'a>>), d: Dims) -> Result<DropArgs<'a>> {
    let params = drop.params();
    let (masks, seeds) = match (drop, on) {
        (OutDrop::None, _) => (None, None),
        (OutDrop::Masks(_), Some(m)) => (Some(view_of(m, d.t * d.b * d.h, "dropout masks")?), None),
        (OutDrop::Seeded { .. }, Some((s, l))) => {
            if s.dtype() != DType::I64 {
                candle_core::bail!("{WHAT}: the dropout seeds are {:?}, not i64", s.dtype())
            }
            let (a, b) = l
                .contiguous_offsets()
                .ok_or_else(|| candle_core::Error::Msg(format!("{WHAT}: the dropout seeds are not contiguous")))?;
            if b - a != d.t {
                candle_core::bail!("{WHAT}: {} dropout seeds for {} steps", b - a, d.t)
            }
            (None, Some(s.as_cuda_slice::<i64>()?.slice(a..b)))
        }
        _ => candle_core::bail!("{WHAT}: the dropout's tensor is not on the GPU"),
    };
    Ok(DropArgs {
        masks,
        seeds,
        params,
        null: 0,
    })
}

/// One block per row (grid-stride past 65,535 rows), the rows of `fpt_lstm.h` shared.
fn per_batch_row(d: Dims) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (d.b.clamp(1, 65_535) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: d.shared_bytes() as u32,
    }
}

/// The forward: `y` [B, T, H] and what backward reads (`Dims::saved` floats).
pub(crate) fn lstm_fwd(
    [xi, wb, ln]: [On<'_>; 3],
    [wt, h0, c0]: [On<'_>; 3],
    drop: (&OutDrop, Option<On<'_>>),
    d: Dims,
    eps: f32,
) -> Result<(CudaStorage, CudaSlice<f32>)> {
    let Dims { b, t, h } = d;
    let dev = xi.0.device().clone();
    let xv = view_of(xi, b * t * 4 * h, "input map")?;
    let wbv = view_of(wb, 4 * h * (h + 1), "[W_hh | b_hh]")?;
    let lnv = view_of(ln, 10 * h, "norms")?;
    let wtv = view_of(wt, 4 * h * h, "W_hh^T")?;
    let (h0v, c0v) = (
        view_of(h0, b * h, "initial state")?,
        view_of(c0, b * h, "initial cell")?,
    );
    let da = drop_args(drop, d)?;
    let y = output(&dev, b * t * h)?;
    let saved = output(&dev, d.saved())?;
    let f = func!(dev, "fpt_lstm_fwd_f32")?;
    let (b64, t64, h64) = (b as i64, t as i64, h as i64);
    let mut l = f.builder();
    l.arg(&xv).arg(&wtv).arg(&wbv).arg(&lnv).arg(&h0v).arg(&c0v);
    da.push(&mut l);
    l.arg(&y).arg(&saved).arg(&b64).arg(&t64).arg(&h64).arg(&eps);
    // SAFETY: every input view holds the length checked above (xi B T 4H, W_hh^T H 4H,
    // [W_hh | b_hh] 4H (H + 1), the norms 10H, h0 and c0 B H, the masks T B H or null, the
    // seeds T or null);
    // y holds B T H and saved T B (12H + 2), fpt_lstm_saved_at's extent; the shared memory
    // asked for is the kernel's 7H + 32 floats (at most 48 KiB, ops/lstm_grid.rs checks).
    unsafe { l.launch(per_batch_row(d)) }.w()?;
    Ok((CudaStorage::wrap_cuda_slice(y, dev), saved))
}

/// The backward through time: the packed result of `Dims::packed` (dxi, the rows' parts,
/// and when `want_w` each step's dr and the states it multiplied).
pub(crate) fn lstm_bwd(
    [dy, wb, ln]: [On<'_>; 3],
    drop: (&OutDrop, Option<On<'_>>),
    saved: &CudaSlice<f32>,
    d: Dims,
    want_w: bool,
) -> Result<CudaStorage> {
    let Dims { b, t, h } = d;
    let dev = dy.0.device().clone();
    let dyv = view_of(dy, b * t * h, "output gradient")?;
    let wbv = view_of(wb, 4 * h * (h + 1), "[W_hh | b_hh]")?;
    let lnv = view_of(ln, 10 * h, "norms")?;
    let da = drop_args(drop, d)?;
    if saved.len() != d.saved() {
        candle_core::bail!("{WHAT}: the kept values do not fit [{b}, {t}, {h}]")
    }
    let (n_dxi, n_part) = (b * t * 4 * h, b * 14 * h);
    let (n_dr, n_h) = if want_w { (t * b * 4 * h, t * b * h) } else { (0, 0) };
    let out = output(&dev, n_dxi + n_part + n_dr + n_h)?;
    let dxi = out.slice(..n_dxi);
    let part = out.slice(n_dxi..n_dxi + n_part);
    let dr = out.slice(n_dxi + n_part..n_dxi + n_part + n_dr);
    let hout = out.slice(n_dxi + n_part + n_dr..);
    let f = func!(dev, "fpt_lstm_bwd_f32")?;
    let (b64, t64, h64, null) = (b as i64, t as i64, h as i64, 0u64);
    {
        let mut l = f.builder();
        l.arg(&dyv).arg(&wbv).arg(&lnv);
        da.push(&mut l);
        l.arg(saved).arg(&dxi).arg(&part);
        if want_w {
            l.arg(&dr).arg(&hout);
        } else {
            l.arg(&null).arg(&null);
        }
        l.arg(&b64).arg(&t64).arg(&h64);
        // SAFETY: dy holds B T H, [W_hh | b_hh] 4H (H + 1), the norms 10H, the masks T B H or
        // null, the seeds T or null, saved T B (12H + 2) (all checked); the output's four disjoint slices hold dxi
        // B T 4H, the parts B 14H, and dr T B 4H and the states T B H when W_hh trains (null
        // pointers otherwise, which the kernel never writes through); every output element is
        // written (the parts are zeroed by the kernel first); shared memory as the forward's.
        unsafe { l.launch(per_batch_row(d)) }.w()?;
    }
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

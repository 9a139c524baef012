//! The layer-norm LSTM's recurrence as `kernels/fpt_lstm.h`'s kernels: one block of 256
//! lanes per batch row runs that row's whole recurrence, step after step (a row's steps
//! depend on nothing else), so a layer is one launch forward and one backward, where the
//! composed ops launch some 20 kernels a step forward, more backward (an LSTM over
//! ListOps' 512 tokens: tens of thousands a training step). The arithmetic is [`super::lstm`]'s; forward keeps what
//! the CPU's fused op keeps, backward runs through time from the last step and leaves each
//! row's parts of the norms' and `b_hh`'s gradients (summed over rows here) and, when
//! `W_hh` trains, each step's `dr` for one product `dr^T h` at the end.
//!
//! On a GPU the CUDA kernels (`fpt_kernels.cu`, launched by `cuda/lstm.rs`); on the CPU the
//! same bodies over the host grid (`host_grid.c`), one thread: a reference that checks the
//! kernels' indexing and numbers in `cargo test` and that `FPT_LSTM=grid` runs whole
//! trainings through, not the CPU's fast path (the fused op of `lstm.rs` is).

use super::lstm::LnLstmParams;
use super::{cpu_slice, tracks};
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};
use std::sync::{Arc, Mutex};

extern "C" {
    fn fpt_host_lstm_fwd_f32(
        xi: *const f32,
        wt: *const f32,
        wb: *const f32,
        ln: *const f32,
        h0: *const f32,
        c0: *const f32,
        masks: *const f32,
        seeds: *const u64,
        block: u64,
        thr: i32,
        keep: f32,
        y: *mut f32,
        saved: *mut f32,
        batch: i64,
        t: i64,
        hs: i64,
        eps: f32,
    ) -> i32;
    fn fpt_host_lstm_bwd_f32(
        dy: *const f32,
        wb: *const f32,
        ln: *const f32,
        masks: *const f32,
        seeds: *const u64,
        block: u64,
        thr: i32,
        keep: f32,
        saved: *const f32,
        dxi: *mut f32,
        part: *mut f32,
        dr: *mut f32,
        hout: *mut f32,
        batch: i64,
        t: i64,
        hs: i64,
    ) -> i32;
}

/// The lanes of a block (`FPT_LSTM_THREADS` in `fpt_lstm.h`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) const THREADS: u32 = 256;

/// A layer's sizes: batch, steps, hidden.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub b: usize,
    pub t: usize,
    pub h: usize,
}

impl Dims {
    /// Floats forward keeps for backward (`fpt_lstm_saved_at`).
    pub fn saved(&self) -> usize {
        self.t * self.b * (12 * self.h + 2)
    }

    /// Shared memory a block takes: seven rows of H and a float per warp.
    pub fn shared_bytes(&self) -> usize {
        (7 * self.h + 32) * 4
    }

    /// The backward's packed result: `dxi`, the rows' parts, then (W_hh training) `dr` and
    /// the states it multiplied.
    fn packed(&self, want_w: bool) -> [usize; 4] {
        let (b, t, h) = (self.b, self.t, self.h);
        let w = if want_w { 1 } else { 0 };
        [b * t * 4 * h, b * 14 * h, w * t * b * 4 * h, w * t * b * h]
    }
}

/// What forward kept, where it ran.
enum Kept {
    Cpu(Vec<f32>),
    #[cfg(feature = "cuda")]
    Cuda(candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>),
}

type Saved = Arc<Mutex<Option<Kept>>>;

/// A layer's dropout on its outputs, as the kernels take it.
pub(crate) enum OutDrop {
    None,
    /// `[T, B, H]` multipliers.
    Masks(Tensor),
    /// Each step's seed (its `B H` multipliers drawn by the kernels as
    /// [`super::dropout_mask_values`] draws them): on the host and, `[T]` i64 bit for bit,
    /// where the op runs.
    Seeded {
        seeds: Vec<u64>,
        on_device: Tensor,
        thr: i32,
        keep: f32,
    },
}

impl OutDrop {
    /// The kernels' `(block, thr, keep)` (unused without seeds).
    pub(crate) fn params(&self) -> (u64, i32, f32) {
        match self {
            OutDrop::Seeded { thr, keep, .. } => (super::dropout::CHUNK as u64, *thr, *keep),
            _ => (0, 0, 1.0),
        }
    }

    /// The tensor a GPU reads: the masks or the seeds.
    fn tensor(&self) -> Option<&Tensor> {
        match self {
            OutDrop::None => None,
            OutDrop::Masks(m) => Some(m),
            OutDrop::Seeded { on_device, .. } => Some(on_device),
        }
    }
}

/// The operands the op holds beside its three (constants of the graph).
struct Held {
    /// `W_hh^T`, `[H, 4H]` contiguous.
    wt: Tensor,
    h0: Tensor,
    c0: Tensor,
    drop: OutDrop,
}

/// A dropout as the host grid takes it: the masks' values or the seeds (each where given).
type HostDrop<'a> = (Option<Vec<f32>>, Option<&'a [u64]>);

impl Held {
    /// The host's masks and seeds (each where given) for the host grid, checked against `d`.
    fn host_drop(&self, d: Dims) -> Result<HostDrop<'_>> {
        match &self.drop {
            OutDrop::None => Ok((None, None)),
            OutDrop::Masks(m) => {
                let v = host_values(m, "dropout masks")?;
                if v.len() != d.t * d.b * d.h {
                    candle_core::bail!(
                        "layer-norm LSTM (grid): {} dropout multipliers for [{}, {}, {}]",
                        v.len(),
                        d.t,
                        d.b,
                        d.h
                    )
                }
                Ok((Some(v), None))
            }
            OutDrop::Seeded { seeds, .. } => {
                if seeds.len() != d.t {
                    candle_core::bail!(
                        "layer-norm LSTM (grid): {} dropout seeds for {} steps",
                        seeds.len(),
                        d.t
                    )
                }
                Ok((None, Some(seeds)))
            }
        }
    }
}

struct LstmGrid {
    d: Dims,
    eps: f32,
    held: Arc<Held>,
    saved: Saved,
}

/// A contiguous CPU tensor's f32 values, or the error naming what it is.
fn host_values(t: &Tensor, what: &str) -> Result<Vec<f32>> {
    if !t.device().is_cpu() {
        candle_core::bail!(
            "layer-norm LSTM (grid): the {what} is on {:?}, the op on the CPU",
            t.device()
        )
    }
    crate::transfer::download_vec::<f32>(t)
}

impl super::ThreeOperands for LstmGrid {
    fn name(&self) -> &'static str {
        "fpt-ln-lstm-grid"
    }

    fn forward_cpu(&self, [(s1, l1), (s2, l2), (s3, l3)]: [(&CpuStorage, &Layout); 3]) -> Result<(CpuStorage, Shape)> {
        super::f32_only(&[s1, s2, s3], "layer-norm LSTM (grid)")?;
        let Dims { b, t, h } = self.d;
        let (xi, wb, ln) = (
            cpu_slice::<f32>(s1, l1, "layer-norm LSTM (grid)")?,
            cpu_slice::<f32>(s2, l2, "layer-norm LSTM (grid)")?,
            cpu_slice::<f32>(s3, l3, "layer-norm LSTM (grid)")?,
        );
        let hd = &self.held;
        let wt = host_values(&hd.wt, "recurrent weight")?;
        let (h0, c0) = (
            host_values(&hd.h0, "initial state")?,
            host_values(&hd.c0, "initial cell")?,
        );
        let (masks, seeds) = hd.host_drop(self.d)?;
        let (block, thr, keep) = hd.drop.params();
        let ok = xi.len() == b * t * 4 * h
            && wb.len() == 4 * h * (h + 1)
            && ln.len() == 10 * h
            && wt.len() == 4 * h * h
            && h0.len() == b * h
            && c0.len() == b * h;
        if !ok {
            candle_core::bail!("layer-norm LSTM (grid): operands do not fit [{b}, {t}, {}]", 4 * h)
        }
        let mut y = vec![0f32; b * t * h];
        let mut saved = vec![0f32; self.d.saved()];
        let mp = masks.as_ref().map_or(std::ptr::null(), |m| m.as_ptr());
        let sp = seeds.map_or(std::ptr::null(), |v| v.as_ptr());
        // SAFETY: every pointer is a live buffer of the length checked above (xi B T 4H,
        // wt H 4H, wb 4H (H + 1), ln 10H, h0 and c0 B H; masks T B H or null, seeds T or
        // null, host_drop checked), y holds
        // B T H and saved T B (12H + 2) (fpt_lstm_saved_at's extent); the outputs are
        // distinct &mut buffers; the function is single-threaded and keeps no pointer.
        let rc = unsafe {
            fpt_host_lstm_fwd_f32(
                xi.as_ptr(),
                wt.as_ptr(),
                wb.as_ptr(),
                ln.as_ptr(),
                h0.as_ptr(),
                c0.as_ptr(),
                mp,
                sp,
                block,
                thr,
                keep,
                y.as_mut_ptr(),
                saved.as_mut_ptr(),
                b as i64,
                t as i64,
                h as i64,
                self.eps,
            )
        };
        if rc != 0 {
            candle_core::bail!("layer-norm LSTM (grid): no memory for the block's scratch")
        }
        *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = Some(Kept::Cpu(saved));
        Ok((CpuStorage::F32(y), Shape::from((b, t, h))))
    }

    #[cfg(feature = "cuda")]
    fn forward_cuda(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [(&candle_core::CudaStorage, &Layout); 3],
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let hd = &self.held;
        let (y, saved) = crate::cuda::lstm::with_storages(
            [Some(&hd.wt), Some(&hd.h0), Some(&hd.c0), hd.drop.tensor()],
            |[wt, h0, c0, drop]| {
                crate::cuda::lstm::lstm_fwd(
                    [(s1, l1), (s2, l2), (s3, l3)],
                    [wt.expect("held"), h0.expect("held"), c0.expect("held")],
                    (&hd.drop, drop),
                    self.d,
                    self.eps,
                )
            },
        )?;
        *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = Some(Kept::Cuda(saved));
        let Dims { b, t, h } = self.d;
        Ok((y, Shape::from((b, t, h))))
    }

    fn gradients(&self, [xi, wb, ln]: [&Tensor; 3], _res: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 3]> {
        let want_w = tracks(wb);
        let op = LstmGridBackward {
            d: self.d,
            held: self.held.clone(),
            saved: self.saved.clone(),
            want_w,
        };
        let packed = dy
            .detach()
            .contiguous()?
            .apply_op3_no_bwd(&wb.detach(), &ln.detach(), &op)?;
        let Dims { b, t, h } = self.d;
        let [n_dxi, n_part, n_dr, n_h] = self.d.packed(want_w);
        let dxi = packed.narrow(0, 0, n_dxi)?.reshape((b, t, 4 * h))?;
        let part = packed.narrow(0, n_dxi, n_part)?.reshape((b, 14 * h))?.sum(0)?;
        let dln = part.narrow(0, 0, 10 * h)?;
        let dwb = if want_w {
            let dr = packed.narrow(0, n_dxi + n_part, n_dr)?.reshape((t * b, 4 * h))?;
            let hp = packed.narrow(0, n_dxi + n_part + n_dr, n_h)?.reshape((t * b, h))?;
            let dw = dr.t()?.matmul(&hp)?;
            let db = part.narrow(0, 10 * h, 4 * h)?.unsqueeze(1)?;
            Some(Tensor::cat(&[&dw, &db], 1)?)
        } else {
            None
        };
        Ok([tracks(xi).then_some(dxi), dwb, tracks(ln).then_some(dln)])
    }
}

/// The backward: `(dy, [W_hh | b_hh], norms)` -> the packed result of [`Dims::packed`].
struct LstmGridBackward {
    d: Dims,
    held: Arc<Held>,
    saved: Saved,
    want_w: bool,
}

impl CustomOp3 for LstmGridBackward {
    fn name(&self) -> &'static str {
        "fpt-ln-lstm-grid-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        super::f32_only(&[s1, s2, s3], "layer-norm LSTM (grid) backward")?;
        let Dims { b, t, h } = self.d;
        let what = "layer-norm LSTM (grid) backward";
        let (dy, wb, ln) = (
            cpu_slice::<f32>(s1, l1, what)?,
            cpu_slice::<f32>(s2, l2, what)?,
            cpu_slice::<f32>(s3, l3, what)?,
        );
        let (masks, seeds) = self.held.host_drop(self.d)?;
        let (block, thr, keep) = self.held.drop.params();
        if dy.len() != b * t * h || wb.len() != 4 * h * (h + 1) || ln.len() != 10 * h {
            candle_core::bail!("{what}: operands do not fit [{b}, {t}, {h}]")
        }
        let kept = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        let Some(Kept::Cpu(saved)) = &*kept else {
            candle_core::bail!("{what}: no forward on the CPU kept its values")
        };
        if saved.len() != self.d.saved() {
            candle_core::bail!("{what}: the kept values do not fit [{b}, {t}, {h}]")
        }
        let [n_dxi, n_part, n_dr, n_h] = self.d.packed(self.want_w);
        let mut out = vec![0f32; n_dxi + n_part + n_dr + n_h];
        let (dxi, rest) = out.split_at_mut(n_dxi);
        let (part, rest) = rest.split_at_mut(n_part);
        let (dr, hout) = rest.split_at_mut(n_dr);
        let (drp, hp) = if self.want_w {
            (dr.as_mut_ptr(), hout.as_mut_ptr())
        } else {
            (std::ptr::null_mut(), std::ptr::null_mut())
        };
        let mp = masks.as_ref().map_or(std::ptr::null(), |m| m.as_ptr());
        let sp = seeds.map_or(std::ptr::null(), |v| v.as_ptr());
        // SAFETY: dy holds B T H, wb 4H (H + 1), ln 10H (checked), masks T B H or null and
        // seeds T or null (host_drop checked),
        // saved T B (12H + 2) (checked); dxi B T 4H, part B 14H, and dr T B 4H and hout
        // T B H when W_hh trains (else null, which the kernel then never writes): four
        // disjoint parts of one &mut buffer; single-threaded, no pointer kept.
        let rc = unsafe {
            fpt_host_lstm_bwd_f32(
                dy.as_ptr(),
                wb.as_ptr(),
                ln.as_ptr(),
                mp,
                sp,
                block,
                thr,
                keep,
                saved.as_ptr(),
                dxi.as_mut_ptr(),
                part.as_mut_ptr(),
                drp,
                hp,
                b as i64,
                t as i64,
                h as i64,
            )
        };
        if rc != 0 {
            candle_core::bail!("{what}: no memory for the block's scratch")
        }
        let n = out.len();
        Ok((CpuStorage::F32(out), Shape::from(n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let kept = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        let Some(Kept::Cuda(saved)) = &*kept else {
            candle_core::bail!("layer-norm LSTM (grid) backward: no forward on this GPU kept its values")
        };
        let [a, b, c, d] = self.d.packed(self.want_w);
        let hd = &self.held;
        let out = crate::cuda::lstm::with_storages([hd.drop.tensor(), None, None, None], |[drop, ..]| {
            crate::cuda::lstm::lstm_bwd(
                [(s1, l1), (s2, l2), (s3, l3)],
                (&hd.drop, drop),
                saved,
                self.d,
                self.want_w,
            )
        })?;
        Ok((out, Shape::from(a + b + c + d)))
    }
}

/// [`super::ln_lstm`]'s recurrence through the kernels (on the CPU the host grid): `wb`
/// (`[W_hh | b_hh]`) and `ln` (the four norm vectors) packed by the caller, which checked
/// every shape.
pub(super) fn ln_lstm_grid(
    xi: &Tensor,
    wb: &Tensor,
    ln: &Tensor,
    w_hh: &Tensor,
    p: &LnLstmParams,
    (h0, c0, drop): (&Tensor, &Tensor, LstmDrop<'_>),
) -> Result<Tensor> {
    let (b, t, g4) = xi.dims3()?;
    let d = Dims { b, t, h: g4 / 4 };
    if b == 0 || t == 0 {
        candle_core::bail!("layer-norm LSTM (grid): a batch of {b} x {t} steps has no row to run")
    }
    if xi.dtype() != DType::F32 {
        candle_core::bail!("layer-norm LSTM (grid): takes f32, got {:?}", xi.dtype())
    }
    if d.shared_bytes() > 48 * 1024 {
        candle_core::bail!(
            "layer-norm LSTM (grid): hidden size {} needs {} bytes of shared memory a block, over the 48 KiB \
             the kernels take; FPT_LSTM=composed runs the composed ops",
            d.h,
            d.shared_bytes()
        )
    }
    // Each held tensor its own storage (`copy`): a GPU forward read-locks all of them at
    // once, and a layer's zero initial state hands the same tensor as h0 and c0.
    let on = |x: &Tensor| -> Result<Tensor> { x.detach().to_dtype(DType::F32)?.contiguous()?.copy() };
    let held = Held {
        wt: w_hh.detach().t()?.contiguous()?,
        h0: on(h0)?,
        c0: on(c0)?,
        drop: match drop {
            LstmDrop::None => OutDrop::None,
            LstmDrop::Masks(m) => OutDrop::Masks(on(m)?),
            LstmDrop::Seeded { p: pr, seeds } => {
                let (thr, keep) = super::dropout::mask_params(pr);
                // The seeds' bits as i64 (candle has no u64): one counted upload of T values.
                let bits: Vec<i64> = seeds.iter().map(|&s| s as i64).collect();
                OutDrop::Seeded {
                    seeds: seeds.to_vec(),
                    on_device: crate::transfer::upload(bits, seeds.len(), xi.device())?,
                    thr,
                    keep,
                }
            }
        },
    };
    for x in [&held.wt, &held.h0, &held.c0].into_iter().chain(held.drop.tensor()) {
        if !x.device().same_device(xi.device()) {
            candle_core::bail!(
                "layer-norm LSTM (grid): an operand is on {:?}, the input on {:?}",
                x.device(),
                xi.device()
            )
        }
    }
    let op = LstmGrid {
        d,
        eps: p.eps as f32,
        held: Arc::new(held),
        saved: Arc::new(Mutex::new(None)),
    };
    xi.contiguous()?.apply_op3(wb, ln, super::Three(op))
}

/// A layer-norm LSTM's dropout on its outputs (the multipliers of each step's `[B, H]`).
#[derive(Clone, Copy)]
pub enum LstmDrop<'a> {
    /// None.
    None,
    /// Given: `[T, B, H]` multipliers.
    Masks(&'a Tensor),
    /// Drawn from each step's seed with probability `p`, as
    /// [`super::dropout_mask_values`]`(B H, p, seeds[s])` draws them: on a GPU by the kernels
    /// themselves (only the `T` seeds are uploaded), elsewhere on the host.
    Seeded {
        /// The dropout probability.
        p: f64,
        /// One seed a step.
        seeds: &'a [u64],
    },
}

/// Where the layer-norm LSTM's recurrence runs (`FPT_LSTM`; [`super::ln_lstm_as`] picks
/// one per call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LstmChoice {
    /// `auto` (the default): the CPU's fused op on the CPU, these kernels on a GPU (f32);
    /// the composed ops for other number formats.
    Auto,
    /// `grid`: these kernels everywhere (on the CPU over the host grid: a reference, slow).
    Grid,
    /// `composed`: stock candle ops, some 20 kernels a step forward, more backward.
    Composed,
}

/// `FPT_LSTM`'s value as an [`LstmChoice`]; anything else an error naming the variable and
/// the choices.
pub(crate) fn parse_lstm_choice(v: Option<&str>) -> std::result::Result<LstmChoice, String> {
    match v.map(str::trim) {
        None | Some("") | Some("auto") => Ok(LstmChoice::Auto),
        Some("grid") => Ok(LstmChoice::Grid),
        Some("composed") => Ok(LstmChoice::Composed),
        Some(other) => Err(format!(
            "FPT_LSTM=`{other}`: the choices are `auto` (the CPU's fused op on a CPU, one block per batch row \
             on a GPU), `grid` (the GPU kernels everywhere; on a CPU over the host grid) and `composed` (stock ops)"
        )),
    }
}

/// The choice `FPT_LSTM` makes for this process (read once).
pub(crate) fn lstm_choice() -> Result<LstmChoice> {
    static CHOICE: std::sync::OnceLock<std::result::Result<LstmChoice, String>> = std::sync::OnceLock::new();
    CHOICE
        .get_or_init(|| parse_lstm_choice(std::env::var("FPT_LSTM").ok().as_deref()))
        .clone()
        .map_err(candle_core::Error::Msg)
}

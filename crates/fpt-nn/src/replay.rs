//! The dropout seeds of a step replayed from device memory (issue 56 item 1).
//!
//! A CUDA graph freezes its kernels' arguments at the capture, so a replayed step that
//! passed its dropout seeds as arguments would draw the same masks at every replay. A
//! replayed step's seeds live in a small device buffer instead ([`SeedSlots`]): the host
//! draws them before each replay from the run's dropout stream, in the order the step
//! draws them, and writes them there; the kernels read their slot.
//!
//! While [`SeedSlots::bind`] runs a step, the seeds it was given are bound to their slots
//! on this thread: every dropout kernel launched with one of those seeds reads it from its
//! slot (`cuda.rs`), and every mask drawn from a seed, on any device, is noted here. When
//! the step ends, each slot must have been read and no other seed used: a dropout site
//! that escaped the slots, or a draw order that differs from the step's, is an error, not
//! a replay that silently repeats its masks. On the CPU the step runs as it always does
//! (the seeds are the values the step draws); what this checks there is the plumbing the
//! GPU's capture relies on.

use candle_core::{DType, Device, Result, Tensor, Var};
use std::cell::RefCell;
use std::collections::HashMap;

/// A step's dropout seeds on the device: one slot per seed the step draws, in draw order.
#[derive(Debug)]
pub struct SeedSlots {
    buf: Var,
    k: usize,
}

struct Bound {
    slots: HashMap<u64, usize>,
    buf: Tensor,
    read: Vec<bool>,
    unknown: Vec<u64>,
    /// Host-device copies the step made ([`crate::transfer`]'s, named by direction).
    copies: Vec<&'static str>,
}

thread_local! {
    /// The steps bound on this thread, innermost last. Steps run on rayon's pool
    /// (`fpt_nn::on_pool`), and a worker waiting inside one step's parallel loop may steal
    /// and run another run's whole step (two runs training in one process): that step binds
    /// on top and unbinds before the outer one resumes, so only the innermost is live.
    static BOUND: RefCell<Vec<Bound>> = const { RefCell::new(Vec::new()) };
}

impl SeedSlots {
    /// Slots for `k` seeds on `device`.
    pub fn new(k: usize, device: &Device) -> Result<Self> {
        Ok(Self {
            buf: Var::zeros(k.max(1), DType::I64, device)?,
            k,
        })
    }

    /// How many seeds a step draws.
    pub fn len(&self) -> usize {
        self.k
    }

    /// Whether the step draws no seed.
    pub fn is_empty(&self) -> bool {
        self.k == 0
    }

    /// Writes a step's seeds into the slots (an upload and a copy into the buffer the
    /// captured kernels read, enqueued before the replay).
    pub fn write(&self, seeds: &[u64]) -> Result<()> {
        if seeds.len() != self.k {
            candle_core::bail!("seed slots: {} seeds for {} slots", seeds.len(), self.k)
        }
        if self.k == 0 {
            return Ok(());
        }
        let bits: Vec<i64> = seeds.iter().map(|&s| s as i64).collect();
        self.buf.set(&crate::transfer::upload(bits, self.k, self.buf.device())?)
    }

    /// Runs `step` with `seeds` (which [`SeedSlots::write`] wrote into the slots: outside
    /// a capture, which must not take host copies) bound to their slots on this thread,
    /// then checks that the step read every slot and drew no other seed.
    pub fn bind<R>(&self, seeds: &[u64], step: impl FnOnce() -> R) -> Result<R> {
        if seeds.len() != self.k {
            candle_core::bail!("seed slots: {} seeds for {} slots", seeds.len(), self.k)
        }
        let mut slots = HashMap::with_capacity(seeds.len());
        for (i, &s) in seeds.iter().enumerate() {
            if slots.insert(s, i).is_some() {
                candle_core::bail!("seed slots: the step's seeds repeat ({s:#x} twice); slots cannot tell them apart")
            }
        }
        let bound = Bound {
            slots,
            buf: self.buf.as_tensor().clone(),
            read: vec![false; seeds.len()],
            unknown: Vec::new(),
            copies: Vec::new(),
        };
        let depth = BOUND.with(|b| {
            let mut b = b.borrow_mut();
            b.push(bound);
            b.len()
        });
        // Unbound when the step returns or unwinds (its binding, and any a step nested in it
        // left by unwinding).
        struct Unbind(usize);
        impl Drop for Unbind {
            fn drop(&mut self) {
                BOUND.with(|b| b.borrow_mut().truncate(self.0 - 1));
            }
        }
        let unbind = Unbind(depth);
        let out = step();
        let bound = BOUND.with(|b| {
            let mut b = b.borrow_mut();
            b.truncate(depth);
            b.pop()
        });
        drop(unbind);
        let bound = bound.expect("bound above");
        if let Some(s) = bound.unknown.first() {
            candle_core::bail!(
                "seed slots: the step drew {} dropout seed(s) it was not given (first {s:#x}): its draws differ from the slots'",
                bound.unknown.len()
            )
        }
        if let Some(first) = bound.copies.first() {
            candle_core::bail!(
                "seed slots: the step made {} copies between host and device (the first an {first}; host-drawn values such as an LSTM's dropout masks): a replayed step reads only what the device holds",
                bound.copies.len()
            )
        }
        if let Some(i) = bound.read.iter().position(|r| !r) {
            candle_core::bail!(
                "seed slots: slot {i} of {} was never read: a dropout site escaped the slots or the step draws fewer seeds",
                seeds.len()
            )
        }
        Ok(out)
    }
}

/// Notes a mask drawn from `seed`; when a step is bound on this thread, returns the slots'
/// buffer and the slot holding `seed` (a kernel reads it from there).
pub(crate) fn seed_slot(seed: u64) -> Option<(Tensor, usize)> {
    BOUND.with(|b| {
        let mut b = b.borrow_mut();
        let bound = b.last_mut()?;
        match bound.slots.get(&seed) {
            Some(&i) => {
                bound.read[i] = true;
                Some((bound.buf.clone(), i))
            }
            None => {
                bound.unknown.push(seed);
                None
            }
        }
    })
}

/// Notes a host-device copy ([`crate::transfer`] calls it for each): a bound step must
/// make none (a capture would freeze what it copied).
pub(crate) fn note_copy(what: &'static str) {
    BOUND.with(|b| {
        if let Some(bound) = b.borrow_mut().last_mut() {
            bound.copies.push(what);
        }
    })
}

/// Whether a step is bound on this thread (a kernel whose seed cannot come from a slot
/// refuses to run under one).
pub(crate) fn bound() -> bool {
    BOUND.with(|b| !b.borrow().is_empty())
}

thread_local! {
    /// The devices whose small uploads are being kept for a capture ([`with_upload_cache`])
    /// on this thread, innermost last.
    static UPLOAD_CACHE: RefCell<Vec<Device>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with `device`'s small uploads (a strided op's dims and strides, constants) kept
/// on the device, as a CUDA graph's capture needs them: candle's
/// `enable_cuda_graph_htod_cache` on a GPU, for the eager passes that fill the cache and the
/// capture that finds it full. Candle's switch is per thread; this one is carried into
/// rayon's pool by [`crate::on_pool`], so that work a capture sends there uploads the same
/// way (without it, a pass on the pool captured plain uploads from host memory freed right
/// after: the H200 of 2026-11-28 read garbage strides in `badd_f32` at the first replay).
/// On other devices it runs `f` as it is, the scope only noted ([`upload_cache_active`]).
pub fn with_upload_cache<R>(device: &Device, f: impl FnOnce() -> R) -> R {
    #[cfg(feature = "cuda")]
    let _guard = match device {
        Device::Cuda(cuda) => Some(cuda.enable_cuda_graph_htod_cache()),
        _ => None,
    };
    UPLOAD_CACHE.with(|c| c.borrow_mut().push(device.clone()));
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            UPLOAD_CACHE.with(|c| c.borrow_mut().pop());
        }
    }
    let _pop = Pop;
    f()
}

/// Whether this thread is inside [`with_upload_cache`].
pub fn upload_cache_active() -> bool {
    UPLOAD_CACHE.with(|c| !c.borrow().is_empty())
}

/// The innermost device of [`with_upload_cache`] on this thread, for [`crate::on_pool`].
pub(crate) fn upload_cache_device() -> Option<Device> {
    UPLOAD_CACHE.with(|c| c.borrow().last().cloned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;

    /// Every seed the bound step draws is read from its slot; a seed it was not given, a
    /// slot it never reads and repeated seeds are errors naming what went wrong.
    #[test]
    fn bound_steps_read_every_slot_and_nothing_else() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::ones(1000, DType::F32, &dev)?;
        let slots = SeedSlots::new(2, &dev)?;
        let mut rng = Rng::new(7);
        let seeds = {
            let mut r = rng.clone();
            [r.next_u64(), r.next_u64()]
        };
        slots.write(&seeds)?;
        let (a, b) = slots.bind(&seeds, || -> Result<_> {
            let a = crate::ops::dropout(&x, 0.5, &mut rng)?;
            let b = crate::ops::dropout_add(&x, &x, 0.5, rng.next_u64())?;
            Ok((a, b))
        })??;
        assert_eq!(
            a.to_vec1::<f32>()?,
            crate::ops::dropout_mask_values(1000, 0.5, seeds[0])
        );
        let want: Vec<f32> = crate::ops::dropout_mask_values(1000, 0.5, seeds[1])
            .iter()
            .map(|m| 1.0 + m)
            .collect();
        assert_eq!(b.to_vec1::<f32>()?, want);
        assert_eq!(
            crate::transfer::download_vec::<i64>(slots.buf.as_tensor())?,
            vec![seeds[0] as i64, seeds[1] as i64]
        );

        let err = slots
            .bind(&seeds, || crate::ops::dropout(&x, 0.5, &mut Rng::new(8)).map(drop))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not given"), "{err}");
        let err = slots
            .bind(&seeds, || crate::ops::dropout(&x, 0.5, &mut Rng::new(7)).map(drop))
            .unwrap_err()
            .to_string();
        assert!(err.contains("slot 1 of 2 was never read"), "{err}");
        let err = SeedSlots::new(2, &dev)?.bind(&[5, 5], || ()).unwrap_err().to_string();
        assert!(err.contains("repeat"), "{err}");
        assert!(!bound(), "a failed bind leaves nothing bound");
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            slots.bind(&seeds, || panic!("a step that panics"))
        }));
        assert!(panicked.is_err());
        assert!(!bound(), "a step that unwound leaves nothing bound");
        Ok(())
    }

    /// Another run's step bound inside this one on the same thread (what a rayon worker
    /// does when it steals that step while waiting in this one's parallel loop): each step
    /// reads its own slots only, before and after the nested one, and nothing stays bound.
    #[test]
    fn a_step_nested_on_the_same_thread_keeps_its_own_slots() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::ones(64, DType::F32, &dev)?;
        let (outer, inner) = (SeedSlots::new(2, &dev)?, SeedSlots::new(1, &dev)?);
        let (so, si) = ([11u64, 12], [21u64]);
        outer.write(&so)?;
        inner.write(&si)?;
        let (a, b, c) = outer.bind(&so, || -> Result<_> {
            let a = crate::ops::dropout_add(&x, &x, 0.5, so[0])?;
            let b = inner.bind(&si, || crate::ops::dropout_add(&x, &x, 0.5, si[0]))??;
            assert!(bound(), "the outer step is bound again after the nested one");
            let c = crate::ops::dropout_add(&x, &x, 0.5, so[1])?;
            Ok((a, b, c))
        })??;
        for (t, seed) in [(a, so[0]), (b, si[0]), (c, so[1])] {
            let want: Vec<f32> = crate::ops::dropout_mask_values(64, 0.5, seed)
                .iter()
                .map(|m| 1.0 + m)
                .collect();
            assert_eq!(t.to_vec1::<f32>()?, want);
        }
        // The nested step drawing the outer's seed is an error of the nested step's.
        let err = outer.bind(&so, || -> Result<_> {
            crate::ops::dropout_add(&x, &x, 0.5, so[0])?;
            let e = inner.bind(&si, || crate::ops::dropout_add(&x, &x, 0.5, so[1]).map(drop));
            crate::ops::dropout_add(&x, &x, 0.5, so[1])?;
            Ok(e.unwrap_err().to_string())
        })??;
        assert!(err.contains("not given"), "{err}");
        assert!(!bound());
        Ok(())
    }

    #[test]
    fn the_upload_cache_scope_goes_along_to_the_pool() {
        // A capture's pass runs on rayon's pool: the scope must hold there too, or its
        // uploads are captured from host memory that is freed after the capture.
        assert!(!upload_cache_active());
        let (outside, on_pool, nested) = with_upload_cache(&Device::Cpu, || {
            (
                upload_cache_active(),
                crate::on_pool(upload_cache_active),
                crate::on_pool(|| crate::on_pool(upload_cache_active)),
            )
        });
        assert!(outside && on_pool && nested);
        assert!(!upload_cache_active());
        assert!(!crate::on_pool(upload_cache_active), "the scope ended with the call");
    }
}

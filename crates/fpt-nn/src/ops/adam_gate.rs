//! Adam's update decided on the device, for a step replayed from device memory (issue 56
//! item 1): a CUDA graph freezes its kernels' arguments, and a training step must skip a
//! non-finite update without the host reading the loss back first.
//!
//! An [`AdamGate`] holds, where the parameters live, the step's verdict, Adam's step count
//! `t`, a ring of the last steps' (loss, gradient norm, verdict), and a table of each
//! step's coefficients (the step size `lr / (1 - b1^t)` with the run's learning-rate
//! schedule, and `1 / sqrt(1 - b2^t)`), computed on the host as [`super::adam_update`]'s
//! caller computes them. [`AdamGate::record`] writes a step's loss and norm and decides;
//! [`AdamGate::update`] then applies Adam's update in place only if the step went
//! through, with its row of the table. The arithmetic is `kernels/fpt_ops.h`'s: the CUDA
//! kernels run it on a GPU, and the CPU runs the same C bodies (host_grid.c), so a CPU
//! step through the gate equals [`super::adam_update`]'s to the last bit (tested in
//! fpt-train's `tests/replay_step.rs`).

use super::adam::{owns_storage, step_cpu, AdamCoefs, MomentOp};
use candle_core::{CpuStorage, DType, Device, Layout, Result, Storage, Tensor, Var};

extern "C" {
    fn fpt_host_step_gate(loss: *const f64, norm: *const f64, state: *mut f64);
    fn fpt_host_gate_coefs(state: *const f64, table: *const f32, step_size: *mut f32, inv_sqrt_bc2: *mut f32) -> i32;
}

/// The state's head before the ring (`FPT_GATE_HEAD` in fpt_ops.h).
const HEAD: usize = 6;

/// Adam's update gated on the device by each step's loss and gradient norm.
#[derive(Debug)]
pub struct AdamGate {
    state: Var,
    table: Tensor,
    ring: usize,
    moment1: (f32, f32),
    moment2: (f32, f32),
    eps: f32,
}

/// One recorded step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateRecord {
    /// The step's loss.
    pub loss: f64,
    /// Its gradient norm before clipping.
    pub grad_norm: f64,
    /// Whether its update was applied (a finite loss and norm, and a row of the table).
    pub applied: bool,
    /// Whether it was skipped because the table had no row left for it.
    pub past_table: bool,
}

/// What the gate holds, read back.
#[derive(Debug, Clone, PartialEq)]
pub struct GateState {
    /// Adam's step count: the updates applied, those before the gate included.
    pub t: usize,
    /// Steps recorded since the gate was made.
    pub recorded: usize,
    /// The last `min(recorded, ring)` steps' records, oldest first.
    pub records: Vec<GateRecord>,
}

impl AdamGate {
    /// A gate for Adam at step count `t0` with `rows` steps of coefficients (`coefs(t)` for
    /// the updates `t0 + 1 ..= t0 + rows`) and a ring of the last `ring` steps, on `device`.
    pub fn new(
        t0: usize,
        rows: usize,
        ring: usize,
        coefs: impl Fn(usize) -> AdamCoefs,
        device: &Device,
    ) -> Result<Self> {
        if rows == 0 || ring == 0 {
            candle_core::bail!("adam gate: a table of {rows} rows and a ring of {ring} (both must be at least 1)")
        }
        let first = coefs(t0 + 1);
        let mut table = Vec::with_capacity(2 * rows);
        for t in t0 + 1..=t0 + rows {
            let c = coefs(t);
            if (c.beta1, c.beta2, c.eps) != (first.beta1, first.beta2, first.eps) {
                candle_core::bail!(
                    "adam gate: beta1, beta2 and eps must not change between steps (they do at step {t})"
                )
            }
            // The f32 roundings adam_update's kernels take.
            table.push(c.step_size as f32);
            table.push(c.inv_sqrt_bc2 as f32);
        }
        let mut state = vec![0f64; HEAD + 3 * ring];
        state[1] = t0 as f64;
        state[3] = t0 as f64;
        state[4] = rows as f64;
        state[5] = ring as f64;
        Ok(Self {
            state: Var::from_tensor(&crate::transfer::upload(state, HEAD + 3 * ring, device)?)?,
            table: crate::transfer::upload(table, (rows, 2), device)?,
            ring,
            moment1: (first.beta1 as f32, (1.0 - first.beta1) as f32),
            moment2: (first.beta2 as f32, (1.0 - first.beta2) as f32),
            eps: first.eps as f32,
        })
    }

    /// Records a step's `loss` and gradient `norm` (one-element f64 tensors where the gate
    /// lives) and decides whether its update applies.
    pub fn record(&self, loss: &Tensor, norm: &Tensor) -> Result<()> {
        let one = |t: &Tensor| t.to_dtype(DType::F64)?.flatten_all()?.contiguous();
        self.state.as_tensor().inplace_op3(&one(loss)?, &one(norm)?, &GateOp)
    }

    /// Adam's update of `p` and its moments `m` and `v` from its gradient `g`, in place, if
    /// the last recorded step went through; nothing otherwise. The tensors must be f32 and
    /// own their storage (what [`super::adam_update`] updates in place).
    pub fn update(&self, p: &Var, m: &Tensor, v: &Tensor, g: &Tensor) -> Result<()> {
        if !(owns_storage(p.as_tensor()) && owns_storage(m) && owns_storage(v)) || g.dtype() != DType::F32 {
            candle_core::bail!(
                "adam gate: the update runs in place on f32 tensors that own their storage (a {:?} parameter of shape {:?})",
                p.dtype(),
                p.shape()
            )
        }
        let g = &g.contiguous()?;
        for ((decay, rest), square, x) in [(self.moment1, false, m), (self.moment2, true, v)] {
            let op = MomentOp { decay, rest, square };
            x.inplace_op2(g, &GatedMoment { op, gate: self })?;
        }
        p.as_tensor().inplace_op3(m, v, &GatedStep { gate: self })
    }

    /// The gate's state, read back (one download).
    pub fn read(&self) -> Result<GateState> {
        let s = crate::transfer::download_vec::<f64>(self.state.as_tensor())?;
        let recorded = s[2] as usize;
        let n = recorded.min(self.ring);
        let records = (recorded - n..recorded)
            .map(|k| {
                let r = &s[HEAD + 3 * (k % self.ring)..][..3];
                GateRecord {
                    loss: r[0],
                    grad_norm: r[1],
                    applied: r[2] == 1.0,
                    past_table: r[2] == -1.0,
                }
            })
            .collect();
        Ok(GateState {
            t: s[1] as usize,
            recorded,
            records,
        })
    }

    /// The steps the ring holds.
    pub fn ring(&self) -> usize {
        self.ring
    }

    /// The state's host values with `f` (on the CPU only).
    fn with_host<R>(&self, f: impl FnOnce(&[f64], &[f32]) -> R) -> Result<R> {
        let (st, sl) = self.state.storage_and_layout();
        let (tt, tl) = self.table.storage_and_layout();
        match (&*st, &*tt) {
            (Storage::Cpu(CpuStorage::F64(s)), Storage::Cpu(CpuStorage::F32(t))) => {
                let s = &s[sl.start_offset()..];
                let t = &t[tl.start_offset()..];
                Ok(f(s, t))
            }
            _ => candle_core::bail!("adam gate: the CPU update needs the gate on the CPU"),
        }
    }

    /// Whether the last step went through, and its (step size, 1 / sqrt(1 - b2^t)).
    fn host_coefs(&self) -> Result<Option<(f32, f32)>> {
        self.with_host(|s, t| {
            let (mut step_size, mut inv) = (0f32, 0f32);
            // SAFETY: `s` holds the gate's head and ring, `t` a row for every step the gate
            // lets through (fpt_step_gate refuses the others); the outputs are two floats.
            let open = unsafe { fpt_host_gate_coefs(s.as_ptr(), t.as_ptr(), &mut step_size, &mut inv) };
            (open != 0).then_some((step_size, inv))
        })
    }
}

struct GateOp;

impl candle_core::InplaceOp3 for GateOp {
    fn name(&self) -> &'static str {
        "adam-gate"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let (CpuStorage::F64(state), CpuStorage::F64(loss), CpuStorage::F64(norm)) = (s1, s2, s3) else {
            candle_core::bail!("adam gate: the state, loss and norm are f64")
        };
        let state = &mut state[l1.start_offset()..];
        if state.len() < HEAD || state.len() < HEAD + 3 * state[5] as usize {
            candle_core::bail!("adam gate: a state of {} values is shorter than its ring", state.len())
        }
        // SAFETY: the state holds its head and ring (checked above); loss and norm are at
        // least one f64 each at their offsets (one-element tensors).
        unsafe {
            fpt_host_step_gate(
                loss[l2.start_offset()..].as_ptr(),
                norm[l3.start_offset()..].as_ptr(),
                state.as_mut_ptr(),
            )
        };
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        _l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<()> {
        crate::cuda::step_gate(s1, (s2, l2), (s3, l3))
    }
}

struct GatedMoment<'a> {
    op: MomentOp,
    gate: &'a AdamGate,
}

impl candle_core::InplaceOp2 for GatedMoment<'_> {
    fn name(&self) -> &'static str {
        "adam-moment-gated"
    }

    fn cpu_fwd(&self, s1: &mut CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<()> {
        match self.gate.host_coefs()? {
            Some(_) => self.op.cpu(s1, l1, s2, l2),
            None => Ok(()),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        _l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<()> {
        let (st, _) = self.gate.state.storage_and_layout();
        let Storage::Cuda(state) = &*st else {
            candle_core::bail!("adam gate: the gate is not on the parameters' GPU")
        };
        let state = state.as_cuda_slice::<f64>()?.slice(..);
        crate::cuda::moment(s1, (s2, l2), self.op.decay, self.op.rest, self.op.square, Some(&state))
    }
}

struct GatedStep<'a> {
    gate: &'a AdamGate,
}

impl candle_core::InplaceOp3 for GatedStep<'_> {
    fn name(&self) -> &'static str {
        "adam-step-gated"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        match self.gate.host_coefs()? {
            Some((step_size, inv)) => step_cpu(s1, l1, s2, l2, s3, l3, self.gate.eps, inv, step_size),
            None => Ok(()),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        _l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<()> {
        let (st, _) = self.gate.state.storage_and_layout();
        let (tt, _) = self.gate.table.storage_and_layout();
        let (Storage::Cuda(state), Storage::Cuda(table)) = (&*st, &*tt) else {
            candle_core::bail!("adam gate: the gate is not on the parameters' GPU")
        };
        let coefs = crate::cuda::StepCoefs::Gate(
            state.as_cuda_slice::<f64>()?.slice(..),
            table.as_cuda_slice::<f32>()?.slice(..),
        );
        crate::cuda::adam_step(s1, (s2, l2), (s3, l3), self.gate.eps, coefs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coefs(t: usize) -> AdamCoefs {
        let (b1, b2, lr) = (0.9f64, 0.999f64, 1e-3);
        AdamCoefs {
            beta1: b1,
            beta2: b2,
            step_size: lr / (1.0 - b1.powi(t as i32)),
            inv_sqrt_bc2: 1.0 / (1.0 - b2.powi(t as i32)).sqrt(),
            eps: 1e-8,
        }
    }

    /// Through the gate, finite steps update exactly as adam_update does at the same step
    /// count; a non-finite loss or norm, or a step past the table, leaves everything as it
    /// was; the ring keeps the last steps in order.
    #[test]
    fn the_gate_applies_finite_steps_exactly_and_skips_the_rest() -> Result<()> {
        let dev = Device::Cpu;
        let n = 40_000; // past one parallel chunk
        let rng = &mut crate::Rng::new(3);
        let p0 = rng.normal_vec(n, 0.0, 1.0);
        let (pa, pb) = (Var::new(p0.clone(), &dev)?, Var::new(p0, &dev)?);
        let z = || Tensor::zeros(n, DType::F32, &dev);
        let (mut ma, mut va, mb, vb) = (z()?, z()?, z()?, z()?);
        let gate = AdamGate::new(5, 3, 2, coefs, &dev)?;
        let scalar = |x: f64| Tensor::new(&[x], &dev);
        let mut t = 5;
        for (step, (loss, norm)) in [
            (1.5, 2.0),
            (f64::NAN, 1.0),
            (1.2, f64::INFINITY),
            (1.1, 0.5),
            (1.0, 0.4),
            (0.9, 0.3),
        ]
        .into_iter()
        .enumerate()
        {
            let g = Tensor::new(rng.normal_vec(n, 0.0, 1.0), &dev)?;
            gate.record(&scalar(loss)?, &scalar(norm)?)?;
            gate.update(&pb, &mb, &vb, &g)?;
            let finite = loss.is_finite() && norm.is_finite();
            let in_table = t < 5 + 3;
            if finite && in_table {
                t += 1;
                super::super::adam_update(&pa, &mut ma, &mut va, &g, &coefs(t))?;
            }
            assert_eq!(pa.to_vec1::<f32>()?, pb.to_vec1::<f32>()?, "step {step}");
            assert_eq!(mb.to_vec1::<f32>()?, ma.to_vec1::<f32>()?, "step {step}");
            assert_eq!(vb.to_vec1::<f32>()?, va.to_vec1::<f32>()?, "step {step}");
            let s = gate.read()?;
            assert_eq!((s.t, s.recorded), (t, step + 1), "step {step}");
            let last = *s.records.last().expect("a record");
            assert_eq!(last.applied, finite && in_table, "step {step}");
            assert_eq!(last.past_table, finite && !in_table, "step {step}");
            assert!(last.loss.to_bits() == loss.to_bits() && last.grad_norm.to_bits() == norm.to_bits());
        }
        let s = gate.read()?;
        assert_eq!(s.t, 8, "three rows of the table, three updates");
        let losses: Vec<f64> = s.records.iter().map(|r| r.loss).collect();
        assert_eq!(
            losses,
            vec![1.0, 0.9],
            "the ring of two keeps the last two, oldest first"
        );
        Ok(())
    }

    /// Coefficients that change beta or eps between steps are refused, as are empty tables.
    #[test]
    fn gates_refuse_what_they_cannot_replay() {
        let err = AdamGate::new(
            0,
            3,
            1,
            |t| AdamCoefs {
                eps: t as f64,
                ..coefs(t)
            },
            &Device::Cpu,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("must not change"), "{err}");
        let err = AdamGate::new(0, 0, 1, coefs, &Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("at least 1"), "{err}");
    }
}

//! The fused residual branch over frozen linear layers (see
//! [`crate::layers::ResidualBranch`]), with its LayerNorm at the input (pre-norm, GPT-2):
//! `y = x + dropout(W2 mid(W1 LN(x) + b1) + b2)`, or at the output (post-norm, BERT):
//! `y = LN(x + dropout(W2 mid(W1 x + b1) + b2))`.
//!
//! Forward runs the kernels of the separate ops (LayerNorm, the packed products, GELU or
//! packed attention, dropout-add) one after another and keeps the first layer's output `u`
//! (and, post-norm, the sum `s` the norm reads) for backward. Backward, for the output
//! gradient `g` and dropout multipliers `m`, pre-norm: `dz = g * m`; `dv = dz W2`;
//! `du = mid'(u, dv)`; `da = du W1`; LayerNorm's backward of `da` gives `dx_norm`, `dgamma`,
//! `dbeta`; `dx = g + dx_norm`. Post-norm: LayerNorm's backward of `g` at `s` gives `ds`,
//! `dgamma`, `dbeta`; `dz = ds * m`; `dv`, `du` as above; `dx = ds + du W1`. The weights are
//! frozen, so no weight gradient is computed, and the intermediates' gradients never reach
//! candle's gradient store.

use super::attention::{packed_backward, packed_forward};
use super::dropout::DropoutAdd;
use super::sgemm::{product, sgemm, MatMut, MatRef, PackedB};
use super::{cpu_slice, grad_like, tracks, with_cpu_slice};
use candle_core::{CpuStorage, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::sync::{Arc, Mutex};

/// Where a [`ResidualBranch`](crate::ResidualBranch)'s LayerNorm sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormAt {
    /// On the branch input, `x + dropout(output(mid(input(norm(x)))))` (GPT-2, pre-norm).
    Input,
    /// On the residual sum, `norm(x + dropout(output(mid(input(x)))))` (BERT, post-norm).
    Output,
}

/// What runs between the two linear layers of a [`ResidualBranch`](crate::ResidualBranch).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BranchMid {
    /// `gelu_new` (GPT-2's feed-forward layer).
    GeluNew,
    /// The exact (erf) GELU (BERT's feed-forward layer).
    GeluErf,
    /// Self-attention over Q, K and V packed side by side in the first layer's output
    /// (GPT-2's `c_attn`, BERT's packed query/key/value), as [`attention_packed`](super::attention_packed) computes it.
    Attention(super::AttentionSpec),
}

/// A frozen linear layer's weight as the fused branch multiplies by it.
pub(crate) enum FrozenWeight {
    /// Packed for fpt's micro-kernel (the AVX2 and AVX-512 paths; bf16 panels on the
    /// `avx512bf16` path): `W^T` (`[n_in, n_out]`) for the forward product, `W`
    /// (`[n_out, n_in]`) for the input gradient's.
    Packed {
        forward: Arc<PackedB>,
        backward: Arc<PackedB>,
    },
    /// `W` as it is (`[n_out, n_in]`, a contiguous f32 or bf16 CPU tensor), multiplied
    /// through the active path's product (on the portable path, the `gemm` crate; a bf16
    /// `W` widened for each product, `ops/bf16.rs`).
    Plain(Tensor),
}

/// A frozen linear layer as the fused branch uses it.
pub(crate) struct FrozenLinear {
    pub(crate) weight: FrozenWeight,
    pub(crate) bias: Option<Vec<f32>>,
    pub(crate) n_in: usize,
    pub(crate) n_out: usize,
}

impl FrozenLinear {
    /// `x W^T + b` for `x` of `m` rows of `n_in`.
    fn apply(&self, x: &[f32]) -> Result<Vec<f32>> {
        match &self.weight {
            FrozenWeight::Packed { forward, .. } => Ok(product(x, forward, self.bias.as_deref())),
            FrozenWeight::Plain(w) => plain_product(x, w, false, self.bias.as_deref()),
        }
    }

    /// `dy W` for `dy` of `m` rows of `n_out`.
    fn apply_t(&self, dy: &[f32]) -> Result<Vec<f32>> {
        match &self.weight {
            FrozenWeight::Packed { backward, .. } => Ok(product(dy, backward, None)),
            FrozenWeight::Plain(w) => plain_product(dy, w, true, None),
        }
    }
}

/// `a W^T (+ bias)` (`transposed: false`; `a` of `n_in` columns) or `a W` (`true`; `a` of
/// `n_out` columns) for the row-major weight `w: [n_out, n_in]`, through the active kernel
/// path's product.
fn plain_product(a: &[f32], w: &Tensor, transposed: bool, bias: Option<&[f32]>) -> Result<Vec<f32>> {
    let (n_out, n_in) = w.dims2()?;
    let (k, n) = if transposed { (n_out, n_in) } else { (n_in, n_out) };
    if k == 0 || !a.len().is_multiple_of(k) {
        candle_core::bail!("residual branch: {} values are not rows of {k}", a.len())
    }
    let m = a.len() / k;
    if w.dtype() == candle_core::DType::BF16 {
        return with_cpu_slice::<half::bf16, _>(w, "residual branch", |ws| {
            super::bf16::widened_product(
                crate::kernels::KernelPath::active(),
                a,
                ws,
                (n_out, n_in),
                transposed,
                bias,
            )
        });
    }
    with_cpu_slice::<f32, _>(w, "residual branch", |ws| {
        // W^T: element (p, j) is w[j * n_in + p] (row stride 1, column stride n_in); W:
        // element (p, j) is w[p * n_in + j].
        let b = if transposed {
            MatRef::of(ws, n_in, 1)
        } else {
            MatRef::of(ws, 1, n_in)
        };
        let mut y = super::uninit::<f32>(m * n);
        // SAFETY: `a` holds m rows of k (checked above), `ws` the n_out x n_in weight (its
        // extent is checked by sgemm against the view), y has m * n slots, none shared with
        // the operands; sgemm in overwrite mode writes every one of them on every path.
        unsafe {
            sgemm(
                crate::kernels::KernelPath::active(),
                m,
                n,
                k,
                MatRef::of(a, k, 1),
                b,
                MatMut::new(y.as_mut_ptr() as *mut f32, n, y.len()),
                false,
                bias,
                crate::num_threads(),
            );
            Ok(super::assume_init(y))
        }
    })
}

/// `a + b` elementwise into `a`.
fn add_into(a: &mut [f32], b: &[f32]) {
    const CHUNK: usize = 1 << 14;
    let body = |(ac, bc): (&mut [f32], &[f32])| {
        for (x, &y) in ac.iter_mut().zip(bc) {
            *x += y;
        }
    };
    if super::use_par(a.len()) {
        a.par_chunks_mut(CHUNK).zip(b.par_chunks(CHUNK)).for_each(body);
    } else {
        a.chunks_mut(CHUNK).zip(b.chunks(CHUNK)).for_each(body);
    }
}

/// What forward keeps for backward of the middle: attention's input `u` (the first layer's
/// output; attention recomputes its probabilities from it), or a GELU's derivative at `u`
/// (computed with the value in one pass; backward is then one product by it).
enum SavedMid {
    Input(Vec<f32>),
    GeluDerivative(Vec<f32>),
}

/// What forward keeps for backward: the middle's, and post-norm the sum `s` the norm reads.
type Saved = (Arc<SavedMid>, Option<Arc<Vec<f32>>>);

pub(crate) struct BranchOp {
    input: FrozenLinear,
    mid: BranchMid,
    output: FrozenLinear,
    norm_at: NormAt,
    eps: f64,
    dropout: Option<(f64, u64)>,
    /// Whether backward may run (an operand takes part in backprop): otherwise forward
    /// keeps nothing and computes no derivative.
    backward: bool,
    saved: Mutex<Option<Saved>>,
}

impl BranchOp {
    pub(crate) fn new(
        input: FrozenLinear,
        mid: BranchMid,
        output: FrozenLinear,
        norm_at: NormAt,
        eps: f64,
        dropout: Option<(f64, u64)>,
        backward: bool,
    ) -> Self {
        Self {
            input,
            mid,
            output,
            norm_at,
            eps,
            dropout,
            backward,
            saved: Mutex::new(None),
        }
    }

    /// Checks `x`'s shape against the layers; returns the shape of `u` (the first layer's
    /// output).
    fn check(&self, x: &Shape, norm: usize) -> Result<Shape> {
        let c = x.dims().last().copied().unwrap_or(0);
        let mid_out = match self.mid {
            BranchMid::GeluNew | BranchMid::GeluErf => self.input.n_out,
            BranchMid::Attention(_) => self.input.n_out / 3,
        };
        let ok = c == norm
            && c == self.input.n_in
            && self.output.n_out == c
            && self.output.n_in == mid_out
            && c > 0
            && mid_out > 0
            && (!matches!(self.mid, BranchMid::Attention(_)) || (x.rank() == 3 && self.input.n_out.is_multiple_of(3)));
        if !ok {
            candle_core::bail!(
                "residual branch: input {x:?} does not fit norm {norm}, layers {} -> {} and {} -> {} ({:?})",
                self.input.n_in,
                self.input.n_out,
                self.output.n_in,
                self.output.n_out,
                self.mid
            )
        }
        let mut d = x.dims().to_vec();
        *d.last_mut().expect("rank >= 1") = self.input.n_out;
        Ok(Shape::from(d))
    }

    /// `mid(u)`, and what backward needs of the middle when it may run.
    fn mid_fwd(&self, u: Vec<f32>, u_shape: &Shape) -> Result<(Vec<f32>, Option<SavedMid>)> {
        use super::fastmath::{GeluErf, GeluNew};
        use super::gelu::fwd_and_grad;
        Ok(match (&self.mid, self.backward) {
            (BranchMid::GeluNew, false) => (super::gelu::gelu_new_fwd(&u), None),
            (BranchMid::GeluErf, false) => (super::gelu::gelu_erf_fwd(&u), None),
            (BranchMid::GeluNew, true) => {
                let (v, d) = fwd_and_grad::<GeluNew>(&u);
                (v, Some(SavedMid::GeluDerivative(d)))
            }
            (BranchMid::GeluErf, true) => {
                let (v, d) = fwd_and_grad::<GeluErf>(&u);
                (v, Some(SavedMid::GeluDerivative(d)))
            }
            (BranchMid::Attention(spec), backward) => {
                let v = packed_forward(&u, u_shape, spec, None)?;
                (v, backward.then_some(SavedMid::Input(u)))
            }
        })
    }

    /// From the gradient `d` of the residual sum's branch term (before dropout) to the
    /// gradient of the first layer's input: `(mid'(u, (d * m) W2)) W1`.
    fn branch_bwd(&self, saved: &SavedMid, u_shape: &Shape, d: &[f32]) -> Result<Vec<f32>> {
        let dz = self.dropout.map(|(p, seed)| DropoutAdd { p, seed }.run(None, d));
        let dv = self.output.apply_t(dz.as_deref().unwrap_or(d))?;
        drop(dz);
        let du = match (&self.mid, saved) {
            (BranchMid::GeluNew | BranchMid::GeluErf, SavedMid::GeluDerivative(g)) => super::gelu::times(&dv, g),
            (BranchMid::Attention(spec), SavedMid::Input(u)) => packed_backward(u, &dv, u_shape, spec, None)?,
            _ => candle_core::bail!(
                "{}: forward kept the wrong values for {:?}",
                super::ThreeOperands::name(self),
                self.mid
            ),
        };
        drop(dv);
        self.input.apply_t(&du)
    }
}

impl super::ThreeOperands for BranchOp {
    fn name(&self) -> &'static str {
        match self.norm_at {
            NormAt::Input => "fpt-pre-norm-branch",
            NormAt::Output => "fpt-post-norm-branch",
        }
    }

    fn forward_cpu(&self, [(s1, l1), (s2, l2), (s3, l3)]: [(&CpuStorage, &Layout); 3]) -> Result<(CpuStorage, Shape)> {
        super::f32_only(&[s1, s2, s3], self.name())?;
        let x = cpu_slice::<f32>(s1, l1, self.name())?;
        let gamma = cpu_slice::<f32>(s2, l2, self.name())?;
        let beta = cpu_slice::<f32>(s3, l3, self.name())?;
        if beta.len() != gamma.len() {
            candle_core::bail!(
                "{}: norm weight {} and bias {} differ",
                self.name(),
                gamma.len(),
                beta.len()
            )
        }
        let u_shape = self.check(l1.shape(), gamma.len())?;
        let u = match self.norm_at {
            NormAt::Input => self
                .input
                .apply(&super::layer_norm::fwd_kernel(x, gamma, beta, self.eps))?,
            NormAt::Output => self.input.apply(x)?,
        };
        let (v, saved_mid) = self.mid_fwd(u, &u_shape)?;
        let z = self.output.apply(&v)?;
        drop(v);
        let sum = match self.dropout {
            Some((p, seed)) => DropoutAdd { p, seed }.run(Some(x), &z),
            None => {
                let mut z = z;
                add_into(&mut z, x);
                z
            }
        };
        let (y, s) = match self.norm_at {
            NormAt::Input => (sum, None),
            NormAt::Output => (
                super::layer_norm::fwd_kernel(&sum, gamma, beta, self.eps),
                self.backward.then(|| Arc::new(sum)),
            ),
        };
        *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = saved_mid.map(|m| (Arc::new(m), s));
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    fn gradients(&self, [x, gamma, beta]: [&Tensor; 3], _res: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 3]> {
        let want = [tracks(x), tracks(gamma), tracks(beta)];
        let (u, s) = self
            .saved
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                candle_core::Error::Msg(format!(
                    "{}: backward before forward, or of a forward that no operand's gradient asked for",
                    self.name()
                ))
            })?;
        let u_shape = self.check(x.shape(), gamma.elem_count())?;
        let what = self.name();
        let (dx, dg, db) = with_cpu_slice::<f32, _>(dy, what, |g| {
            with_cpu_slice::<f32, _>(gamma, what, |gs| match (self.norm_at, s.as_deref()) {
                (NormAt::Input, _) => {
                    let da = self.branch_bwd(&u, &u_shape, g)?;
                    let (mut dx, dg, db) = with_cpu_slice::<f32, _>(x, what, |xs| {
                        Ok(super::layer_norm::bwd_kernel(xs, gs, &da, self.eps))
                    })?;
                    // The residual path: x's gradient is the output's plus the norm's.
                    add_into(&mut dx, g);
                    Ok((dx, dg, db))
                }
                (NormAt::Output, Some(s)) => {
                    let (ds, dg, db) = super::layer_norm::bwd_kernel(s, gs, g, self.eps);
                    // x's gradient: the sum's (the residual path) plus the branch's.
                    let mut dx = self.branch_bwd(&u, &u_shape, &ds)?;
                    add_into(&mut dx, &ds);
                    Ok((dx, dg, db))
                }
                (NormAt::Output, None) => candle_core::bail!("{what}: forward kept no sum"),
            })
        })?;
        Ok([
            grad_like(dx, x, want[0])?,
            grad_like(dg, gamma, want[1])?,
            grad_like(db, beta, want[2])?,
        ])
    }
}

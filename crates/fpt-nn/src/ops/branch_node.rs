//! A residual branch over frozen linear layers ([`crate::ResidualBranch`]) as one node of
//! candle's graph on any device: what a GPU runs (the CPU runs the fused op of
//! `residual_branch.rs`, whose kernels are its own).
//!
//! Composed of the layers' ops, the branch leaves every intermediate in the graph (the
//! first layer's output `u`, the middle's `v`, the second layer's `z`, the residual sum),
//! and candle's backprop starts each of their gradients as a zero tensor and adds into it:
//! a memset and a pass over memory per intermediate, for gradients that have one
//! contributor each (candle's `badd` took 14 ms of a 54 ms step on an H100, issue 56).
//! Here the forward runs the same ops on detached operands, so nothing of it is in the
//! graph but the branch's output, and the node's backward chains the ops' own backward
//! passes by hand: each intermediate's gradient is the one product or kernel that makes
//! it, and `x`'s two contributions (the residual path's and the branch's) are added once,
//! starting from the first. Its values are the composed ops' to the last bit, forward and
//! backward (the same ops in the same order; the two contributions' sum is commutative),
//! which `tests` below check on the CPU, on every kernel path.

use super::residual_branch::NormAt;
use super::{tracks, InputGrad, ThreeOperands};
use candle_core::{CpuStorage, Layout, Result, Shape, Tensor};
use std::sync::Arc;

/// A frozen linear layer as the node's backward multiplies by it.
pub(crate) struct NodeLinear {
    /// `W` (`[n_out, n_in]`, f32 or bf16).
    pub(crate) weight: Tensor,
    /// A bf16 `W` packed for the input gradient's product on the CPU, when the layer keeps one.
    pub(crate) packed_t: Option<Arc<super::sgemm::PackedB>>,
    /// The shape of the layer's input.
    pub(crate) input_shape: Shape,
}

impl NodeLinear {
    /// The layer input's gradient from its output's.
    fn input_grad(&self, dy: &Tensor) -> Result<Tensor> {
        super::linear::frozen_input_grad(dy, &self.weight, self.packed_t.clone(), &self.input_shape)
    }
}

/// The middle's backward: a GELU's at its input `u`, or the attention op's kept backward.
pub(crate) enum NodeMid {
    /// `gelu_erf` (`erf: true`) or `gelu_new` at `u`.
    Gelu { erf: bool, u: Tensor },
    /// The chosen attention op's backward ([`super::attention_dispatch`]).
    Attention(InputGrad),
}

/// The branch node: its output (computed beforehand) and what its backward reads.
pub(crate) struct BranchNode {
    pub(crate) out: super::Computed,
    pub(crate) input: NodeLinear,
    pub(crate) mid: NodeMid,
    pub(crate) output: NodeLinear,
    pub(crate) norm_at: NormAt,
    pub(crate) eps: f64,
    /// The residual dropout `(p, seed)`, as [`super::dropout_add`] draws it.
    pub(crate) dropout: Option<(f64, u64)>,
    /// Post-norm: the residual sum the norm reads.
    pub(crate) sum: Option<Tensor>,
}

impl BranchNode {
    /// From the gradient `d` of the residual sum's branch term to the gradient of the first
    /// layer's input: `W1^T mid'(W2^T (d * mask))`.
    fn branch_grad(&self, d: &Tensor) -> Result<Tensor> {
        let dz = match self.dropout {
            Some((p, seed)) => super::dropout::dropout_add_grad(d, p, seed)?,
            None => d.clone(),
        };
        let dv = self.output.input_grad(&dz)?;
        drop(dz);
        let du = match &self.mid {
            NodeMid::Gelu { erf, u } => super::gelu::gelu_grad(*erf, u, &dv)?,
            NodeMid::Attention(grad) => grad(&dv)?,
        };
        drop(dv);
        self.input.input_grad(&du)
    }
}

impl ThreeOperands for BranchNode {
    fn name(&self) -> &'static str {
        match self.norm_at {
            NormAt::Input => "fpt-pre-norm-branch-node",
            NormAt::Output => "fpt-post-norm-branch-node",
        }
    }

    fn forward_cpu(&self, _: [(&CpuStorage, &Layout); 3]) -> Result<(CpuStorage, Shape)> {
        self.out.take(super::computed_cpu)
    }

    #[cfg(feature = "cuda")]
    fn forward_cuda(&self, _: [(&candle_core::CudaStorage, &Layout); 3]) -> Result<(candle_core::CudaStorage, Shape)> {
        self.out.take(super::computed_cuda)
    }

    fn gradients(&self, [x, gamma, beta]: [&Tensor; 3], _res: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 3]> {
        let want = [tracks(x), tracks(gamma), tracks(beta)];
        let gamma = gamma.detach();
        match (self.norm_at, &self.sum) {
            (NormAt::Input, _) => {
                let da = self.branch_grad(dy)?;
                let [dxn, dg, db] = super::layer_norm::layer_norm_grads(&x.detach(), &gamma, &da, self.eps, want)?;
                // The residual path's contribution and the norm's.
                let dx = dxn.map(|d| dy + d).transpose()?;
                Ok([dx, dg, db])
            }
            (NormAt::Output, Some(s)) => {
                let [ds, dg, db] = super::layer_norm::layer_norm_grads(s, &gamma, dy, self.eps, want)?;
                // x's gradient: the sum's (the residual path) plus the branch's.
                let dx = match ds {
                    Some(ds) => Some((&ds + self.branch_grad(&ds)?)?),
                    None => None,
                };
                Ok([dx, dg, db])
            }
            (NormAt::Output, None) => candle_core::bail!("{}: forward kept no sum", self.name()),
        }
    }
}

/// How `FPT_BRANCH` says a [`crate::ResidualBranch`] over frozen layers runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchChoice {
    /// Unset, empty or `auto`: the fused op on the CPU, the node on a GPU.
    Auto,
    /// `node`: the node on every device (on the CPU in place of the fused op: how the
    /// tests train through the GPU's branch without a GPU).
    Node,
    /// `composed`: the layers' ops, each intermediate a node of candle's graph, on every
    /// device (the reference; the GPU's branch before the node).
    Composed,
}

/// `FPT_BRANCH`'s value as a [`BranchChoice`]; anything else an error naming the variable
/// and the choices.
pub fn parse_branch_choice(value: Option<&str>) -> std::result::Result<BranchChoice, String> {
    match value.map(str::trim) {
        None | Some("") | Some("auto") => Ok(BranchChoice::Auto),
        Some("node") => Ok(BranchChoice::Node),
        Some("composed") => Ok(BranchChoice::Composed),
        Some(other) => Err(format!(
            "FPT_BRANCH=`{other}`: the choices are `node` (each residual branch one node of the graph, \
             on every device), `composed` (the layers' ops, on every device) and `auto` (the default: \
             fused on the CPU, a node on a GPU)"
        )),
    }
}

thread_local! {
    /// [`with_branch`]'s choice on this thread, over `FPT_BRANCH`.
    static OVERRIDE: std::cell::Cell<Option<BranchChoice>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the residual branches run as `choice` says on this thread (`None`: as
/// `FPT_BRANCH` says), whatever `FPT_BRANCH` is; [`crate::on_pool`] carries it to the pool's
/// worker. How the tests compare the GPU's branch with the composed one in one process.
pub fn with_branch<R>(choice: Option<BranchChoice>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<BranchChoice>);
    impl Drop for Restore {
        fn drop(&mut self) {
            OVERRIDE.with(|o| o.set(self.0));
        }
    }
    let _restore = Restore(OVERRIDE.with(|o| o.replace(choice)));
    f()
}

/// This thread's [`with_branch`] choice, if any.
pub fn overridden() -> Option<BranchChoice> {
    OVERRIDE.with(|o| o.get())
}

/// The choice in force: this thread's [`with_branch`], else `FPT_BRANCH` as this process
/// reads it (once).
pub fn branch_choice() -> Result<BranchChoice> {
    if let Some(c) = overridden() {
        return Ok(c);
    }
    static CHOICE: std::sync::OnceLock<std::result::Result<BranchChoice, String>> = std::sync::OnceLock::new();
    CHOICE
        .get_or_init(|| parse_branch_choice(std::env::var("FPT_BRANCH").ok().as_deref()))
        .clone()
        .map_err(candle_core::Error::Msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_branch_switch_is_read_and_a_bad_value_named() {
        assert_eq!(parse_branch_choice(None), Ok(BranchChoice::Auto));
        assert_eq!(parse_branch_choice(Some(" auto")), Ok(BranchChoice::Auto));
        assert_eq!(parse_branch_choice(Some("node")), Ok(BranchChoice::Node));
        assert_eq!(parse_branch_choice(Some("composed ")), Ok(BranchChoice::Composed));
        let e = parse_branch_choice(Some("fused")).unwrap_err();
        assert!(
            e.contains("FPT_BRANCH") && e.contains("fused") && e.contains("node"),
            "{e}"
        );
    }

    #[test]
    fn the_override_holds_inside_and_on_the_pool_and_is_restored() {
        let before = branch_choice().unwrap();
        with_branch(Some(BranchChoice::Node), || {
            assert_eq!(branch_choice().unwrap(), BranchChoice::Node);
            with_branch(Some(BranchChoice::Composed), || {
                assert_eq!(crate::on_pool(|| branch_choice().unwrap()), BranchChoice::Composed);
            });
            assert_eq!(branch_choice().unwrap(), BranchChoice::Node);
        });
        assert_eq!(branch_choice().unwrap(), before);
    }
}

//! Layers over [`Param`]s: each picks the op that computes no gradient for what is frozen.

pub use crate::ops::residual_branch::{BranchMid, NormAt};
use crate::{ops, Param};

use crate::ops::sgemm::{MatRef, PackedB};
use candle_core::{DType, Result, Tensor, TensorId};
use std::sync::{Arc, Mutex};

/// A frozen weight packed for the forward product, with the id of the tensor it was
/// packed from (so a replaced weight is packed again, never read stale).
type PackCache = Arc<Mutex<Option<(TensorId, Arc<PackedB>)>>>;

/// `y = x W^T + b`, `W: [out, in]`.
///
/// On the AVX2 and AVX-512 kernel paths, a frozen f32 weight is packed for the forward product at the first
/// forward and kept (one more copy of the weight in memory; clones of the layer share it),
/// so the steps after the first skip re-packing it. A [`ResidualBranch`] also keeps it packed
/// for the backward product (a second copy).
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Param,
    /// `[out]`.
    pub bias: Option<Param>,
    /// `W^T` packed (the forward product's operand).
    packed: PackCache,
    /// `W` packed (the input gradient's product's operand).
    packed_t: PackCache,
}

impl Linear {
    /// A linear layer from its parameters.
    pub fn new(weight: Param, bias: Option<Param>) -> Self {
        Self {
            weight,
            bias,
            packed: Arc::default(),
            packed_t: Arc::default(),
        }
    }

    /// Applies the layer to `x: [.., in]`. The op computes gradients only for what takes
    /// part in backprop: a frozen weight gets none.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let w = self.weight.get();
        let (packed, packed_t) = if self.packs_for(x) {
            // A bf16 weight is packed for the input gradient's product too (half the bytes
            // of an f32 pack each); an f32 one only for the forward's.
            let t = if w.dtype() == DType::BF16 && x.track_op() {
                Some(self.packed_weight(true)?)
            } else {
                None
            };
            (Some(self.packed_weight(false)?), t)
        } else {
            (None, None)
        };
        let b = self.bias.as_ref().map(|b| b.get());
        ops::linear_prepacked(x, &w, b.as_ref(), packed, packed_t)
    }

    /// The bf16 weight packed for the input gradient's product, as [`Self::forward`] keeps
    /// it for a tracked `x` (none for an f32 weight or where nothing is packed).
    pub(crate) fn input_grad_pack(&self, x: &Tensor) -> Result<Option<Arc<PackedB>>> {
        match self.packs_for(x) && self.weight.tensor().dtype() == DType::BF16 {
            true => Ok(Some(self.packed_weight(true)?)),
            false => Ok(None),
        }
    }

    /// Whether the weight is kept packed for `x`: frozen, on the CPU with `x` f32, and
    /// either f32 on the AVX2 or AVX-512 kernel path or bf16 on the `avx512bf16` path.
    fn packs_for(&self, x: &Tensor) -> bool {
        let path = crate::kernels::KernelPath::active();
        self.frozen_cpu(x)
            && match self.weight.tensor().dtype() {
                DType::BF16 => path.bf16(),
                _ => path.own_gemm(),
            }
    }

    /// Whether the weight is frozen, `x` is f32 and the (contiguous) weight f32 or bf16, all
    /// on the CPU.
    fn frozen_cpu(&self, x: &Tensor) -> bool {
        let w = self.weight.tensor();
        !self.weight.is_trainable()
            && x.dtype() == DType::F32
            && matches!(w.dtype(), DType::F32 | DType::BF16)
            && x.device().is_cpu()
            && w.device().is_cpu()
            && w.is_contiguous()
    }

    /// Whether the bias (if any) is frozen too.
    fn bias_frozen(&self) -> bool {
        self.bias.as_ref().is_none_or(|b| !b.is_trainable())
    }

    /// The weight packed as the forward product's operand `W^T` (`transposed: false`) or as
    /// the backward product's `W` (`true`), packed at the first call.
    pub(crate) fn packed_weight(&self, transposed: bool) -> Result<Arc<PackedB>> {
        let w = self.weight.tensor();
        let cache = if transposed { &self.packed_t } else { &self.packed };
        let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((id, p)) = cache.as_ref() {
            if *id == w.id() {
                return Ok(p.clone());
            }
        }
        let (n, k) = w.dims2()?;
        let id = w.id();
        let w = w.contiguous()?;
        let (storage, layout) = w.storage_and_layout();
        let cpu = match &*storage {
            candle_core::Storage::Cpu(cs) => cs,
            _ => candle_core::bail!("linear: expected a CPU weight"),
        };
        let (a, b) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("linear: weight is not contiguous".into()))?;
        let threads = crate::num_threads();
        if w.dtype() == DType::BF16 {
            let ws = &cpu.as_slice::<half::bf16>()?[a..b];
            let p = Arc::new(if transposed {
                PackedB::new_bf16(ws, k, 1, n, k, threads)
            } else {
                PackedB::new_bf16(ws, 1, k, k, n, threads)
            });
            *cache = Some((id, p.clone()));
            return Ok(p);
        }
        let ws = &cpu.as_slice::<f32>()?[a..b];
        let p = Arc::new(if transposed {
            // B = W: [n, k] row-major.
            PackedB::new(MatRef::of(ws, k, 1), n, k, threads)
        } else {
            // B = W^T: element (p, j) = w[j * k + p] -> row stride 1, column stride k.
            PackedB::new(MatRef::of(ws, 1, k), k, n, threads)
        });
        *cache = Some((id, p.clone()));
        Ok(p)
    }

    /// The bias values (f32, CPU), if any.
    fn bias_values(&self) -> Result<Option<Vec<f32>>> {
        self.bias
            .as_ref()
            .map(|b| b.tensor().flatten_all()?.to_vec1::<f32>())
            .transpose()
    }
}

/// A residual branch over two linear layers with a LayerNorm, either on the branch input
/// (pre-norm, [`NormAt::Input`]: `x + dropout(output(mid(input(norm(x)))))`, a half of a
/// GPT-2 block) or on the residual sum (post-norm, [`NormAt::Output`]:
/// `norm(x + dropout(output(mid(input(x)))))`, a half of a BERT block).
///
/// When both linear layers are frozen (weights and biases) and `x` is f32 on the CPU (any
/// kernel path), [`ResidualBranch::forward`] runs it as one op
/// ([`ResidualBranch::is_fused`]): its backward chains the same kernels by hand and returns
/// gradients for `x` and the norm's parameters only. The composed version hands each
/// intermediate's gradient to candle's backward, which starts every one from a zero tensor
/// and adds to it (a memset and a full pass over memory per intermediate, ~7% of a GPT-2
/// base FPT step); the fused op keeps the intermediates between its kernels and stores only
/// the first layer's output (and, post-norm, the sum the norm reads) for backward. On the
/// AVX2 and AVX-512 paths both linear layers keep their weight packed for the forward and
/// the backward products; on the portable path the products read the weights as they are.
/// On a GPU (f32, frozen layers, an operand in backprop) it runs
/// [`ResidualBranch::forward_node`]: the composed ops' values, the same hand-chained
/// backward over those ops' own backward passes. Elsewhere (a trained weight, another
/// dtype or device) it runs [`ResidualBranch::forward_composed`].
#[derive(Debug, Clone, Copy)]
pub struct ResidualBranch<'a> {
    /// The norm: on the branch input or on the residual sum (`norm_at`).
    pub norm: &'a LayerNorm,
    /// Where `norm` sits.
    pub norm_at: NormAt,
    /// The first linear layer (`c_attn` or `c_fc` in GPT-2, the packed query/key/value or
    /// `intermediate.dense` in BERT).
    pub input: &'a Linear,
    /// What runs between the two.
    pub mid: BranchMid,
    /// The second linear layer, back to the width of `x`.
    pub output: &'a Linear,
}

impl ResidualBranch<'_> {
    /// Whether [`Self::forward`] runs the fused op for `x`.
    pub fn is_fused(&self, x: &Tensor) -> bool {
        let layers = [self.input, self.output];
        let norm_f32 = [&self.norm.weight, &self.norm.bias]
            .iter()
            .all(|p| p.tensor().dtype() == DType::F32 && p.tensor().device().is_cpu());
        let rank_ok = match self.mid {
            BranchMid::GeluNew | BranchMid::GeluErf => x.rank() >= 1,
            BranchMid::Attention(_) => x.rank() == 3,
        };
        norm_f32
            && rank_ok
            && layers.iter().all(|l| {
                l.frozen_cpu(x) && l.bias_frozen() && l.bias.as_ref().is_none_or(|b| b.tensor().dtype() == DType::F32)
            })
    }

    /// The branch with residual dropout `(p, seed)` (as [`ops::dropout_add`]; `None`: plain
    /// sum). Fused when [`Self::is_fused`], one node when [`Self::is_node`], else
    /// [`Self::forward_composed`]; the three agree.
    pub fn forward(&self, x: &Tensor, dropout: Option<(f64, u64)>) -> Result<Tensor> {
        if self.is_node(x)? {
            return self.forward_node(x, dropout);
        }
        if !self.is_fused(x) || ops::branch_node::branch_choice()? == ops::branch_node::BranchChoice::Composed {
            return self.forward_composed(x, dropout);
        }
        let layer = |l: &Linear| -> Result<ops::residual_branch::FrozenLinear> {
            let (n_out, n_in) = l.weight.tensor().dims2()?;
            let weight = if l.packs_for(x) {
                ops::residual_branch::FrozenWeight::Packed {
                    forward: l.packed_weight(false)?,
                    backward: l.packed_weight(true)?,
                }
            } else {
                ops::residual_branch::FrozenWeight::Plain(l.weight.tensor().clone())
            };
            Ok(ops::residual_branch::FrozenLinear {
                weight,
                bias: l.bias_values()?,
                n_in,
                n_out,
            })
        };
        let (gamma, beta) = (self.norm.weight.get(), self.norm.bias.get());
        let op = ops::residual_branch::BranchOp::new(
            layer(self.input)?,
            self.mid,
            layer(self.output)?,
            self.norm_at,
            self.norm.eps,
            dropout.filter(|&(p, _)| p > 0.0),
            [x, &gamma, &beta].iter().any(|t| t.track_op()),
        );
        x.contiguous()?.apply_op3(&gamma, &beta, ops::Three(op))
    }

    /// Whether [`Self::forward`] runs [`Self::forward_node`] for `x`: f32, both linear layers
    /// frozen, an operand taking part in backprop, and on a GPU (`FPT_BRANCH` unset or
    /// `auto`) or on any device (`FPT_BRANCH=node`); never under `FPT_BRANCH=composed`.
    pub fn is_node(&self, x: &Tensor) -> Result<bool> {
        use ops::branch_node::BranchChoice;
        let norm = [&self.norm.weight, &self.norm.bias];
        let fits = x.dtype() == DType::F32
            && (x.rank() == 3 || !matches!(self.mid, BranchMid::Attention(_)))
            && norm.iter().all(|p| p.tensor().dtype() == DType::F32)
            && [self.input, self.output]
                .iter()
                .all(|l| !l.weight.is_trainable() && l.bias_frozen())
            && (x.track_op() || norm.iter().any(|p| p.is_trainable()));
        Ok(fits
            && match ops::branch_node::branch_choice()? {
                BranchChoice::Auto => x.device().is_cuda(),
                BranchChoice::Node => true,
                BranchChoice::Composed => false,
            })
    }

    /// The branch as one node of candle's graph, on any device: the values of
    /// [`Self::forward_composed`] (its ops, run on detached operands) and a backward that
    /// chains those ops' own backward passes by hand (`ops/branch_node.rs`), so the
    /// intermediates' gradients never reach candle's gradient store, which would start each
    /// from a zero tensor and add into it. What a GPU runs ([`Self::is_node`]); the linear
    /// layers must be frozen (their weights get no gradient here).
    pub fn forward_node(&self, x: &Tensor, dropout: Option<(f64, u64)>) -> Result<Tensor> {
        use ops::branch_node::{BranchNode, NodeLinear, NodeMid};
        if let Some(l) = [self.input, self.output]
            .iter()
            .find(|l| l.weight.is_trainable() || !l.bias_frozen())
        {
            candle_core::bail!(
                "residual branch node: the linear layer {:?} trains; the node computes no weight gradient",
                l.weight.tensor().dims()
            )
        }
        let (gamma, beta) = (self.norm.weight.get(), self.norm.bias.get());
        let (xd, gd, bd) = (x.detach(), gamma.detach(), beta.detach());
        let eps = self.norm.eps;
        let a = match self.norm_at {
            NormAt::Input => ops::layer_norm(&xd, &gd, &bd, eps)?,
            NormAt::Output => xd.clone(),
        };
        let u = self.input.forward(&a)?;
        let (v, mid) = match self.mid {
            BranchMid::GeluNew => (ops::gelu_new(&u)?, NodeMid::Gelu { erf: false, u }),
            BranchMid::GeluErf => (ops::gelu_erf(&u)?, NodeMid::Gelu { erf: true, u }),
            BranchMid::Attention(spec) => {
                let (v, grad) = ops::attention_packed_detached(&u, spec)?;
                (v, NodeMid::Attention(grad))
            }
        };
        let z = self.output.forward(&v)?;
        let (v_shape, output_pack) = (v.shape().clone(), self.output.input_grad_pack(&v)?);
        drop(v);
        let sum = match dropout {
            Some((p, seed)) => ops::dropout_add(&xd, &z, p, seed)?,
            None => (&xd + z)?,
        };
        let (y, sum) = match self.norm_at {
            NormAt::Input => (sum, None),
            NormAt::Output => (ops::layer_norm(&sum, &gd, &bd, eps)?, Some(sum)),
        };
        if ![x, &gamma, &beta].iter().any(|t| t.track_op()) {
            return Ok(y);
        }
        let node = BranchNode {
            out: ops::Computed::new("residual branch node", y),
            input: NodeLinear {
                weight: self.input.weight.tensor().clone(),
                packed_t: self.input.input_grad_pack(&a)?,
                input_shape: a.shape().clone(),
            },
            mid,
            output: NodeLinear {
                weight: self.output.weight.tensor().clone(),
                packed_t: output_pack,
                input_shape: v_shape,
            },
            norm_at: self.norm_at,
            eps,
            dropout,
            sum,
        };
        x.apply_op3(&gamma, &beta, ops::Three(node))
    }

    /// The branch composed of the layers' own ops (the reference; every device).
    pub fn forward_composed(&self, x: &Tensor, dropout: Option<(f64, u64)>) -> Result<Tensor> {
        let u = match self.norm_at {
            NormAt::Input => self.input.forward(&self.norm.forward(x)?)?,
            NormAt::Output => self.input.forward(x)?,
        };
        let v = match self.mid {
            BranchMid::GeluNew => ops::gelu_new(&u)?,
            BranchMid::GeluErf => ops::gelu_erf(&u)?,
            BranchMid::Attention(spec) => ops::attention_packed(&u, spec)?,
        };
        let z = self.output.forward(&v)?;
        let sum = match dropout {
            Some((p, seed)) => ops::dropout_add(x, &z, p, seed)?,
            None => (x + z)?,
        };
        match self.norm_at {
            NormAt::Input => Ok(sum),
            NormAt::Output => self.norm.forward(&sum),
        }
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
        ops::layer_norm(x, &self.weight.get(), &self.bias.get(), self.eps)
    }
}

/// A lookup table `[vocab, d]`.
#[derive(Debug, Clone)]
pub struct Embedding {
    /// `[vocab, d]`.
    pub weight: Param,
}

impl Embedding {
    /// Looks up `ids: [b, t]` (u32) -> `[b, t, d]`. Under `FPT_CHECK_DEVICE=1`
    /// ([`crate::transfer::checking`]) the ids as the device holds them are read back
    /// first, and one outside the table is an error naming it (a GPU's lookup would stop
    /// the process with a device-side assert).
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.forward_checked(ids, crate::transfer::checking(ids.device()))
    }

    /// [`Embedding::forward`], reading the ids back and checking them against the table
    /// first when `check` is set.
    pub fn forward_checked(&self, ids: &Tensor, check: bool) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let (rows, d) = self.weight.tensor().dims2()?;
        if check {
            let held = crate::transfer::download_vec::<u32>(ids)?;
            if let Some((i, id)) = held.iter().enumerate().find(|(_, &id)| id as usize >= rows) {
                candle_core::bail!(
                    "FPT_CHECK_DEVICE: embedding: id {id} at position {i} of a [{b}, {t}] batch is outside the table's {rows} rows"
                )
            }
        }
        self.weight
            .get()
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, d))
    }
}

//! The frozen pretrained transformer (Lu et al. 2021, §2.2, reference `fpt.py`): a new
//! input layer, a backbone whose attention and feed-forward weights stay frozen, and a new
//! output layer read from the last token(s).
//!
//! - Input layer: `Linear(width, hidden)` with an orthogonal init of gain 1.41 and zero
//!   bias, then dropout 0.1; or `Embedding(vocab, hidden)` with N(0, 1) init for token tasks.
//! - Output layer: `Linear(hidden, output_dim)` with PyTorch's default init, applied to the
//!   last `readout_tokens` hidden states (the reference code's `ratio`), whose logits are
//!   laid out as `[labels_per_example, classes]`.
//! - Parameter groups by [`Role`]; which train is a [`TrainGroups`]. Frozen tensors are
//!   plain tensors, trainable ones `Var`s; [`Fpt::trainable`] lists the `Var`s only.

use candle_core::{Device, Tensor, Var};
use fpt_backbones::{Backbone, ParamSpec};
use fpt_nn::{Ctx, Embedding, Linear, Param, Rng};
use fpt_spec::{Role, TrainGroups};
use fpt_tasks::{InputKind, Inputs, TaskDims};
use serde::Serialize;
use std::collections::BTreeMap;

/// Errors from building or running the model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The task does not fit the backbone.
    #[error("{0}")]
    Mismatch(String),
    /// An error inside candle.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, ModelError>;

/// Settings of the layers around the backbone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadConfig {
    /// Dropout after the input layer.
    pub input_dropout: f64,
    /// Gain of the orthogonal init of a Linear input layer.
    pub orth_gain: f64,
    /// How a Linear input layer is initialised.
    pub input_init: fpt_spec::InputInit,
}

impl Default for HeadConfig {
    fn default() -> Self {
        Self {
            input_dropout: fpt_spec::DEFAULT_INPUT_DROPOUT,
            orth_gain: fpt_spec::DEFAULT_ORTH_GAIN,
            input_init: fpt_spec::InputInit::Orthogonal,
        }
    }
}

enum InputLayer {
    Linear(Linear),
    Embedding(Embedding),
}

/// Total and trainable parameter counts per role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ParamCounts {
    /// Per role: (total, trainable).
    pub by_role: BTreeMap<Role, (usize, usize)>,
    /// All parameters, including ones the forward pass does not use (GPT-2's `wte`).
    pub total: usize,
    /// Trained parameters.
    pub trainable: usize,
}

impl ParamCounts {
    fn add(&mut self, role: Role, n: usize, trains: bool) {
        let e = self.by_role.entry(role).or_default();
        e.0 += n;
        self.total += n;
        if trains {
            e.1 += n;
            self.trainable += n;
        }
    }
}

/// Shapes of the input and output layers for a task on a backbone of width `hidden`:
/// (name, shape, role).
fn head_specs(dims: &TaskDims, hidden: usize) -> Vec<(&'static str, Vec<usize>, Role)> {
    let mut v = match dims.input {
        InputKind::Vectors { width } => vec![
            ("input.weight", vec![hidden, width], Role::Input),
            ("input.bias", vec![hidden], Role::Input),
        ],
        InputKind::Tokens { vocab } => vec![("input.weight", vec![vocab, hidden], Role::Input)],
    };
    v.push(("output.weight", vec![dims.output_dim(), hidden], Role::Output));
    v.push(("output.bias", vec![dims.output_dim()], Role::Output));
    v
}

/// Parameter counts of a backbone from its specs alone (no weights needed), with the same
/// trainable predicate the backbones build their parameters with
/// ([`fpt_spec::TrainGroups::trains_tensor`]).
pub fn count_backbone(backbone: &[ParamSpec], groups: &TrainGroups) -> ParamCounts {
    let last = fpt_backbones::last_block(backbone.iter().map(|s| s.name.as_str()));
    let mut c = ParamCounts::default();
    for s in backbone {
        c.add(s.role, s.numel(), s.trains(groups, last));
    }
    c
}

/// Parameter counts of an FPT from the backbone's specs alone (no weights needed), so any
/// size can be inspected; equal to [`Fpt::param_counts`] of the built model.
pub fn count_params(backbone: &[ParamSpec], hidden: usize, dims: &TaskDims, groups: &TrainGroups) -> ParamCounts {
    let mut c = count_backbone(backbone, groups);
    for (_, shape, role) in head_specs(dims, hidden) {
        c.add(role, shape.iter().product(), groups.trains(role));
    }
    c
}

/// A frozen pretrained transformer for one task.
pub struct Fpt {
    input: InputLayer,
    backbone: Box<dyn Backbone>,
    output: Linear,
    dims: TaskDims,
    head: HeadConfig,
}

impl Fpt {
    /// Wraps `backbone` for a task of shape `dims`, drawing the new layers' init from `rng`.
    pub fn new(
        backbone: Box<dyn Backbone>,
        dims: TaskDims,
        groups: TrainGroups,
        head: HeadConfig,
        device: &Device,
        rng: &mut Rng,
    ) -> Result<Self> {
        let hidden = backbone.hidden_size();
        if dims.seq_len > backbone.max_positions() {
            return Err(ModelError::Mismatch(format!(
                "the task's examples are {} tokens long but the backbone has {} positions: cut them with \
                 --max-len {} (token tasks), or use a backbone with a larger position table (random init: --positions)",
                dims.seq_len,
                backbone.max_positions(),
                backbone.max_positions()
            )));
        }
        if dims.readout_tokens == 0 || !(dims.labels_per_example * dims.classes).is_multiple_of(dims.readout_tokens) {
            return Err(ModelError::Mismatch(format!(
                "{} labels x {} classes cannot be spread over {} read-out tokens",
                dims.labels_per_example, dims.classes, dims.readout_tokens
            )));
        }
        let input = match dims.input {
            InputKind::Vectors { width } => {
                let (w, b) = match head.input_init {
                    fpt_spec::InputInit::Orthogonal => (
                        fpt_nn::init::orthogonal(hidden, width, head.orth_gain, rng, device)?,
                        Tensor::zeros(hidden, candle_core::DType::F32, device)?,
                    ),
                    fpt_spec::InputInit::Uniform => {
                        // PyTorch's nn.Linear default: U(-1/sqrt(in), 1/sqrt(in)), bias too.
                        let bound = 1.0 / (width as f64).sqrt();
                        let mut u = |n: usize| -> Vec<f32> {
                            (0..n).map(|_| ((rng.uniform() * 2.0 - 1.0) * bound) as f32).collect()
                        };
                        (
                            fpt_nn::transfer::upload(u(hidden * width), (hidden, width), device)?,
                            fpt_nn::transfer::upload(u(hidden), hidden, device)?,
                        )
                    }
                };
                InputLayer::Linear(Linear::new(
                    Param::new(w, groups.input)?,
                    Some(Param::new(b, groups.input)?),
                ))
            }
            InputKind::Tokens { vocab } => {
                let w = fpt_nn::init::normal(&[vocab, hidden], 0.0, 1.0, rng, device)?;
                InputLayer::Embedding(Embedding {
                    weight: Param::new(w, groups.input)?,
                })
            }
        };
        // PyTorch's nn.Linear default: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
        let out_dim = dims.output_dim();
        let bound = 1.0 / (hidden as f64).sqrt();
        let mut uniform =
            |n: usize| -> Vec<f32> { (0..n).map(|_| ((rng.uniform() * 2.0 - 1.0) * bound) as f32).collect() };
        let w = Tensor::from_vec(uniform(out_dim * hidden), (out_dim, hidden), device)?;
        let b = Tensor::from_vec(uniform(out_dim), out_dim, device)?;
        let output = Linear::new(Param::new(w, groups.output)?, Some(Param::new(b, groups.output)?));
        Ok(Self {
            input,
            backbone,
            output,
            dims,
            head,
        })
    }

    /// Logits `[batch, labels_per_example, classes]`.
    pub fn forward(&self, inputs: &Inputs, ctx: &mut Ctx) -> Result<Tensor> {
        let f = self.features(inputs, ctx)?;
        self.head(&f)
    }

    /// The backbone's last `readout_tokens` hidden states `[batch, readout, hidden]`: what
    /// the output layer reads (and what output-only training caches).
    pub fn features(&self, inputs: &Inputs, ctx: &mut Ctx) -> Result<Tensor> {
        let x = match (&self.input, inputs) {
            (InputLayer::Linear(l), Inputs::Vectors(x)) => {
                let h = l.forward(x)?;
                ctx.dropout(&h, self.head.input_dropout)?
            }
            (InputLayer::Embedding(e), Inputs::Tokens(ids)) => e.forward(ids)?,
            _ => {
                return Err(ModelError::Mismatch(
                    "input kind does not match the model's input layer".into(),
                ))
            }
        };
        if self.backbone.num_layers() == 0 {
            // No block (depth 0): the embedding stage's whole output, then the read-out's
            // last tokens (the backbones read out inside their last block).
            let h = self.backbone.forward(&x, ctx)?;
            let (t, k) = (h.dim(1)?, self.dims.readout_tokens);
            return Ok(h.narrow(1, t.saturating_sub(k), k.min(t))?);
        }
        Ok(self.backbone.forward_last(&x, ctx, self.dims.readout_tokens)?)
    }

    /// The output layer on [`Fpt::features`]: logits `[batch, labels_per_example, classes]`.
    pub fn head(&self, features: &Tensor) -> Result<Tensor> {
        let b = features.dim(0)?;
        let out = self.output.forward(features)?; // [b, r, output_dim]
        Ok(out.reshape((b, self.dims.labels_per_example, self.dims.classes))?)
    }

    /// Every parameter with its name and role (backbone tensors by checkpoint name).
    pub fn params(&self) -> Vec<(String, Role, &Param)> {
        let mut v: Vec<(String, Role, &Param)> = Vec::new();
        match &self.input {
            InputLayer::Linear(l) => {
                v.push(("input.weight".into(), Role::Input, &l.weight));
                if let Some(b) = &l.bias {
                    v.push(("input.bias".into(), Role::Input, b));
                }
            }
            InputLayer::Embedding(e) => v.push(("input.weight".into(), Role::Input, &e.weight)),
        }
        v.extend(self.backbone.params());
        v.push(("output.weight".into(), Role::Output, &self.output.weight));
        if let Some(b) = &self.output.bias {
            v.push(("output.bias".into(), Role::Output, b));
        }
        v
    }

    /// The trainable parameters (name, `Var`), in a fixed order.
    pub fn trainable(&self) -> Vec<(String, Var)> {
        self.params()
            .into_iter()
            .filter_map(|(n, _, p)| p.var().map(|v| (n, v.clone())))
            .collect()
    }

    /// Parameter counts per role, read off the built parameters (trainable = a `Var`, what
    /// the optimizer gets); the architecture's tensors the model does not materialise
    /// (GPT-2's `wte`, BERT's pooler) count as frozen.
    pub fn param_counts(&self) -> ParamCounts {
        let mut c = ParamCounts::default();
        let params = self.params();
        let built: std::collections::HashSet<&str> = params.iter().map(|(n, _, _)| n.as_str()).collect();
        for spec in self.backbone.param_specs() {
            if !built.contains(spec.name.as_str()) {
                c.add(spec.role, spec.numel(), false);
            }
        }
        for (_, role, p) in &params {
            c.add(*role, p.tensor().elem_count(), p.is_trainable());
        }
        c
    }

    /// The backbone.
    pub fn backbone(&self) -> &dyn Backbone {
        self.backbone.as_ref()
    }

    /// The task shapes this model was built for.
    pub fn dims(&self) -> &TaskDims {
        &self.dims
    }
}

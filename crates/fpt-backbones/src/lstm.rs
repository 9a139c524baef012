//! The layer-norm LSTM baselines of paper §3.3 (Tables 1, 3-5), as in the reference code's
//! `models/lstm.py` (`LNLSTM` of `LayerNormLSTM` cells, unidirectional, batch first).
//!
//! One cell, for input `x` and state `(h, c)`:
//!
//! ```text
//! pre = LN_i2h(W_ih x + b_ih) + LN_h2h(W_hh h + b_hh)        (4H wide)
//! i, f, o = sigmoid(pre[0:H]), sigmoid(pre[H:2H]), sigmoid(pre[2H:3H]);  g = tanh(pre[3H:4H])
//! c' = LN_cell(f * c + i * g);   h' = o * tanh(c')             (the normalised c' is carried)
//! ```
//!
//! Layers are stacked; with `residual` each layer's output is added to its input (Table 5).
//! With `positions` a learned table (zero init, 1024 rows) is added to the inputs first.
//! There is no final norm. The cell's dropout (0.1, on `h'`, which is also the next state)
//! is on in training like GPT-2's.
//!
//! The reference cell's quirks, kept by default and documented here:
//! - **LayerNorm**: unbiased variance and `eps` (1e-6) inside the square root,
//!   `(x - mean) / sqrt(var_unbiased + eps)`; computed exactly, with fpt's fused LayerNorm
//!   (`var_biased`) via `eps' = eps (n-1)/n` and a scale of `sqrt((n-1)/n)`.
//! - **LayerNorm init**: scales *and* biases drawn from U(-1/sqrt(n), 1/sqrt(n)), not 1 and
//!   0 ([`LnInit::Reference`]; [`LnInit::Unit`] gives the usual 1/0).
//! - **Initial state**: `h0` and `c0` drawn from N(0, sqrt(2 / (in + hidden))) at every
//!   forward call ([`InitialState::Random`]), from the call's random stream (`Ctx::rng`:
//!   the training stream, or the fixed evaluation stream); [`InitialState::Zeros`] is the
//!   usual choice.
//! - **Linear init**: `W_ih, b_ih, W_hh, b_hh` from U(-1/sqrt(H), 1/sqrt(H)).
//!
//! Tensor names: `wpe.weight` (positions), `layers.{i}.{i2h,h2h}.{weight,bias}` (role
//! recurrent: frozen in the FPT setting, trained with `--train all` or `rec`),
//! `layers.{i}.{ln_i2h,ln_h2h,ln_cell}.{weight,bias}` (LayerNorm).

use crate::{role_by_rules, Arch, Backbone, BackboneError, Common, Naming, ParamSpec, ParamTaker, Result};
use candle_core::{DType, Device, Tensor};
use fpt_nn::{ops, Ctx, Linear, Param, Rng};
use fpt_spec::{Role, ShapeOverrides, TrainGroups};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The reference code's freezing rule applied to the LSTM's names, first match wins.
pub const ROLE_RULES: &[(&str, Role)] = &[
    ("ln_", Role::LayerNorm),
    ("wpe", Role::Positions),
    ("2h.", Role::Recurrent),
];

/// How the cells' LayerNorm scales and biases start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LnInit {
    /// U(-1/sqrt(n), 1/sqrt(n)) for scales and biases (the reference code).
    #[default]
    Reference,
    /// Scales 1, biases 0.
    Unit,
}

/// The state a forward call starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum InitialState {
    /// N(0, sqrt(2 / (in + hidden))) per call (the reference code).
    #[default]
    Random,
    /// Zeros.
    Zeros,
}

/// An LSTM backbone's configuration (`model_type = "fpt-lstm"` in a `config.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LstmConfig {
    /// Stacked layers.
    pub num_layers: usize,
    /// Width of the inputs, states and outputs.
    pub hidden_size: usize,
    /// Residual connection around each layer.
    #[serde(default)]
    pub residual: bool,
    /// Add a learned position table to the inputs.
    #[serde(default)]
    pub positions: bool,
    /// Rows of the position table (and the longest input).
    pub max_positions: usize,
    /// LayerNorm epsilon (inside the square root, with the unbiased variance).
    pub layer_norm_eps: f64,
    /// Dropout on each cell's output in training.
    pub dropout: f64,
    /// LayerNorm init.
    #[serde(default)]
    pub ln_init: LnInit,
    /// Initial state.
    #[serde(default)]
    pub initial_state: InitialState,
    /// Always `fpt-lstm`.
    #[serde(default)]
    pub model_type: Option<String>,
}

impl LstmConfig {
    /// `lstm`: the paper's 3-layer, 768-wide "standard" LSTM (no residual, no positions).
    pub fn builtin(name: &str) -> Option<Self> {
        (name == "lstm").then(|| Self {
            num_layers: 3,
            hidden_size: 768,
            residual: false,
            positions: false,
            max_positions: 1024,
            layer_norm_eps: 1e-6,
            dropout: 0.1,
            ln_init: LnInit::Reference,
            initial_state: InitialState::Random,
            model_type: Some("fpt-lstm".into()),
        })
    }

    /// Parses and checks a `config.json` text (`path` names it in errors).
    pub fn from_json(text: &str, path: &std::path::Path) -> Result<Self> {
        crate::parse_config(text, path, Self::validate)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        use fpt_spec::limits::*;
        crate::check_sizes(&[
            ("num_layers", self.num_layers, MAX_LAYERS),
            ("hidden_size", self.hidden_size, MAX_HIDDEN),
            ("max_positions", self.max_positions, MAX_POSITIONS),
        ])?;
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(format!("dropout {} is not in [0, 1)", self.dropout));
        }
        Ok(())
    }

    /// Applies shape overrides: layers, hidden, positions (table rows), residual, position
    /// table on/off. Heads do not apply.
    pub fn with_overrides(mut self, o: &ShapeOverrides) -> Result<Self> {
        if o.heads.is_some() {
            return Err(BackboneError::Unsupported(
                "an LSTM has no attention heads (a `heads` override does not apply)".into(),
            ));
        }
        if let Some(l) = o.layers {
            self.num_layers = l;
        }
        if let Some(h) = o.hidden {
            self.hidden_size = h;
        }
        if let Some(p) = o.positions {
            self.max_positions = p;
        }
        if let Some(r) = o.lstm_residual {
            self.residual = r;
        }
        if let Some(p) = o.lstm_positions {
            self.positions = p;
        }
        self.validate()
            .map_err(|m| BackboneError::Unsupported(format!("invalid LSTM shape: {m}")))?;
        Ok(self)
    }

    /// Every parameter, in order.
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        let h = self.hidden_size;
        let mut v = Vec::new();
        let mut push = |name: String, shape: Vec<usize>| {
            let role = role_by_rules(&name, ROLE_RULES);
            v.push(ParamSpec {
                name,
                shape,
                role,
                used: true,
            });
        };
        if self.positions {
            push("wpe.weight".into(), vec![self.max_positions, h]);
        }
        for i in 0..self.num_layers {
            let p = format!("layers.{i}.");
            for lin in ["i2h", "h2h"] {
                push(format!("{p}{lin}.weight"), vec![4 * h, h]);
                push(format!("{p}{lin}.bias"), vec![4 * h]);
            }
            for (ln, n) in [("ln_i2h", 4 * h), ("ln_h2h", 4 * h), ("ln_cell", h)] {
                push(format!("{p}{ln}.weight"), vec![n]);
                push(format!("{p}{ln}.bias"), vec![n]);
            }
        }
        v
    }
}

/// The reference cell's LayerNorm: unbiased variance, `eps` inside the square root.
struct RefLayerNorm {
    weight: Param,
    bias: Param,
    eps: f64,
}

impl RefLayerNorm {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let n = x.dim(candle_core::D::Minus1)? as f64;
        let k = (n - 1.0) / n;
        // (x - m) / sqrt(var_u + eps) = sqrt(k) (x - m) / sqrt(var_b + eps k).
        let gamma = self.weight.get().affine(k.sqrt(), 0.0)?;
        ops::layer_norm(x, &gamma, &self.bias.get(), self.eps * k)
    }
}

struct Layer {
    i2h: Linear,
    h2h: Linear,
    ln_i2h: RefLayerNorm,
    ln_h2h: RefLayerNorm,
    ln_cell: RefLayerNorm,
}

/// A stack of layer-norm LSTM layers.
pub struct Lstm {
    config: LstmConfig,
    wpe: Option<Param>,
    layers: Vec<Layer>,
    common: Common,
}

/// The LSTM baseline's entry in [`crate::ARCHITECTURES`].
pub const REGISTRATION: crate::Registration = crate::Registration {
    names: &["LSTM"],
    model_types: &["fpt-lstm"],
    builtin: |name| LstmConfig::builtin(name).map(crate::Config::new),
    read: |v, text, path| {
        (crate::model_type(v) == Some("fpt-lstm")).then(|| LstmConfig::from_json(text, path).map(crate::Config::new))
    },
    gguf: None,
};

impl crate::ArchConfig for LstmConfig {
    crate::arch_config_common!(LstmConfig, Lstm, |c| (c.num_layers, 0, c.hidden_size));

    fn architecture(&self) -> &'static str {
        "lstm"
    }

    fn summary(&self) -> String {
        let c = self;
        format!(
            "layer-norm lstm: {} layers, hidden {}, {}, {}, {:?} LayerNorm init, {:?} initial state, dropout {}",
            c.num_layers,
            c.hidden_size,
            if c.residual { "residual" } else { "no residual" },
            if c.positions {
                format!("{} learned positions", c.max_positions)
            } else {
                "no positions".to_string()
            },
            c.ln_init,
            c.initial_state,
            c.dropout
        )
    }

    fn has_pretrained_weights(&self) -> bool {
        false
    }

    fn saved_as(&self) -> Option<crate::SavedAs> {
        Some(crate::SavedAs {
            model_type: "fpt-lstm",
            class: "FptLstm",
            naming: Lstm::NAMING,
        })
    }
}

impl Arch for Lstm {
    type Config = LstmConfig;
    const NAMING: Naming = Naming::PLAIN;
    const ROLE_RULES: &'static [(&'static str, Role)] = ROLE_RULES;

    fn specs(config: &Self::Config) -> Vec<ParamSpec> {
        config.param_specs()
    }

    fn assemble(config: &LstmConfig, mut t: ParamTaker, origin: String) -> candle_core::Result<Self> {
        let eps = config.layer_norm_eps;
        let wpe = if config.positions {
            Some(t.take("wpe.weight".into())?)
        } else {
            None
        };
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = format!("layers.{i}.");
            let mut ln = |name: &str| -> candle_core::Result<RefLayerNorm> {
                Ok(RefLayerNorm {
                    weight: t.take(format!("{p}{name}.weight"))?,
                    bias: t.take(format!("{p}{name}.bias"))?,
                    eps,
                })
            };
            let (ln_i2h, ln_h2h, ln_cell) = (ln("ln_i2h")?, ln("ln_h2h")?, ln("ln_cell")?);
            layers.push(Layer {
                i2h: t.linear(&format!("{p}i2h"))?,
                h2h: t.linear(&format!("{p}h2h"))?,
                ln_i2h,
                ln_h2h,
                ln_cell,
            });
        }
        Ok(Self {
            config: config.clone(),
            wpe,
            layers,
            common: t.finish(origin),
        })
    }
}

impl Lstm {
    /// The reference init (see the module docs); positions start at zero.
    pub fn random(config: &LstmConfig, groups: &TrainGroups, device: &Device, rng: &mut Rng) -> Result<Self> {
        let mut tensors = HashMap::new();
        let mut uniform = |shape: &[usize], bound: f64| -> candle_core::Result<Tensor> {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n).map(|_| ((rng.uniform() * 2.0 - 1.0) * bound) as f32).collect();
            Tensor::from_vec(v, shape, device)
        };
        let lin_bound = 1.0 / (config.hidden_size as f64).sqrt();
        for spec in config.param_specs() {
            let shape = spec.shape.as_slice();
            let t = match spec.role {
                Role::Positions => Tensor::zeros(shape, DType::F32, device)?,
                Role::LayerNorm => match config.ln_init {
                    LnInit::Reference => uniform(shape, 1.0 / (shape[0] as f64).sqrt())?,
                    LnInit::Unit if spec.name.ends_with(".weight") => Tensor::ones(shape, DType::F32, device)?,
                    LnInit::Unit => Tensor::zeros(shape, DType::F32, device)?,
                },
                _ => uniform(shape, lin_bound)?,
            };
            tensors.insert(spec.name, t);
        }
        let origin = format!(
            "random init (layer-norm LSTM, {} layers x {} wide{}{}, {:?} LayerNorm init, {:?} initial state)",
            config.num_layers,
            config.hidden_size,
            if config.residual { ", residual" } else { "" },
            if config.positions { ", learned positions" } else { "" },
            config.ln_init,
            config.initial_state,
        );
        Ok(Self::from_tensors(config, tensors, groups, origin)?)
    }

    /// Loads a `model.safetensors` written by [`crate::save_pretrained`] (every tensor checked).
    pub fn load(config: &LstmConfig, weights: &std::path::Path, groups: &TrainGroups, device: &Device) -> Result<Self> {
        <Self as Arch>::load_checkpoint(config, weights, groups, device)
    }

    /// The config this model was built from.
    pub fn config(&self) -> &LstmConfig {
        &self.config
    }

    fn layer_forward(&self, l: &Layer, x: &Tensor, ctx: &mut Ctx) -> candle_core::Result<Tensor> {
        let (b, t, w) = x.dims3()?;
        let hsz = self.config.hidden_size;
        // The input map and its LayerNorm do not depend on the state: all steps at once.
        let xi = l.ln_i2h.forward(&l.i2h.forward(x)?)?; // [b, t, 4H]
        let (h0, c0) = match self.config.initial_state {
            InitialState::Random => {
                let std = (2.0 / (w + hsz) as f64).sqrt();
                let hv = ctx.rng.normal_vec(b * hsz, 0.0, std);
                let cv = ctx.rng.normal_vec(b * hsz, 0.0, std);
                // Drawn on the host from the run's stream: two counted uploads a layer.
                (
                    fpt_nn::transfer::upload(hv, (b, hsz), x.device())?,
                    fpt_nn::transfer::upload(cv, (b, hsz), x.device())?,
                )
            }
            InitialState::Zeros => {
                let z = Tensor::zeros((b, hsz), DType::F32, x.device())?;
                (z.clone(), z)
            }
        };
        // Each step's dropout seed, drawn in step order as `Ctx::dropout` would: the op draws
        // the step's multipliers from it (on the host for the CPU's ops, on a GPU in the
        // kernels, so only the seeds cross).
        let p = self.config.dropout;
        let seeds: Option<Vec<u64>> =
            (self.common.dropout && ctx.train && p > 0.0).then(|| (0..t).map(|_| ctx.rng.next_u64()).collect());
        let b_hh = l
            .h2h
            .bias
            .as_ref()
            .ok_or_else(|| candle_core::Error::Msg("layer-norm LSTM: h2h has no bias".into()))?;
        let [b_hh, g_h2h, b_h2h, g_cell, b_cell, w_hh] = [
            b_hh,
            &l.ln_h2h.weight,
            &l.ln_h2h.bias,
            &l.ln_cell.weight,
            &l.ln_cell.bias,
            &l.h2h.weight,
        ]
        .map(|p| p.get());
        let params = ops::LnLstmParams {
            b_hh: &b_hh,
            ln_h2h: (&g_h2h, &b_h2h),
            ln_cell: (&g_cell, &b_cell),
            eps: self.config.layer_norm_eps,
        };
        match seeds {
            Some(seeds) => ops::ln_lstm_seeded(&xi, &w_hh, &params, &h0, &c0, p, &seeds),
            None => ops::ln_lstm(&xi, &w_hh, &params, &h0, &c0, None),
        }
    }
}

impl Backbone for Lstm {
    fn architecture(&self) -> &'static str {
        "lstm"
    }
    fn host_draws(&self) -> Option<&'static str> {
        Some("the LSTM's random initial state and its dropout seeds, drawn on the host at every call")
    }
    fn max_positions(&self) -> usize {
        self.config.max_positions
    }
    fn is_causal(&self) -> bool {
        true
    }

    fn forward(&self, embeds: &Tensor, ctx: &mut Ctx) -> candle_core::Result<Tensor> {
        let t = crate::check_embeds(self, embeds)?;
        let mut x = match &self.wpe {
            Some(p) => embeds.broadcast_add(&p.get().narrow(0, 0, t)?)?,
            None => embeds.clone(),
        };
        for l in &self.layers {
            let y = self.layer_forward(l, &x, ctx)?;
            x = if self.config.residual { (x + y)? } else { y };
        }
        Ok(x)
    }

    fn config(&self) -> crate::Config {
        crate::Config::new(self.config.clone())
    }

    crate::backbone_common!(layers, num_layers, hidden_size);
}

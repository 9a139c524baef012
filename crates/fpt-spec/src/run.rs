//! A whole run: task, backbone, trained groups and trainer settings.

use crate::*;
use serde::{Deserialize, Serialize};

/// Everything that defines a run. Serialised as the run's `spec.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// The task.
    pub task: TaskSpec,
    /// The backbone.
    pub backbone: BackboneSpec,
    /// Which parameter groups train.
    pub train_groups: TrainGroups,
    /// Trainer settings.
    pub train: TrainSpec,
    /// Dropout after the input layer (the reference code's 0.1).
    pub input_dropout: f64,
    /// Gain of the orthogonal init of the input layer (the reference code's 1.41).
    pub orth_gain: f64,
    /// How a linear input layer is initialised: orthogonal (default; not written) or
    /// PyTorch's `nn.Linear` default (§3.12: the orthogonal init matters when the input
    /// layer is frozen).
    #[serde(default, skip_serializing_if = "InputInit::is_orthogonal")]
    pub input_init: InputInit,
    /// Whether the backbone's own dropouts (GPT-2: embd/attn/resid 0.1) are on in training.
    pub backbone_dropout: bool,
    /// The model trained: FPT (default; not written), output-only on cached features, or
    /// the linear baseline.
    #[serde(default, skip_serializing_if = "ModelKind::is_fpt")]
    pub model: ModelKind,
}

impl RunSpec {
    /// A run of `task` on `backbone` with the paper's FPT recipe and every default in one
    /// place: the FPT groups trained (input, output, LayerNorms, positions),
    /// [`TrainSpec::default`], [`DEFAULT_INPUT_DROPOUT`], [`DEFAULT_ORTH_GAIN`], the
    /// backbone's own dropouts on. Change fields after (`RunSpec { train, ..RunSpec::new(..) }`).
    pub fn new(task: TaskSpec, backbone: BackboneSpec) -> Self {
        Self {
            task,
            backbone,
            train_groups: TrainGroups::fpt(),
            train: TrainSpec::default(),
            input_dropout: DEFAULT_INPUT_DROPOUT,
            orth_gain: DEFAULT_ORTH_GAIN,
            input_init: InputInit::Orthogonal,
            backbone_dropout: true,
            model: ModelKind::Fpt,
        }
    }

    /// 16 hex digits of the SHA-256 of the spec's JSON: a run directory's name in the
    /// harness (`results/runs/<key>`) and a self-trained backbone's cache key.
    pub fn key(&self) -> String {
        let json = serde_json::to_vec(self).expect("a run spec serialises");
        files::sha256_hex(&json)[..16].to_string()
    }

    /// Checks value ranges; returns the first problem with the field it is in.
    pub fn validate(&self) -> Result<()> {
        let t = &self.train;
        let bad = |field: &'static str, msg: &str| {
            Err(SpecError::Invalid {
                field,
                msg: msg.to_string(),
            })
        };
        let size = |field: &'static str, value: usize, max: usize| -> Result<()> {
            limits::check_positive(field, value, max).map_err(|msg| SpecError::Invalid { field, msg })
        };
        size("batch_size", t.batch_size, limits::MAX_BATCH)?;
        size("steps", t.steps, limits::MAX_STEPS)?;
        if t.micro_batch_size == 0 || !t.batch_size.is_multiple_of(t.micro_batch_size) {
            return Err(SpecError::Invalid {
                field: "micro_batch_size",
                msg: format!("{} does not divide batch_size {}", t.micro_batch_size, t.batch_size),
            });
        }
        if !(t.lr.is_finite() && t.lr > 0.0) {
            return bad("lr", "must be a positive finite number");
        }
        if let Some(c) = t.clip_norm {
            if !(c.is_finite() && c > 0.0) {
                return bad("clip_norm", "must be a positive finite number");
            }
        }
        size("eval_every", t.eval_every, limits::MAX_STEPS)?;
        if t.checkpoint_every == Some(0) {
            return bad("checkpoint_every", "must be at least 1");
        }
        if t.early_stop_patience == Some(0) {
            return bad("early_stop_patience", "must be at least 1");
        }
        if !(t.divergence_factor.is_finite() && t.divergence_factor > 1.0) {
            return bad("divergence_factor", "must be a finite number above 1");
        }
        if !(t.convergence_tolerance.is_finite() && t.convergence_tolerance >= 0.0) {
            return bad("convergence_tolerance", "must be a non-negative finite number");
        }
        if !(0.0..1.0).contains(&self.input_dropout) {
            return bad("input_dropout", "must be in [0, 1)");
        }
        if self.task.eval_examples == 0 && self.task.name.is_generated() {
            return bad("eval_examples", "must be at least 1 for the generated bit tasks");
        }
        limits::check("eval_examples", self.task.eval_examples, limits::MAX_EXAMPLES).map_err(|msg| {
            SpecError::Invalid {
                field: "eval_examples",
                msg,
            }
        })?;
        if let Some(n) = self.task.train_examples {
            size("train_examples", n, limits::MAX_EXAMPLES)?;
        }
        if let Some(n) = self.task.n_bits {
            size("n_bits", n, limits::MAX_BITS)?;
        }
        if let Some(n) = self.task.patch {
            size("patch", n, limits::MAX_BITS)?;
        }
        if let Some(n) = self.task.data.max_len {
            size("max_len", n, limits::MAX_POSITIONS)?;
        }
        if let Some(n) = self.task.data.vocab {
            size("vocab", n, limits::MAX_VOCAB)?;
        }
        let shape = &self.backbone.shape;
        for (field, value, max) in [
            ("layers", shape.layers, limits::MAX_LAYERS),
            ("hidden", shape.hidden, limits::MAX_HIDDEN),
            ("heads", shape.heads, limits::MAX_HEADS),
            ("positions", shape.positions, limits::MAX_POSITIONS),
            ("vocab", shape.vocab, limits::MAX_VOCAB),
        ] {
            if let Some(v) = value {
                size(field, v, max)?;
            }
        }
        // Depth 0 keeps no block: the backbone's embedding stage alone, between the new
        // input and output layers (the critics' "w/o LLM" row).
        if let Some(d) = self.backbone.depth {
            limits::check("depth", d, limits::MAX_LAYERS).map_err(|msg| SpecError::Invalid { field: "depth", msg })?;
        }
        if let Some(bp) = &self.backbone.bit_pretrain {
            size("bit_pretrain.steps", bp.steps, limits::MAX_STEPS)?;
            size("bit_pretrain.batch_size", bp.batch_size, limits::MAX_BATCH)?;
            if !(bp.lr.is_finite() && bp.lr > 0.0) {
                return bad("bit_pretrain.lr", "must be a positive finite number");
            }
        }
        if self.task.name == TaskName::Custom && self.task.path.is_none() {
            return bad("task.path", "the custom task needs a path (custom:PATH)");
        }
        match (self.model, t.cached_epochs) {
            (ModelKind::OutputOnly, None) => {
                return bad(
                    "cached_epochs",
                    "output-only training on cached features needs its number of epochs",
                )
            }
            (ModelKind::OutputOnly, Some(0)) => return bad("cached_epochs", "must be at least 1"),
            (ModelKind::OutputOnly, Some(_)) => {
                let out_only = TrainGroups {
                    output: true,
                    ..TrainGroups::none()
                };
                if self.train_groups != out_only {
                    return bad(
                        "train_groups",
                        "output-only training on cached features trains the output layer alone (`out`)",
                    );
                }
            }
            (other, Some(_)) => {
                return Err(SpecError::Invalid {
                    field: "cached_epochs",
                    msg: format!("epochs on cached features are for model output-only, not {other}"),
                })
            }
            (_, None) => {}
        }
        if self.model == ModelKind::Linear && !self.backbone.precision.is_f32() {
            return bad(
                "backbone.precision",
                "bf16 stores a backbone's frozen weights in bf16; the linear model has no backbone (use f32)",
            );
        }
        if self.backbone.depth.is_some() && self.train_groups.last_attention {
            return bad(
                "train_groups.last_attention",
                "`last-attn` trains the checkpoint's last block, which a depth cut removes; use one or the other",
            );
        }
        if !self.backbone.final_norm && self.backbone.depth.is_none() {
            return bad(
                "final_norm",
                "dropping the final norm is a depth-cut option; set depth too",
            );
        }
        if self.backbone.bit_pretrain.is_some() && self.backbone.init != Init::BitPretrained {
            return bad("bit_pretrain", "only applies to init `bit-pretrained`");
        }
        if self.backbone.init.needs_weights() && self.backbone.shape.any() {
            return bad(
                "shape",
                "shape overrides (layers, hidden, heads, positions) only apply to init `random` (a pretrained checkpoint fixes its shape)",
            );
        }
        Ok(())
    }
}

impl RunSpec {
    /// The fields (as JSON paths) where `other` differs from `self`, e.g. `train.lr`.
    pub fn differences(&self, other: &RunSpec) -> Vec<String> {
        fn walk(prefix: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
            match (a, b) {
                (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
                    let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
                    keys.sort();
                    keys.dedup();
                    for k in keys {
                        let p = if prefix.is_empty() {
                            k.clone()
                        } else {
                            format!("{prefix}.{k}")
                        };
                        let null = serde_json::Value::Null;
                        walk(&p, x.get(k).unwrap_or(&null), y.get(k).unwrap_or(&null), out);
                    }
                }
                _ if a != b => out.push(format!("{prefix}: {a} -> {b}")),
                _ => {}
            }
        }
        let a = serde_json::to_value(self).expect("spec serialises");
        let b = serde_json::to_value(other).expect("spec serialises");
        let mut out = Vec::new();
        walk("", &a, &b, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_the_field() {
        let mut spec = RunSpec::new(TaskSpec::new(TaskName::BitXor), BackboneSpec::new("gpt2", Init::Random));
        spec.validate().unwrap();
        spec.train.micro_batch_size = 5;
        let e = spec.validate().unwrap_err().to_string();
        assert!(e.contains("micro_batch_size"), "{e}");
        let json = serde_json::to_string(&spec).unwrap();
        let back: RunSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back, spec);
        // f32 is left out of spec.json (every earlier run keeps its key); bf16 is written.
        assert!(!json.contains("precision"), "{json}");
        let mut bf16 = spec.clone();
        bf16.backbone.precision = Precision::Bf16;
        let j = serde_json::to_string(&bf16).unwrap();
        assert!(j.contains(r#""precision":"bf16""#), "{j}");
        assert_ne!(bf16.key(), spec.key());
        assert_eq!(serde_json::from_str::<RunSpec>(&j).unwrap(), bf16);
        let mut other = spec.clone();
        other.train.lr = 0.5;
        other.train.lr_schedule = "cosine:10".parse().unwrap();
        let d = spec.differences(&other);
        assert_eq!(d.len(), 3, "{d:?}"); // lr, and the schedule's kind and warm-up
        assert!(d[0].starts_with("train.lr: 0.001 -> 0.5"), "{d:?}");

        // Sizes: zero and absurd values are refused before anything is allocated.
        for (edit, field) in [
            (&(|s: &mut RunSpec| s.train.steps = 0) as &dyn Fn(&mut RunSpec), "steps"),
            (&|s: &mut RunSpec| s.train.batch_size = 1 << 40, "batch_size"),
            (
                &|s: &mut RunSpec| s.backbone.shape.layers = Some(1_000_000_000),
                "layers",
            ),
            (&|s: &mut RunSpec| s.backbone.shape.hidden = Some(1 << 31), "hidden"),
            (&|s: &mut RunSpec| s.backbone.shape.heads = Some(0), "heads"),
            (&|s: &mut RunSpec| s.task.data.max_len = Some(0), "max_len"),
            (&|s: &mut RunSpec| s.task.n_bits = Some(1 << 40), "n_bits"),
            (
                &|s: &mut RunSpec| {
                    s.model = ModelKind::Linear;
                    s.backbone.precision = Precision::Bf16;
                },
                "backbone.precision",
            ),
        ] {
            let mut bad = spec.clone();
            bad.train.micro_batch_size = bad.train.batch_size;
            edit(&mut bad);
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
    }

    /// spec.json is read strictly: an unknown or misspelt key, or a key given twice, is an
    /// error naming it (a misspelt optional key once silently turned early stopping off).
    #[test]
    fn spec_json_refuses_unknown_and_duplicate_keys() {
        let spec = RunSpec::new(TaskSpec::new(TaskName::BitXor), BackboneSpec::new("gpt2", Init::Random));
        let json = serde_json::to_string(&spec).unwrap();
        let misspelt = json.replace("\"train\":{", "\"train\":{\"early_stop_patiense\":3,");
        let e = serde_json::from_str::<RunSpec>(&misspelt).unwrap_err().to_string();
        assert!(e.contains("early_stop_patiense"), "{e}");
        let twice = json.replace("\"train\":{", "\"train\":{\"lr\":0.5,");
        let e = serde_json::from_str::<RunSpec>(&twice).unwrap_err().to_string();
        assert!(e.contains("duplicate field `lr`"), "{e}");
        let top = json.replacen('{', "{\"seeds\":3,", 1);
        assert!(serde_json::from_str::<RunSpec>(&top)
            .unwrap_err()
            .to_string()
            .contains("seeds"));
    }
}

/// How a linear input layer (vector inputs) is initialised; token inputs always get a
/// N(0, 1) embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InputInit {
    /// Orthogonal with gain `orth_gain` (the reference code's; the paper's §3.12 finds it
    /// very important when the input layer is not trained).
    #[default]
    Orthogonal,
    /// PyTorch's `nn.Linear` default: weight and bias from U(-1/sqrt(width), 1/sqrt(width)).
    Uniform,
}

impl InputInit {
    /// Whether this is the default (not written into a spec, so keys stay as they were).
    pub fn is_orthogonal(&self) -> bool {
        *self == InputInit::Orthogonal
    }
}

impl std::str::FromStr for InputInit {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "orthogonal" => Ok(InputInit::Orthogonal),
            "uniform" => Ok(InputInit::Uniform),
            _ => Err(format!(
                "input init `{s}`: expected `orthogonal` or `uniform` (nn.Linear's default)"
            )),
        }
    }
}

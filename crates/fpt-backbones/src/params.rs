//! Parameters by name and role: specs known from a config alone, the role rules, block
//! indices and truncation, and the `ParamTaker` that turns named tensors into trainable or
//! frozen `Param`s; the usual random init.

#[allow(unused_imports)]
use super::*;

/// A parameter tensor's name, shape and role, known from the config alone (no weights
/// needed), so parameter counts can be reported for any size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    /// Checkpoint name without prefix, e.g. `h.0.attn.c_attn.weight`.
    pub name: String,
    /// Shape in our (PyTorch `nn.Linear`) layout.
    pub shape: Vec<usize>,
    /// Its role in the FPT recipe.
    pub role: Role,
    /// Whether the forward pass uses it (GPT-2's token table `wte` is not used with input
    /// embeddings; it is counted but never loaded).
    pub used: bool,
}

impl ParamSpec {
    /// Number of scalars.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether this tensor trains under `groups` in a backbone whose last block is
    /// `last_block` ([`last_block`] of its specs); unused tensors never train.
    pub fn trains(&self, groups: &TrainGroups, last_block: Option<usize>) -> bool {
        self.used && groups.trains_tensor(self.role, layer_index(&self.name), last_block)
    }
}

/// The highest block index among `names` (see [`layer_index`]): the block
/// `TrainGroups::last_attention` trains.
pub fn last_block<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<usize> {
    names.into_iter().filter_map(layer_index).max()
}

/// Maps a parameter name to its role by the first matching substring of `rules` (checked
/// on the lower-cased name), `Role::Other` if none matches. This is the reference code's
/// freezing rule, kept as data per architecture.
pub fn role_by_rules(name: &str, rules: &[(&str, Role)]) -> Role {
    let lower = name.to_lowercase();
    rules
        .iter()
        .find(|(pat, _)| lower.contains(pat))
        .map(|(_, r)| *r)
        .unwrap_or(Role::Other)
}

/// Drops the named parameters whose names contain `part`.
pub(crate) fn drop_named(named: &mut Vec<(String, Role, Param)>, part: &str) {
    named.retain(|(n, _, _)| !n.contains(part));
}

/// The block index in a parameter name (`h.3.`, `encoder.layer.3.`, `encoder.block.3.`).
pub fn layer_index(name: &str) -> Option<usize> {
    let parts: Vec<&str> = name.split('.').collect();
    parts.windows(2).find_map(|w| match w[0] {
        "h" | "layer" | "layers" | "block" | "blocks" => w[1].parse().ok(),
        _ => None,
    })
}

/// Checks a truncation request against a backbone's depth.
pub(crate) fn check_truncate(layers: usize, have: usize) -> Result<()> {
    if layers > have {
        return Err(BackboneError::Unsupported(format!(
            "depth (`--depth`): cannot keep {layers} of the backbone's {have} layers (choose 0..={have}; 0 keeps no block)"
        )));
    }
    Ok(())
}

/// Drops the named parameters of blocks `layers..`.
pub(crate) fn keep_layers(named: &mut Vec<(String, Role, Param)>, layers: usize) {
    named.retain(|(n, _, _)| layer_index(n).is_none_or(|i| i < layers));
}

thread_local! {
    /// Whether [`ParamTaker::weight`] stores frozen weight matrices in bf16 (set by
    /// [`with_precision`] around a load).
    static FROZEN_BF16: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` (a backbone's load) with frozen linear weights taken in `precision`; the
/// previous setting comes back when `f` returns or panics.
pub(crate) fn with_precision<R>(precision: fpt_spec::Precision, f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            FROZEN_BF16.with(|b| b.set(self.0));
        }
    }
    let _restore = Restore(FROZEN_BF16.with(|b| b.replace(precision == fpt_spec::Precision::Bf16)));
    f()
}

/// What every backbone carries beside its layers: each parameter with its name and role,
/// where the weights came from, and whether its dropouts are on.
pub(crate) struct Common {
    /// Every parameter, in the order taken, with its name and role.
    pub named: Vec<(String, Role, Param)>,
    /// Where the weights came from (a file, a random init).
    pub origin: String,
    /// Dropouts on (the reference keeps them on during training).
    pub dropout: bool,
}

/// Turns named tensors into [`Param`]s (trainable or frozen by role) and records them.
pub(crate) struct ParamTaker<'a> {
    tensors: std::collections::HashMap<String, Tensor>,
    groups: &'a TrainGroups,
    rules: &'static [(&'static str, Role)],
    /// The last block's index (for `TrainGroups::last_attention`).
    last_block: Option<usize>,
    /// Every parameter taken, in order, with its name and role.
    pub named: Vec<(String, Role, Param)>,
}

impl<'a> ParamTaker<'a> {
    pub(crate) fn new(
        tensors: std::collections::HashMap<String, Tensor>,
        groups: &'a TrainGroups,
        rules: &'static [(&'static str, Role)],
    ) -> Self {
        let last_block = last_block(tensors.keys().map(String::as_str));
        Self {
            tensors,
            groups,
            rules,
            last_block,
            named: Vec::new(),
        }
    }

    /// The parameter `name` (the caller has checked that it exists).
    pub(crate) fn take(&mut self, name: String) -> candle_core::Result<Param> {
        let t = self.tensors.remove(&name).expect("tensor checked by the caller");
        let role = role_by_rules(&name, self.rules);
        let trains = self.groups.trains_tensor(role, layer_index(&name), self.last_block);
        let p = Param::new(t, trains)?;
        self.named.push((name, role, p.clone()));
        Ok(p)
    }

    /// The parameters taken, as a backbone's [`Common`] part (dropouts on).
    pub(crate) fn finish(self, origin: String) -> Common {
        Common {
            named: self.named,
            origin,
            dropout: true,
        }
    }

    /// `{prefix}.weight` and `{prefix}.bias` as a LayerNorm.
    pub(crate) fn layer_norm(&mut self, prefix: &str, eps: f64) -> candle_core::Result<fpt_nn::LayerNorm> {
        Ok(fpt_nn::LayerNorm {
            weight: self.take(format!("{prefix}.weight"))?,
            bias: self.take(format!("{prefix}.bias"))?,
            eps,
        })
    }

    /// The weight matrix `name` of a linear layer: as [`Self::take`], stored in bf16 when it
    /// is frozen and the backbone loads with `precision: bf16` ([`with_precision`]).
    pub(crate) fn weight(&mut self, name: String) -> candle_core::Result<Param> {
        let role = role_by_rules(&name, self.rules);
        let trains = self.groups.trains_tensor(role, layer_index(&name), self.last_block);
        if !trains && FROZEN_BF16.with(|b| b.get()) {
            let t = self.tensors.remove(&name).expect("tensor checked by the caller");
            let t = fpt_nn::ops::bf16::to_bf16(&t)?;
            self.tensors.insert(name.clone(), t);
        }
        self.take(name)
    }

    /// The linear layers `parts` (`(prefix, layer)`: taken from `{prefix}.weight` and
    /// `{prefix}.bias`, all over the same input) as one: their weights (and biases, where
    /// every one has one) stacked by rows, so one product replaces several. Only when every
    /// weight and bias is frozen (else `None`, the layers unchanged): the layers' and the
    /// named parameters become views of the stacked tensors, so no second copy is kept.
    pub(crate) fn stacked(
        &mut self,
        parts: &mut [(&str, &mut fpt_nn::Linear)],
    ) -> candle_core::Result<Option<fpt_nn::Linear>> {
        let frozen = parts
            .iter()
            .all(|(_, l)| !l.weight.is_trainable() && l.bias.as_ref().is_none_or(|b| !b.is_trainable()));
        let biased = parts.iter().filter(|(_, l)| l.bias.is_some()).count();
        if !frozen || (biased != 0 && biased != parts.len()) || parts.len() < 2 {
            return Ok(None);
        }
        let stack = |ts: Vec<Tensor>| Tensor::cat(&ts, 0);
        let w = stack(parts.iter().map(|(_, l)| l.weight.tensor().clone()).collect())?;
        let b = if biased > 0 {
            Some(stack(
                parts
                    .iter()
                    .map(|(_, l)| l.bias.as_ref().expect("checked").tensor().clone())
                    .collect(),
            )?)
        } else {
            None
        };
        let mut row = 0;
        for (prefix, l) in parts.iter_mut() {
            let rows = l.weight.tensor().dim(0)?;
            let wv = Param::Frozen(w.narrow(0, row, rows)?);
            let bv = b
                .as_ref()
                .map(|b| b.narrow(0, row, rows))
                .transpose()?
                .map(Param::Frozen);
            for (name, _, p) in self.named.iter_mut() {
                if *name == format!("{prefix}.weight") {
                    *p = wv.clone();
                } else if let Some(bv) = bv.as_ref().filter(|_| *name == format!("{prefix}.bias")) {
                    *p = bv.clone();
                }
            }
            **l = fpt_nn::Linear::new(wv, bv);
            row += rows;
        }
        Ok(Some(fpt_nn::Linear::new(Param::Frozen(w), b.map(Param::Frozen))))
    }

    /// `{prefix}.weight` and `{prefix}.bias` as a Linear (the weight through [`Self::weight`]).
    pub(crate) fn linear(&mut self, prefix: &str) -> candle_core::Result<fpt_nn::Linear> {
        Ok(fpt_nn::Linear::new(
            self.weight(format!("{prefix}.weight"))?,
            Some(self.take(format!("{prefix}.bias"))?),
        ))
    }
}

/// The usual transformer init for every used parameter: LayerNorm weights 1 and biases 0,
/// other biases 0, every other tensor N(0, std(name)).
pub(crate) fn random_tensors(
    specs: &[ParamSpec],
    std: &dyn Fn(&str) -> f64,
    device: &Device,
    rng: &mut Rng,
) -> Result<std::collections::HashMap<String, Tensor>> {
    let mut out = std::collections::HashMap::new();
    for spec in specs.iter().filter(|s| s.used) {
        let (n, shape) = (&spec.name, spec.shape.as_slice());
        let t = if spec.role == Role::LayerNorm && n.ends_with(".weight") {
            Tensor::ones(shape, DType::F32, device)?
        } else if n.ends_with(".bias") {
            Tensor::zeros(shape, DType::F32, device)?
        } else {
            fpt_nn::init::normal(shape, 0.0, std(n), rng, device)?
        };
        out.insert(n.clone(), t);
    }
    Ok(out)
}

//! Golden checks: a backbone against the outputs and gradients another framework computed
//! for the same checkpoint (llm.c's `test_gpt2` style).
//!
//! A golden file (`golden.safetensors`, written by `tools/make_fixtures.py` with PyTorch and
//! Hugging Face `transformers` or timm) holds `inputs_embeds`, the reference
//! `last_hidden_state` (eval mode, no dropout), `loss_weights` `r`, and the gradients of
//! `sum(last_hidden_state * r)` with respect to the input (`grad.inputs_embeds`) and to
//! some parameters (`grad.<checkpoint name>`, which train in the FPT setting); ViT's files
//! also hold `fpt_positions`, the rows fpt's own position table is set to first. The tests
//! and `fpt selfcheck` run the same check.

use crate::{Backbone, BackboneError, Result};
use candle_core::{Device, Tensor, Var};
use fpt_nn::Ctx;
use fpt_spec::TrainGroups;
use std::collections::HashMap;
use std::path::Path;

/// Prefixes a checkpoint's names may carry that fpt's parameter names do not.
const PREFIXES: &[&str] = &["transformer.", "bert.", "roberta.", "longformer.", "vit."];

/// The largest differences a [`check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct GoldenDiff {
    /// max |ours - reference| over the hidden states.
    pub hidden: f32,
    /// Over the input gradient.
    pub input_grad: f32,
    /// Over every parameter gradient in the file.
    pub param_grads: f32,
    /// How many parameter gradients were compared.
    pub params_checked: usize,
    /// The largest of the differences above relative to its tensor's largest reference
    /// value (`max |ours - reference| / max |reference|`): the measure for `bf16`, whose
    /// rounding is relative.
    pub relative: f32,
}

impl GoldenDiff {
    /// The largest of the three differences.
    pub fn max(&self) -> f32 {
        self.hidden.max(self.input_grad).max(self.param_grads)
    }
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    if a.dims() != b.dims() {
        return Err(BackboneError::Unsupported(format!(
            "golden check: shape {:?} vs the reference's {:?}",
            a.dims(),
            b.dims()
        )));
    }
    let d = (a.to_device(&Device::Cpu)? - b.to_device(&Device::Cpu)?)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()?;
    // A NaN anywhere must fail the check, not slip through `max`.
    Ok(if d.is_nan() { f32::INFINITY } else { d })
}

/// [`max_abs_diff`] and the same relative to `b`'s largest magnitude.
fn diffs(a: &Tensor, b: &Tensor) -> Result<(f32, f32)> {
    let d = max_abs_diff(a, b)?;
    let scale = b
        .to_device(&Device::Cpu)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()?;
    Ok((d, if scale > 0.0 { d / scale } else { d }))
}

/// Reads a golden file.
pub fn read(path: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
    candle_core::safetensors::load(path, device).map_err(|e| BackboneError::Safetensors {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })
}

/// Runs `model` (built with the FPT groups, so LayerNorm and position parameters are
/// `Var`s) on the golden input in eval mode and compares its hidden states and gradients.
/// Every gradient the file holds must belong to a trainable parameter of the model.
pub fn check(model: &dyn Backbone, golden: &HashMap<String, Tensor>) -> Result<GoldenDiff> {
    let get = |name: &str| {
        golden
            .get(name)
            .ok_or_else(|| BackboneError::Unsupported(format!("golden file has no `{name}`")))
    };
    let params: HashMap<String, fpt_nn::Param> = model.params().into_iter().map(|(n, _, p)| (n, p.clone())).collect();
    if let Some(pos) = golden.get("fpt_positions") {
        let table = params
            .get("fpt.position_embeddings.weight")
            .and_then(|p| p.var())
            .ok_or_else(|| {
                BackboneError::Unsupported("golden file sets fpt's position table, which this backbone lacks".into())
            })?;
        let (rows, width) = pos.dims2()?;
        let rest = Tensor::zeros((table.dim(0)? - rows, width), pos.dtype(), pos.device())?;
        table.set(&Tensor::cat(&[pos, &rest], 0)?)?;
    }
    let x = Var::from_tensor(get("inputs_embeds")?)?;
    let out = model.forward(x.as_tensor(), &mut Ctx::eval())?;
    let (hidden, relative) = diffs(&out, get("last_hidden_state")?)?;
    let mut diff = GoldenDiff {
        hidden,
        relative,
        ..Default::default()
    };
    let grads = (out * get("loss_weights")?)?.sum_all()?.backward()?;
    let gx = grads
        .get(x.as_tensor())
        .ok_or_else(|| BackboneError::Unsupported("no gradient reached the input".into()))?;
    let (d, r) = diffs(gx, get("grad.inputs_embeds")?)?;
    diff.input_grad = d;
    diff.relative = diff.relative.max(r);
    for (key, want) in golden {
        let Some(name) = key.strip_prefix("grad.") else {
            continue;
        };
        if name == "inputs_embeds" {
            continue;
        }
        let ours = if name == "fpt_positions" {
            // The gradient of the rows the input used.
            let table = params.get("fpt.position_embeddings.weight").and_then(|p| p.var());
            table
                .and_then(|v| grads.get(v.as_tensor()))
                .map(|g| g.narrow(0, 0, want.dim(0)?))
                .transpose()?
        } else {
            let bare = PREFIXES.iter().find_map(|p| name.strip_prefix(p)).unwrap_or(name);
            let param = params.get(name).or_else(|| params.get(bare)).ok_or_else(|| {
                BackboneError::Unsupported(format!("golden gradient `{name}` names no parameter of the model"))
            })?;
            let var = param.var().ok_or_else(|| {
                BackboneError::Unsupported(format!("`{name}` is frozen; the golden check needs it trainable"))
            })?;
            grads.get(var.as_tensor()).cloned()
        };
        let ours = ours.ok_or_else(|| BackboneError::Unsupported(format!("no gradient reached `{name}`")))?;
        let (d, r) = diffs(&ours, want)?;
        diff.param_grads = diff.param_grads.max(d);
        diff.relative = diff.relative.max(r);
        diff.params_checked += 1;
    }
    Ok(diff)
}

/// Loads the checkpoint directory `dir` (`config.json`, `model.safetensors`) with the FPT
/// groups and checks it against `dir/golden.safetensors`.
pub fn check_dir(dir: &Path, device: &Device) -> Result<GoldenDiff> {
    check_dir_in(dir, device, fpt_spec::Precision::F32)
}

/// [`check_dir`] with the frozen weights in `precision` (`bf16`: the differences then
/// include bf16's rounding of the weights and of their products' operands).
pub fn check_dir_in(dir: &Path, device: &Device, precision: fpt_spec::Precision) -> Result<GoldenDiff> {
    let spec = fpt_spec::BackboneSpec {
        source: dir.display().to_string(),
        init: fpt_spec::Init::Pretrained,
        shape: Default::default(),
        residual_init: Default::default(),
        depth: None,
        final_norm: true,
        bit_pretrain: None,
        precision,
    };
    let mut model = crate::load(&spec, &TrainGroups::fpt(), device, &mut fpt_nn::Rng::new(0))?;
    model.set_dropout(false);
    check(model.as_ref(), &read(&dir.join("golden.safetensors"), device)?)
}

/// The real all-MiniLM-L6-v2 against reference hidden states `transformers` computed
/// (`data/fixtures/minilm-reference.json`: `input_ids` and the first 8 values of each
/// token's last hidden state): the ids are looked up in the checkpoint's own word table,
/// run through fpt's BERT. Returns the largest difference over those values and the
/// relative difference of the sum of all hidden states (`hidden_sum`). A copy of the
/// weights without the word embeddings (FPT never uses them; `bench/gpu/campaign.sh
/// --prepare --weights` makes one for a GPU machine) cannot be checked this way: its error
/// says [`NO_WORD_TABLE`].
pub fn minilm_diff(
    files: &crate::hub::ModelFiles,
    reference: &serde_json::Value,
    device: &Device,
) -> Result<(f32, f64)> {
    let bad = |msg: &str| BackboneError::Unsupported(format!("MiniLM reference: {msg}"));
    let Some(cfg) = crate::Config::from_file(&files.config)?
        .get::<crate::bert::BertConfig>()
        .cloned()
    else {
        return Err(bad("the cached model is not a BERT"));
    };
    let weights = files
        .weights
        .as_ref()
        .ok_or_else(|| bad("the cached model has no weights"))?;
    let model = crate::bert::Bert::load(&cfg, weights, &TrainGroups::fpt(), device)?;
    let table = read(weights, device)?
        .remove("embeddings.word_embeddings.weight")
        .ok_or_else(|| bad(NO_WORD_TABLE))?;
    let ids: Vec<u32> = reference["input_ids"]
        .as_array()
        .ok_or_else(|| bad("no input_ids"))?
        .iter()
        .map(|v| v.as_u64().map(|i| i as u32).ok_or_else(|| bad("an id is not a number")))
        .collect::<Result<_>>()?;
    let embeds = table
        .index_select(&Tensor::new(ids.as_slice(), device)?, 0)?
        .unsqueeze(0)?;
    let h = model.forward(&embeds, &mut Ctx::eval())?.squeeze(0)?.to_vec2::<f32>()?;
    let rows = reference["hidden_first8"]
        .as_array()
        .ok_or_else(|| bad("no hidden_first8"))?;
    if rows.len() != h.len() {
        return Err(bad("one row per input id expected"));
    }
    let mut worst = 0f32;
    for (t, row) in rows.iter().enumerate() {
        for (j, v) in row
            .as_array()
            .ok_or_else(|| bad("a row is not a list"))?
            .iter()
            .enumerate()
        {
            let want = v.as_f64().ok_or_else(|| bad("a value is not a number"))? as f32;
            let d = (want - h[t][j]).abs();
            worst = worst.max(if d.is_nan() { f32::INFINITY } else { d });
        }
    }
    let want = reference["hidden_sum"].as_f64().ok_or_else(|| bad("no hidden_sum"))?;
    let sum: f64 = h.iter().flatten().map(|&v| v as f64).sum();
    let rel = (sum - want).abs() / want.abs().max(1.0);
    Ok((worst, if rel.is_nan() { f64::INFINITY } else { rel }))
}

/// `x` with the rows of fpt's own position table (ViT's, a Llama's), where the backbone has
/// one, taken off: the backbone adds them back, so its output is the checkpoint's own
/// computation on `x`, as another framework computes it (`fpt forward`, the SmolLM2 check).
pub fn without_fpt_positions(model: &dyn Backbone, x: &Tensor) -> Result<Tensor> {
    let table = model
        .params()
        .into_iter()
        .find(|(n, _, _)| n == "fpt.position_embeddings.weight")
        .map(|(_, _, p)| p.tensor().clone());
    Ok(match table {
        Some(t) => {
            let rows = x.dim(1)?.min(t.dim(0)?);
            x.broadcast_sub(&t.narrow(0, 0, rows)?)?
        }
        None => x.clone(),
    })
}

/// The real SmolLM2 GGUF at `gguf` against the hidden states `transformers` computed from
/// the same file (`data/fixtures/smollm2-reference.safetensors`): the largest difference
/// relative to the largest reference value, after all 30 blocks and the final norm, and
/// after 29 blocks without a norm (the residual stream, where values reach ~1e4).
pub fn smollm2_diff(gguf: &Path, reference: &HashMap<String, Tensor>, device: &Device) -> Result<(f32, f32)> {
    let get = |name: &str| {
        reference
            .get(name)
            .ok_or_else(|| BackboneError::Unsupported(format!("SmolLM2 reference has no `{name}`")))
    };
    let x = get("inputs_embeds")?.to_device(device)?;
    let spec = fpt_spec::BackboneSpec {
        source: gguf.display().to_string(),
        init: fpt_spec::Init::Pretrained,
        shape: Default::default(),
        residual_init: Default::default(),
        depth: None,
        final_norm: true,
        bit_pretrain: None,
        precision: Default::default(),
    };
    // One load (the file is ~100 MB): all blocks first, then cut to 29 without the norm.
    let mut model = crate::load(&spec, &TrainGroups::none(), device, &mut fpt_nn::Rng::new(0))?;
    model.set_dropout(false);
    let run = |model: &dyn Backbone, want: &Tensor| -> Result<f32> {
        let h = model.forward(&without_fpt_positions(model, &x)?, &mut Ctx::eval())?;
        let scale = want.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        Ok(max_abs_diff(&h, want)? / scale.max(f32::MIN_POSITIVE))
    };
    let last = run(model.as_ref(), get("last_hidden_state")?)?;
    model.truncate(29)?;
    model.drop_final_norm()?;
    Ok((last, run(model.as_ref(), get("hidden_after_29_blocks")?)?))
}

/// What [`minilm_diff`]'s error says of a MiniLM copy without its word embeddings.
pub const NO_WORD_TABLE: &str = "the cached weights have no word embeddings (a copy made without them, for a GPU machine): the reference runs token ids through them";

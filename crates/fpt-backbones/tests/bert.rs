//! BERT against golden outputs and gradients from Hugging Face `transformers`
//! (`tools/make_fixtures.py`), the real all-MiniLM-L6-v2 weights against reference values
//! (when they are in the Hugging Face cache: `fpt fetch minilm`), and loading errors.

use candle_core::{safetensors, DType, Device, Tensor, Var};
use fpt_backbones::bert::{Bert, BertConfig};
use fpt_backbones::{Backbone, Config};
use fpt_nn::{Ctx, Rng};
use fpt_spec::{Role, TrainGroups};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

mod common;
use common::max_diff;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fixtures/bert-tiny")
}

fn load(dir: &Path, groups: &TrainGroups) -> Bert {
    let Some(cfg) = Config::from_file(&dir.join("config.json"))
        .unwrap()
        .get::<fpt_backbones::bert::BertConfig>()
        .cloned()
    else {
        panic!("expected a BERT config")
    };
    Bert::load(&cfg, &dir.join("model.safetensors"), groups, &Device::Cpu).unwrap()
}

#[test]
fn forward_and_backward_match_transformers() {
    fpt_nn::kernels::on_every_path(|_| forward_and_backward_match_transformers_on_one_path());
}

fn forward_and_backward_match_transformers_on_one_path() {
    let model = load(&fixture(), &TrainGroups::fpt());
    let g = safetensors::load(fixture().join("golden.safetensors"), &Device::Cpu).unwrap();
    let x = Var::from_tensor(&g["inputs_embeds"]).unwrap();
    let out = model.forward(x.as_tensor(), &mut Ctx::eval()).unwrap();
    let d = max_diff(&out, &g["last_hidden_state"]);
    assert!(d <= 1e-4, "last_hidden_state differs by {d}");
    let grads = (out * &g["loss_weights"])
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let d = max_diff(grads.get(&x).unwrap(), &g["grad.inputs_embeds"]);
    assert!(d <= 1e-4, "input gradient differs by {d}");
    let params: HashMap<String, _> = model.params().into_iter().map(|(n, _, p)| (n, p.clone())).collect();
    for name in [
        "embeddings.position_embeddings.weight",
        "embeddings.LayerNorm.weight",
        "encoder.layer.0.attention.output.LayerNorm.bias",
        "encoder.layer.1.output.LayerNorm.weight",
    ] {
        let var = params[name]
            .var()
            .unwrap_or_else(|| panic!("{name} should train under FPT groups"));
        let d = max_diff(grads.get(var.as_tensor()).unwrap(), &g[&format!("grad.{name}")]);
        assert!(d <= 1e-4, "gradient of {name} differs by {d}");
    }
    for (name, role, p) in model.params() {
        assert_eq!(
            p.is_trainable(),
            matches!(role, Role::LayerNorm | Role::Positions),
            "{name}"
        );
        if !p.is_trainable() {
            assert!(grads.get(p.tensor()).is_none(), "{name} got a gradient");
        }
    }
}

/// `forward_last` (the last layer for the read-out positions only) equals the full
/// forward's last positions, in values and in every gradient (input and trainable
/// parameters), and matches the transformers golden output; with the FPT groups and with
/// every weight trained.
#[test]
fn forward_last_equals_the_full_forward_on_the_read_out_positions() {
    fpt_nn::kernels::on_every_path(|_| forward_last_equals_the_full_forward_on_the_read_out_positions_on_one_path());
}

fn forward_last_equals_the_full_forward_on_the_read_out_positions_on_one_path() {
    let g = safetensors::load(fixture().join("golden.safetensors"), &Device::Cpu).unwrap();
    let t = g["inputs_embeds"].dim(1).unwrap();
    for groups in [TrainGroups::fpt(), TrainGroups::all()] {
        let model = load(&fixture(), &groups);
        for last in [1, 2, t] {
            let compared = common::check_forward_last(&model, &g, last);
            assert!(compared >= 4, "only {compared} gradients compared");
        }
    }
}

#[test]
fn prefixed_and_gamma_beta_checkpoints_load() {
    fpt_nn::kernels::on_every_path(|_| prefixed_and_gamma_beta_checkpoints_load_on_one_path());
}

fn prefixed_and_gamma_beta_checkpoints_load_on_one_path() {
    let tmp = tempfile::tempdir().unwrap();
    let t = safetensors::load(fixture().join("model.safetensors"), &Device::Cpu).unwrap();
    let renamed: HashMap<String, Tensor> = t
        .into_iter()
        .map(|(k, v)| {
            (
                format!(
                    "bert.{}",
                    k.replace("LayerNorm.weight", "LayerNorm.gamma")
                        .replace("LayerNorm.bias", "LayerNorm.beta")
                ),
                v,
            )
        })
        .collect();
    safetensors::save(&renamed, tmp.path().join("model.safetensors")).unwrap();
    std::fs::copy(fixture().join("config.json"), tmp.path().join("config.json")).unwrap();
    let a = load(&fixture(), &TrainGroups::fpt());
    let b = load(tmp.path(), &TrainGroups::fpt());
    let x = Tensor::randn(0f32, 1.0, (1, 5, 32), &Device::Cpu).unwrap();
    assert_eq!(
        max_diff(
            &a.forward(&x, &mut Ctx::eval()).unwrap(),
            &b.forward(&x, &mut Ctx::eval()).unwrap()
        ),
        0.0
    );
}

#[test]
fn roles_and_counts_on_real_configs() {
    let c = Config::builtin("bert-base-uncased").unwrap();
    let specs = c.param_specs();
    let total: usize = specs.iter().map(|s| s.numel()).sum();
    assert_eq!(total, 109_482_240); // BertModel with pooler, as `transformers` counts it
    let by = |r: Role| specs.iter().filter(|s| s.role == r).map(|s| s.numel()).sum::<usize>();
    assert_eq!(by(Role::Positions), 512 * 768);
    assert_eq!(by(Role::LayerNorm), (1 + 2 * 12) * 2 * 768);
    assert_eq!(by(Role::Attention), 12 * 4 * (768 * 768 + 768));
    assert_eq!(by(Role::FeedForward), 12 * 2 * 768 * 3072 + 12 * (3072 + 768));
    let m = Config::builtin("sentence-transformers/all-MiniLM-L6-v2")
        .unwrap()
        .param_specs();
    assert_eq!(m.iter().map(|s| s.numel()).sum::<usize>(), 22_713_216);
}

#[test]
fn random_init_and_errors() {
    let cfg = BertConfig::builtin("minilm")
        .unwrap()
        .with_overrides(&fpt_spec::ShapeOverrides {
            layers: Some(1),
            hidden: Some(30),
            heads: Some(4),
            positions: None,
            ..Default::default()
        });
    let e = cfg.unwrap_err().to_string();
    assert!(
        e.contains("hidden_size 30") && e.contains("num_attention_heads 4"),
        "{e}"
    );
    let cfg = BertConfig::builtin("minilm").unwrap();
    let m = Bert::random(&cfg, &TrainGroups::fpt(), &Device::Cpu, &mut Rng::new(0)).unwrap();
    assert_eq!(m.num_layers(), 6);
    assert!(!m.is_causal());
    // A wrong-shaped tensor names itself.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(fixture().join("config.json"), tmp.path().join("config.json")).unwrap();
    let mut t = safetensors::load(fixture().join("model.safetensors"), &Device::Cpu).unwrap();
    t.insert(
        "encoder.layer.0.intermediate.dense.weight".into(),
        Tensor::zeros((3, 3), DType::F32, &Device::Cpu).unwrap(),
    );
    safetensors::save(&t, tmp.path().join("model.safetensors")).unwrap();
    let Some(c) = Config::from_file(&tmp.path().join("config.json"))
        .unwrap()
        .get::<fpt_backbones::bert::BertConfig>()
        .cloned()
    else {
        panic!()
    };
    let e = Bert::load(
        &c,
        &tmp.path().join("model.safetensors"),
        &TrainGroups::fpt(),
        &Device::Cpu,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("encoder.layer.0.intermediate.dense.weight") && e.contains("[3, 3]"),
        "{e}"
    );
}

/// Runs when all-MiniLM-L6-v2 is in the Hugging Face cache (`fpt fetch minilm`; `.ci/run`
/// fetches it and sets FPT_REQUIRE_MINILM=1 so that CI cannot skip it).
#[test]
fn real_minilm_matches_reference_values() {
    fpt_nn::kernels::on_every_path(|_| real_minilm_matches_reference_values_on_one_path());
}

fn real_minilm_matches_reference_values_on_one_path() {
    std::env::set_var("HF_HUB_OFFLINE", "1");
    let files = match fpt_backbones::hub::resolve("sentence-transformers/all-MiniLM-L6-v2", true) {
        Ok(f) => f,
        Err(e) => {
            assert!(
                std::env::var_os("FPT_REQUIRE_MINILM").is_none(),
                "FPT_REQUIRE_MINILM is set but MiniLM is not cached: {e}"
            );
            eprintln!("SKIPPED: all-MiniLM-L6-v2 is not in the Hugging Face cache (run `fpt fetch minilm`)");
            return;
        }
    };
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fixtures/minilm-reference.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let (worst, sum) = fpt_backbones::golden::minilm_diff(&files, &reference, &Device::Cpu).unwrap();
    assert!(
        worst <= 1e-4,
        "MiniLM hidden states differ from transformers by {worst}"
    );
    assert!(sum <= 1e-3, "sum of the hidden states off by {sum} (relative)");
}

/// Attention-only blocks (the critics' LLM2Attn): no feed-forward tensors, nothing saved as
/// a Hub BERT, and one block's output is the post-norm attention half composed here by hand
/// from its own parameters, `LN(h + Attn(h) W_o + b_o)` over the embedding stage's `h`.
#[test]
fn an_attention_only_block_is_the_attention_half() {
    let cfg = BertConfig::builtin("minilm")
        .unwrap()
        .with_overrides(&fpt_spec::ShapeOverrides {
            layers: Some(1),
            hidden: Some(32),
            heads: Some(4),
            positions: Some(16),
            attention_only: Some(true),
            ..Default::default()
        })
        .unwrap();
    let m = Bert::random(&cfg, &TrainGroups::all(), &Device::Cpu, &mut Rng::new(4)).unwrap();
    let names: Vec<String> = m.params().into_iter().map(|(n, _, _)| n).collect();
    let ffn = |n: &String| n.contains("intermediate") || (n.contains("output.") && !n.contains("attention.output"));
    assert!(!names.iter().any(ffn), "{names:?}");
    assert!(
        names.iter().any(|n| n.contains("attention.output.LayerNorm")),
        "{names:?}"
    );
    assert!(m.param_specs().iter().all(|s| s.role != Role::FeedForward));
    let p = |n: &str| {
        m.params()
            .into_iter()
            .find(|(name, _, _)| name == n)
            .unwrap_or_else(|| panic!("{n}"))
            .2
            .get()
    };
    let (b, t, c, nh) = (2, 5, 32, 4);
    let x = Tensor::new(Rng::new(8).normal_vec(b * t * c, 0.0, 1.0), &Device::Cpu)
        .unwrap()
        .reshape((b, t, c))
        .unwrap();
    let got = m.forward(&x, &mut Ctx::eval()).unwrap();
    let ln = |h: &Tensor, n: &str| {
        fpt_nn::ops::layer_norm_composed(
            h,
            &p(&format!("{n}.weight")),
            &p(&format!("{n}.bias")),
            cfg.layer_norm_eps,
        )
        .unwrap()
    };
    let lin = |h: &Tensor, n: &str| {
        h.broadcast_matmul(&p(&format!("{n}.weight")).t().unwrap())
            .unwrap()
            .broadcast_add(&p(&format!("{n}.bias")))
            .unwrap()
    };
    let emb = x
        .broadcast_add(&p("embeddings.position_embeddings.weight").narrow(0, 0, t).unwrap())
        .unwrap()
        .broadcast_add(&p("embeddings.token_type_embeddings.weight").narrow(0, 0, 1).unwrap())
        .unwrap();
    let h = ln(&emb, "embeddings.LayerNorm");
    let heads = |y: Tensor| {
        y.reshape((b, t, nh, c / nh))
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap()
    };
    let l = "encoder.layer.0.attention";
    let (q, k, v) = (
        heads(lin(&h, &format!("{l}.self.query"))),
        heads(lin(&h, &format!("{l}.self.key"))),
        heads(lin(&h, &format!("{l}.self.value"))),
    );
    let s = (q.matmul(&k.t().unwrap()).unwrap() / ((c / nh) as f64).sqrt()).unwrap();
    let a = candle_nn_free_softmax(&s).matmul(&v).unwrap();
    let a = a
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape((b, t, c))
        .unwrap();
    let want = ln(
        &(&h + lin(&a, &format!("{l}.output.dense"))).unwrap(),
        &format!("{l}.output.LayerNorm"),
    );
    assert!(max_diff(&got, &want) < 1e-5, "{}", max_diff(&got, &want));
    // Other architectures refuse the shape, naming it.
    let e = Config::builtin("gpt2")
        .unwrap()
        .with_overrides(&fpt_spec::ShapeOverrides {
            attention_only: Some(true),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("attention-only") && e.contains("gpt2"), "{e}");
}

/// Softmax over the last dimension, composed of tensor ops.
fn candle_nn_free_softmax(s: &Tensor) -> Tensor {
    let m = s.max_keepdim(candle_core::D::Minus1).unwrap();
    let e = s.broadcast_sub(&m).unwrap().exp().unwrap();
    e.broadcast_div(&e.sum_keepdim(candle_core::D::Minus1).unwrap())
        .unwrap()
}

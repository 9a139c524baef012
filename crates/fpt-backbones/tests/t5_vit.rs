//! The T5 encoder and ViT against golden outputs and gradients from Hugging Face
//! `transformers` (`tools/make_fixtures.py`), their roles and counts on real configs, and
//! the shape rules each has.

use candle_core::{safetensors, Device, Tensor, Var};
use fpt_backbones::t5::T5Config;
use fpt_backbones::{Backbone, Config};
use fpt_nn::Ctx;
use fpt_spec::{Role, ShapeOverrides, TrainGroups};
use std::path::{Path, PathBuf};

mod common;
use common::max_diff;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/fixtures")
        .join(name)
}

/// Forward in eval mode and the gradients of sum(out * r) against the golden file (every
/// gradient it holds, at least `grads_of`), and the attention and feed-forward weights frozen.
fn check_golden(model: &dyn Backbone, dir: &Path, grads_of: &[&str]) {
    let g = fpt_backbones::golden::read(&dir.join("golden.safetensors"), &Device::Cpu).unwrap();
    for name in grads_of {
        assert!(g.contains_key(&format!("grad.{name}")), "{name}");
    }
    let d = fpt_backbones::golden::check(model, &g).unwrap();
    assert!(d.max() <= 1e-4, "{}: {d:?}", dir.display());
    assert_eq!(
        d.params_checked,
        grads_of.len() + g.contains_key("grad.fpt_positions") as usize
    );
    for (name, role, p) in model.params() {
        if matches!(role, Role::Attention | Role::FeedForward) {
            assert!(!p.is_trainable(), "{name} is not frozen");
        }
    }
}

fn load(dir: &Path) -> Box<dyn Backbone> {
    let spec = fpt_spec::BackboneSpec {
        source: dir.to_str().unwrap().into(),
        init: fpt_spec::Init::Pretrained,
        shape: ShapeOverrides::default(),
        residual_init: Default::default(),
        depth: None,
        final_norm: true,
        bit_pretrain: None,
        precision: Default::default(),
    };
    fpt_backbones::load(&spec, &TrainGroups::fpt(), &Device::Cpu, &mut fpt_nn::Rng::new(0)).unwrap()
}

#[test]
fn t5_encoder_matches_transformers() {
    fpt_nn::kernels::on_every_path(|_| t5_encoder_matches_transformers_on_one_path());
}

fn t5_encoder_matches_transformers_on_one_path() {
    let m = load(&fixture("t5-tiny"));
    assert_eq!(m.architecture(), "t5");
    check_golden(
        m.as_ref(),
        &fixture("t5-tiny"),
        &[
            "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            "encoder.block.0.layer.0.layer_norm.weight",
            "encoder.block.1.layer.1.layer_norm.weight",
            "encoder.final_layer_norm.weight",
        ],
    );
}

#[test]
fn vit_matches_transformers_with_fpt_positions() {
    fpt_nn::kernels::on_every_path(|_| vit_matches_transformers_with_fpt_positions_on_one_path());
}

fn vit_matches_transformers_with_fpt_positions_on_one_path() {
    let dir = fixture("vit-tiny");
    let m = load(&dir);
    assert_eq!((m.architecture(), m.max_positions()), ("vit", 1024));
    // fpt's position table starts at zero; put the fixture's positions in its first rows.
    let g = safetensors::load(dir.join("golden.safetensors"), &Device::Cpu).unwrap();
    let (name, _, pos) = m
        .params()
        .into_iter()
        .find(|(n, _, _)| n == "fpt.position_embeddings.weight")
        .unwrap();
    let pos = pos.var().unwrap().clone();
    assert_eq!(
        pos.as_tensor()
            .abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap(),
        0.0,
        "{name} starts at zero"
    );
    let rows = g["fpt_positions"].dim(0).unwrap();
    let rest = Tensor::zeros((1024 - rows, 32), candle_core::DType::F32, &Device::Cpu).unwrap();
    pos.set(&Tensor::cat(&[&g["fpt_positions"], &rest], 0).unwrap())
        .unwrap();
    check_golden(
        m.as_ref(),
        &dir,
        &[
            "encoder.layer.0.layernorm_before.weight",
            "encoder.layer.1.layernorm_after.bias",
            "layernorm.weight",
        ],
    );
    // The gradient of the used position rows matches too.
    let x = Var::from_tensor(&g["inputs_embeds"]).unwrap();
    let out = m.forward(x.as_tensor(), &mut Ctx::eval()).unwrap();
    let grads = (out * &g["loss_weights"])
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let gp = grads.get(pos.as_tensor()).unwrap().narrow(0, 0, rows).unwrap();
    assert!(max_diff(&gp, &g["grad.fpt_positions"]) <= 1e-4);
}

#[test]
fn t5_relative_buckets_follow_transformers() {
    // Values of transformers' T5Attention._relative_position_bucket (bidirectional, 32
    // buckets, max distance 128) for key - query in -200..=200, spot-checked.
    let c = T5Config::builtin("t5-base").unwrap();
    let cases = [
        (0, 0),
        (1, 17),
        (-1, 1),
        (7, 23),
        (-7, 7),
        (8, 24),
        (-8, 8),
        (12, 25),
        (-12, 9),
        (20, 26),
        (-30, 11),
        (64, 30),
        (127, 31),
        (-128, 15),
        (-200, 15),
        (200, 31),
    ];
    for (rel, want) in cases {
        assert_eq!(c.bucket(rel), want, "relative position {rel}");
    }
}

#[test]
fn roles_and_counts_on_real_configs() {
    let t5 = Config::builtin("t5-base").unwrap().param_specs();
    let total: usize = t5.iter().map(|s| s.numel()).sum();
    assert_eq!(total, 109_628_544); // T5EncoderModel("t5-base"), as transformers counts it
    let by =
        |s: &[fpt_backbones::ParamSpec], r: Role| s.iter().filter(|x| x.role == r).map(|x| x.numel()).sum::<usize>();
    assert_eq!(by(&t5, Role::Positions), 32 * 12);
    assert_eq!(by(&t5, Role::LayerNorm), (2 * 12 + 1) * 768);
    let vit = Config::builtin("google/vit-base-patch16-224-in21k")
        .unwrap()
        .param_specs();
    let hf: usize = vit
        .iter()
        .filter(|s| !s.name.starts_with("fpt."))
        .map(|s| s.numel())
        .sum::<usize>()
        + 768 * 768
        + 768;
    assert_eq!(hf, 86_389_248); // ViTModel with pooler, as transformers counts it
    assert_eq!(by(&vit, Role::Positions), 1024 * 768);
    assert_eq!(by(&vit, Role::LayerNorm), (2 * 12 + 1) * 2 * 768);
    let e = Config::builtin("t5-base")
        .unwrap()
        .with_overrides(&ShapeOverrides {
            positions: Some(10),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("relative-position"), "{e}");
}

#[test]
fn longformer_matches_transformers_with_its_sliding_window() {
    fpt_nn::kernels::on_every_path(|_| longformer_matches_transformers_with_its_sliding_window_on_one_path());
}

fn longformer_matches_transformers_with_its_sliding_window_on_one_path() {
    let dir = fixture("longformer-tiny");
    let m = load(&dir);
    assert_eq!(m.architecture(), "longformer");
    assert_eq!(m.max_positions(), 20 - 2); // pad_token_id 1: positions start at 2
    check_golden(
        m.as_ref(),
        &dir,
        &[
            "embeddings.position_embeddings.weight",
            "embeddings.LayerNorm.weight",
            "encoder.layer.1.attention.output.LayerNorm.bias",
        ],
    );
    let c = Config::builtin("allenai/longformer-base-4096").unwrap();
    assert!(c.summary().contains("256 keys each side"), "{}", c.summary());
    let total: usize = c.param_specs().iter().map(|s| s.numel()).sum();
    assert_eq!(total, 148_068_864); // LongformerModel(add_pooling_layer=False), as transformers counts it
}

#[test]
fn timm_vit_checkpoints_load_under_hf_names() {
    fpt_nn::kernels::on_every_path(|_| timm_vit_checkpoints_load_under_hf_names_on_one_path());
}

fn timm_vit_checkpoints_load_under_hf_names_on_one_path() {
    let dir = fixture("vit-timm-tiny");
    let m = load(&dir);
    assert_eq!(m.architecture(), "vit");
    let g = safetensors::load(dir.join("golden.safetensors"), &Device::Cpu).unwrap();
    let (_, _, pos) = m
        .params()
        .into_iter()
        .find(|(n, _, _)| n == "fpt.position_embeddings.weight")
        .unwrap();
    let pos = pos.var().unwrap().clone();
    let rows = g["fpt_positions"].dim(0).unwrap();
    let rest = Tensor::zeros((1024 - rows, 32), candle_core::DType::F32, &Device::Cpu).unwrap();
    pos.set(&Tensor::cat(&[&g["fpt_positions"], &rest], 0).unwrap())
        .unwrap();
    check_golden(m.as_ref(), &dir, &[]);
}

#[test]
fn every_backbone_truncates_to_its_first_layers() {
    for name in ["gpt2-tiny", "bert-tiny", "t5-tiny", "vit-tiny", "longformer-tiny"] {
        let mut m = load(&fixture(name));
        let before: usize = m.param_specs().iter().map(|s| s.numel()).sum();
        let x = Tensor::randn(0f32, 1.0, (1, 5, 32), &Device::Cpu).unwrap();
        assert!(m.truncate(3).is_err(), "{name}");
        // Depth 0 (the critics' "w/o LLM"): no block left, the embedding stage runs alone.
        let mut none = load(&fixture(name));
        none.truncate(0).unwrap();
        assert_eq!(none.num_layers(), 0, "{name}");
        assert!(
            none.params()
                .iter()
                .all(|(n, _, _)| fpt_backbones::layer_index(n).is_none()),
            "{name}"
        );
        assert_eq!(
            none.forward(&x, &mut Ctx::eval()).unwrap().dims(),
            &[1, 5, 32],
            "{name}"
        );
        m.truncate(1).unwrap();
        assert_eq!(m.num_layers(), 1, "{name}");
        let after: usize = m.param_specs().iter().map(|s| s.numel()).sum();
        assert!(after < before, "{name}");
        assert!(
            m.params()
                .iter()
                .all(|(n, _, _)| fpt_backbones::layer_index(n).is_none_or(|i| i == 0)),
            "{name}"
        );
        let materialised: usize = m.params().iter().map(|(_, _, p)| p.elem_count()).sum();
        let used: usize = m.param_specs().iter().filter(|s| s.used).map(|s| s.numel()).sum();
        assert_eq!(materialised, used, "{name}");
        assert_eq!(m.forward(&x, &mut Ctx::eval()).unwrap().dims(), &[1, 5, 32]);
    }
}

#[test]
fn every_registered_architecture_reads_back_its_built_in_configs() {
    // The registry is the one place that knows the architectures: each built-in config,
    // written as `config.json`, is read back by `Config::from_json` to the same config.
    let names = [
        "gpt2",
        "bert-base-uncased",
        "sentence-transformers/all-MiniLM-L6-v2",
        "t5-base",
        "google/vit-base-patch16-224-in21k",
        "lstm",
        "smollm2",
    ];
    for r in fpt_backbones::ARCHITECTURES {
        assert!(
            names.iter().any(|n| (r.builtin)(n).is_some()),
            "{:?} has no built-in config in this test",
            r.names
        );
    }
    // (Longformer's config keeps fpt's window and offset, not `attention_window`, so it
    // is not written back as a `config.json`; `save_pretrained` refuses it.)
    for name in names {
        let c = Config::builtin(name).unwrap_or_else(|| panic!("{name} is built in"));
        let text = c.to_json().to_string();
        let back =
            Config::from_json(&text, std::path::Path::new("config.json")).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(back, c, "{name}");
        assert_eq!(back.summary(), c.summary(), "{name}");
    }
    let e = Config::from_json(r#"{"model_type": "mamba"}"#, std::path::Path::new("c.json"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("c.json") && e.contains("mamba") && e.contains("gpt2, bert, longformer, t5, vit, fpt-lstm"),
        "{e}"
    );
}

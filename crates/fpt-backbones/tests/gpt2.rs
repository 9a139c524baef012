//! GPT-2 against golden outputs and gradients from Hugging Face `transformers`
//! (`tools/make_fixtures.py`), plus loading errors and init statistics.

use candle_core::{safetensors, DType, Device, Tensor, Var};
use fpt_backbones::gpt2::{Gpt2, Gpt2Config};
use fpt_backbones::{Backbone, BackboneError};
use fpt_nn::{Ctx, Rng};
use fpt_spec::{ResidualInit, Role, TrainGroups};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

mod common;
use common::max_diff;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fixtures/gpt2-tiny")
}

fn golden() -> HashMap<String, Tensor> {
    safetensors::load(fixture().join("golden.safetensors"), &Device::Cpu).unwrap()
}

fn load_tiny(dir: &Path) -> Result<Gpt2, BackboneError> {
    let cfg = Gpt2Config::from_file(&dir.join("config.json"))?;
    Gpt2::load(&cfg, &dir.join("model.safetensors"), &TrainGroups::fpt(), &Device::Cpu)
}

#[test]
fn forward_and_backward_match_transformers() {
    fpt_nn::kernels::on_every_path(|_| forward_and_backward_match_transformers_on_one_path());
}

fn forward_and_backward_match_transformers_on_one_path() {
    let model = load_tiny(&fixture()).unwrap();
    let g = golden();
    let x = Var::from_tensor(&g["inputs_embeds"]).unwrap();
    let out = model.forward(x.as_tensor(), &mut Ctx::eval()).unwrap();
    let d = max_diff(&out, &g["last_hidden_state"]);
    assert!(d <= 1e-4, "last_hidden_state differs by {d}");

    let loss = (out * &g["loss_weights"]).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    let gx = grads.get(&x).expect("input gradient");
    let d = max_diff(gx, &g["grad.inputs_embeds"]);
    assert!(d <= 1e-4, "input gradient differs by {d}");
    let params: HashMap<String, _> = model.params().into_iter().map(|(n, _, p)| (n, p.clone())).collect();
    for name in ["wpe.weight", "h.0.ln_1.weight", "h.1.ln_2.bias", "ln_f.weight"] {
        let var = params[name]
            .var()
            .unwrap_or_else(|| panic!("{name} should be trainable under FPT groups"));
        let ours = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        let d = max_diff(ours, &g[&format!("grad.{name}")]);
        assert!(d <= 1e-4, "gradient of {name} differs by {d}");
    }
    // Frozen by construction: attention and MLP weights are not Vars and got no gradient.
    for (name, role, p) in model.params() {
        let frozen = matches!(role, Role::Attention | Role::FeedForward);
        assert_eq!(p.is_trainable(), !frozen, "{name}");
        if frozen {
            assert!(grads.get(p.tensor()).is_none(), "{name} got a gradient");
        }
    }
}

#[test]
fn loads_a_transformer_prefixed_checkpoint() {
    fpt_nn::kernels::on_every_path(|_| loads_a_transformer_prefixed_checkpoint_on_one_path());
}

fn loads_a_transformer_prefixed_checkpoint_on_one_path() {
    let tmp = tempfile::tempdir().unwrap();
    let mut tensors = safetensors::load(fixture().join("model.safetensors"), &Device::Cpu).unwrap();
    let renamed: HashMap<String, Tensor> = tensors.drain().map(|(k, v)| (format!("transformer.{k}"), v)).collect();
    safetensors::save(&renamed, tmp.path().join("model.safetensors")).unwrap();
    std::fs::copy(fixture().join("config.json"), tmp.path().join("config.json")).unwrap();
    let model = load_tiny(tmp.path()).unwrap();
    let g = golden();
    let out = model.forward(&g["inputs_embeds"], &mut Ctx::eval()).unwrap();
    assert!(max_diff(&out, &g["last_hidden_state"]) <= 1e-4);
}

#[test]
fn save_pretrained_round_trips() {
    let cfg = Gpt2Config::from_file(&fixture().join("config.json")).unwrap();
    let a = Gpt2::random(
        &cfg,
        ResidualInit::Scaled,
        &TrainGroups::fpt(),
        &Device::Cpu,
        &mut Rng::new(3),
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    fpt_backbones::save_pretrained(&a, tmp.path(), Default::default(), &mut Rng::new(4)).unwrap();
    let b = load_tiny(tmp.path()).unwrap();
    let x = Tensor::randn(0f32, 1.0, (2, 5, 32), &Device::Cpu).unwrap();
    let (ya, yb) = (
        a.forward(&x, &mut Ctx::eval()).unwrap(),
        b.forward(&x, &mut Ctx::eval()).unwrap(),
    );
    assert_eq!(max_diff(&ya, &yb), 0.0);
}

fn copy_fixture(tmp: &Path) {
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture().join(f), tmp.join(f)).unwrap();
    }
}

#[test]
fn truncated_weights_name_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    copy_fixture(tmp.path());
    let w = tmp.path().join("model.safetensors");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_tiny(tmp.path())
        .err()
        .expect("truncated file must fail")
        .to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("not a valid safetensors"),
        "{e}"
    );
}

#[test]
fn missing_config_field_names_file_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    copy_fixture(tmp.path());
    let c = tmp.path().join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&c).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("n_head");
    std::fs::write(&c, v.to_string()).unwrap();
    let e = load_tiny(tmp.path()).err().expect("must fail").to_string();
    assert!(e.contains("config.json") && e.contains("n_head"), "{e}");
}

#[test]
fn wrong_shape_and_missing_tensor_name_the_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    copy_fixture(tmp.path());
    let w = tmp.path().join("model.safetensors");
    let mut t = safetensors::load(&w, &Device::Cpu).unwrap();
    t.insert(
        "h.1.mlp.c_fc.weight".into(),
        Tensor::zeros((32, 100), DType::F32, &Device::Cpu).unwrap(),
    );
    safetensors::save(&t, &w).unwrap();
    let e = load_tiny(tmp.path()).err().expect("must fail").to_string();
    assert!(
        e.contains("`h.1.mlp.c_fc.weight`") && e.contains("[32, 100]") && e.contains("[32, 128]"),
        "{e}"
    );
    t.remove("h.1.mlp.c_fc.weight");
    safetensors::save(&t, &w).unwrap();
    let e = load_tiny(tmp.path()).err().expect("must fail").to_string();
    assert!(e.contains("missing tensor `h.1.mlp.c_fc.weight`"), "{e}");
}

#[test]
fn pytorch_bin_only_is_refused_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(fixture().join("config.json"), tmp.path().join("config.json")).unwrap();
    std::fs::write(tmp.path().join("pytorch_model.bin"), b"not read").unwrap();
    let e = fpt_backbones::hub::resolve(tmp.path().to_str().unwrap(), true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("pytorch_model.bin") && e.contains("safetensors"), "{e}");
}

#[test]
fn random_init_follows_gpt2_defaults() {
    let cfg = Gpt2Config::builtin("gpt2")
        .unwrap()
        .with_overrides(&fpt_spec::ShapeOverrides {
            layers: Some(2),
            hidden: Some(256),
            heads: Some(4),
            positions: Some(64),
            ..Default::default()
        })
        .unwrap();
    let m = Gpt2::random(
        &cfg,
        ResidualInit::Scaled,
        &TrainGroups::fpt(),
        &Device::Cpu,
        &mut Rng::new(0),
    )
    .unwrap();
    let std = |t: &Tensor| {
        t.flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|&v| (v as f64).powi(2))
            .sum::<f64>()
            / t.elem_count() as f64
    };
    for (name, _, p) in m.params() {
        let t = p.tensor();
        let s = std(t).sqrt();
        if name.contains("ln_") {
            let want = if name.ends_with("weight") { 1.0 } else { 0.0 };
            assert!(
                t.flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
                    .iter()
                    .all(|&v| v == want),
                "{name}"
            );
        } else if name.ends_with(".bias") {
            assert_eq!(s, 0.0, "{name}");
        } else if name.ends_with("c_proj.weight") {
            assert!((s - 0.01).abs() < 0.0015, "{name}: std {s}"); // 0.02 / sqrt(2 * 2)
        } else {
            assert!((s - 0.02).abs() < 0.002, "{name}: std {s}");
        }
    }
}

#[test]
fn base_config_counts_match_the_paper_code() {
    let specs = Gpt2Config::builtin("gpt2").unwrap().param_specs();
    let total: usize = specs.iter().map(|s| s.numel()).sum();
    let groups = TrainGroups::fpt();
    let trainable: usize = specs.iter().filter(|s| groups.trains(s.role)).map(|s| s.numel()).sum();
    assert_eq!(total, 124_439_808);
    assert_eq!(trainable, 824_832);
    let by = |r: Role| specs.iter().filter(|s| s.role == r).map(|s| s.numel()).sum::<usize>();
    assert_eq!(by(Role::LayerNorm), 38_400);
    assert_eq!(by(Role::Positions), 786_432);
    assert_eq!(by(Role::Other), 50257 * 768);
}

#[test]
fn offline_and_uncached_names_model_and_fetch_command() {
    let tmp = tempfile::tempdir().unwrap();
    // Only this test touches these variables in this test binary's process.
    std::env::set_var("HF_HUB_CACHE", tmp.path());
    std::env::set_var("HF_HUB_OFFLINE", "1");
    let e = fpt_backbones::hub::resolve("someone/not-cached-model", true)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("someone/not-cached-model") && e.contains("fpt fetch") && e.contains("HF_HUB_OFFLINE"),
        "{e}"
    );
}

#[test]
fn sharded_checkpoints_load_and_missing_shards_are_named() {
    fpt_nn::kernels::on_every_path(|_| sharded_checkpoints_load_and_missing_shards_are_named_on_one_path());
}

fn sharded_checkpoints_load_and_missing_shards_are_named_on_one_path() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(fixture().join("config.json"), tmp.path().join("config.json")).unwrap();
    let all = safetensors::load(fixture().join("model.safetensors"), &Device::Cpu).unwrap();
    let (mut a, mut b) = (HashMap::new(), HashMap::new());
    let mut map = serde_json::Map::new();
    for (k, v) in all {
        let first = k.starts_with("h.0.") || k.starts_with("w");
        let file = if first {
            "model-00001-of-00002.safetensors"
        } else {
            "model-00002-of-00002.safetensors"
        };
        map.insert(k.clone(), file.into());
        if first {
            a.insert(k, v);
        } else {
            b.insert(k, v);
        }
    }
    safetensors::save(&a, tmp.path().join("model-00001-of-00002.safetensors")).unwrap();
    safetensors::save(&b, tmp.path().join("model-00002-of-00002.safetensors")).unwrap();
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(tmp.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    let files = fpt_backbones::hub::resolve(tmp.path().to_str().unwrap(), true).unwrap();
    let cfg = Gpt2Config::from_file(&files.config).unwrap();
    let model = Gpt2::load(&cfg, files.weights.as_ref().unwrap(), &TrainGroups::fpt(), &Device::Cpu).unwrap();
    let g = golden();
    let out = model.forward(&g["inputs_embeds"], &mut Ctx::eval()).unwrap();
    assert!(max_diff(&out, &g["last_hidden_state"]) <= 1e-4);
    std::fs::remove_file(tmp.path().join("model-00002-of-00002.safetensors")).unwrap();
    let e = Gpt2::load(&cfg, files.weights.as_ref().unwrap(), &TrainGroups::fpt(), &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("model-00002-of-00002.safetensors") && e.contains("missing"),
        "{e}"
    );
}

#[test]
fn statistics_only_init_keeps_each_tensors_mean_and_std_and_nothing_else() {
    let spec = |init| fpt_spec::BackboneSpec {
        source: fixture().to_str().unwrap().into(),
        init,
        shape: Default::default(),
        residual_init: Default::default(),
        depth: None,
        final_norm: true,
        bit_pretrain: None,
        precision: Default::default(),
    };
    let load =
        |init, seed| fpt_backbones::load(&spec(init), &TrainGroups::fpt(), &Device::Cpu, &mut Rng::new(seed)).unwrap();
    let (pre, stats, again, other) = (
        load(fpt_spec::Init::Pretrained, 0),
        load(fpt_spec::Init::StatsOnly, 0),
        load(fpt_spec::Init::StatsOnly, 0),
        load(fpt_spec::Init::StatsOnly, 1),
    );
    assert!(
        stats.origin().starts_with("statistics-only init from"),
        "{}",
        stats.origin()
    );
    let moments = |t: &Tensor| {
        let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        let n = v.len() as f64;
        let m = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        (
            m,
            (v.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / n).sqrt(),
            v,
        )
    };
    let (p, s, a, o) = (pre.params(), stats.params(), again.params(), other.params());
    assert_eq!(p.len(), s.len());
    let mut checked = 0;
    for (((name, role, pt), (n2, r2, st)), ((_, _, at), (_, _, ot))) in p.iter().zip(&s).zip(a.iter().zip(&o)) {
        assert_eq!((name, role), (n2, r2));
        let (pm, ps, pv) = moments(pt.tensor());
        let (sm, ss, sv) = moments(st.tensor());
        assert_eq!(sv, moments(at.tensor()).2, "{name}: same seed, same draw");
        if ps > 0.0 {
            assert_ne!(sv, pv, "{name}: redrawn, not copied");
            assert_ne!(sv, moments(ot.tensor()).2, "{name}: another seed, another draw");
        }
        if pv.len() >= 1000 {
            // Sample moments of n draws: mean within 5 standard errors, std within 10%.
            assert!(
                (sm - pm).abs() <= 5.0 * ps / (pv.len() as f64).sqrt() + 1e-6,
                "{name}: mean {sm} vs {pm}"
            );
            assert!((ss - ps).abs() <= 0.1 * ps + 1e-6, "{name}: std {ss} vs {ps}");
            checked += 1;
        }
    }
    assert!(checked >= 4, "only {checked} tensors were large enough to check");
}

/// `forward_last` (the last block and final norm for the read-out positions only) equals the
/// full forward's last positions, in values and in every gradient (input and trainable
/// parameters), against the transformers golden output too.
#[test]
fn forward_last_equals_the_full_forward_on_the_read_out_positions() {
    fpt_nn::kernels::on_every_path(|_| forward_last_equals_the_full_forward_on_the_read_out_positions_on_one_path());
}

fn forward_last_equals_the_full_forward_on_the_read_out_positions_on_one_path() {
    let model = load_tiny(&fixture()).unwrap();
    let g = golden();
    for last in [1, 2] {
        common::check_forward_last(&model, &g, last);
    }
}

/// In training (every dropout on), the FPT model (frozen blocks: each block half runs as one
/// fused op on CPUs with AVX-512) and the fully trained one (trained weights: the same halves
/// composed of separate ops) give the same output and the same gradients for the input,
/// the positions and the norms: the fused backward equals the composed one.
#[test]
fn frozen_fused_blocks_train_like_the_composed_ones() {
    fpt_nn::kernels::on_every_path(|_| frozen_fused_blocks_train_like_the_composed_ones_on_one_path());
}

fn frozen_fused_blocks_train_like_the_composed_ones_on_one_path() {
    let g = golden();
    let fpt = load_tiny(&fixture()).unwrap();
    let cfg = Gpt2Config::from_file(&fixture().join("config.json")).unwrap();
    let full = Gpt2::load(
        &cfg,
        &fixture().join("model.safetensors"),
        &TrainGroups::all(),
        &Device::Cpu,
    )
    .unwrap();
    let run = |model: &Gpt2| {
        let x = Var::from_tensor(&g["inputs_embeds"]).unwrap();
        let out = model.forward(x.as_tensor(), &mut Ctx::train(7)).unwrap();
        let loss = (&out * &g["loss_weights"]).unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        let params: HashMap<String, Tensor> = model
            .params()
            .into_iter()
            .filter(|(_, role, _)| !matches!(role, Role::Attention | Role::FeedForward))
            .map(|(n, _, p)| {
                let gr = grads.get(p.tensor()).unwrap_or_else(|| panic!("no gradient for {n}"));
                (n, gr.clone())
            })
            .collect();
        (out, grads.get(&x).expect("input gradient").clone(), params)
    };
    let (out_a, gx_a, params_a) = run(&fpt);
    let (out_b, gx_b, params_b) = run(&full);
    assert!(max_diff(&out_a, &out_b) <= 1e-5, "outputs differ");
    assert!(max_diff(&gx_a, &gx_b) <= 1e-4, "input gradients differ");
    assert!(params_a.len() >= 6, "{:?}", params_a.keys());
    for (name, ga) in &params_a {
        let d = max_diff(ga, &params_b[name]);
        assert!(d <= 1e-4, "gradient of {name} differs by {d}");
    }
    // Dropout is on: another seed gives another output.
    let x = g["inputs_embeds"].clone();
    let other = fpt.forward(&x, &mut Ctx::train(8)).unwrap();
    assert!(max_diff(&out_a, &other) > 1e-3, "dropout should change the output");
}

/// `load` refuses a `bit-pretrained` spec (its weights come from a training run that
/// `fpt_train::pretrain::resolve_backbone` makes first) instead of quietly building a
/// random backbone.
#[test]
fn a_bit_pretrained_spec_is_refused_not_loaded_as_random() {
    let spec = fpt_spec::BackboneSpec {
        source: "gpt2".into(),
        init: fpt_spec::Init::BitPretrained,
        shape: Default::default(),
        residual_init: Default::default(),
        depth: None,
        final_norm: true,
        bit_pretrain: Some(Default::default()),
        precision: Default::default(),
    };
    let e = fpt_backbones::load(&spec, &TrainGroups::fpt(), &Device::Cpu, &mut Rng::new(0))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("bit-pretrained") && e.contains("resolve_backbone"), "{e}");
}

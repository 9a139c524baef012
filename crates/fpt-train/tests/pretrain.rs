//! Backbones fpt trains itself (bit-pretrained init, `fpt pretrain` export), output-only
//! training on cached features, the last-attention group and the depth cut without final
//! norm, on tiny random GPT-2s. `$FPT_HOME` points at one temporary directory for the whole
//! binary (the bit-pretrained cache lives there).

use candle_core::{Device, Tensor};
use fpt_spec::{
    BackboneSpec, BitPretrainSpec, Init, ModelKind, ResidualInit, RunSpec, ShapeOverrides, TaskName, TaskSpec,
    TrainGroups, TrainSpec,
};
use fpt_train::{pretrain, train, Trainer};
use std::collections::HashMap;
use std::sync::OnceLock;

fn home() -> &'static std::path::Path {
    static HOME: OnceLock<tempfile::TempDir> = OnceLock::new();
    HOME.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        std::env::set_var("FPT_HOME", d.path());
        d
    })
    .path()
}

fn backbone(init: Init) -> BackboneSpec {
    BackboneSpec {
        source: "gpt2".into(),
        init,
        shape: ShapeOverrides {
            layers: Some(2),
            hidden: Some(32),
            heads: Some(2),
            positions: Some(128),
            ..Default::default()
        },
        residual_init: ResidualInit::Scaled,
        depth: None,
        final_norm: true,
        bit_pretrain: None,
        precision: Default::default(),
    }
}

fn spec(task: TaskSpec, backbone: BackboneSpec, groups: TrainGroups, steps: usize) -> RunSpec {
    RunSpec {
        task,
        backbone,
        train_groups: groups,
        train: TrainSpec {
            steps,
            batch_size: 16,
            micro_batch_size: 16,
            eval_every: steps.max(1),
            ..TrainSpec::default()
        },
        input_dropout: 0.1,
        orth_gain: 1.41,
        input_init: fpt_spec::InputInit::Orthogonal,
        backbone_dropout: true,
        model: ModelKind::Fpt,
    }
}

fn xor() -> TaskSpec {
    let mut t = TaskSpec::new(TaskName::BitXor);
    t.eval_examples = 128;
    t
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

#[test]
fn bit_pretrained_backbones_are_trained_once_cached_and_loaded_frozen() {
    home();
    let mut bb = backbone(Init::BitPretrained);
    bb.bit_pretrain = Some(BitPretrainSpec {
        steps: 4,
        batch_size: 4,
        lr: 1e-3,
        seed: 0,
        until_accuracy: None,
    });
    let resolved = pretrain::resolve_backbone(&bb, &Device::Cpu).unwrap();
    assert_eq!(resolved.init, Init::Pretrained);
    let dir = std::path::PathBuf::from(&resolved.source);
    assert!(dir.starts_with(home().join("backbones")), "{}", dir.display());
    for f in ["config.json", "model.safetensors", "README.md"] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    // The exported blocks are the Bit Memory run's final weights (every group trained).
    let run_dir = dir.with_extension("run");
    let last = fpt_train::checkpoint::latest(&run_dir).unwrap().unwrap();
    let trained = fpt_train::checkpoint::load(&last, &Device::Cpu).unwrap().trainable;
    let down = spec(xor(), bb.clone(), TrainGroups::fpt(), 1);
    let tr = Trainer::new(&down, &Device::Cpu).unwrap();
    let mut checked = 0;
    for (name, _, p) in tr.model().backbone().params() {
        assert_eq!(values(p.tensor()), values(&trained[&name]), "{name}");
        if name.contains(".attn.") || name.contains(".mlp.") {
            assert!(!p.is_trainable(), "{name} is frozen downstream");
            checked += 1;
        }
    }
    assert!(checked >= 8);
    assert!(tr.weights().contains("bit-memory-"), "{}", tr.weights());
    // A second request reuses the cache: same directory, no new training.
    let stamp = std::fs::metadata(dir.join("model.safetensors"))
        .unwrap()
        .modified()
        .unwrap();
    let again = pretrain::resolve_backbone(&bb, &Device::Cpu).unwrap();
    assert_eq!(again.source, resolved.source);
    assert_eq!(
        std::fs::metadata(dir.join("model.safetensors"))
            .unwrap()
            .modified()
            .unwrap(),
        stamp
    );
    // Another pretraining budget is another backbone.
    let mut other = bb.clone();
    other.bit_pretrain = Some(BitPretrainSpec {
        steps: 5,
        ..bb.bit_pretrain.unwrap()
    });
    assert_ne!(
        pretrain::resolve_backbone(&other, &Device::Cpu).unwrap().source,
        resolved.source
    );
}

#[test]
fn a_language_model_exports_its_token_table_and_loads_as_a_backbone() {
    home();
    let mut task = TaskSpec::parse("text:parens").unwrap();
    task.data.max_len = Some(16);
    task.data.vocab = Some(50);
    task.eval_examples = 32;
    let mut bb = backbone(Init::Random);
    bb.shape.vocab = Some(50);
    let s = spec(task, bb, TrainGroups::all(), 30);
    let out = tempfile::tempdir().unwrap();
    let run_dir = out.path().join("run");
    let r = train(&s, &run_dir, &Device::Cpu, &mut |_| {}).unwrap();
    assert!(
        r.test_loss.unwrap() < (50f64).ln(),
        "the LM beats a uniform guess: {:?}",
        r.test_loss
    );
    let model_dir = out.path().join("model");
    pretrain::export_backbone(&run_dir, &model_dir, true, "card").unwrap();
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model_dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "gpt2");
    assert_eq!(cfg["vocab_size"], 50);
    let st = candle_core::safetensors::load(model_dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let last = fpt_train::checkpoint::latest(&run_dir).unwrap().unwrap();
    let trained = fpt_train::checkpoint::load(&last, &Device::Cpu).unwrap().trainable;
    assert_eq!(
        values(&st["wte.weight"]),
        values(&trained["input.weight"]),
        "wte is the trained embedding"
    );
    // GPT-2's Conv1D layout on disk: [in, out].
    assert_eq!(st["h.0.mlp.c_fc.weight"].dims(), &[32, 128]);
    let down = spec(
        xor(),
        BackboneSpec {
            source: model_dir.display().to_string(),
            init: Init::Pretrained,
            shape: Default::default(),
            residual_init: ResidualInit::Scaled,
            depth: None,
            final_norm: true,
            bit_pretrain: None,
            precision: Default::default(),
        },
        TrainGroups::fpt(),
        1,
    );
    let tr = Trainer::new(&down, &Device::Cpu).unwrap();
    let (_, _, w) = tr
        .model()
        .backbone()
        .params()
        .into_iter()
        .find(|(n, _, _)| n == "h.1.attn.c_attn.weight")
        .unwrap();
    assert_eq!(values(w.tensor()), values(&trained["h.1.attn.c_attn.weight"]));
}

#[test]
fn output_only_training_caches_features_and_reports_a_speedup() {
    home();
    let mut s = spec(xor(), backbone(Init::Random), TrainGroups::none(), 20);
    s.train_groups.output = true;
    s.train.cached_epochs = Some(6);
    s.model = ModelKind::OutputOnly;
    let out = tempfile::tempdir().unwrap();
    let r = train(&s, out.path(), &Device::Cpu, &mut |_| {}).unwrap();
    let c = r.cached.clone().expect("cached stats");
    assert_eq!(c.train_examples, 20 * 16, "steps x batch examples for a generated task");
    assert_eq!(c.epochs, 6);
    assert_eq!(r.steps, 6 * 20, "one optimizer step per batch per epoch");
    assert!(c.epoch_seconds > 0.0 && c.fpt_step_seconds > 0.0);
    assert!((c.speedup - c.fpt_epoch_seconds / c.epoch_seconds).abs() < 1e-6 * c.speedup);
    assert!(c.speedup > 1.0, "a cached epoch is cheaper than an FPT epoch: {c:?}");
    assert_eq!(r.trainable_params, 32 * 2 + 2, "only the output layer trains");
    let metrics: Vec<fpt_train::EvalRecord> = std::fs::read_to_string(out.path().join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(metrics.len(), 6, "one evaluation per epoch");
    // The head fits the cached features: its training loss falls epoch after epoch.
    assert!(
        metrics[5].train_loss < metrics[0].train_loss,
        "{} -> {}",
        metrics[0].train_loss,
        metrics[5].train_loss
    );
    // Fewer examples than one feature chunk (a single forward pass) work the same way.
    let mut small = s.clone();
    small.train.steps = 2;
    let r = train(&small, &out.path().join("small"), &Device::Cpu, &mut |_| {}).unwrap();
    let r_small_accuracy = r.test_accuracy;
    assert_eq!(r.cached.unwrap().train_examples, 32);
    // The spec is refused unless only the output layer trains.
    let mut bad = s.clone();
    bad.train_groups = TrainGroups::fpt();
    let e = train(&bad, &out.path().join("x"), &Device::Cpu, &mut |_| {})
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("train_groups") && e.contains("`out`"), "{e}");
    // Epochs on cached features belong to the output-only model, and it needs them.
    let mut fpt = s.clone();
    fpt.model = ModelKind::Fpt;
    let e = fpt.validate().unwrap_err().to_string();
    assert!(e.contains("cached_epochs") && e.contains("output-only"), "{e}");
    let mut none = s.clone();
    none.train.cached_epochs = None;
    let e = none.validate().unwrap_err().to_string();
    assert!(e.contains("cached_epochs") && e.contains("epochs"), "{e}");
    // A resumed output-only run trains again from the start, to the same numbers.
    let again = fpt_train::resume(&out.path().join("small"), None, &Device::Cpu, &mut |_| {}).unwrap();
    assert_eq!(again.test_accuracy, r_small_accuracy);
}

#[test]
fn last_attention_trains_only_the_last_blocks_attention() {
    let mut bb = backbone(Init::Random);
    bb.shape.layers = Some(3);
    let groups: TrainGroups = "ln,last-attn".parse().unwrap();
    assert_eq!(groups.to_string(), "ln,last-attn");
    let tr = Trainer::new(&spec(xor(), bb.clone(), groups, 1), &Device::Cpu).unwrap();
    let trains: HashMap<String, bool> = tr
        .model()
        .backbone()
        .params()
        .into_iter()
        .map(|(n, _, p)| (n, p.is_trainable()))
        .collect();
    for (n, t) in &trains {
        let want = n.contains("ln_") || (n.starts_with("h.2.attn."));
        assert_eq!(*t, want, "{n}");
    }
    assert!(trains["h.2.attn.c_attn.weight"] && !trains["h.1.attn.c_attn.weight"]);
    // With a depth cut, "last" would be ambiguous: refused by name.
    let mut cut = spec(xor(), bb, groups, 1);
    cut.backbone.depth = Some(2);
    let e = cut.validate().unwrap_err().to_string();
    assert!(e.contains("last_attention"), "{e}");
}

#[test]
fn a_depth_cut_can_drop_the_final_norm() {
    let mut bb = backbone(Init::Random);
    bb.depth = Some(1);
    let with = Trainer::new(&spec(xor(), bb.clone(), TrainGroups::fpt(), 1), &Device::Cpu).unwrap();
    bb.final_norm = false;
    let without = Trainer::new(&spec(xor(), bb.clone(), TrainGroups::fpt(), 1), &Device::Cpu).unwrap();
    let names =
        |tr: &Trainer| -> Vec<String> { tr.model().backbone().params().into_iter().map(|(n, _, _)| n).collect() };
    assert!(names(&with).iter().any(|n| n.starts_with("ln_f.")));
    assert!(!names(&without).iter().any(|n| n.starts_with("ln_f.")));
    let counts = |tr: &Trainer| tr.model().param_counts();
    assert_eq!(
        counts(&with).total - counts(&without).total,
        2 * 32,
        "ln_f leaves the counts"
    );
    assert_eq!(counts(&with).trainable - counts(&without).trainable, 2 * 32);
    // Same init (same seed): the outputs differ only by the final LayerNorm.
    let x = Tensor::randn(0f32, 1.0, (2, 10, 32), &Device::Cpu).unwrap();
    let ctx = || fpt_nn::Ctx::eval();
    let a = with.model().backbone().forward(&x, &mut ctx()).unwrap();
    let b = without.model().backbone().forward(&x, &mut ctx()).unwrap();
    let (_, _, w) = with
        .model()
        .backbone()
        .params()
        .into_iter()
        .find(|(n, _, _)| n == "ln_f.weight")
        .unwrap();
    let (_, _, bias) = with
        .model()
        .backbone()
        .params()
        .into_iter()
        .find(|(n, _, _)| n == "ln_f.bias")
        .unwrap();
    let normed = fpt_nn::ops::layer_norm_composed(&b, w.tensor(), bias.tensor(), 1e-5).unwrap();
    let diff = values(&(normed - &a).unwrap()).iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(diff < 1e-4, "{diff}");
    // Without a depth cut the option is refused.
    bb.depth = None;
    let e = spec(xor(), bb, TrainGroups::fpt(), 1)
        .validate()
        .unwrap_err()
        .to_string();
    assert!(e.contains("final_norm"), "{e}");
}

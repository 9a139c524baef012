//! Parameter counts of the FPT on GPT-2 base for every task of the paper, against the
//! reference code's numbers (REFERENCE.md), and materialised counts against spec counts.

use candle_core::Device;
use fpt_backbones::gpt2::{Gpt2, Gpt2Config};
use fpt_model::{count_params, Fpt, HeadConfig};
use fpt_nn::Rng;
use fpt_spec::{ResidualInit, Role, TrainGroups};
use fpt_tasks::{InputKind, TaskDims};

fn dims(input: InputKind, seq_len: usize, readout: usize, labels: usize, classes: usize) -> TaskDims {
    TaskDims {
        input,
        seq_len,
        readout_tokens: readout,
        labels_per_example: labels,
        classes,
    }
}

#[test]
fn gpt2_base_trainable_counts_per_task() {
    let cfg = Gpt2Config::builtin("gpt2").unwrap();
    let specs = cfg.param_specs();
    let g = TrainGroups::fpt();
    let v = |w| InputKind::Vectors { width: w };
    let t = |n| InputKind::Tokens { vocab: n };
    let cases = [
        ("bit-memory", dims(v(50), 120, 20, 1000, 2), 940_900),
        ("bit-xor", dims(v(1), 10, 5, 5, 2), 827_906),
        ("listops", dims(t(15), 512, 1, 1, 10), 844_042),
        ("mnist", dims(v(16), 64, 1, 1, 10), 845_578),
        ("cifar10", dims(v(48), 64, 1, 1, 10), 870_154),
        ("cifar10-lra", dims(v(1), 1024, 1, 1, 10), 834_058),
        ("homology", dims(t(30), 1024, 1, 1, 1200), 1_770_672),
    ];
    for (name, d, want) in cases {
        let c = count_params(&specs, 768, &d, &g);
        assert_eq!(c.trainable, want, "{name}");
        assert_eq!(
            c.by_role[&Role::LayerNorm].1 + c.by_role[&Role::Positions].1,
            824_832,
            "{name}"
        );
        assert_eq!(c.by_role[&Role::Attention].1, 0);
    }
    let c = count_params(&specs, 768, &cases[1].1, &TrainGroups::all());
    assert_eq!(c.total, 124_439_808 + 1536 + 1538);
    // `Other` (wte) never trains, even under `all`.
    assert_eq!(c.trainable, c.total - 50257 * 768);
}

/// One trainable predicate: for every architecture and every `--train` value (last-attn
/// included), the built model's `Var`s, its counts (`result.json`) and the counts from the
/// specs alone (`fpt inspect`, table reports) agree, per role.
#[test]
fn every_train_value_counts_what_the_optimizer_gets() {
    let dev = Device::Cpu;
    let shape = fpt_spec::ShapeOverrides {
        layers: Some(2),
        hidden: Some(32),
        heads: Some(4),
        positions: Some(32),
        ..Default::default()
    };
    let trains = [
        "fpt",
        "all",
        "none",
        "in",
        "out",
        "ln",
        "pos",
        "attn",
        "ff",
        "rec",
        "in,out,ln,pos,last-attn",
        "last-attn",
        "ln,ff,last-attn",
    ];
    for source in [
        "gpt2",
        "bert-base-uncased",
        "t5-base",
        "google/vit-base-patch16-224-in21k",
        "allenai/longformer-base-4096",
        "lstm",
    ] {
        let mut shape = shape;
        if source == "t5-base" || source.contains("vit") {
            shape.positions = None; // T5: relative-position buckets; ViT: fpt's fixed table
        }
        if source == "lstm" {
            shape.heads = None;
        }
        let spec = fpt_spec::BackboneSpec {
            source: source.into(),
            init: fpt_spec::Init::Random,
            shape,
            residual_init: ResidualInit::Scaled,
            depth: None,
            final_norm: true,
            bit_pretrain: None,
            precision: Default::default(),
        };
        let (_, specs) = fpt_backbones::param_specs(&spec).unwrap();
        for t in trains {
            let groups: TrainGroups = t.parse().unwrap();
            let mut rng = Rng::new(0);
            let bb = fpt_backbones::load(&spec, &groups, &dev, &mut rng).unwrap();
            let d = dims(InputKind::Vectors { width: 3 }, 10, 5, 5, 2);
            let m = Fpt::new(bb, d, groups, HeadConfig::default(), &dev, &mut rng).unwrap();
            let what = format!("{source} --train {t}");
            let vars: usize = m.trainable().iter().map(|(_, v)| v.elem_count()).sum();
            let built = m.param_counts();
            assert_eq!(vars, built.trainable, "{what}: Vars vs the model's count");
            assert_eq!(
                built,
                count_params(&specs, 32, &d, &groups),
                "{what}: built vs spec counts"
            );
            // Each built tensor trains exactly when its spec says so.
            let last = fpt_backbones::last_block(specs.iter().map(|s| s.name.as_str()));
            for (name, _, p) in m.params() {
                if let Some(s) = specs.iter().find(|s| s.name == name) {
                    assert_eq!(p.is_trainable(), s.trains(&groups, last), "{what}: {name}");
                }
            }
            if t.contains("last-attn") && source != "lstm" {
                let attn = built.by_role[&Role::Attention];
                assert!(
                    attn.1 > 0 && attn.1 < attn.0,
                    "{what}: only the last block's attention trains: {attn:?}"
                );
            }
        }
    }
}

#[test]
fn too_long_inputs_are_refused() {
    let cfg = Gpt2Config::builtin("gpt2")
        .unwrap()
        .with_overrides(&fpt_spec::ShapeOverrides {
            layers: Some(1),
            hidden: Some(16),
            heads: Some(2),
            positions: Some(8),
            ..Default::default()
        })
        .unwrap();
    let dev = Device::Cpu;
    let mut rng = Rng::new(0);
    let bb = Gpt2::random(&cfg, ResidualInit::Scaled, &TrainGroups::fpt(), &dev, &mut rng).unwrap();
    let d = dims(InputKind::Vectors { width: 1 }, 10, 5, 5, 2);
    let e = Fpt::new(
        Box::new(bb),
        d,
        TrainGroups::fpt(),
        HeadConfig::default(),
        &dev,
        &mut rng,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("10 tokens") && e.contains("8 positions"), "{e}");
}

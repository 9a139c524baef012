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

#[test]
fn materialised_vars_match_the_spec_count() {
    let cfg = Gpt2Config::builtin("gpt2")
        .unwrap()
        .with_overrides(&fpt_spec::ShapeOverrides {
            layers: Some(2),
            hidden: Some(64),
            heads: Some(4),
            positions: Some(32),
            ..Default::default()
        })
        .unwrap();
    let dev = Device::Cpu;
    for groups in [TrainGroups::fpt(), TrainGroups::all(), "ln".parse().unwrap()] {
        let mut rng = Rng::new(0);
        let bb = Gpt2::random(&cfg, ResidualInit::Scaled, &groups, &dev, &mut rng).unwrap();
        let d = dims(InputKind::Vectors { width: 3 }, 10, 5, 5, 2);
        let m = Fpt::new(Box::new(bb), d, groups, HeadConfig::default(), &dev, &mut rng).unwrap();
        let vars: usize = m.trainable().iter().map(|(_, v)| v.elem_count()).sum();
        assert_eq!(vars, m.param_counts().trainable, "{groups}");
        // Every trainable tensor is a Var; every frozen one is not.
        for (name, role, p) in m.params() {
            assert_eq!(p.is_trainable(), groups.trains(role), "{name}");
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

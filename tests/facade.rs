//! The facade crate: a user depending on `fpt` alone builds and trains a model.

use fpt::spec::{
    BackboneSpec, Init, ResidualInit, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainGroups, TrainSpec,
};

#[test]
fn facade_trains_a_tiny_model() {
    let mut task = TaskSpec::new(TaskName::BitXor);
    task.eval_examples = 64;
    let backbone = BackboneSpec {
        shape: ShapeOverrides {
            layers: Some(1),
            hidden: Some(16),
            heads: Some(2),
            positions: Some(16),
            ..Default::default()
        },
        residual_init: ResidualInit::Unscaled,
        ..BackboneSpec::new("gpt2", Init::Random)
    };
    let spec = RunSpec {
        train: TrainSpec {
            steps: 5,
            batch_size: 4,
            micro_batch_size: 4,
            eval_every: 5,
            ..TrainSpec::default()
        },
        ..RunSpec::new(task, backbone)
    };
    assert_eq!(spec.train_groups, TrainGroups::fpt());
    let dir = tempfile::tempdir().unwrap();
    let mut evals = 0;
    let r = fpt::train::train(&spec, dir.path(), &fpt::candle_core::Device::Cpu, &mut |e| {
        if matches!(e, fpt::train::Event::Eval(_)) {
            evals += 1;
        }
    })
    .unwrap();
    assert_eq!((r.steps, evals), (5, 1));
    assert!(r.weights.contains("unscaled"), "{}", r.weights);
    assert!((0.0..=1.0).contains(&r.test_accuracy));
}

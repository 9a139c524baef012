//! `fpt_train::pending_call`: the convergence rule's call on a run as of its latest
//! checkpoint, what `fpt run-table --status` and the campaign page show for a run in
//! progress. At a run's last evaluation (its last checkpoint) it is the call the run's own
//! loop wrote into `result.json`.

use candle_core::Device;
use fpt_spec::{BackboneSpec, Init, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainSpec};

#[test]
fn the_call_from_a_checkpoint_is_the_one_the_run_wrote() {
    let mut task = TaskSpec::new(TaskName::BitXor);
    task.eval_examples = 64;
    let shape = ShapeOverrides {
        layers: Some(1),
        hidden: Some(16),
        heads: Some(2),
        ..Default::default()
    };
    let spec = RunSpec {
        train: TrainSpec {
            steps: 40,
            batch_size: 8,
            micro_batch_size: 8,
            eval_every: 5,
            seed: 5,
            ..TrainSpec::default()
        },
        ..RunSpec::new(
            task,
            BackboneSpec {
                shape,
                ..BackboneSpec::new("gpt2", Init::Random)
            },
        )
    };
    let dir = tempfile::tempdir().unwrap();
    assert!(fpt_train::pending_call(dir.path()).is_none(), "no run, no call");
    let result = fpt_train::train(&spec, dir.path(), &Device::Cpu, &mut |_| {}).unwrap();
    let written = result.plateau.expect("the run wrote its call");
    let read = fpt_train::pending_call(dir.path()).expect("a call from the last checkpoint");
    assert_eq!(read, written);
    assert_eq!(read.to_step, 40);
    assert!(read.describe().contains("points over steps"), "{}", read.describe());
}

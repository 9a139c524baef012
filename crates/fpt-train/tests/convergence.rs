//! `result.json`'s `converged`, from the trend rule over the last half of a run, on
//! real training runs (a 2 x 32 x 2 GPT-2, every parameter trained, on Bit XOR: 67% at step
//! 50, 93% at 250, 100% from 300 on, measured): a run stopped at its cap while climbing is
//! not converged, one on its plateau is; `stop_on_plateau` stops the second and never the
//! first.

use candle_core::Device;
use fpt_spec::{BackboneSpec, Init, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainGroups, TrainSpec};
use fpt_train::{train, RunResult};

fn xor(steps: usize, every: usize) -> RunSpec {
    let mut task = TaskSpec::new(TaskName::BitXor);
    task.eval_examples = 256;
    let shape = ShapeOverrides {
        layers: Some(2),
        hidden: Some(32),
        heads: Some(2),
        ..Default::default()
    };
    RunSpec {
        train_groups: TrainGroups::all(),
        train: TrainSpec {
            steps,
            batch_size: 32,
            micro_batch_size: 32,
            eval_every: every,
            seed: 0,
            ..TrainSpec::default()
        },
        ..RunSpec::new(
            task,
            BackboneSpec {
                shape,
                ..BackboneSpec::new("gpt2", Init::Random)
            },
        )
    }
}

fn run(spec: &RunSpec) -> (RunResult, Vec<f64>) {
    let dir = tempfile::tempdir().unwrap();
    let r = train(spec, dir.path(), &Device::Cpu, &mut |_| {}).unwrap();
    let text = std::fs::read_to_string(dir.path().join("result.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        json["converged"].as_bool(),
        r.converged,
        "result.json carries `converged`"
    );
    let curve = std::fs::read_to_string(dir.path().join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["test_accuracy"]
                .as_f64()
                .unwrap()
        })
        .collect();
    (r, curve)
}

#[test]
fn a_run_stopped_while_climbing_is_not_converged_and_one_on_its_plateau_is() {
    // Stopped at 250 steps, mid-climb.
    let (r, curve) = run(&xor(250, 50));
    let p = r.plateau.clone().expect("a plateau test");
    assert_eq!(r.converged, Some(false), "{curve:?}: {p:?}");
    // Rising by its trend: the line through the last half gains half a point or more.
    assert!(p.rising && p.gain >= fpt_train::outcomes::RISING_GAIN, "{p:?}");
    assert_eq!(p.call(), "rising");
    assert_eq!((p.from_step, p.to_step, p.window), (100, 250, 3));
    // Trained past its plateau: its last half is flat, at three evaluations in a row.
    let (r, curve) = run(&xor(700, 50));
    let p = r.plateau.clone().expect("a plateau test");
    assert_eq!(r.converged, Some(true), "{curve:?}: {p:?}");
    assert!(
        !p.rising && p.gain.abs() < 1e-9 && p.interval.1 < fpt_train::outcomes::FLAT_GAIN,
        "{p:?}"
    );
    // One evaluation cannot show a plateau.
    let (r, _) = run(&xor(50, 50));
    assert_eq!(r.converged, Some(false));
    assert!(r.plateau.is_none());
}

#[test]
fn stopping_on_a_plateau_stops_a_flat_run_and_never_a_climbing_one() {
    let mut spec = xor(2000, 50);
    spec.train.early_stop_patience = Some(3);
    spec.train.stop_on_plateau = true;
    let (r, curve) = run(&spec);
    assert!(r.stopped_early && r.steps < 2000, "{} steps: {curve:?}", r.steps);
    assert_eq!(r.converged, Some(true));
    // Every evaluation before the stop was still climbing over its window (or had no full
    // window yet): the curve up to the stop rose by more than its noise.
    assert!(curve.len() >= 4, "{curve:?}");
    assert!(curve[curve.len() - 1] >= 0.99, "{curve:?}");
    // A slow climber (a tenth of the learning rate: 52% at step 50 and 100, then 55, 61, 68
    // and 70%, measured) is never stopped early, though its first two evaluations are flat: it
    // ends at its cap, not converged, its accuracy a lower bound.
    let mut slow = xor(300, 50);
    slow.train.lr = 1e-4;
    slow.train.early_stop_patience = Some(3);
    slow.train.stop_on_plateau = true;
    let (r, curve) = run(&slow);
    assert!(!r.stopped_early && r.steps == 300, "{curve:?}");
    assert_eq!(r.converged, Some(false), "{curve:?}");
}

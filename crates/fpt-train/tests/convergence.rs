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

/// A run an earlier rule stopped early (`"rule": "half"` in its result) is reopened: it is
/// not finished while its checkpoint is there, and resuming continues from that checkpoint
/// (not from step 0) to an ending judged by the trend rule.
#[test]
fn a_run_an_earlier_rule_stopped_is_reopened_and_continues_from_its_checkpoint() {
    let mut spec = xor(2000, 50);
    spec.train.early_stop_patience = Some(3);
    spec.train.stop_on_plateau = true;
    let dir = tempfile::tempdir().unwrap();
    let first = train(&spec, dir.path(), &Device::Cpu, &mut |_| {}).unwrap();
    assert!(first.stopped_early && first.steps < 2000);
    assert!(
        fpt_train::finished_result(dir.path()).is_some(),
        "a trend-rule ending stands"
    );
    assert!(fpt_train::reopen_reason(&first, &spec).is_none());
    // As the earlier rule would have written it.
    let path = dir.path().join("result.json");
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["plateau"]["rule"] = serde_json::json!("half");
    std::fs::write(&path, json.to_string()).unwrap();
    let old: RunResult = serde_json::from_value(json).unwrap();
    assert!(fpt_train::reopen_reason(&old, &spec).is_some());
    assert!(
        fpt_train::finished_result(dir.path()).is_none(),
        "reopened while its checkpoint is there"
    );
    let mut from = None;
    let again = fpt_train::resume(dir.path(), Some(&spec), &Device::Cpu, &mut |e| {
        if let fpt_train::Event::Started { from_step, .. } = e {
            from = Some(*from_step);
        }
    })
    .unwrap();
    assert_eq!(from, Some(first.steps), "resumed from its checkpoint, not from step 0");
    assert!(again.steps > first.steps);
    assert_eq!(again.plateau.as_ref().and_then(|p| p.rule.as_deref()), Some("trend"));
    assert!(fpt_train::finished_result(dir.path()).is_some());
    let history = std::fs::read_to_string(dir.path().join("history.jsonl")).unwrap();
    assert_eq!(history.lines().count(), 2, "{history}");
    // Without a checkpoint a reopened result stands (nothing would be trained from 0).
    std::fs::remove_dir_all(dir.path().join("checkpoints")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["plateau"]["rule"] = serde_json::json!("half");
    json["stopped_early"] = serde_json::json!(true);
    std::fs::write(&path, json.to_string()).unwrap();
    assert!(fpt_train::finished_result(dir.path()).is_some());
}

/// A run that does not learn (a learning rate too small to move it off chance on Bit XOR)
/// ends at its baseline past its floor, not rising there and never below the trivial
/// predictor's training loss: it stops, and says so. Without a floor it trains on to its cap
/// (a plateau before learning is not an end).
#[test]
fn a_run_flat_at_its_baseline_past_its_floor_ended_there() {
    let mut spec = xor(1500, 50);
    spec.train.lr = 1e-7;
    spec.train.early_stop_patience = Some(3);
    spec.train.stop_on_plateau = true;
    spec.train.converge_floor = Some(400);
    let (r, curve) = run(&spec);
    assert!(
        r.stopped_early && r.steps >= 400 && r.steps < 1500,
        "{} steps: {curve:?}",
        r.steps
    );
    assert!(r.ended_at_baseline && r.ended_at_baseline_now(), "{r:?}");
    assert!(
        r.plateau.as_ref().is_some_and(|p| !p.rising && p.to_step >= 400),
        "{r:?}"
    );
    assert!(r.baseline.as_ref().is_some_and(|b| !b.left));
    spec.train.converge_floor = None;
    spec.train.steps = 600;
    let (r, curve) = run(&spec);
    assert!(!r.stopped_early && r.steps == 600 && !r.ended_at_baseline, "{curve:?}");
}

/// `fpt_train::pending_call`: the rule's call on a run as of its latest checkpoint, what
/// `fpt run-table --status` and the campaign page show for a run in progress. At a run's
/// last evaluation (its last checkpoint) it is the call the run's own loop wrote.
#[test]
fn the_call_from_a_checkpoint_is_the_one_the_run_wrote() {
    let dir = tempfile::tempdir().unwrap();
    assert!(fpt_train::pending_call(dir.path()).is_none(), "no run, no call");
    let result = train(&xor(40, 5), dir.path(), &Device::Cpu, &mut |_| {}).unwrap();
    let written = result.plateau.expect("the run wrote its call");
    let read = fpt_train::pending_call(dir.path()).expect("a call from the last checkpoint");
    assert_eq!(read, written);
    assert_eq!(read.to_step, 40);
    assert!(read.describe().contains("points over steps"), "{}", read.describe());
}

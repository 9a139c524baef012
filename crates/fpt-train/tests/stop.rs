//! Stopping a run from outside its loop (`fpt_train::stop`: a campaign's deadline, an
//! interrupt): it writes a checkpoint and returns `TrainError::Stopped`, and resuming ends
//! with the same numbers as an unbroken run. One test in this binary: the stop is
//! process-wide.

use candle_core::Device;
use fpt_spec::{BackboneSpec, Init, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainSpec};
use fpt_train::{resume, stop, train, Event, TrainError};

fn spec() -> RunSpec {
    let mut task = TaskSpec::new(TaskName::BitXor);
    task.eval_examples = 64;
    let shape = ShapeOverrides {
        layers: Some(1),
        hidden: Some(16),
        heads: Some(2),
        ..Default::default()
    };
    RunSpec {
        train: TrainSpec {
            steps: 40,
            batch_size: 8,
            micro_batch_size: 8,
            eval_every: 10,
            seed: 3,
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

fn history_lines(dir: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("history.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_stopped_run_checkpoints_and_resumes_to_the_unbroken_result() {
    let s = spec();
    let whole = tempfile::tempdir().unwrap();
    let unbroken = train(&s, whole.path(), &Device::Cpu, &mut |_| {}).unwrap();

    // An interrupt at step 17 (between evaluations and checkpoints).
    let d = tempfile::tempdir().unwrap();
    let e = train(&s, d.path(), &Device::Cpu, &mut |e| {
        if let Event::Step { step: 17, .. } = e {
            stop::request();
        }
    })
    .unwrap_err();
    stop::clear_request();
    match e {
        TrainError::Stopped { step, steps, why, .. } => {
            assert_eq!((step, steps, why), (17, 40, stop::Why::Requested));
        }
        other => panic!("expected a stop, got {other}"),
    }
    assert!(!d.path().join("result.json").exists(), "a stopped run has no result");
    let ck = fpt_train::checkpoint::latest(d.path()).unwrap().unwrap();
    assert!(ck.ends_with("step-000017"), "{}", ck.display());

    // A deadline already past: one more step, then a stop.
    stop::set_deadline(Some(std::time::SystemTime::now()));
    let e = resume(d.path(), Some(&s), &Device::Cpu, &mut |_| {}).unwrap_err();
    stop::set_deadline(None);
    assert!(
        matches!(
            e,
            TrainError::Stopped {
                step: 18,
                why: stop::Why::Deadline,
                ..
            }
        ),
        "{e}"
    );

    // Resumed to the end: the unbroken run's numbers.
    let r = resume(d.path(), Some(&s), &Device::Cpu, &mut |_| {}).unwrap();
    assert_eq!(r.steps, unbroken.steps);
    assert_eq!(r.test_accuracy, unbroken.test_accuracy);
    assert_eq!(r.test_loss, unbroken.test_loss);
    assert_eq!(r.final_train_loss, unbroken.final_train_loss);
    assert_eq!(r.plateau, unbroken.plateau);
    assert_eq!(r.converged, unbroken.converged);
    let m = |dir: &std::path::Path| std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let strip = |t: String| -> Vec<serde_json::Value> {
        t.lines()
            .map(|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                let o = v.as_object_mut().unwrap();
                o.remove("elapsed_s");
                o.remove("eval_s");
                v
            })
            .collect()
    };
    assert_eq!(strip(m(d.path())), strip(m(whole.path())));

    // The history says where each stretch ran and how it ended.
    let h = history_lines(d.path());
    let spans: Vec<(u64, u64)> = h
        .iter()
        .map(|x| (x["from_step"].as_u64().unwrap(), x["to_step"].as_u64().unwrap()))
        .collect();
    assert_eq!(spans, vec![(0, 17), (17, 18), (18, 40)]);
    assert!(h[0]["how"].as_str().unwrap().contains("stop was requested"), "{h:?}");
    assert!(h[1]["how"].as_str().unwrap().contains("time budget"), "{h:?}");
    assert_eq!(h[2]["device"], "cpu");
    assert_eq!(history_lines(whole.path()).len(), 1);
}

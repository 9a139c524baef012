//! Runs judged against their task's trivial baseline: random labels are at baseline and
//! learnable ones are not; early stopping within noise never stops a run at its baseline.

mod common;
use common::{fpt, stderr};

/// `count` JSONL records of 4 time steps x 2 features, the first 80% `train`, the rest
/// `test`; the label is `label(features, u)` with `u` a uniform number drawn apart from them.
fn custom_records(count: usize, label: impl Fn(&[f64], f64) -> u32) -> String {
    // A fixed linear congruential stream: the same file on every machine.
    let mut state = 12345u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut lines = String::new();
    for i in 0..count {
        let f: Vec<f64> = (0..8).map(|_| next() * 2.0 - 1.0).collect();
        let u = next();
        let steps: Vec<String> = f.chunks(2).map(|c| format!("[{}, {}]", c[0], c[1])).collect();
        let split = if i < count * 4 / 5 { "train" } else { "test" };
        lines.push_str(&format!(
            "{{\"features\": [{}], \"label\": {}, \"split\": \"{split}\"}}\n",
            steps.join(", "),
            label(&f, u)
        ));
    }
    lines
}

fn train_custom(file: &std::path::Path, out: &std::path::Path, more: &[&str]) -> serde_json::Value {
    let task = format!("custom:{}", file.display());
    let mut args = vec![
        "train",
        "--task",
        &task,
        "--backbone",
        "gpt2",
        "--init",
        "random",
        "--layers",
        "1",
        "--hidden",
        "32",
        "--heads",
        "2",
        "--batch-size",
        "16",
        "-q",
    ];
    // 150 steps, evaluated every 50, unless `more` says otherwise.
    for (flag, default) in [("--steps", "150"), ("--eval-every", "50")] {
        if !more.contains(&flag) {
            args.extend([flag, default]);
        }
    }
    args.extend(more);
    args.extend(["--out", out.to_str().unwrap()]);
    let o = fpt(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_str(&std::fs::read_to_string(out.join("result.json")).unwrap()).unwrap()
}

/// Random labels (80/20) cannot be learned: the run is marked at its baseline (the majority
/// class) in result.json. The same model on labels its inputs decide leaves it.
#[test]
fn random_labels_are_at_baseline_and_learnable_ones_are_not() {
    let d = tempfile::tempdir().unwrap();
    let random = d.path().join("random.jsonl");
    std::fs::write(&random, custom_records(500, |_, u| u32::from(u >= 0.8))).unwrap();
    let r = train_custom(&random, &d.path().join("random"), &[]);
    let b = &r["baseline"];
    assert_eq!(b["kind"], "majority-class", "{r}");
    assert_eq!(b["left"], false, "random labels left their baseline: {b}");
    assert!(!b["reasons"].as_array().unwrap().is_empty());
    let share = b["accuracy"].as_f64().unwrap();
    assert!((0.7..0.9).contains(&share), "{share}");

    // The label is the sign of the last time step's first feature (the token read out).
    let learnable = d.path().join("learnable.jsonl");
    std::fs::write(&learnable, custom_records(500, |f, _| u32::from(f[6] > 0.0))).unwrap();
    let r = train_custom(&learnable, &d.path().join("learnable"), &[]);
    let b = &r["baseline"];
    assert_eq!(b["left"], true, "a learnable task stayed at its baseline: {r}");
    assert!(b["reasons"].as_array().unwrap().is_empty());
    assert!(
        r["test_accuracy"].as_f64().unwrap() > b["accuracy"].as_f64().unwrap() + 0.2,
        "{r}"
    );
}

/// Stopping within noise: a run at its baseline trains to the cap (a plateau before learning
/// is not convergence); one that learned and went flat stops early.
#[test]
fn early_stopping_within_noise_never_stops_a_run_at_its_baseline() {
    let d = tempfile::tempdir().unwrap();
    let stop = [
        "--steps",
        "600",
        "--eval-every",
        "25",
        "--early-stop-patience",
        "2",
        "--early-stop-within-noise",
    ];
    let random = d.path().join("random.jsonl");
    std::fs::write(&random, custom_records(500, |_, u| u32::from(u >= 0.8))).unwrap();
    let r = train_custom(&random, &d.path().join("random"), &stop);
    assert_eq!(r["baseline"]["left"], false, "{r}");
    assert_eq!(
        (r["stopped_early"].as_bool(), r["steps"].as_u64()),
        (Some(false), Some(600)),
        "{r}"
    );
    let learnable = d.path().join("learnable.jsonl");
    std::fs::write(&learnable, custom_records(500, |f, _| u32::from(f[6] > 0.0))).unwrap();
    let r = train_custom(&learnable, &d.path().join("learnable"), &stop);
    assert_eq!(r["baseline"]["left"], true, "{r}");
    assert_eq!(r["stopped_early"], true, "{r}");
    assert!(r["steps"].as_u64().unwrap() < 600, "{r}");
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.path().join("learnable/spec.json")).unwrap()).unwrap();
    assert_eq!(spec["train"]["early_stop_within_noise"], true);
}

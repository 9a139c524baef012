//! `fpt compare`: runs paired by seed, their accuracies and the paired bootstrap interval,
//! and its errors.

mod common;
use common::{fpt, json, stderr};

/// `fpt compare`: accuracies and the paired difference from the runs' outcomes; a
/// difference far outside the examples' noise is `ahead`, identical runs `within`; missing
/// outcomes and unequal counts are errors naming what is wrong.
#[test]
fn compare_pairs_runs_by_example_and_seed() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, seed: u64, correct: &dyn Fn(usize) -> bool| {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        let c: Vec<u32> = (0..400).map(|i| u32::from(correct(i))).collect();
        let o = serde_json::json!({"step": 100, "labels_per_example": 1, "correct": c,
            "predicted": [200, 200], "fingerprint": "f"});
        std::fs::write(d.join("outcomes.json"), o.to_string()).unwrap();
        std::fs::write(d.join("spec.json"), format!("{{\"train\": {{\"seed\": {seed}}}}}")).unwrap();
        d.display().to_string()
    };
    // A: right on 300 of 400 (75%); B: right on a subset of A's, 200 (50%): +25 points.
    let (a0, a1) = (run("a0", 0, &|i| i % 4 != 0), run("a1", 1, &|i| i % 4 != 1));
    let (b0, b1) = (run("b0", 0, &|i| i % 2 == 1), run("b1", 1, &|i| i % 2 == 0));
    let v = json(&fpt(&["compare", &a0, &a1, "--vs", &b0, &b1, "--json"]));
    assert!((v["difference"].as_f64().unwrap() - 25.0).abs() < 1e-9, "{v}");
    let (lo, hi) = (v["interval"][0].as_f64().unwrap(), v["interval"][1].as_f64().unwrap());
    assert!(lo > 15.0 && lo < 25.0 && hi > 25.0 && hi < 35.0, "{v}");
    assert_eq!(v["verdict"], "ahead");
    assert_eq!(v["runs"][1]["seed"], 1);
    assert_eq!(v["runs"][0]["accuracy"], 75.0);
    // The same run against itself: 0, with an interval of 0 either side.
    let v = json(&fpt(&["compare", &a0, "--vs", &a0, "--json"]));
    assert_eq!(v["difference"], 0.0);
    assert_eq!(v["verdict"], "within the uncertainty");
    // A seed spread widens a one-seed comparison.
    let narrow = json(&fpt(&["compare", &a0, "--vs", &b0, "--json"]));
    let wide = json(&fpt(&["compare", &a0, "--vs", &b0, "--seed-sd", "10", "--json"]));
    let width = |v: &serde_json::Value| v["interval"][1].as_f64().unwrap() - v["interval"][0].as_f64().unwrap();
    assert!(width(&wide) > 2.0 * width(&narrow), "{narrow} {wide}");
    // What each run's result.json says travels along: a run stopped at its cap while
    // rising is a lower bound, one at its trivial baseline learned nothing; both are said.
    std::fs::write(
        std::path::Path::new(&a0).join("result.json"),
        r#"{"converged": false, "baseline": {"left": true}}"#,
    )
    .unwrap();
    std::fs::write(
        std::path::Path::new(&b0).join("result.json"),
        r#"{"converged": true, "baseline": {"left": false}}"#,
    )
    .unwrap();
    let v = json(&fpt(&["compare", &a0, "--vs", &b0, "--json"]));
    assert_eq!(
        (&v["runs"][0]["converged"], &v["vs"][0]["left_baseline"]),
        (&false.into(), &false.into())
    );
    let out = fpt(&["compare", &a0, "--vs", &b0]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.contains(">=75.0%") && text.contains("[rising at its cap: a lower bound]"),
        "{text}"
    );
    assert!(
        text.contains("[at its task's trivial baseline]") && text.contains("learned nothing"),
        "{text}"
    );
    assert!(text.contains("could only widen the gap"), "{text}");
    // Errors.
    let out = fpt(&["compare", &a0, &a1, "--vs", &b0]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("2 runs against 1"), "{}", stderr(&out));
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let out = fpt(&["compare", empty.to_str().unwrap(), "--vs", &b0]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("outcomes.json"), "{}", stderr(&out));

    // Runs of different tasks, or scored on different held-out examples, are no
    // comparison: refused with both named, no verdict, whatever their outcomes say.
    let of_task = |name: &str, task: &str, fingerprint: &str| {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        let c: Vec<u32> = (0..400).map(|i| u32::from(i % 3 == 0)).collect();
        let o = serde_json::json!({"step": 100, "labels_per_example": 1, "correct": c,
            "predicted": [200, 200], "fingerprint": fingerprint});
        std::fs::write(d.join("outcomes.json"), o.to_string()).unwrap();
        let spec = serde_json::json!({"task": {"name": task}, "train": {"seed": 0}});
        std::fs::write(d.join("spec.json"), spec.to_string()).unwrap();
        d.display().to_string()
    };
    let features = of_task("features", "custom", "f");
    let tokens = of_task("tokens", "listops", "f");
    for args in [
        vec!["compare", features.as_str(), "--vs", tokens.as_str()],
        vec!["compare", features.as_str(), "--vs", tokens.as_str(), "--json"],
    ] {
        let out = fpt(&args);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("different tasks") && err.contains("features") && err.contains("tokens"),
            "{err}"
        );
        assert!(out.stdout.is_empty(), "no verdict printed");
    }
    let other_split = of_task("other-split", "custom", "g");
    let out = fpt(&["compare", features.as_str(), "--vs", other_split.as_str()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("different held-out examples"), "{}", stderr(&out));
}

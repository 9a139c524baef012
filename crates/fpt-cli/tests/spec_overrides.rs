//! `fpt train --spec S` with flags beside it: the spec is the base, the flags override its
//! fields.

mod common;
use common::*;

/// `fpt train --spec S --seed 1` runs S with seed 1: the flags given beside `--spec` override
/// its fields (and the run's spec.json, hence its key, says so); the rest is S's.
#[test]
fn flags_beside_a_spec_override_its_fields() {
    let tmp = tempfile::tempdir().unwrap();
    let first = tmp.path().join("a");
    let out = fpt(&[
        "train",
        "--task",
        "bit-xor",
        "--backbone",
        "gpt2",
        "--init",
        "random",
        "--layers",
        "1",
        "--hidden",
        "16",
        "--heads",
        "2",
        "--steps",
        "2",
        "--lr",
        "3e-4",
        "-q",
        "--out",
        first.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let spec = first.join("spec.json");
    let second = tmp.path().join("b");
    let out = fpt(&[
        "train",
        "--spec",
        spec.to_str().unwrap(),
        "--seed",
        "1",
        "--steps",
        "3",
        "-q",
        "--out",
        second.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let read = |p: &std::path::Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p.join("spec.json")).unwrap()).unwrap()
    };
    let (a, b) = (read(&first), read(&second));
    assert_eq!(b["train"]["seed"], 1);
    assert_eq!(b["train"]["steps"], 3);
    assert_eq!(b["train"]["lr"], a["train"]["lr"], "not given: the spec's");
    assert_eq!(b["backbone"], a["backbone"]);
    assert_eq!(b["task"], a["task"]);
    // The input layer's init: not written at its default (keys stay as they were), written
    // when given, and an unknown one refused by name.
    assert!(a.get("input_init").is_none(), "{a}");
    let third = tmp.path().join("u");
    let out = fpt(&[
        "train",
        "--spec",
        spec.to_str().unwrap(),
        "--input-init",
        "uniform",
        "-q",
        "--out",
        third.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(read(&third)["input_init"], "uniform");
    let out = fpt(&[
        "train",
        "--spec",
        spec.to_str().unwrap(),
        "--input-init",
        "gaussian",
        "--out",
        tmp.path().join("g").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("`orthogonal` or `uniform`"), "{}", stderr(&out));
    // A flag that makes the spec invalid is refused, naming the file.
    let out = fpt(&[
        "train",
        "--spec",
        spec.to_str().unwrap(),
        "--batch-size",
        "0",
        "--out",
        tmp.path().join("c").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("spec.json"), "{}", stderr(&out));
}

/// `--seeds 0,1` runs the spec once per seed into OUT/seed-N (each spec.json with its seed)
/// and prints the set's mean with its interval and the seeds' spread; a seed named twice,
/// or `--seeds` beside `--seed`, is refused.
#[test]
fn seeds_run_one_spec_per_seed_and_summarize_them() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("set");
    let args = |seeds: &str, out: &std::path::Path| {
        vec![
            "train".to_string(),
            "--task".into(),
            "bit-xor".into(),
            "--backbone".into(),
            "gpt2".into(),
            "--init".into(),
            "random".into(),
            "--layers".into(),
            "1".into(),
            "--hidden".into(),
            "16".into(),
            "--heads".into(),
            "2".into(),
            "--steps".into(),
            "3".into(),
            "-q".into(),
            "--seeds".into(),
            seeds.into(),
            "--out".into(),
            out.to_str().unwrap().into(),
        ]
    };
    let run = |v: Vec<String>| fpt(&v.iter().map(String::as_str).collect::<Vec<_>>());
    let out = run(args("0,1", &out_dir));
    assert!(out.status.success(), "{}", stderr(&out));
    for seed in [0, 1] {
        let spec: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out_dir.join(format!("seed-{seed}")).join("spec.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(spec["train"]["seed"], seed);
    }
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("2 seeds: mean test accuracy"), "{text}");
    assert!(text.contains("seed-to-seed sd"), "{text}");
    let out = run(args("3,3", &tmp.path().join("twice")));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("seed 3 twice"), "{}", stderr(&out));
    let mut both = args("4", &tmp.path().join("both"));
    both.extend(["--seed".to_string(), "5".to_string()]);
    let out = run(both);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

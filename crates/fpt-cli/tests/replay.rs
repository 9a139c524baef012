//! `FPT_STEP=replay`: a run whose steps go through the replayed step (the batch in fixed
//! buffers, the dropout seeds in slots, Adam's update decided by the device's gate; a CUDA
//! graph on a GPU, eager through the same buffers here) ends with the same metrics and
//! result as the eager run, and what it cannot replay is an error that says so.

use std::path::Path;
use std::process::{Command, Output};

fn train(out: &Path, step: &str, micro: &str) -> Output {
    let out = out.to_str().unwrap();
    Command::new(env!("CARGO_BIN_EXE_fpt"))
        .args([
            "train",
            "--task",
            "bit-xor",
            "--backbone",
            "gpt2",
            "--init",
            "random",
            "--layers",
            "2",
            "--hidden",
            "32",
            "--heads",
            "2",
            "--steps",
            "30",
            "--batch-size",
            "8",
            "--micro-batch-size",
            micro,
            "--eval-every",
            "10",
            "--checkpoint-every",
            "7",
            "--eval-examples",
            "64",
            "--seed",
            "4",
            "--out",
            out,
        ])
        .env("FPT_STEP", step)
        .env("FPT_LOG", "info")
        .env("HF_HUB_OFFLINE", "1")
        .env("FPT_HOME", std::env::temp_dir().join("fpt-cli-test-empty-fpt-home"))
        .output()
        .expect("run fpt")
}

fn read(dir: &Path, file: &str, drop: &[&str]) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join(file))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            for k in drop {
                v.as_object_mut().unwrap().remove(*k);
            }
            v
        })
        .collect()
}

#[test]
fn replayed_runs_end_as_eager_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (eager, replay) = (tmp.path().join("eager"), tmp.path().join("replay"));
    for (dir, step) in [(&eager, "eager"), (&replay, "replay")] {
        let out = train(dir, step, "8");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{step}: {err}");
        assert_eq!(
            err.contains("FPT_STEP=replay: steps replayed"),
            step == "replay",
            "{err}"
        );
    }
    let metrics = |d: &Path| read(d, "metrics.jsonl", &["elapsed_s", "eval_s"]);
    assert_eq!(metrics(&replay), metrics(&eager));
    assert_eq!(metrics(&eager).len(), 3);
    // Where and how each stretch ran: the replayed run's history says so.
    let how = |d: &Path| read(d, "history.jsonl", &[])[0]["step"].clone();
    assert_eq!(how(&replay), "replay");
    assert!(how(&eager).is_null());
    let result = |d: &Path| {
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join("result.json")).unwrap()).unwrap();
        v.as_object_mut().unwrap().remove("wall_seconds");
        v
    };
    assert_eq!(result(&replay), result(&eager));
    // The steps ran in chunks ending at each evaluation and checkpoint (7, 10, 14, ...): the
    // last checkpoint's trained tensors and optimizer state are the eager run's.
    let last = |d: &Path| {
        let c = d.join("checkpoints");
        let latest = std::fs::read_to_string(c.join("LATEST")).unwrap();
        let dir = c.join(latest.trim());
        let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        files
            .iter()
            .filter(|f| f.extension().is_some_and(|x| x == "safetensors"))
            .map(|f| (f.file_name().unwrap().to_owned(), std::fs::read(f).unwrap()))
            .collect::<Vec<_>>()
    };
    let (a, b) = (last(&eager), last(&replay));
    assert!(
        a.len() >= 2,
        "trained tensors and optimizer state: {:?}",
        a.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    assert!(a == b, "the last checkpoints' tensors differ");
}

#[test]
fn what_cannot_be_replayed_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let out = train(&tmp.path().join("a"), "graph", "8");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("FPT_STEP=graph") && err.contains("`eager` or `replay`"),
        "{err}"
    );
    let out = train(&tmp.path().join("b"), "replay", "4");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("accumulates"), "{err}");
}

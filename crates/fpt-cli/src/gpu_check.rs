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
    /// Timed steps per benchmark (after 2 warm-up steps).
    #[arg(long, default_value_t = 5)]
    bench_steps: usize,
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
    let kernels = fpt_train::device_check::agreement(&device)?;
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
            eprintln!("fpt gpu-check: step benchmark `{name}` ({precision}) on {}", a.device);
            let r = match fpt_train::bench::run(&shape, 2, a.bench_steps, false, &device, prec) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("  fpt step failed: {e}");
                    bench.insert(
                        format!("{name}/{precision}"),
                        serde_json::json!({ "error": e.to_string() }),
                    );
                    failed.push(format!("bench {name} {precision}"));
                    continue;
                }
            };
            eprintln!(
                "  fpt step {:.1} ms, {:.1} GFLOP/s; copies a step: {:.1} up ({:.0} B), {:.1} down ({:.0} B)",
                r.ours_ms,
                r.gflops,
                r.copies.uploads,
                r.copies.upload_bytes,
                r.copies.downloads,
                r.copies.download_bytes
            );
            let mut row = serde_json::to_value(&r)?;
            let mut torch_ms = None;
            // PyTorch's step at the same shape on the same device (autocast-bf16 for the bf16
            // row), where torch is importable and the script is at hand (the working tree).
            let script = std::path::Path::new("bench/pytorch_fpt_step.py");
            if script.is_file() {
                let mut cmd =
                    std::process::Command::new(std::env::var("FPT_PYTHON").unwrap_or_else(|_| "python3".into()));
                cmd.arg(script)
                    // The script reads the shapes from `fpt bench --list`: this binary's.
                    .arg("--fpt")
                    .arg(std::env::current_exe().context("the path of this fpt binary")?)
                    .args([
                        "--shape",
                        name,
                        "--steps",
                        &a.bench_steps.to_string(),
                        "--warmup",
                        "2",
                        "--no-full",
                        "--device",
                        &a.device,
                    ]);
                if !prec.is_f32() {
                    cmd.args(["--autocast", "bf16"]);
                }
                match cmd.output() {
                    Ok(o) if o.status.success() => {
                        let t: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
                        if let Some(ms) = t.get("pytorch_ms").and_then(|v| v.as_f64()) {
                            eprintln!("  pytorch step {ms:.1} ms: fpt/pytorch {:.2}", r.ours_ms / ms);
                            row["pytorch"] = t;
                            row["ratio_vs_pytorch"] = serde_json::json!(r.ours_ms / ms);
                            torch_ms = Some(ms);
                        }
                    }
                    Ok(o) => {
                        let err = String::from_utf8_lossy(&o.stderr);
                        row["pytorch_error"] = serde_json::json!(err.lines().last().unwrap_or("failed"));
                    }
                    Err(e) => row["pytorch_error"] = serde_json::json!(e.to_string()),
                }
            }
            table.push(format!(
                "| {name} | {precision} | {:.1} | {} | {} | {:.0} | {:.0} |",
                r.ours_ms,
                torch_ms.map_or("-".into(), |m| format!("{m:.1}")),
                torch_ms.map_or("-".into(), |m| format!("{:.2}x", r.ours_ms / m)),
                r.copies.upload_bytes,
                r.copies.download_bytes,
            ));
            bench.insert(format!("{name}/{precision}"), row);
            result["bench"] = serde_json::Value::Object(bench.clone());
            save(&result)?;
        }
    }
    eprintln!("\n| shape | precision | fpt ms | PyTorch ms | ratio | bytes up a step | bytes down a step |");
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

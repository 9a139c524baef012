//! `fpt gpu-check`: everything a GPU run must pass, in one command that needs no network,
//! no Rust and no weights that cannot be carried (the fixtures are compiled in; the
//! training run and the benchmark use random-init GPT-2 shapes): the self-check on the
//! device (golden outputs and gradients, and the PyTorch training trajectories, within
//! 1e-3), a short training run on the device beside the same run on the CPU, and the FPT
//! step benchmark on the device. Writes one JSON; exits 1 when a check fails. `cargo xtask
//! gpu-check` builds the CUDA binary and runs it; `--device cpu` tries it all on the CPU.

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
    /// Step-benchmark shapes (`fpt bench --shape` names; GPT-2 base size: c10, lra, listops).
    #[arg(long = "shape", default_values_t = ["c10".to_string(), "lra".to_string(), "listops".to_string()])]
    shapes: Vec<String>,
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

    let mut bench = serde_json::Map::new();
    for name in &a.shapes {
        let shape = fpt_train::bench::shape(name).with_context(|| format!("unknown --shape `{name}`"))?;
        eprintln!("fpt gpu-check: step benchmark `{name}` on {}", a.device);
        let r = fpt_train::bench::run(&shape, 2, 5, false, &device, fpt_spec::Precision::F32)?;
        eprintln!("  fpt step {:.1} ms, {:.1} GFLOP/s", r.ours_ms, r.gflops);
        let mut row = serde_json::to_value(&r)?;
        // PyTorch's step at the same shape on the same device, where torch is importable
        // and the script is at hand (the working tree): the ratio in the same run.
        let script = std::path::Path::new("bench/pytorch_fpt_step.py");
        if script.is_file() {
            let out = std::process::Command::new(std::env::var("FPT_PYTHON").unwrap_or_else(|_| "python3".into()))
                .arg(script)
                // The script reads the shapes from `fpt bench --list`: this binary's.
                .arg("--fpt")
                .arg(std::env::current_exe().context("the path of this fpt binary")?)
                .args([
                    "--shape",
                    name,
                    "--steps",
                    "5",
                    "--warmup",
                    "2",
                    "--no-full",
                    "--device",
                    &a.device,
                ])
                .output();
            match out {
                Ok(o) if o.status.success() => {
                    let t: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
                    if let Some(ms) = t.get("pytorch_ms").and_then(|v| v.as_f64()) {
                        eprintln!("  pytorch step {ms:.1} ms: fpt/pytorch {:.2}", r.ours_ms / ms);
                        row["pytorch"] = t;
                        row["ratio_vs_pytorch"] = serde_json::json!(r.ours_ms / ms);
                    }
                }
                Ok(o) => {
                    let err = String::from_utf8_lossy(&o.stderr);
                    row["pytorch_error"] = serde_json::json!(err.lines().last().unwrap_or("failed"));
                }
                Err(e) => row["pytorch_error"] = serde_json::json!(e.to_string()),
            }
        }
        bench.insert(name.clone(), row);
    }

    let (commit, profile) = fpt_train::selfcheck::build_info();
    let result = serde_json::json!({
        "device": a.device,
        "build": { "commit": commit, "profile": profile, "cuda_feature": cfg!(feature = "cuda") },
        "passed": failed.is_empty(),
        "failed": failed,
        "selfcheck": sc,
        "training": runs,
        "bench": bench,
        "seconds": t0.elapsed().as_secs_f64(),
    });
    fpt_spec::files::write_atomic(&a.out, serde_json::to_string_pretty(&result)?.as_bytes())
        .with_context(|| format!("writing {}", a.out.display()))?;
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

//! `cargo xtask bench step`: the FPT step (and the full fine-tune step) timed by `fpt bench`
//! on each kernel path, beside the same step in PyTorch (`bench/pytorch_fpt_step.py`), in
//! alternating rounds; the shapes are `fpt bench --list`'s.

use crate::{build_fpt, root};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;

pub(crate) fn python() -> String {
    std::env::var("FPT_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn run_json(cmd: &mut Command, what: &str) -> Result<serde_json::Value> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or("");
    serde_json::from_str(last).with_context(|| format!("{what} printed no JSON: {text}"))
}

/// One bench round of a shape: fpt's JSON entry per kernel path (with `--precision bf16`,
/// the bf16 step's with the f32 step's of the same round under `f32`) and PyTorch's (when
/// measured).
type Round = (Vec<serde_json::Value>, Option<serde_json::Value>);

/// `cargo xtask bench`'s benchmarks.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Bench {
    /// Time the FPT step (and the full fine-tune step) on each kernel path beside PyTorch's
    /// same step (`bench/pytorch_fpt_step.py`, when `torch` and `transformers` import from
    /// `$FPT_PYTHON`, else `python3`), one process per shape and path, in alternating rounds;
    /// prints all and their ratios, per kernel path
    Step(StepArgs),
    /// Regenerate bench/README.md's current table from bench/records
    Readme,
    /// The rows of an `at-once.jsonl` a device call wrote (bench/gpu/session.sh: N campaign
    /// MNIST steps at once, fpt's and PyTorch's), as `step --at-once` makes them; printed,
    /// and with `--record` written as a dated record
    AtOnce(AtOnceArgs),
}

/// `cargo xtask bench at-once`'s flags.
#[derive(Debug, clap::Args)]
pub(crate) struct AtOnceArgs {
    /// The file (one JSON line per process)
    file: std::path::PathBuf,
    /// The device it ran on, as the record names it (`cuda:0` on an H100, say)
    #[arg(long, default_value = "cuda:0")]
    device: String,
    /// Print one JSON object instead of the table
    #[arg(long)]
    json: bool,
    /// Also write a dated record in bench/records/, its machine line the device machine's
    /// (`--machine`, or the `...-machine.txt` bench/gpu/ keeps beside the file)
    #[arg(long)]
    record: bool,
    /// The machine the file was measured on, as the record names it (default: from the
    /// `<stamp>-machine.txt` beside the file, as bench/gpu/session.sh writes it)
    #[arg(long)]
    machine: Option<String>,
    /// The commit the device's binary was built from (gpu-check.json's `build`), when it is
    /// not this checkout's HEAD
    #[arg(long)]
    commit: Option<String>,
    /// The same call's `streams.jsonl` (N runs in one process, `fpt bench --streams`): rows
    /// beside PyTorch's N processes from FILE
    #[arg(long, value_name = "FILE")]
    streams: Option<std::path::PathBuf>,
}

/// `cargo xtask bench step`'s flags.
#[derive(Debug, clap::Args)]
pub(crate) struct StepArgs {
    /// The backbone whose shapes are timed (`fpt bench --list` names them: gpt2, minilm, lstm, smollm2)
    #[arg(long, default_value = "gpt2")]
    pub(crate) backbone: String,
    /// A shape to time (repeatable; `--backbone minilm --shape mnist` means `minilm-mnist`);
    /// default: every shape of the backbone
    #[arg(long = "shape", value_name = "NAME")]
    pub(crate) shapes: Vec<String>,
    /// Timed steps per process
    #[arg(long, default_value_t = 5)]
    pub(crate) steps: usize,
    /// Untimed steps first
    #[arg(long, default_value_t = 2)]
    pub(crate) warmup: usize,
    /// Alternating rounds (fpt, PyTorch, fpt, ...); the medians are reported
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) rounds: u64,
    /// Kernel paths: `native` (the best this CPU runs) and/or `portable`
    #[arg(long, default_value = "native,portable", value_delimiter = ',', value_parser = ["native", "portable"])]
    pub(crate) paths: Vec<String>,
    /// Device: `cpu`, or `cuda` / `cuda:N` with a CUDA build
    #[arg(long, default_value = "cpu")]
    pub(crate) device: String,
    /// Time the FPT step only (not the full fine-tune step)
    #[arg(long)]
    pub(crate) no_full: bool,
    /// The frozen weights' number format: `bf16` times fpt's bf16 step beside fpt's f32
    /// step and PyTorch's autocast-bf16 step in each round (no full fine-tune step)
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"])]
    pub(crate) precision: String,
    /// Print one JSON object instead of the tables
    #[arg(long)]
    pub(crate) json: bool,
    /// Also write the results as a dated record in bench/records/ and regenerate
    /// bench/README.md's current table from the records
    #[arg(long)]
    pub(crate) record: bool,
    /// Processes timed at once, per measurement (a list: `1,2,4`): N fpt processes of the
    /// FPT step side by side, their timed steps started together (`fpt bench --barrier`),
    /// then N PyTorch processes the same way; each N reports the steps a second of all N
    /// together, fpt's beside PyTorch's, and how far the timed windows overlapped. How many
    /// campaign runs a lent GPU should train at once. 1 alone: the one-process bench
    #[arg(long, value_delimiter = ',', default_value = "1", value_parser = clap::value_parser!(u64).range(1..=64))]
    pub(crate) at_once: Vec<u64>,
}

/// The shapes of a backbone, as `fpt bench --list` defines them (the PyTorch script reads
/// the same list).
fn bench_shapes(bin: &Path, backbone: &str) -> Result<Vec<String>> {
    let out = Command::new(bin)
        .args(["bench", "--list"])
        .output()
        .context("running fpt bench --list")?;
    let all: Vec<serde_json::Value> =
        serde_json::from_slice(&out.stdout).context("fpt bench --list printed no JSON list")?;
    let v: Vec<String> = all
        .iter()
        .filter(|s| s["arch"] == backbone)
        .filter_map(|s| s["name"].as_str().map(String::from))
        .collect();
    if v.is_empty() {
        let mut known: Vec<&str> = all.iter().filter_map(|s| s["arch"].as_str()).collect();
        known.sort();
        known.dedup();
        bail!(
            "bench step: unknown --backbone `{backbone}` (`fpt bench --list` has {})",
            known.join(", ")
        );
    }
    Ok(v)
}

/// The name of the kernel path fpt picks here by default (the most capable this CPU runs),
/// as a one-step `fpt bench` reports it.
fn native_path(bin: &Path) -> Result<String> {
    let out = Command::new(bin)
        .args([
            "bench",
            "--json",
            "--shape",
            "tiny",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--no-full",
        ])
        .output()
        .context("running fpt bench to find the native kernel path")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value =
        serde_json::from_str(text.lines().last().unwrap_or("")).context("fpt bench printed no JSON")?;
    v["tiny"]["kernel_path"]
        .as_str()
        .map(str::to_string)
        .context("fpt bench reported no kernel path")
}

pub(crate) fn bench(which: &Bench) -> Result<()> {
    let a = match which {
        Bench::Step(a) => a,
        Bench::Readme => return crate::bench_records::readme(),
        Bench::AtOnce(x) => {
            let text = std::fs::read_to_string(&x.file).with_context(|| format!("reading {}", x.file.display()))?;
            let mut all = crate::bench_at_once::import_at_once(&text, &x.device)
                .with_context(|| format!("{}", x.file.display()))?;
            if let Some(f) = &x.streams {
                let lines = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
                let rows = crate::bench_at_once::import_streams(&lines, &x.device, &all)
                    .with_context(|| format!("{}", f.display()))?;
                all.extend(rows);
            }
            if x.record {
                let backbone = all
                    .values()
                    .next()
                    .and_then(|r| r["backbone"].as_str())
                    .unwrap_or("minilm");
                let machine = match &x.machine {
                    Some(m) => m.clone(),
                    None => crate::bench_at_once::device_machine(&x.file)?,
                };
                let path = crate::bench_records::record_on(
                    &serde_json::Value::Object(all.clone()),
                    backbone,
                    None,
                    Some(machine),
                    x.commit.clone(),
                )?;
                eprintln!("xtask: recorded in {}", path.display());
            }
            if x.json {
                println!("{}", serde_json::Value::Object(all));
            } else {
                crate::bench_at_once::print_at_once(&all);
            }
            return Ok(());
        }
    };
    let bf16 = a.precision == "bf16";
    let (device, no_full, backbone) = (a.device.clone(), a.no_full || bf16, a.backbone.clone());
    let (steps, warmup, rounds) = (a.steps.to_string(), a.warmup.to_string(), a.rounds as usize);
    let mut shapes = a.shapes.clone();
    if a.at_once.iter().any(|&n| n > 1) && bf16 {
        bail!("bench step: --at-once times the precision given beside PyTorch's f32 step; it does not pair bf16 with f32 (run it with --precision f32, or time bf16 one process at a time)");
    }
    let bin = build_fpt()?;
    let known = bench_shapes(&bin, &backbone)?;
    if shapes.is_empty() {
        shapes = known.clone();
    } else {
        // `--backbone minilm --shape mnist` means `minilm-mnist`.
        for s in shapes.iter_mut() {
            let prefixed = format!("{backbone}-{s}");
            if !known.contains(s) && known.contains(&prefixed) {
                *s = prefixed;
            }
            if !known.contains(s) {
                bail!(
                    "bench step: no shape `{s}` for --backbone {backbone} (known: {})",
                    known.join(", ")
                );
            }
        }
    }
    // Kernel paths: the native one and the portable one (what users without AVX-512 or
    // AVX2 get), each named by what ran; one when they coincide or off the CPU.
    let native = native_path(&bin)?;
    let mut paths: Vec<(String, Option<&str>)> = Vec::new();
    for p in &a.paths {
        match p.as_str() {
            "native" => paths.push((native.clone(), None)),
            _ => paths.push(("portable".into(), Some("portable"))),
        }
    }
    paths.dedup_by(|a, b| a.0 == b.0);
    if device != "cpu" {
        paths.truncate(1);
    }
    let torch_ok = Command::new(python())
        .args(["-c", "import torch, transformers"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !torch_ok {
        eprintln!("xtask: `{} -c \"import torch, transformers\"` failed: PyTorch is not measured (pip install torch transformers, or set FPT_PYTHON)", python());
    }
    let script = root().join("bench").join("pytorch_fpt_step.py");
    if a.at_once.iter().any(|&n| n > 1) {
        let all = crate::bench_at_once::at_once(a, &bin, &shapes, &paths, torch_ok, &script)?;
        return finish(a, all, torch_ok);
    }
    let mut all = serde_json::Map::new();
    let median = |mut v: Vec<f64>| -> Option<f64> {
        v.sort_by(|a, b| a.total_cmp(b));
        (!v.is_empty()).then(|| v[v.len() / 2])
    };
    for s in &shapes {
        // Rounds alternate fpt (each path) and PyTorch, so all see the same machine: on
        // shared cloud cores the speed drifts by 10-30% over minutes.
        let mut round_rows: Vec<Round> = Vec::new();
        for r in 1..=rounds {
            let mut ours_per_path = Vec::new();
            for (name, env) in &paths {
                let fpt = |precision: &str| -> Result<serde_json::Value> {
                    eprintln!("xtask: bench {s} (round {r}/{rounds}): fpt {precision} on the {name} kernel path ...");
                    let mut cmd = Command::new(&bin);
                    cmd.args([
                        "bench",
                        "--json",
                        "--shape",
                        s,
                        "--steps",
                        &steps,
                        "--warmup",
                        &warmup,
                        "--device",
                        &device,
                        "--precision",
                        precision,
                    ]);
                    if let Some(v) = env {
                        cmd.env("FPT_KERNELS", v);
                    }
                    if no_full {
                        cmd.arg("--no-full");
                    }
                    let ours = run_json(&mut cmd, "fpt bench")?;
                    ours.get(s.as_str()).cloned().context("fpt bench returned no entry")
                };
                let mut entry = fpt(&a.precision)?;
                if bf16 {
                    entry["f32"] = fpt("f32")?;
                }
                ours_per_path.push(entry);
            }
            let torch = if torch_ok {
                eprintln!("xtask: bench {s} (round {r}/{rounds}): pytorch ...");
                let mut cmd = Command::new(python());
                cmd.arg(&script).args([
                    "--shape", s, "--steps", &steps, "--warmup", &warmup, "--device", &device,
                ]);
                cmd.arg("--fpt").arg(&bin);
                if no_full {
                    cmd.arg("--no-full");
                }
                if bf16 {
                    cmd.args(["--autocast", "bf16"]);
                }
                Some(run_json(&mut cmd, "pytorch_fpt_step.py")?)
            } else {
                None
            };
            round_rows.push((ours_per_path, torch));
        }
        let f = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_f64());
        let torch_med = |k: &str| {
            median(
                round_rows
                    .iter()
                    .filter_map(|x| x.1.as_ref().and_then(|t| f(t, k)))
                    .collect(),
            )
        };
        for (pi, (path, _)) in paths.iter().enumerate() {
            let ours_of = |x: &Round| x.0[pi].clone();
            let ratios: Vec<f64> = round_rows
                .iter()
                .filter_map(|x| f(&ours_of(x), "ours_ms").zip(x.1.as_ref().and_then(|t| f(t, "pytorch_ms"))))
                .map(|(a, b)| a / b)
                .collect();
            let full_ratios: Vec<f64> = round_rows
                .iter()
                .filter_map(|x| f(&ours_of(x), "full_ms").zip(x.1.as_ref().and_then(|t| f(t, "pytorch_full_ms"))))
                .map(|(a, b)| a / b)
                .collect();
            // GFLOP/s, peak and memory come from the round with the median fpt time.
            let mut order: Vec<usize> = (0..round_rows.len()).collect();
            order.sort_by(|&a, &b| {
                let r = |i: usize| f(&ours_of(&round_rows[i]), "ours_ms").unwrap_or(f64::MAX);
                r(a).total_cmp(&r(b))
            });
            let mid = &round_rows[order[order.len() / 2]];
            let ours = ours_of(mid);
            let ours_ms = median(round_rows.iter().filter_map(|x| f(&ours_of(x), "ours_ms")).collect());
            let full_ms = median(round_rows.iter().filter_map(|x| f(&ours_of(x), "full_ms")).collect());
            // bf16: fpt's own f32 step of the same rounds, and the speedup per round.
            let f32_of = |x: &Round| ours_of(x).get("f32").and_then(|v| f(v, "ours_ms"));
            let speedups: Vec<f64> = round_rows
                .iter()
                .filter_map(|x| f32_of(x).zip(f(&ours_of(x), "ours_ms")))
                .map(|(a, b)| a / b)
                .collect();
            let mut row = serde_json::json!({
                "shape": s,
                "backbone": backbone,
                "kernel_path": ours.get("kernel_path").cloned().unwrap_or(serde_json::Value::String(path.clone())),
                "ours_ms": ours_ms,
                "full_ms": full_ms,
                "pytorch_ms": torch_med("pytorch_ms"),
                "pytorch_full_ms": torch_med("pytorch_full_ms"),
                "pytorch_nn_lstm_ms": torch_med("nn_lstm_ms"),
                "ratio_vs_pytorch": median(ratios.clone()),
                "round_ratios": ratios,
                "full_ratio_vs_pytorch": median(full_ratios),
                "rounds": rounds,
                "fpt_over_full": ours_ms.zip(full_ms).map(|(a, b)| a / b),
                "gflops": f(&ours, "gflops"),
                "peak_gflops": f(&ours, "peak_gflops"),
                "peak_fraction": f(&ours, "peak_fraction"),
                "peak_rss_mb": f(&ours, "peak_rss_mb"),
                "model_rss_mb": f(&ours, "model_rss_mb"),
                "frozen_mb": f(&ours, "frozen_mb"),
                "pytorch_peak_rss_mb": mid.1.as_ref().and_then(|t| f(t, "peak_rss_mb")),
                "spread_ms": ours.get("ours"),
            });
            if bf16 {
                let extra = serde_json::json!({
                    "precision": "bf16",
                    "pytorch_autocast": "bf16",
                    "f32_ms": median(round_rows.iter().filter_map(f32_of).collect()),
                    "speedup_vs_f32": median(speedups.clone()),
                    "round_speedups": speedups,
                    "f32_peak_rss_mb": ours.get("f32").and_then(|v| f(v, "peak_rss_mb")),
                    "f32_model_rss_mb": ours.get("f32").and_then(|v| f(v, "model_rss_mb")),
                    "f32_frozen_mb": ours.get("f32").and_then(|v| f(v, "frozen_mb")),
                });
                if let (Some(r), Some(e)) = (row.as_object_mut(), extra.as_object()) {
                    r.extend(e.clone());
                }
                all.insert(format!("{s} [{path}, bf16]"), row);
            } else {
                all.insert(format!("{s} [{path}]"), row);
            }
        }
    }
    finish(a, all, torch_ok)
}

/// Records (`--record`) and prints (`--json`, or the table) what a bench call measured.
fn finish(a: &StepArgs, all: serde_json::Map<String, serde_json::Value>, torch_ok: bool) -> Result<()> {
    let (json, backbone) = (a.json, &a.backbone);
    if a.record {
        let torch = torch_ok
            .then(|| {
                let o = Command::new(python())
                    .args(["-c", "import torch, transformers; print(f'torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads')"])
                    .output()
                    .ok()?;
                Some(String::from_utf8_lossy(&o.stdout).trim().to_string())
            })
            .flatten();
        let path = crate::bench_records::record(&serde_json::Value::Object(all.clone()), backbone, torch)?;
        eprintln!("xtask: recorded in {}", path.display());
    }
    if json {
        println!("{}", serde_json::Value::Object(all));
        return Ok(());
    }
    let fmt = |v: &serde_json::Value, k: &str, p: usize| {
        v.get(k)
            .and_then(|x| x.as_f64())
            .map_or("-".to_string(), |x| format!("{x:.p$}"))
    };
    if all.values().any(|r| r["at_once"].is_number()) {
        crate::bench_at_once::print_at_once(&all);
        return Ok(());
    }
    println!("| shape | kernels | fpt step ms | pytorch ms | ours/pytorch | full ms (ours / pytorch) | full ratio | GFLOP/s | peak fraction | RSS MB (ours / pytorch) |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in all.values() {
        // With several rounds, the per-round ratios beside their median.
        let mut ratio = fmt(r, "ratio_vs_pytorch", 2);
        let rounds: Vec<String> = r["round_ratios"]
            .as_array()
            .map(|v| v.iter().filter_map(|x| x.as_f64()).map(|x| format!("{x:.2}")).collect())
            .unwrap_or_default();
        if rounds.len() > 1 {
            ratio = format!("{ratio} ({})", rounds.join(", "));
        }
        let mut torch = fmt(r, "pytorch_ms", 1);
        if r["pytorch_nn_lstm_ms"].is_number() {
            torch = format!("{torch} (nn.LSTM {})", fmt(r, "pytorch_nn_lstm_ms", 1));
        }
        let kernels = match r["speedup_vs_f32"].as_f64() {
            Some(x) => format!(
                "{}, bf16: {x:.2}x fpt's f32 step ({} ms); frozen weights {} MB (f32: {}), model memory {} MB (f32: {})",
                r["kernel_path"].as_str().unwrap_or("?"),
                fmt(r, "f32_ms", 1),
                fmt(r, "frozen_mb", 0),
                fmt(r, "f32_frozen_mb", 0),
                fmt(r, "model_rss_mb", 0),
                fmt(r, "f32_model_rss_mb", 0)
            ),
            None => r["kernel_path"].as_str().unwrap_or("?").to_string(),
        };
        if r["pytorch_autocast"].is_string() {
            torch = format!("{torch} (autocast bf16)");
        }
        println!(
            "| {} | {kernels} | {} | {torch} | {ratio} | {} / {} | {} | {} | {} of {} | {} / {} |",
            r["shape"].as_str().unwrap_or("?"),
            fmt(r, "ours_ms", 1),
            fmt(r, "full_ms", 1),
            fmt(r, "pytorch_full_ms", 1),
            fmt(r, "full_ratio_vs_pytorch", 2),
            fmt(r, "gflops", 1),
            fmt(r, "peak_fraction", 2),
            fmt(r, "peak_gflops", 1),
            fmt(r, "peak_rss_mb", 0),
            fmt(r, "pytorch_peak_rss_mb", 0)
        );
    }
    Ok(())
}

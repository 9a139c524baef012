//! `fpt bench`: one training step timed at the benchmark shapes.

use crate::parse_device;
use anyhow::{Context, Result};
use clap::Args;

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Shapes to time (repeatable); default: every shape of `--backbone`.
    #[arg(long = "shape")]
    pub(crate) shapes: Vec<String>,
    /// Backbone whose shapes run: `gpt2`, `minilm` (all-MiniLM-L6-v2's config) or `lstm`
    /// (the cpu scale's 3 x 256 layer-norm LSTM); a `--shape` may then drop the prefix
    /// (`--backbone minilm --shape mnist`).
    #[arg(long, default_value = "gpt2")]
    pub(crate) backbone: String,
    /// Timed steps per measurement (median and spread are reported).
    #[arg(long, default_value_t = 5)]
    pub(crate) steps: usize,
    /// Untimed steps first.
    #[arg(long, default_value_t = 2)]
    pub(crate) warmup: usize,
    /// Skip the full fine-tune step.
    #[arg(long)]
    pub(crate) no_full: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
    /// Print every benchmark shape as one JSON list (what `cargo xtask bench` and the
    /// PyTorch reference script read); time nothing.
    #[arg(long)]
    pub(crate) list: bool,
    /// Device: `cpu`, or `cuda` / `cuda:N` when built with `--features cuda`.
    #[arg(long, default_value = "cpu")]
    pub(crate) device: String,
    /// The frozen weights' number format (`f32` or `bf16`; `bf16` times no full fine-tune
    /// step, which has no frozen weights).
    #[arg(long, default_value = "f32")]
    pub(crate) precision: fpt_spec::Precision,
    /// Several processes timed at once (`cargo xtask bench step --at-once N` starts them):
    /// after its warm-up each writes `ready-<pid>` into this directory and waits until
    /// `--at-once` processes have, so their timed steps overlap. One shape only.
    #[arg(long, value_name = "DIR", requires = "at_once")]
    pub(crate) barrier: Option<std::path::PathBuf>,
    /// How many processes share `--barrier`.
    #[arg(long, value_name = "N", requires = "barrier", value_parser = clap::value_parser!(u64).range(1..=256))]
    pub(crate) at_once: Option<u64>,
    /// The longest wait at `--barrier` for the others, in seconds, before this process gives
    /// up naming the directory.
    #[arg(long, value_name = "SECS", default_value_t = 900, requires = "barrier")]
    pub(crate) barrier_timeout: u64,
    /// Time the FPT step captured as one CUDA graph and replayed, beside the same step
    /// launched kernel by kernel (a GPU; an experiment: one batch, replayed as captured,
    /// bench/README.md).
    #[arg(long, conflicts_with_all = ["barrier", "list"])]
    pub(crate) graph: bool,
    /// Train N runs of one shape side by side in this process, each on a device of its own
    /// (on a GPU, a stream of its own), their timed steps started together: the steps a
    /// second of all of them (against N processes, `--at-once`, which a GPU time-slices).
    #[arg(long, value_name = "N", conflicts_with_all = ["barrier", "list", "graph"],
          value_parser = clap::value_parser!(u64).range(1..=64))]
    pub(crate) streams: Option<u64>,
}

pub(crate) fn bench(a: BenchArgs) -> Result<()> {
    use fpt_train::bench;
    if a.list {
        println!("{}", serde_json::to_string(&bench::SHAPES.to_vec())?);
        return Ok(());
    }
    let device = parse_device(&a.device)?;
    let arch = bench::Arch::parse(&a.backbone).with_context(|| {
        let known: Vec<&str> = bench::Arch::ALL.iter().map(|a| a.name()).collect();
        format!("unknown --backbone `{}` (known: {})", a.backbone, known.join(", "))
    })?;
    let shapes: Vec<bench::Shape> = if a.shapes.is_empty() {
        bench::shapes_for(arch)
    } else {
        a.shapes
            .iter()
            .map(|n| {
                bench::find(arch, n).or_else(|| bench::shape(n)).with_context(|| {
                    let known: Vec<&str> = bench::SHAPES.iter().map(|s| s.name).collect();
                    format!("unknown --shape `{n}` (known: {})", known.join(", "))
                })
            })
            .collect::<Result<_>>()?
    };
    if a.graph {
        return graph(&a, &shapes, &device);
    }
    if let Some(n) = a.streams {
        return streams(&a, &shapes, n as usize);
    }
    let gate = match (&a.barrier, a.at_once) {
        (Some(dir), Some(n)) => {
            if shapes.len() != 1 {
                anyhow::bail!(
                    "--barrier times one shape at once in each process; name it with --shape (this call names {})",
                    shapes.len()
                );
            }
            bench::Gate::Barrier {
                dir: dir.clone(),
                count: n as usize,
                timeout: std::time::Duration::from_secs(a.barrier_timeout),
            }
        }
        _ => bench::Gate::Open,
    };
    let mut out = serde_json::Map::new();
    for s in &shapes {
        if !a.json {
            eprintln!(
                "fpt bench: {} ({} {} layers x {}, batch {} x {} tokens, {} kernels, {}) ...",
                s.name,
                s.arch.name(),
                s.layers,
                s.hidden,
                s.batch,
                s.tokens,
                fpt_nn::kernels::KernelPath::active().name(),
                a.precision
            );
        }
        let r = bench::run_gated(s, a.warmup, a.steps, !a.no_full, &device, a.precision, &gate)?;
        if !a.json {
            println!(
                "{:<14} fpt step {:>9.1} ms (min {:.1}, max {:.1}){}  {:.1} GFLOP/s = {:.0}% of the {:.1} GFLOP/s matmul peak  peak RSS {}",
                s.name,
                r.ours_ms,
                r.ours.min_ms,
                r.ours.max_ms,
                r.full_ms.map(|f| format!("  full {f:.1} ms (fpt/full {:.2})", r.ours_ms / f)).unwrap_or_default(),
                r.gflops,
                100.0 * r.peak_fraction,
                r.peak_gflops,
                r.peak_rss_mb.map(|m| format!("{m:.0} MB")).unwrap_or_else(|| "n/a".into())
            );
        }
        out.insert(s.name.to_string(), serde_json::to_value(&r)?);
    }
    if a.json {
        println!("{}", serde_json::Value::Object(out));
    }
    Ok(())
}

/// `fpt bench --streams N`: N runs of one shape side by side in this process.
fn streams(a: &BenchArgs, shapes: &[fpt_train::bench::Shape], n: usize) -> Result<()> {
    let [s] = shapes else {
        anyhow::bail!(
            "--streams times one shape; name it with --shape (this call names {})",
            shapes.len()
        )
    };
    let make = || -> fpt_train::Result<candle_core::Device> { Ok(fpt_nn::device::parse(&a.device)?) };
    let t = fpt_train::bench_streams::time_streams(
        s,
        fpt_spec::TrainGroups::fpt(),
        a.precision,
        a.warmup,
        a.steps,
        n,
        None,
        &make,
    )
    .with_context(|| format!("fpt bench --streams {n}: {}", s.name))?;
    if a.json {
        println!("{}", serde_json::json!({ s.name: t }));
    } else {
        let each: Vec<String> = t.per_run.iter().map(|r| format!("{:.2}", r.median_ms)).collect();
        println!(
            "{:<14} {n} runs in one process on {} ({} steps): {:.1} steps/s in all; each run's median step {} ms; timed together {:.0}% of the window",
            s.name,
            a.device,
            if t.replayed { "replayed" } else { "eager" },
            t.steps_per_s,
            each.join(", "),
            100.0 * t.overlap
        );
    }
    Ok(())
}

/// `fpt bench --graph`: each shape's step eagerly and as a replayed CUDA graph.
fn graph(a: &BenchArgs, shapes: &[fpt_train::bench::Shape], device: &candle_core::Device) -> Result<()> {
    let mut out = serde_json::Map::new();
    for s in shapes {
        let groups = fpt_spec::TrainGroups::fpt();
        let r = fpt_train::bench_graph::time_graph_steps(s, groups, a.precision, a.warmup, a.steps, device)
            .with_context(|| format!("fpt bench --graph: {}", s.name))?;
        if !a.json {
            // A side's median with its spread, and which replay ran.
            let t = |t: &fpt_train::bench::Timing| {
                format!("{:>8.2} ms (min {:.2}, max {:.2})", t.median_ms, t.min_ms, t.max_ms)
            };
            let how = |captured: bool| {
                if captured {
                    "graph replay"
                } else {
                    "replay (eager, no capture off a GPU)"
                }
            };
            println!(
                "{:<14} eager step {}  {} {}  replay/eager {:.2}  back to back {:.2} ms  training loss {:.4} -> {:.4}, {} skipped",
                s.name,
                t(&r.eager),
                how(r.captured),
                t(&r.replay),
                r.replay.median_ms / r.eager.median_ms,
                r.pipelined_ms,
                r.loss_first,
                r.loss_last,
                r.skipped
            );
            println!(
                "{:<14} evaluation of {} batches of {}: eager {}  {} {}  replay/eager {:.2}",
                "",
                fpt_train::bench_graph::EVAL_BATCHES,
                r.eval_batch,
                t(&r.eval_eager),
                how(r.eval_captured),
                t(&r.eval_replay),
                r.eval_replay.median_ms / r.eval_eager.median_ms,
            );
        }
        out.insert(s.name.to_string(), serde_json::to_value(&r)?);
    }
    if a.json {
        println!("{}", serde_json::Value::Object(out));
    }
    Ok(())
}

//! `fpt`: train and inspect frozen pretrained transformers (Lu et al. 2021).
//!
//! - `fpt train --task bit-xor --backbone gpt2 --init random --layers 4 --hidden 128 --heads 4 --steps 4000 --out DIR`
//! - `fpt inspect --backbone gpt2 --task bit-xor [--json]`

use anyhow::{bail, Context, Result};
use candle_core::Device;
use clap::{Args, Parser, Subcommand};
use fpt_spec::{
    BackboneSpec, Init, ResidualInit, Role, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainGroups, TrainSpec,
};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "fpt",
    version,
    about = "Frozen pretrained transformers as universal computation engines"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train the input/output layers (and chosen groups) of a frozen backbone on a task.
    Train(TrainArgs),
    /// Print a backbone's config summary and parameter counts per group.
    Inspect(InspectArgs),
}

#[derive(Args, Clone)]
struct BackboneArgs {
    /// `gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl`, a Hugging Face model id, or a local
    /// directory with config.json and model.safetensors.
    #[arg(long, default_value = "gpt2")]
    backbone: String,
    /// `pretrained` (load the checkpoint) or `random` (the architecture's default init).
    #[arg(long, default_value = "pretrained")]
    init: Init,
    /// Number of transformer blocks (random init only).
    #[arg(long)]
    layers: Option<usize>,
    /// Hidden width (random init only).
    #[arg(long)]
    hidden: Option<usize>,
    /// Attention heads (random init only).
    #[arg(long)]
    heads: Option<usize>,
    /// Size of the learned position table (random init only).
    #[arg(long)]
    positions: Option<usize>,
    /// GPT-2 random init of the residual projections: `scaled` (current transformers) or
    /// `unscaled` (transformers 4.1.1, as in the paper's random rows).
    #[arg(long, default_value = "scaled")]
    residual_init: ResidualInit,
    /// Parameter groups to train: a list of in,out,ln,pos,attn,ff, or `all`, `fpt`, `none`.
    #[arg(long = "train", default_value = "in,out,ln,pos")]
    train_groups: TrainGroups,
}

impl BackboneArgs {
    fn spec(&self) -> BackboneSpec {
        BackboneSpec {
            source: self.backbone.clone(),
            init: self.init,
            shape: ShapeOverrides {
                layers: self.layers,
                hidden: self.hidden,
                heads: self.heads,
                positions: self.positions,
            },
            residual_init: self.residual_init,
        }
    }
}

#[derive(Args)]
struct TrainArgs {
    /// Task: bit-xor or bit-memory.
    #[arg(long)]
    task: TaskName,
    #[command(flatten)]
    backbone: BackboneArgs,
    /// Optimizer steps.
    #[arg(long, default_value_t = 1000)]
    steps: usize,
    /// Examples per optimizer step.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Examples per forward/backward pass (gradient accumulation when smaller than
    /// --batch-size); defaults to --batch-size.
    #[arg(long)]
    micro_batch_size: Option<usize>,
    /// Adam learning rate (constant; no weight decay).
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Gradient-norm clipping threshold; 0 turns clipping off.
    #[arg(long, default_value_t = 1.0)]
    clip: f64,
    /// Evaluate on the held-out set every N steps (and at the end).
    #[arg(long, default_value_t = 250)]
    eval_every: usize,
    /// Held-out examples (bit tasks draw them once per seed).
    #[arg(long, default_value_t = 512)]
    eval_examples: usize,
    /// Bits per string for the bit tasks (paper: XOR 5, Memory 1000).
    #[arg(long)]
    n_bits: Option<usize>,
    /// Bits per token for the bit tasks (paper: XOR 1, Memory 50).
    #[arg(long)]
    patch: Option<usize>,
    /// Dropout after the input layer.
    #[arg(long, default_value_t = 0.1)]
    input_dropout: f64,
    /// Gain of the orthogonal init of the input layer.
    #[arg(long, default_value_t = 1.41)]
    orth_gain: f64,
    /// Turn the backbone's own dropouts off during training (the reference keeps them on).
    #[arg(long)]
    no_backbone_dropout: bool,
    /// Seed of every random number in the run.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Device: `cpu`, or `cuda` / `cuda:N` when built with `--features cuda`.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Run directory for spec.json, metrics.jsonl and result.json.
    #[arg(long)]
    out: PathBuf,
    /// Print only the final line.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Args)]
struct InspectArgs {
    #[command(flatten)]
    backbone: BackboneArgs,
    /// Count the input and output layers of this task too.
    #[arg(long)]
    task: Option<TaskName>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn parse_device(s: &str) -> Result<Device> {
    match s {
        "cpu" => Ok(Device::Cpu),
        _ => {
            let ordinal = match s.strip_prefix("cuda") {
                Some("") => 0,
                Some(rest) => rest
                    .strip_prefix(':')
                    .and_then(|n| n.parse().ok())
                    .with_context(|| format!("bad --device `{s}` (expected cpu, cuda or cuda:N)"))?,
                None => bail!("unknown --device `{s}` (expected cpu, cuda or cuda:N)"),
            };
            Device::new_cuda(ordinal).with_context(|| {
                format!(
                    "--device {s}: this fpt was built without CUDA or no GPU is visible (build with `--features cuda`)"
                )
            })
        }
    }
}

fn train(a: TrainArgs) -> Result<()> {
    let mut task = TaskSpec::new(a.task);
    task.n_bits = a.n_bits;
    task.patch = a.patch;
    task.eval_examples = a.eval_examples;
    let spec = RunSpec {
        task,
        backbone: a.backbone.spec(),
        train_groups: a.backbone.train_groups,
        train: TrainSpec {
            steps: a.steps,
            batch_size: a.batch_size,
            micro_batch_size: a.micro_batch_size.unwrap_or(a.batch_size),
            lr: a.lr,
            clip_norm: (a.clip > 0.0).then_some(a.clip),
            eval_every: a.eval_every,
            seed: a.seed,
        },
        input_dropout: a.input_dropout,
        orth_gain: a.orth_gain,
        backbone_dropout: !a.no_backbone_dropout,
    };
    let device = parse_device(&a.device)?;
    let quiet = a.quiet;
    let total_steps = a.steps;
    let tty = std::io::stderr().is_terminal();
    let mut on_event = |e: &fpt_train::Event| {
        if quiet {
            return;
        }
        match e {
            fpt_train::Event::Started {
                trainable,
                total,
                weights,
            } => {
                eprintln!(
                    "fpt: {} on {} [{}], training {} of {} parameters ({:.3}%)",
                    spec.task.name,
                    spec.backbone.source,
                    weights,
                    trainable,
                    total,
                    100.0 * *trainable as f64 / *total as f64
                );
            }
            fpt_train::Event::Eval(r) => {
                let rate = r.step as f64 / r.elapsed_s.max(1e-9);
                let eta = (total_steps.saturating_sub(r.step)) as f64 / rate.max(1e-9);
                let line = format!(
                    "step {:>6}/{total_steps}  train_loss {:.4}  test_loss {:.4}  test_acc {:.4}  {:.1} steps/s  elapsed {:.0}s  eta {:.0}s",
                    r.step, r.train_loss, r.test_loss, r.test_accuracy, rate, r.elapsed_s, eta
                );
                if tty {
                    eprintln!("\x1b[2K{line}");
                } else {
                    eprintln!("{line}");
                }
            }
            fpt_train::Event::Diverged(step) => eprintln!(
                "fpt: diverged at step {step} (non-finite loss or gradient); reporting the last finite parameters"
            ),
        }
    };
    let r = fpt_train::train(&spec, &a.out, &device, &mut on_event)?;
    println!(
        "{}: test_accuracy {:.4} (best {:.4} at step {}), {} steps in {:.1}s -> {}",
        r.task,
        r.test_accuracy,
        r.best_accuracy,
        r.best_step,
        r.steps,
        r.wall_seconds,
        a.out.join("result.json").display()
    );
    Ok(())
}

fn inspect(a: InspectArgs) -> Result<()> {
    let bspec = a.backbone.spec();
    let (config, specs) = fpt_backbones::param_specs(&bspec)?;
    let groups = a.backbone.train_groups;
    let hidden = config.n_embd;
    let dims = match a.task {
        Some(t) => Some(
            fpt_tasks::build(
                &TaskSpec {
                    eval_examples: 1,
                    ..TaskSpec::new(t)
                },
                0,
            )?
            .dims(),
        ),
        None => None,
    };
    // Without a task, count the backbone alone.
    let counts = match &dims {
        Some(d) => fpt_model::count_params(&specs, hidden, d, &groups),
        None => {
            let mut c = fpt_model::ParamCounts::default();
            for s in &specs {
                let e = c.by_role.entry(s.role).or_default();
                e.0 += s.numel();
                c.total += s.numel();
                if groups.trains(s.role) {
                    e.1 += s.numel();
                    c.trainable += s.numel();
                }
            }
            c
        }
    };
    let backbone_trainable: usize = specs.iter().filter(|s| groups.trains(s.role)).map(|s| s.numel()).sum();
    let backbone_total: usize = specs.iter().map(|s| s.numel()).sum();
    if a.json {
        let by_role: serde_json::Map<String, serde_json::Value> = counts
            .by_role
            .iter()
            .map(|(r, (t, tr))| (r.to_string(), serde_json::json!({"total": t, "trainable": tr})))
            .collect();
        let v = serde_json::json!({
            "backbone": bspec.source,
            "architecture": "gpt2",
            "init": bspec.init.to_string(),
            "config": config,
            "task": a.task.map(|t| t.to_string()),
            "task_dims": dims,
            "train_groups": groups.to_string(),
            "backbone_total": backbone_total,
            "backbone_trainable": backbone_trainable,
            "total": counts.total,
            "trainable": counts.trainable,
            "by_role": by_role,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("backbone   {} (gpt2, init {})", bspec.source, bspec.init);
    println!(
        "config     {} layers, hidden {}, {} heads, mlp {}, {} positions, eps {:e}",
        config.n_layer,
        config.n_embd,
        config.n_head,
        config.inner(),
        config.n_positions,
        config.layer_norm_epsilon
    );
    if let (Some(t), Some(d)) = (a.task, &dims) {
        println!(
            "task       {t}: {} tokens of {:?}, read-out from the last {}, {} labels x {} classes",
            d.seq_len, d.input, d.readout_tokens, d.labels_per_example, d.classes
        );
    }
    println!("train      {groups}");
    println!("{:<14}{:>14}{:>14}", "group", "total", "trainable");
    for r in Role::ALL {
        if let Some((t, tr)) = counts.by_role.get(&r) {
            println!("{:<14}{:>14}{:>14}", r.to_string(), t, tr);
        }
    }
    println!("{:<14}{:>14}{:>14}", "all", counts.total, counts.trainable);
    println!("backbone     {backbone_total:>14}{backbone_trainable:>14}");
    println!("(`other` is GPT-2's token table wte: counted, never used with input embeddings, never trained)");
    Ok(())
}

fn main() {
    // candle re-reads /proc/cpuinfo on every matmul to count threads unless this is set.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", fpt_nn::num_threads().to_string());
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("FPT_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Train(a) => train(a),
        Command::Inspect(a) => inspect(a),
    };
    if let Err(e) = res {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

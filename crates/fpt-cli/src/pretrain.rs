//! `fpt pretrain`: a small GPT-2 trained from scratch, written as a backbone directory.

use crate::parse_device;
use crate::train::Progress;
use anyhow::{bail, Context, Result};
use clap::Args;
use fpt_spec::{
    BackboneSpec, Init, LrSchedule, ResidualInit, RunSpec, ShapeOverrides, TaskSpec, TrainEval, TrainGroups, TrainSpec,
};
use std::path::PathBuf;

#[derive(Args)]
#[command(allow_negative_numbers = true)]
pub(crate) struct PretrainArgs {
    /// `austen` (English, `fpt fetch austen` first), `uniform`, `zipf`, `parens` (the
    /// follow-up slides' artificial corpora), `bit-memory` (the paper's "Bit" backbone), or
    /// the directory of a prepared corpus.
    #[arg(long, default_value = "austen")]
    pub(crate) corpus: String,
    /// Output directory: `run/` (the training run, resumable) and `model/` (the backbone:
    /// config.json, model.safetensors, tokenizer.json where there is one, README.md).
    #[arg(long, required_unless_present = "resume")]
    pub(crate) out: Option<PathBuf>,
    /// Continue the pretraining in this output directory (same flags as the first time).
    #[arg(long, value_name = "DIR", conflicts_with = "out")]
    pub(crate) resume: Option<PathBuf>,
    /// GPT-2 blocks.
    #[arg(long, default_value_t = 4)]
    pub(crate) layers: usize,
    /// Hidden width.
    #[arg(long, default_value_t = 256)]
    pub(crate) hidden: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    pub(crate) heads: usize,
    /// Tokens per training window (language corpora).
    #[arg(long, default_value_t = 128)]
    pub(crate) seq_len: usize,
    /// Vocabulary of the artificial corpora.
    #[arg(long, default_value_t = 4096)]
    pub(crate) vocab: usize,
    /// Optimizer steps.
    #[arg(long, default_value_t = 4000)]
    pub(crate) steps: usize,
    /// Windows per step.
    #[arg(long, default_value_t = 16)]
    pub(crate) batch_size: usize,
    /// Peak Adam learning rate (linear warm-up over 5% of the steps, cosine decay).
    #[arg(long, default_value_t = 1e-3)]
    pub(crate) lr: f64,
    /// Steps between evaluations (and checkpoints).
    #[arg(long, default_value_t = 500)]
    pub(crate) eval_every: usize,
    /// Held-out windows per evaluation (0 = the whole held-out text).
    #[arg(long, default_value_t = 0)]
    pub(crate) eval_examples: usize,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Device: `cpu`, or `cuda` / `cuda:N` when built with `--features cuda`.
    #[arg(long, default_value = "cpu")]
    pub(crate) device: String,
}

/// The run spec `fpt pretrain` trains for a language corpus.
pub(crate) fn lm_run_spec(a: &PretrainArgs) -> Result<RunSpec> {
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
        orth_gain: fpt_spec::DEFAULT_ORTH_GAIN,
        backbone_dropout: true,
    };
    spec.validate()?;
    Ok(spec)
}

pub(crate) fn pretrain(a: PretrainArgs) -> Result<()> {
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

//! `fpt pretrain`: a small GPT-2 trained from scratch, written as a backbone directory
//! (the workflow is `fpt_train::pretrain::pretrain`; this parses and prints).

use crate::parse_device;
use crate::train::Progress;
use anyhow::Result;
use clap::Args;
use fpt_train::pretrain::PretrainRequest;
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

impl PretrainArgs {
    /// The library's request for these flags.
    pub(crate) fn request(&self) -> PretrainRequest {
        PretrainRequest {
            corpus: self.corpus.clone(),
            layers: self.layers,
            hidden: self.hidden,
            heads: self.heads,
            seq_len: self.seq_len,
            vocab: self.vocab,
            steps: self.steps,
            batch_size: self.batch_size,
            lr: self.lr,
            eval_every: self.eval_every,
            eval_examples: self.eval_examples,
            seed: self.seed,
        }
    }
}

pub(crate) fn pretrain(a: PretrainArgs) -> Result<()> {
    let device = parse_device(&a.device)?;
    let out = a.out.clone().or_else(|| a.resume.clone()).expect("clap requires one");
    let mut progress = Progress {
        quiet: false,
        bar: None,
        steps: 0,
        last_acc: None,
    };
    let started = std::time::Instant::now();
    let done = fpt_train::pretrain::pretrain(&a.request(), &out, a.resume.is_some(), &device, &mut |e| progress.on(e))?;
    if let Some(b) = &progress.bar {
        b.finish_and_clear();
    }
    if let Some((ppl, unigram, tokens)) = done.perplexity {
        println!(
            "held-out perplexity {} vs unigram {unigram:.1} ({tokens} tokens seen)",
            ppl.map_or("-".into(), |x| format!("{x:.1}")),
        );
    }
    println!(
        "backbone written to {} ({:.0} s); use it with `fpt train --backbone {} --init pretrained`",
        done.model_dir.display(),
        started.elapsed().as_secs_f64(),
        done.model_dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: PretrainArgs,
    }

    /// `fpt pretrain` with no flags asks for the library's default request.
    #[test]
    fn the_flag_defaults_are_the_library_defaults() {
        let cli = Cli::try_parse_from(["fpt", "--out", "x"]).unwrap();
        assert_eq!(cli.a.request(), PretrainRequest::default());
    }
}

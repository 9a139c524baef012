//! Backbones fpt trains itself: the paper's "Bit" init (Table 2: a backbone fully trained on
//! Bit Memory, then frozen) and `fpt pretrain` (causal language modelling on a corpus).
//!
//! Both are ordinary runs of the [`Trainer`](crate::Trainer) with every group trained
//! (`--train all`), so they checkpoint and resume like any run; [`export_backbone`] then
//! writes the trained backbone as a checkpoint directory (`config.json` +
//! `model.safetensors`, the Hub's format for GPT-2 and BERT) that `--backbone DIR` loads.

use crate::{Event, Result, TrainError};
use candle_core::{Device, Tensor};
use fpt_spec::{BackboneSpec, BitPretrainSpec, Init, RunSpec, TaskName, TaskSpec, TrainGroups, TrainSpec};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where self-trained backbones are cached: `$FPT_HOME/backbones`.
pub fn backbones_home() -> PathBuf {
    fpt_tasks::fetch::home().join("backbones")
}

/// The run that makes a `bit-pretrained` backbone: the same architecture and shape,
/// randomly initialised, every parameter trained on Bit Memory.
pub fn bit_memory_run(spec: &BackboneSpec, bp: &BitPretrainSpec) -> RunSpec {
    let mut task = TaskSpec::new(TaskName::BitMemory);
    task.eval_examples = 256;
    let backbone = BackboneSpec {
        shape: spec.shape,
        residual_init: spec.residual_init,
        ..BackboneSpec::new(spec.source.clone(), Init::Random)
    };
    RunSpec {
        train_groups: TrainGroups::all(),
        train: TrainSpec {
            steps: bp.steps,
            batch_size: bp.batch_size,
            micro_batch_size: bp.batch_size,
            lr: bp.lr,
            // Pretrained until solved: evaluated every 100 steps, so it stops soon after.
            eval_every: match bp.until_accuracy {
                Some(_) => bp.steps.div_ceil(4).clamp(1, 100),
                None => bp.steps.div_ceil(4).max(1),
            },
            seed: bp.seed,
            stop_at_accuracy: bp.until_accuracy,
            ..TrainSpec::default()
        },
        ..RunSpec::new(task, backbone)
    }
}

/// How a Bit backbone's pretraining ended (`bit_pretrain.json` beside the cached backbone,
/// and every run on it records it in `result.json`): whether it learned its task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BitBackbone {
    /// Steps the pretraining ran.
    pub steps: usize,
    /// Its final held-out bit accuracy (0..1).
    pub bit_accuracy: f64,
    /// Bit Memory's copy baseline on the same examples (copy the visible bits, guess the
    /// masked ones).
    pub copy_baseline: Option<f64>,
    /// The accuracy at which it counts as having solved Bit Memory.
    pub target: f64,
    /// Whether it got there: a Bit backbone that did not is no evidence about Bit pretraining.
    pub solved: bool,
}

impl BitBackbone {
    /// The backbone in words, for a report's cells.
    pub fn describe(&self) -> String {
        format!(
            "the Bit backbone's own Bit Memory accuracy: {:.1}% after {} steps of pretraining{} ({}: {:.0}% needed)",
            100.0 * self.bit_accuracy,
            self.steps,
            self.copy_baseline
                .map_or(String::new(), |b| format!(", the copy baseline {:.1}%", 100.0 * b)),
            if self.solved {
                "it solved Bit Memory"
            } else {
                "it did NOT learn Bit Memory"
            },
            100.0 * self.target
        )
    }
}

/// The file beside a cached Bit backbone that records its pretraining.
const BIT_RECORD: &str = "bit_pretrain.json";

/// How the Bit backbone of `spec` was pretrained, once it is built; `None` for another
/// init or a backbone cached before fpt recorded it.
pub fn bit_backbone(spec: &BackboneSpec) -> Option<BitBackbone> {
    let dir = self_built_dir(spec)?;
    serde_json::from_slice(&std::fs::read(dir.join(BIT_RECORD)).ok()?).ok()
}

/// Serialises the building of self-trained backbones within a process (`--jobs` runs
/// share one); [`BuildLock`] does the same across processes.
static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Where the backbone of a `bit-pretrained` spec is cached (whether built yet or not);
/// `None` for every other init. Its `config.json` exists once it is built.
pub fn self_built_dir(spec: &BackboneSpec) -> Option<PathBuf> {
    (spec.init == Init::BitPretrained).then(|| {
        let run = bit_memory_run(spec, &spec.bit_pretrain.unwrap_or_default());
        backbones_home().join(format!("bit-memory-{}", run.key()))
    })
}

/// An exclusive advisory lock on `<dir>.lock`, held while a self-trained backbone is built,
/// so that runs in other processes (`fpt run-table --jobs N` trains runs in child
/// processes) wait for the one building it instead of training it twice. Released on drop,
/// and by the OS if the process dies.
struct BuildLock(#[allow(dead_code)] std::fs::File);

impl BuildLock {
    fn take(dir: &Path) -> Result<Self> {
        let path = dir.with_extension("lock");
        let io = |source| TrainError::Io {
            path: path.clone(),
            source,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| TrainError::Io {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io)?;
        f.lock().map_err(io)?;
        Ok(Self(f))
    }
}

/// The backbone a run actually loads. For `bit-pretrained`, the cached Bit Memory backbone
/// (trained first if missing: `$FPT_HOME/backbones/bit-memory-<key>`, its training run
/// beside it in `<dir>.run`, resumed if interrupted), as a pretrained checkpoint
/// directory; every other spec as it is.
pub fn resolve_backbone(spec: &BackboneSpec, device: &Device) -> Result<BackboneSpec> {
    if spec.init != Init::BitPretrained {
        return Ok(spec.clone());
    }
    let bp = spec.bit_pretrain.unwrap_or_default();
    let run = bit_memory_run(spec, &bp);
    let dir = self_built_dir(spec).expect("a bit-pretrained spec");
    let shape = if spec.shape.any() {
        serde_json::to_string(&spec.shape).unwrap_or_default()
    } else {
        "its own shape".into()
    };
    let _guard = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let _lock = if dir.join("config.json").is_file() {
        None
    } else {
        Some(BuildLock::take(&dir)?)
    };
    if !dir.join("config.json").is_file() {
        let run_dir = dir.with_extension("run");
        tracing::info!(
            "bit-pretrained backbone: training {} ({shape}) on Bit Memory for {} steps into {}",
            spec.source,
            bp.steps,
            run_dir.display()
        );
        let mut log = |e: &Event| {
            if let Event::Eval(r) = e {
                tracing::info!(
                    "bit-pretraining step {}: loss {:.4}, bit accuracy {:.4}",
                    r.step,
                    r.train_loss,
                    r.test_accuracy
                );
            }
        };
        let result = if run_dir.join("spec.json").is_file() {
            match std::fs::metadata(run_dir.join("result.json")) {
                Ok(_) => None,
                Err(_) => Some(crate::resume(&run_dir, Some(&run), device, &mut log)?),
            }
        } else {
            Some(crate::train(&run, &run_dir, device, &mut log)?)
        };
        let card = format!(
            "# Bit Memory backbone\n\n{} ({}) with its default random init, every parameter trained \
             on Bit Memory (paper Table 2's \"Bit\" row), then saved by fpt for use as a frozen \
             backbone.\n\n- steps: {}, batch {}, Adam lr {}, seed {}\n- final bit accuracy: {}\n- training run: {}\n",
            spec.source,
            shape,
            bp.steps,
            bp.batch_size,
            bp.lr,
            bp.seed,
            result
                .as_ref()
                .map(|r| format!("{:.4}", r.test_accuracy))
                .unwrap_or_else(|| "see the run's result.json".into()),
            run_dir.display()
        );
        export_backbone(&run_dir, &dir, false, &card)?;
        // What the pretraining reached, beside the backbone.
        let done = match result {
            Some(r) => r,
            None => serde_json::from_slice::<crate::RunResult>(&std::fs::read(run_dir.join("result.json")).map_err(
                |e| TrainError::RunDir {
                    path: run_dir.clone(),
                    msg: format!("result.json: {e}"),
                },
            )?)
            .map_err(|e| TrainError::RunDir {
                path: run_dir.clone(),
                msg: format!("result.json: {e}"),
            })?,
        };
        let target = bp.until_accuracy.unwrap_or(fpt_spec::BIT_SOLVED);
        let record = BitBackbone {
            steps: done.steps,
            bit_accuracy: done.test_accuracy,
            copy_baseline: done.baseline_accuracy,
            target,
            solved: done.test_accuracy >= target,
        };
        if !record.solved {
            tracing::warn!("bit-pretrained backbone: {}", record.describe());
        }
        let text = serde_json::to_vec_pretty(&record).map_err(|e| TrainError::RunDir {
            path: dir.clone(),
            msg: e.to_string(),
        })?;
        fpt_spec::files::write_atomic(&dir.join(BIT_RECORD), &text).map_err(|e| TrainError::RunDir {
            path: dir.join(BIT_RECORD),
            msg: e.to_string(),
        })?;
    }
    Ok(BackboneSpec {
        source: dir.display().to_string(),
        init: Init::Pretrained,
        shape: Default::default(),
        residual_init: spec.residual_init,
        depth: spec.depth,
        final_norm: spec.final_norm,
        bit_pretrain: None,
        precision: spec.precision,
    })
}

/// Writes the backbone of the finished run in `run_dir` (its last checkpoint) to
/// `model_dir` as a checkpoint directory, with `card` as its `README.md`. With
/// `token_table`, the run's input embedding becomes the backbone's token table (`wte`).
/// The directory is assembled under a temporary name and renamed into place.
pub fn export_backbone(run_dir: &Path, model_dir: &Path, token_table: bool, card: &str) -> Result<()> {
    let spec = crate::saved_spec(run_dir)?;
    let cpu = Device::Cpu;
    let tr = crate::Trainer::new(&spec, &cpu)?;
    let last = crate::checkpoint::latest(run_dir)?
        .ok_or_else(|| crate::run_dir_err(run_dir, "has no checkpoint to export (did the run diverge?)"))?;
    let loaded = crate::checkpoint::load(&last, &cpu)?;
    crate::checkpoint::load_trainable(
        tr.model(),
        &loaded.trainable,
        &last.join(crate::checkpoint::TRAINABLE_FILE),
    )?;
    let mut extra: HashMap<String, Tensor> = HashMap::new();
    if token_table {
        let input = tr
            .model()
            .params()
            .into_iter()
            .find(|(n, _, _)| n == "input.weight")
            .map(|(_, _, p)| p.tensor().clone())
            .expect("every model has an input layer");
        let table = match tr.model().backbone().architecture() {
            "gpt2" => "wte.weight",
            "bert" => "embeddings.word_embeddings.weight",
            other => {
                return Err(TrainError::RunDir {
                    path: run_dir.to_path_buf(),
                    msg: format!("exporting a token table for a {other} backbone is not supported"),
                })
            }
        };
        extra.insert(table.to_string(), input);
    }
    let parent = model_dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|source| TrainError::Io {
        path: parent.to_path_buf(),
        source,
    })?;
    let tmp = model_dir.with_extension("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    fpt_backbones::save_pretrained(
        tr.model().backbone(),
        &tmp,
        extra,
        &mut fpt_nn::Rng::new(spec.train.seed).fork("export"),
    )?;
    crate::write_atomic(&tmp.join("README.md"), card.as_bytes())?;
    if model_dir.exists() {
        // An earlier export of the same run (e.g. `fpt pretrain` finishing twice): replace.
        std::fs::remove_dir_all(model_dir).map_err(|source| TrainError::Io {
            path: model_dir.to_path_buf(),
            source,
        })?;
    }
    std::fs::rename(&tmp, model_dir).map_err(|source| TrainError::Io {
        path: model_dir.to_path_buf(),
        source,
    })?;
    Ok(())
}

/// What [`pretrain`] trains: a small GPT-2 from scratch, on a language corpus (causal
/// language modelling) or on Bit Memory (the paper's "Bit" backbone). `Default` gives the
/// settings `fpt pretrain` uses when no flag is given.
#[derive(Debug, Clone, PartialEq)]
pub struct PretrainRequest {
    /// `austen`, `uniform`, `zipf`, `parens`, `bit-memory`, or the directory of a corpus.
    pub corpus: String,
    /// GPT-2 blocks.
    pub layers: usize,
    /// Hidden width.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Tokens per training window (language corpora).
    pub seq_len: usize,
    /// Vocabulary of the artificial corpora.
    pub vocab: usize,
    /// Optimizer steps.
    pub steps: usize,
    /// Windows (or bit strings) per step.
    pub batch_size: usize,
    /// Peak Adam learning rate (linear warm-up over 5% of the steps, cosine decay, for
    /// language corpora; constant for Bit Memory).
    pub lr: f64,
    /// Steps between evaluations and checkpoints.
    pub eval_every: usize,
    /// Held-out windows per evaluation (0 = the whole held-out text).
    pub eval_examples: usize,
    /// Seed.
    pub seed: u64,
}

impl Default for PretrainRequest {
    fn default() -> Self {
        PretrainRequest {
            corpus: "austen".into(),
            layers: 4,
            hidden: 256,
            heads: 4,
            seq_len: 128,
            vocab: 4096,
            steps: 4000,
            batch_size: 16,
            lr: 1e-3,
            eval_every: 500,
            eval_examples: 0,
            seed: 0,
        }
    }
}

/// What [`pretrain`] made.
#[derive(Debug, Clone)]
pub struct Pretrained {
    /// The training run's result (its directory is `<out>/run`).
    pub result: crate::RunResult,
    /// The backbone directory (`<out>/model`), loadable with `--backbone DIR`.
    pub model_dir: PathBuf,
    /// The model card written as its `README.md`.
    pub card: String,
    /// Language corpora: held-out perplexity (where measured), the unigram perplexity of
    /// the same held-out tokens, and the tokens seen in training.
    pub perplexity: Option<(Option<f64>, f64, usize)>,
}

impl PretrainRequest {
    /// Whether this is the Bit Memory backbone rather than a language model.
    pub fn is_bits(&self) -> bool {
        self.corpus == "bit-memory"
    }

    fn shape(&self) -> fpt_spec::ShapeOverrides {
        fpt_spec::ShapeOverrides {
            layers: Some(self.layers),
            hidden: Some(self.hidden),
            heads: Some(self.heads),
            ..Default::default()
        }
    }

    /// The run spec this request trains (validated).
    pub fn run_spec(&self) -> Result<RunSpec> {
        if self.is_bits() {
            let bb = BackboneSpec {
                shape: self.shape(),
                ..BackboneSpec::new("gpt2", Init::BitPretrained)
            };
            let mut s = bit_memory_run(
                &bb,
                &BitPretrainSpec {
                    steps: self.steps,
                    batch_size: self.batch_size,
                    lr: self.lr,
                    seed: self.seed,
                    until_accuracy: None,
                },
            );
            s.train.eval_every = self.eval_every;
            s.train.checkpoint_every = Some(self.eval_every);
            s.validate()?;
            return Ok(s);
        }
        let mut task = TaskSpec::parse(&format!("text:{}", self.corpus))?;
        task.data.max_len = Some(self.seq_len);
        task.eval_examples = self.eval_examples;
        if fpt_tasks::text::ARTIFICIAL.contains(&self.corpus.as_str()) {
            task.data.vocab = Some(self.vocab);
        }
        let vocab = match fpt_tasks::dims_of(&task) {
            Some(d) => d.classes,
            None => {
                fpt_tasks::check_present(&task)?;
                return Err(TrainError::RunDir {
                    path: PathBuf::from(&self.corpus),
                    msg: "cannot read the corpus's vocabulary".into(),
                });
            }
        };
        let spec = RunSpec {
            train_groups: TrainGroups::all(),
            train: TrainSpec {
                steps: self.steps,
                batch_size: self.batch_size,
                micro_batch_size: self.batch_size,
                lr: self.lr,
                lr_schedule: fpt_spec::LrSchedule::Cosine {
                    warmup_steps: (self.steps / 20).max(1),
                },
                eval_every: self.eval_every,
                checkpoint_every: Some(self.eval_every),
                train_eval: fpt_spec::TrainEval::Never,
                seed: self.seed,
                ..TrainSpec::default()
            },
            input_dropout: 0.0,
            ..RunSpec::new(
                task,
                BackboneSpec {
                    shape: fpt_spec::ShapeOverrides {
                        positions: Some(self.seq_len.max(1024)),
                        vocab: Some(vocab),
                        ..self.shape()
                    },
                    residual_init: fpt_spec::ResidualInit::Scaled,
                    ..BackboneSpec::new("gpt2", Init::Random)
                },
            )
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// Trains the backbone `req` describes in `<out>/run` (continuing it there with `resume`)
/// and exports it to `<out>/model` with a model card (and the corpus's tokenizer, where it
/// has one).
pub fn pretrain(
    req: &PretrainRequest,
    out: &Path,
    resume: bool,
    device: &Device,
    on_event: &mut dyn FnMut(&Event),
) -> Result<Pretrained> {
    let run_dir = out.join("run");
    let model_dir = out.join("model");
    let spec = req.run_spec()?;
    let r = if resume {
        crate::resume(&run_dir, Some(&spec), device, on_event)?
    } else {
        crate::train(&spec, &run_dir, device, on_event)?
    };
    let shape = format!(
        "GPT-2, {} layers x {} wide x {} heads",
        req.layers, req.hidden, req.heads
    );
    let (card, perplexity) = if req.is_bits() {
        let card = format!(
            "# {shape}, trained on Bit Memory\n\nEvery parameter trained on Bit Memory (paper Table 2's \"Bit\" \
             backbone) by `fpt pretrain --corpus bit-memory`.\n\n- steps: {}, batch {}, lr {}, seed {}\n\
             - final bit accuracy (held-out): {:.4}\n- training time: {:.0} s\n",
            r.steps, req.batch_size, req.lr, req.seed, r.test_accuracy, r.wall_seconds
        );
        (card, None)
    } else {
        let task = fpt_tasks::text::TextTask::new(&spec.task, &crate::root_rng(&spec))?;
        let unigram = task.unigram_perplexity();
        let ppl = r.test_loss.map(f64::exp);
        let tokens = r.steps * req.batch_size * req.seq_len;
        let opt = |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |x| format!("{x:.digits$}"));
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
            corpus = req.corpus,
            vocab = task.vocab(),
            seq = req.seq_len,
            steps = r.steps,
            batch = req.batch_size,
            train_loss = opt(r.final_train_loss, 4),
            test_loss = opt(r.test_loss, 4),
            ppl = opt(ppl, 1),
            acc = r.test_accuracy,
            secs = r.wall_seconds,
            device = r.device,
            seed = req.seed,
        );
        (card, Some((ppl, unigram, tokens)))
    };
    export_backbone(&run_dir, &model_dir, !req.is_bits(), &card)?;
    if !req.is_bits() {
        let dir = fpt_tasks::text::corpus_dir(Path::new(&req.corpus));
        let tok = dir.join(fpt_tasks::text::TOKENIZER);
        if tok.is_file() {
            std::fs::copy(&tok, model_dir.join(fpt_tasks::text::TOKENIZER)).map_err(|source| TrainError::Io {
                path: tok.clone(),
                source,
            })?;
        }
    }
    Ok(Pretrained {
        result: r,
        model_dir,
        card,
        perplexity,
    })
}

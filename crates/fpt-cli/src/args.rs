//! The task and backbone flags `train`, `inspect` and `pretrain` share.

use clap::Args;
use fpt_spec::{
    BackboneSpec, Brackets, ImageSize, Init, Precision, ResidualInit, ShapeOverrides, TaskSpec, TrainGroups,
};
use std::path::PathBuf;

pub(crate) fn parse_task(s: &str) -> std::result::Result<TaskSpec, String> {
    TaskSpec::parse(s).map_err(|e| e.to_string())
}

/// Which task, and the dataset switches.
#[derive(Args, Clone)]
#[command(next_help_heading = "Task")]
pub(crate) struct TaskArgs {
    /// Task: bit-xor, bit-memory, listops, mnist, fashion-mnist, cifar10, cifar10-lra,
    /// homology, or custom:PATH (your JSONL data).
    #[arg(long, value_parser = parse_task)]
    pub(crate) task: Option<TaskSpec>,
    /// Read the dataset from this directory instead of $FPT_HOME/data/<task>.
    #[arg(long, value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,
    /// Train on a fixed seeded sample of this many training examples.
    #[arg(long)]
    pub(crate) train_examples: Option<usize>,
    /// Evaluation split (listops: val|test; homology: valid|test_fold_holdout|
    /// test_superfamily_holdout|test_family_holdout; others: test). Default: the reference code's.
    #[arg(long)]
    pub(crate) eval_split: Option<String>,
    /// ListOps brackets: `drop` (the reference code, 15 ids) or `keep` (LRA's fix, 16 ids).
    #[arg(long)]
    pub(crate) brackets: Option<Brackets>,
    /// MNIST image size: `native` (28x28, 49 tokens; the reference code) or `pad32` (the paper).
    #[arg(long)]
    pub(crate) image_size: Option<ImageSize>,
    /// Turn CIFAR-10 training augmentation off (on by default, as the reference code).
    #[arg(long)]
    pub(crate) no_augment: bool,
    /// Maximum tokens per sequence (ListOps 512, homology 1024, custom: the longest record).
    #[arg(long)]
    pub(crate) max_len: Option<usize>,
}

impl TaskArgs {
    /// Applies the flags for which `set` is true to `t`.
    pub(crate) fn apply(&self, t: &mut TaskSpec, set: &dyn Fn(&str) -> bool) {
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
    pub(crate) fn spec(&self) -> Option<TaskSpec> {
        let mut t = self.task.clone()?;
        self.apply(&mut t, &|_| true);
        Some(t)
    }
}

#[derive(Args, Clone)]
#[command(next_help_heading = "Backbone")]
pub(crate) struct BackboneArgs {
    /// `gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl`; short names `minilm`
    /// (all-MiniLM-L6-v2, BERT family), `smollm2` (SmolLM2-135M-Instruct, llama family; both
    /// installable offline with `fpt fetch`), `vit`, `longformer`; `lstm` (the layer-norm
    /// LSTM baseline, 3 x 768); a Hugging Face model id (GPT-2, BERT, T5, ViT, Longformer,
    /// Llama/Qwen2); a `.gguf` file (llama family, dequantized to f32); or a local directory
    /// with config.json and model.safetensors (e.g. one written by `fpt pretrain`).
    #[arg(long, default_value = "gpt2")]
    pub(crate) backbone: String,
    /// `pretrained` (load the checkpoint), `random` (the architecture's default init),
    /// `stats-only` (each tensor drawn from a Gaussian with its pretrained mean and std) or
    /// `bit-pretrained` (random init, every parameter trained on Bit Memory, then frozen;
    /// cached under $FPT_HOME/backbones).
    #[arg(long, default_value = "pretrained")]
    pub(crate) init: Init,
    /// Steps of Bit Memory training for `--init bit-pretrained`.
    #[arg(long, default_value_t = fpt_spec::BitPretrainSpec::default().steps)]
    pub(crate) bit_pretrain_steps: usize,
    /// LSTM backbones: residual connections around each layer (paper Table 5).
    #[arg(long)]
    pub(crate) lstm_residual: bool,
    /// LSTM backbones: a learned, zero-initialised position table added to the inputs.
    #[arg(long)]
    pub(crate) lstm_positions: bool,
    /// Blocks without their feed-forward half: attention and its LayerNorm only (random
    /// init, BERT-family backbones; with `--layers 1 --train all`: the critics' LLM2Attn).
    #[arg(long)]
    pub(crate) attention_only: bool,
    /// Number of transformer blocks (random init only).
    #[arg(long)]
    pub(crate) layers: Option<usize>,
    /// Hidden width (random init only).
    #[arg(long)]
    pub(crate) hidden: Option<usize>,
    /// Attention heads (random init only).
    #[arg(long)]
    pub(crate) heads: Option<usize>,
    /// Size of the learned position table (random init only).
    #[arg(long)]
    pub(crate) positions: Option<usize>,
    /// GPT-2 random init of the residual projections: `unscaled` (every weight N(0, 0.02), as
    /// transformers 4.1.1 did for the paper's random rows) or `scaled` (c_proj by
    /// 1/sqrt(2 * n_layer), as current transformers does).
    #[arg(long, default_value = "unscaled")]
    pub(crate) residual_init: ResidualInit,
    /// Use only the first N blocks of the backbone (depth cut, paper Tables 11-12; 0 keeps no
    /// block: the embedding stage alone, the critics' "w/o LLM")
    #[arg(long)]
    pub(crate) depth: Option<usize>,
    /// With --depth, drop the final norm (GPT-2's ln_f) instead of keeping it on top of the
    /// kept blocks.
    #[arg(long, requires = "depth")]
    pub(crate) no_final_norm: bool,
    /// Number format of the products with the frozen weights: `f32`, or `bf16` (each frozen
    /// weight matrix stored in bf16 once at load, its products with bf16 operands and f32
    /// sums; trained parameters, norms, softmax, loss and optimizer stay f32). Native on CPUs
    /// with AVX512_BF16 (the `avx512bf16` kernel path), widened to f32 elsewhere.
    #[arg(long, default_value = "f32")]
    pub(crate) precision: Precision,
    /// Parameter groups to train: a list of in,out,ln,pos,attn,ff,rec,last-attn, or `all`,
    /// `fpt`, `none` (`rec`: LSTM cell weights; `last-attn`: the last block's attention).
    #[arg(long = "train", default_value = "in,out,ln,pos")]
    pub(crate) train_groups: TrainGroups,
}

impl BackboneArgs {
    pub(crate) fn spec(&self) -> BackboneSpec {
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
                attention_only: self.attention_only.then_some(true),
                vocab: None,
            },
            residual_init: self.residual_init,
            depth: self.depth,
            final_norm: !self.no_final_norm,
            bit_pretrain: (self.init == Init::BitPretrained).then(|| fpt_spec::BitPretrainSpec {
                steps: self.bit_pretrain_steps,
                ..Default::default()
            }),
            precision: self.precision,
        }
    }
}

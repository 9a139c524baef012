//! fpt: frozen pretrained transformers as universal computation engines (Lu, Grover,
//! Abbeel and Mordatch, 2021), on candle.
//!
//! This facade re-exports the workspace's library crates, so depending on `fpt` alone is
//! enough; each crate can also be used on its own:
//!
//! - [`spec`]: the serde types that describe a run ([`spec::RunSpec`]) and the paper's tables.
//! - [`nn`]: candle ops with exact backward passes for training next to frozen weights.
//! - [`backbones`]: GPT-2, BERT (and MiniLM), T5's encoder, ViT, Longformer, Llama-family
//!   decoders (Llama, Mistral, Qwen2; SmolLM2 from a GGUF file) and the layer-norm LSTM
//!   baselines, from Hugging Face checkpoints or GGUF files (or random, statistics-only or
//!   Bit-pretrained init), input embeddings in.
//! - [`model`]: the FPT wrapper (input layer, frozen backbone, output layer, parameter roles).
//! - [`tasks`]: task datasets: Bit Memory, Bit XOR, ListOps, MNIST, Fashion-MNIST, CIFAR-10,
//!   CIFAR-10 LRA, remote homology, your own JSONL data, and text corpora for pretraining;
//!   each with its trivial baseline.
//! - [`train`]: the training loop, its run directory, per-example outcomes and the judgement
//!   against the trivial baseline, Bit pretraining, output-only training.
//! - [`ablate`]: the paper's tables and figures as data, run at a scale and reported beside
//!   the paper's numbers, with the paper's claims checked.
//!
//! ```no_run
//! use fpt::spec::{BackboneSpec, Init, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainSpec};
//! let backbone = BackboneSpec {
//!     shape: ShapeOverrides { layers: Some(4), hidden: Some(128), heads: Some(4), ..Default::default() },
//!     ..BackboneSpec::new("gpt2", Init::Random)
//! };
//! let spec = RunSpec {
//!     train: TrainSpec { steps: 4000, ..TrainSpec::default() },
//!     ..RunSpec::new(TaskSpec::new(TaskName::BitXor), backbone)
//! };
//! let result = fpt::train::train(&spec, "runs/xor".as_ref(), &fpt::candle_core::Device::Cpu, &mut |_| {})?;
//! println!("test accuracy {}", result.test_accuracy);
//! # Ok::<(), fpt::train::TrainError>(())
//! ```

/// candle, which the crates' APIs speak (`Device`, `Tensor`), so that `fpt` alone suffices.
pub use candle_core;
pub use fpt_ablate as ablate;
pub use fpt_backbones as backbones;
pub use fpt_model as model;
pub use fpt_nn as nn;
pub use fpt_spec as spec;
pub use fpt_tasks as tasks;
pub use fpt_train as train;

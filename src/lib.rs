//! fpt: frozen pretrained transformers as universal computation engines (Lu, Grover,
//! Abbeel and Mordatch, 2021), on candle.
//!
//! This facade re-exports the workspace's library crates, so depending on `fpt` alone is
//! enough; each crate can also be used on its own:
//!
//! - [`spec`]: the serde types that describe a run ([`spec::RunSpec`]).
//! - [`nn`]: candle ops with exact backward passes for training next to frozen weights.
//! - [`backbones`]: GPT-2 from Hugging Face checkpoints (or random init), input embeddings in.
//! - [`model`]: the FPT wrapper (input layer, frozen backbone, output layer, parameter roles).
//! - [`tasks`]: task datasets (bit XOR, bit memory).
//! - [`train`]: the training loop and its run directory.
//!
//! ```no_run
//! use fpt::spec::{BackboneSpec, Init, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainGroups, TrainSpec};
//! let spec = RunSpec {
//!     task: TaskSpec::new(TaskName::BitXor),
//!     backbone: BackboneSpec {
//!         source: "gpt2".into(),
//!         init: Init::Random,
//!         shape: ShapeOverrides { layers: Some(4), hidden: Some(128), heads: Some(4), ..Default::default() },
//!         residual_init: Default::default(),
//!         depth: None,
//!         final_norm: true,
//!         bit_pretrain: None,
//!     },
//!     train_groups: TrainGroups::fpt(),
//!     train: TrainSpec { steps: 4000, ..TrainSpec::default() },
//!     input_dropout: 0.1,
//!     orth_gain: 1.41,
//!     backbone_dropout: true,
//! };
//! let result = fpt::train::train(&spec, "runs/xor".as_ref(), &candle_core::Device::Cpu, &mut |_| {})?;
//! println!("test accuracy {}", result.test_accuracy);
//! # Ok::<(), fpt::train::TrainError>(())
//! ```

pub use fpt_ablate as ablate;
pub use fpt_backbones as backbones;
pub use fpt_model as model;
pub use fpt_nn as nn;
pub use fpt_spec as spec;
pub use fpt_tasks as tasks;
pub use fpt_train as train;

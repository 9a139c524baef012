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

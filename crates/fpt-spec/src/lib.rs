//! Serde types that describe an fpt run: which task, which backbone and how it is
//! initialised, which parameter groups train, and how the trainer runs.
//!
//! This crate has no candle dependency: the CLI, the trainer and (later) the ablation
//! harness all speak these types, and a [`RunSpec`] serialised to JSON is the effective
//! config saved next to every result. Names follow the paper (Lu et al. 2021, §2.2 and
//! App. C): `TrainGroups { input, output, layer_norm, positions, attention, feed_forward }`.
//!
//! One concept per module, every type re-exported at the crate root: `run` ([`RunSpec`],
//! its one constructor and validation), `task` ([`TaskSpec`]), `backbone` ([`BackboneSpec`],
//! [`Init`]), `groups` ([`TrainGroups`], [`Role`]), `schedule` ([`TrainSpec`],
//! [`LrSchedule`]), `error` ([`SpecError`]); [`table`] for the paper's tables as data,
//! [`files`] for hashing and atomic writes, [`limits`] for size limits on inputs.

pub mod files;
pub mod limits;
pub mod table;

mod backbone;
mod error;
mod groups;
mod run;
mod schedule;
mod task;

pub use backbone::*;
pub use error::*;
pub use groups::*;
pub use run::*;
pub use schedule::*;
pub use task::*;

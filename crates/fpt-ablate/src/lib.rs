//! The ablation harness: a table of the paper (`data/tables/<id>.toml`, see
//! [`fpt_spec::table`]) is expanded at a scale into one [`Cell`] per (row, column); each
//! runnable cell becomes a [`RunSpec`] whose hash names its run directory; missing runs are
//! trained; a report puts our number beside the paper's for every cell, with every backbone
//! substitution the scale made and every cell it could not run, and why.
//!
//! ```no_run
//! let dir = std::path::Path::new("data/tables");
//! let table = fpt_ablate::load_table(dir, "table2").unwrap();
//! let scales = fpt_ablate::load_scales(dir).unwrap();
//! let cells = fpt_ablate::expand(&table, &scales, "smoke").unwrap();
//! let out = std::path::Path::new("results");
//! fpt_ablate::run(&cells, out, &fpt_ablate::RunOptions::default(), &mut |line| eprintln!("{line}")).unwrap();
//! let report = fpt_ablate::Report::new(&table, "smoke", &cells, out);
//! report.write(out).unwrap();
//! ```

pub mod bootstrap;
pub mod campaign;
pub mod campaign_time;
pub mod chart;
pub mod claims;
pub mod compare;
pub mod convergence;
pub mod equal_budget;
mod expand;
pub mod figure;
pub mod figure_claims;
mod here;
pub mod paper;
pub mod precision;
pub mod record;
mod render;
pub mod report;
pub mod reproduce;
mod runner;
mod seeds;
pub mod site;
mod site_campaign;
mod site_html;
mod site_pages;
mod tables;
pub mod worker;

pub use expand::{at_scale, describe, expand, expand_unchecked, scale_of, spec_key, Cell, Counted, Plan};
pub use here::assets;
pub use report::Report;
pub(crate) use runner::run_one;
pub use runner::{command_for, run, run_dir, runs_of, CampaignOrder, RunOptions, Trained};
pub use tables::{list, load_scales, load_table};

use fpt_spec::table::{CellSettings, Metric, ScaleSettings, TableSpec};
use fpt_spec::{BackboneSpec, Init, ResidualInit, RunSpec, TaskSpec, TrainGroups, TrainSpec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Errors of the harness.
#[derive(Debug, thiserror::Error)]
pub enum AblateError {
    /// A table or scale file is malformed.
    #[error("{}: {msg}", path.display())]
    Spec {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A run failed.
    #[error(transparent)]
    Train(#[from] fpt_train::TrainError),
    /// A run panicked.
    #[error("{}: {msg}", dir.display())]
    Panicked {
        /// The run directory.
        dir: PathBuf,
        /// The panic's message.
        msg: String,
    },
    /// A run trained in a child process failed (see [`worker`]).
    #[error("{}: {msg}", dir.display())]
    Worker {
        /// The run directory.
        dir: PathBuf,
        /// Why.
        msg: String,
    },
    /// A request names something that does not exist (a table id, a scale) or asks for
    /// something impossible (no jobs).
    #[error("{0}")]
    Request(String),
    /// This build failed its self-check: no report is written from it.
    #[error("not writing {table}: this build failed its self-check ({summary}); run `fpt selfcheck` to see which")]
    SelfCheck {
        /// The table.
        table: String,
        /// The self-check's one-line summary.
        summary: String,
    },
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, AblateError>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> AblateError + '_ {
    move |source| AblateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

//! Errors from parsing spec values.

use crate::TaskName;

/// Errors from parsing spec values given as text (CLI flags, table files).
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A `--train` list named a group that does not exist.
    #[error("unknown parameter group `{0}` (expected a comma-separated list of: in, out, ln, pos, attn, ff, rec, last-attn, or `all` / `fpt` / `none`)")]
    UnknownGroup(String),
    /// An unknown task name.
    #[error("unknown task `{0}` (known tasks: {known})", known = TaskName::ALL.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(", "))]
    UnknownTask(String),
    /// An unknown init mode.
    #[error("unknown init `{0}` (expected `pretrained`, `random`, `stats-only` or `bit-pretrained`)")]
    UnknownInit(String),
    /// A value that is out of its valid range.
    #[error("invalid value for `{field}`: {msg}")]
    Invalid {
        /// The field (or flag) name.
        field: &'static str,
        /// What is wrong.
        msg: String,
    },
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, SpecError>;

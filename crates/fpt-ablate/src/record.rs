//! A run as reports and the results site read it ([`RunRecord`]): from its run directory
//! (`runs/<key>`: `spec.json`, `result.json`, `metrics.jsonl`, `outcomes.json`) or, where the
//! directory is not kept (a fresh clone: run directories stay local, see `.gitignore`), from
//! its record `records/<key>.json` beside the reports, which the site writes for every run a
//! report cites.

use crate::{io, AblateError, Result};
use fpt_train::outcomes::Outcomes;
use fpt_train::{EvalRecord, RunResult};
use std::path::{Path, PathBuf};

/// One run as reports and the site read it: its spec (as written), result, evaluations and
/// final per-example outcomes.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RunRecord {
    /// The run's key (its directory's name).
    pub key: String,
    /// `spec.json` as written.
    pub spec: serde_json::Value,
    /// `result.json`, when the run finished.
    pub result: Option<RunResult>,
    /// `metrics.jsonl`, one record per evaluation.
    pub evals: Vec<EvalRecord>,
    /// `outcomes.json`: the final evaluation's per-example outcomes (absent in runs made
    /// before fpt kept them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcomes: Option<Outcomes>,
}

impl RunRecord {
    /// Reads a run directory (`spec.json`, and `result.json` and `metrics.jsonl` where
    /// present); a file that is there but does not parse is an error naming it.
    pub fn from_dir(dir: &Path) -> Result<RunRecord> {
        let key = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| dir.display().to_string());
        let spec_path = dir.join("spec.json");
        let spec = parse_json(&spec_path, &read(&spec_path)?)?;
        let result_path = dir.join("result.json");
        let result = match read_optional(&result_path)? {
            // A result an earlier rule wrote that today's reopens (its run continues from its
            // checkpoint: `fpt_train::reopen_reason`) is no result: the run is unfinished.
            Some(text) => {
                let r = parse_json(&result_path, &text)?;
                fpt_train::finished_result(dir).is_some().then_some(r)
            }
            None => None,
        };
        let metrics_path = dir.join("metrics.jsonl");
        let mut evals = Vec::new();
        for (i, line) in read_optional(&metrics_path)?.unwrap_or_default().lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            evals.push(serde_json::from_str(line).map_err(|e| AblateError::Spec {
                path: metrics_path.clone(),
                msg: format!("line {}: not an evaluation record: {e}", i + 1),
            })?);
        }
        let outcomes_path = dir.join("outcomes.json");
        let outcomes = match read_optional(&outcomes_path)? {
            Some(text) => Some(parse_json(&outcomes_path, &text)?),
            None => None,
        };
        Ok(RunRecord {
            key,
            spec,
            result,
            evals,
            outcomes,
        })
    }

    /// The run `key` under the results directory `results`: its run directory when
    /// present, else its record (`records/<key>.json`); `None` when neither exists.
    pub fn load(results: &Path, key: &str) -> Result<Option<RunRecord>> {
        let dir = crate::run_dir(results, key);
        if dir.join("spec.json").is_file() {
            return RunRecord::from_dir(&dir).map(Some);
        }
        let path = record_path(results, key);
        match read_optional(&path)? {
            Some(text) => parse_json(&path, &text).map(Some),
            None => Ok(None),
        }
    }

    /// A short label: task, backbone, init and train groups.
    pub fn label(&self) -> String {
        match &self.result {
            Some(r) => format!(
                "{} / {} / {} / {}",
                r.task,
                short_backbone(&r.backbone),
                r.init,
                r.train_groups
            ),
            None => self.key.clone(),
        }
    }
}

fn short_backbone(b: &str) -> &str {
    b.rsplit('/').next().unwrap_or(b)
}

pub(crate) fn record_path(results: &Path, key: &str) -> PathBuf {
    results.join("records").join(format!("{key}.json"))
}

pub(crate) fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(io(path))
}

fn read_optional(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(AblateError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| AblateError::Spec {
        path: path.to_path_buf(),
        msg: format!("does not parse: {e}"),
    })
}

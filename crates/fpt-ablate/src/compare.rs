//! Two sets of finished runs, paired by order (seed i of one with seed i of the other), as
//! the table reports compare two cells: each run's accuracy, and the mean difference in
//! points with its 95% interval from the paired bootstrap over the held-out examples and
//! seeds ([`crate::bootstrap`]), read from each run's `outcomes.json`. What `fpt compare`
//! prints and the Python package's `fpt.compare` returns.

use crate::bootstrap::{mean_difference, Pair, REPLICATES};
use crate::{AblateError, Result};
use fpt_train::outcomes::Outcomes;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// One run of a comparison.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    /// The run directory.
    pub dir: PathBuf,
    /// Its seed (from `spec.json`), where readable.
    pub seed: Option<u64>,
    /// The step its outcomes were evaluated at.
    pub step: usize,
    /// Held-out examples evaluated.
    pub examples: usize,
    /// Accuracy in percent.
    pub accuracy: f64,
    /// Whether the run ended on a plateau (`result.json`'s `converged`): `false` for a run
    /// stopped at its cap while rising, whose accuracy is a lower bound; `None` where not
    /// recorded.
    pub converged: Option<bool>,
    /// Whether the run left its task's trivial baseline (`result.json`'s `baseline.left`);
    /// `None` where not recorded.
    pub left_baseline: Option<bool>,
}

/// The comparison of `runs` with `vs`.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The runs that should be ahead.
    pub runs: Vec<RunSummary>,
    /// The runs they are compared with.
    pub vs: Vec<RunSummary>,
    /// Mean difference runs - vs, in points.
    pub difference: f64,
    /// Its 95% interval.
    pub interval: [f64; 2],
    /// `ahead`, `behind` or `within the uncertainty`.
    pub verdict: &'static str,
    /// What the interval is over.
    pub over: String,
}

fn bad(msg: String) -> AblateError {
    AblateError::Request(msg)
}

fn read_run(dir: &Path) -> Result<(RunSummary, Outcomes)> {
    if !dir.is_dir() {
        return Err(bad(format!("{}: not a run directory", dir.display())));
    }
    let path = dir.join("outcomes.json");
    let text = std::fs::read_to_string(&path).map_err(|_| {
        bad(format!(
            "{}: no per-example outcomes (the run has not finished, or predates outcomes.json)",
            path.display()
        ))
    })?;
    let outcomes: Outcomes =
        serde_json::from_str(&text).map_err(|e| bad(format!("{}: not an outcomes file ({e})", path.display())))?;
    if outcomes.correct.is_empty() {
        return Err(bad(format!("{}: no evaluated examples", path.display())));
    }
    let json = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
    };
    let seed = json("spec.json").and_then(|v| v["train"]["seed"].as_u64());
    let result = json("result.json");
    let converged = result.as_ref().and_then(|v| v["converged"].as_bool());
    let left_baseline = result.as_ref().and_then(|v| v["baseline"]["left"].as_bool());
    let l = outcomes.labels_per_example.max(1) as f64;
    let accuracy =
        100.0 * outcomes.correct.iter().map(|&c| c as f64).sum::<f64>() / (l * outcomes.correct.len() as f64);
    let summary = RunSummary {
        dir: dir.to_path_buf(),
        seed,
        step: outcomes.step,
        examples: outcomes.correct.len(),
        accuracy,
        converged,
        left_baseline,
    };
    Ok((summary, outcomes))
}

/// Compares `runs` with `vs` (paired in order, one per seed); `seed_sd` (points) is the
/// task's seed-to-seed spread, added where each side ran one seed (0: the interval is over
/// the held-out examples only).
pub fn compare_runs(runs: &[PathBuf], vs: &[PathBuf], seed_sd: f64) -> Result<Comparison> {
    if runs.is_empty() || runs.len() != vs.len() {
        return Err(bad(format!(
            "{} runs against {} (vs): they pair up in order, one per seed, so the counts must match and not be 0",
            runs.len(),
            vs.len()
        )));
    }
    if !(seed_sd.is_finite() && seed_sd >= 0.0) {
        return Err(bad(format!(
            "seed spread {seed_sd}: must be a number of points, 0 or more"
        )));
    }
    let (ours, oa): (Vec<RunSummary>, Vec<Outcomes>) = runs
        .iter()
        .map(|d| read_run(d))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    let (theirs, ob): (Vec<RunSummary>, Vec<Outcomes>) = vs
        .iter()
        .map(|d| read_run(d))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    // Runs of different tasks, or pairs scored on different held-out examples, are not a
    // comparison: refused with both named, never given a verdict.
    let task_of = |d: &PathBuf| {
        std::fs::read_to_string(d.join("spec.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .map(|v| serde_json::to_string(&v["task"]).unwrap_or_default())
    };
    let all: Vec<&PathBuf> = runs.iter().chain(vs).collect();
    let first_task = task_of(all[0]);
    if let Some(other) = all.iter().skip(1).find(|d| task_of(d) != first_task) {
        return Err(bad(format!(
            "{} and {} are runs of different tasks ({} vs {}): refused, no verdict",
            all[0].display(),
            other.display(),
            first_task.unwrap_or_else(|| "no spec.json".into()),
            task_of(other).unwrap_or_else(|| "no spec.json".into())
        )));
    }
    if let Some(((a, b), _)) = ours
        .iter()
        .zip(&theirs)
        .zip(oa.iter().zip(&ob))
        .find(|(_, (x, y))| x.fingerprint != y.fingerprint || x.correct.len() != y.correct.len())
    {
        return Err(bad(format!(
            "{} and {} were scored on different held-out examples (split or fingerprint differ): refused, no verdict; pair runs of the same task and seed",
            a.dir.display(),
            b.dir.display()
        )));
    }
    let (difference, (lo, hi)) = mean_difference(&[Pair {
        a: &oa,
        b: &ob,
        seed_sd: if oa.len() == 1 { seed_sd } else { 0.0 },
    }]);
    let over = format!(
        "paired bootstrap over {} held-out examples{} and {} seed{}, {REPLICATES} replicates{}",
        oa[0].correct.len(),
        if oa[0].labels_per_example > 1 {
            format!(" ({} labels each)", oa[0].labels_per_example)
        } else {
            String::new()
        },
        oa.len(),
        if oa.len() == 1 { "" } else { "s" },
        if oa.len() == 1 && seed_sd > 0.0 {
            format!(", with the task's seed spread of {seed_sd} points")
        } else {
            String::new()
        }
    );
    let verdict = if lo > 0.0 {
        "ahead"
    } else if hi < 0.0 {
        "behind"
    } else {
        "within the uncertainty"
    };
    Ok(Comparison {
        runs: ours,
        vs: theirs,
        difference,
        interval: [lo, hi],
        verdict,
        over,
    })
}

/// Runs of one spec, one per seed (`fpt train --seeds`): each accuracy, their mean with the
/// 95% bootstrap interval over seeds and held-out examples, and the seeds' spread.
#[derive(Debug, Clone, Serialize)]
pub struct SeedSet {
    /// The runs.
    pub runs: Vec<RunSummary>,
    /// Mean accuracy in percent.
    pub mean: f64,
    /// Its 95% interval.
    pub interval: [f64; 2],
    /// The standard deviation of the runs' accuracies, in points (0 for one run).
    pub seed_sd: f64,
}

/// [`SeedSet`] of the finished runs in `dirs`.
pub fn summarize_seeds(dirs: &[PathBuf]) -> Result<SeedSet> {
    if dirs.is_empty() {
        return Err(bad("no runs to summarize".into()));
    }
    let (runs, outcomes): (Vec<RunSummary>, Vec<Outcomes>) = dirs
        .iter()
        .map(|d| read_run(d))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    let (mean, (lo, hi)) = crate::bootstrap::mean_accuracy(&outcomes);
    let n = runs.len() as f64;
    let m = runs.iter().map(|r| r.accuracy).sum::<f64>() / n;
    let seed_sd = if runs.len() > 1 {
        (runs.iter().map(|r| (r.accuracy - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    Ok(SeedSet {
        runs,
        mean,
        interval: [lo, hi],
        seed_sd,
    })
}

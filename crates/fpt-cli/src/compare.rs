//! `fpt compare`: two sets of finished runs, paired by order (seed i of one with seed i of
//! the other), as the table reports compare two cells: each run's accuracy, and the mean
//! difference in points with its 95% interval from the paired bootstrap over the held-out
//! examples and seeds (`fpt_ablate::bootstrap`), read from each run's `outcomes.json`.

use anyhow::{bail, Context, Result};
use fpt_ablate::bootstrap::{mean_difference, Pair, REPLICATES};
use fpt_train::outcomes::Outcomes;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct CompareArgs {
    /// Run directories of the model that should be ahead (one per seed).
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Run directories it is compared with, paired with the first ones in order (seed i with
    /// seed i).
    #[arg(long = "vs", required = true, num_args = 1..)]
    pub vs: Vec<PathBuf>,
    /// The task's spread across seeds (standard deviation, points), added where each side
    /// ran one seed, as the table reports do (`seed_spread` in data/tables/scales.toml);
    /// 0 leaves it out: the interval is then over the held-out examples only.
    #[arg(long, default_value_t = 0.0)]
    pub seed_sd: f64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

struct Run {
    dir: PathBuf,
    outcomes: Outcomes,
    seed: Option<u64>,
}

fn read_run(dir: &Path) -> Result<Run> {
    if !dir.is_dir() {
        bail!("{}: not a run directory", dir.display());
    }
    let path = dir.join("outcomes.json");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "{}: no per-example outcomes (the run has not finished, or predates outcomes.json)",
            path.display()
        )
    })?;
    let outcomes: Outcomes =
        serde_json::from_str(&text).with_context(|| format!("{}: not an outcomes file", path.display()))?;
    if outcomes.correct.is_empty() {
        bail!("{}: no evaluated examples", path.display());
    }
    let seed = std::fs::read_to_string(dir.join("spec.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["train"]["seed"].as_u64());
    Ok(Run {
        dir: dir.to_path_buf(),
        outcomes,
        seed,
    })
}

fn accuracy(o: &Outcomes) -> f64 {
    let l = o.labels_per_example.max(1) as f64;
    100.0 * o.correct.iter().map(|&c| c as f64).sum::<f64>() / (l * o.correct.len() as f64)
}

pub fn compare(a: CompareArgs) -> Result<()> {
    if a.runs.len() != a.vs.len() {
        bail!(
            "{} runs against {} (--vs): they pair up in order, one per seed, so the counts must match",
            a.runs.len(),
            a.vs.len()
        );
    }
    if !(a.seed_sd.is_finite() && a.seed_sd >= 0.0) {
        bail!("--seed-sd {}: must be a number of points, 0 or more", a.seed_sd);
    }
    let ours: Vec<Run> = a.runs.iter().map(|d| read_run(d)).collect::<Result<_>>()?;
    let theirs: Vec<Run> = a.vs.iter().map(|d| read_run(d)).collect::<Result<_>>()?;
    let mut unpaired = Vec::new();
    for (x, y) in ours.iter().zip(&theirs) {
        if x.outcomes.fingerprint != y.outcomes.fingerprint || x.outcomes.correct.len() != y.outcomes.correct.len() {
            unpaired.push(format!("{} and {}", x.dir.display(), y.dir.display()));
        }
    }
    let oa: Vec<Outcomes> = ours.iter().map(|r| r.outcomes.clone()).collect();
    let ob: Vec<Outcomes> = theirs.iter().map(|r| r.outcomes.clone()).collect();
    let (d, (lo, hi)) = mean_difference(&[Pair {
        a: &oa,
        b: &ob,
        seed_sd: if oa.len() == 1 { a.seed_sd } else { 0.0 },
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
        if oa.len() == 1 && a.seed_sd > 0.0 {
            format!(", with the task's seed spread of {} points", a.seed_sd)
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
    if a.json {
        let runs = |rs: &[Run]| -> Vec<serde_json::Value> {
            rs.iter()
                .map(|r| {
                    serde_json::json!({
                        "dir": r.dir.display().to_string(),
                        "seed": r.seed,
                        "step": r.outcomes.step,
                        "examples": r.outcomes.correct.len(),
                        "accuracy": accuracy(&r.outcomes),
                    })
                })
                .collect()
        };
        let v = serde_json::json!({
            "runs": runs(&ours),
            "vs": runs(&theirs),
            "difference": d,
            "interval": [lo, hi],
            "verdict": verdict,
            "over": over,
            "unpaired": unpaired,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let line = |r: &Run| {
        format!(
            "  {}{}: {:.1}% (step {}, {} examples)",
            r.dir.display(),
            r.seed.map_or(String::new(), |s| format!(" (seed {s})")),
            accuracy(&r.outcomes),
            r.outcomes.step,
            r.outcomes.correct.len()
        )
    };
    println!("runs:");
    ours.iter().for_each(|r| println!("{}", line(r)));
    println!("vs:");
    theirs.iter().for_each(|r| println!("{}", line(r)));
    for u in &unpaired {
        println!("note: {u} were evaluated on different examples: drawn apart, not paired");
    }
    println!("difference: {d:+.1} points, 95% interval {lo:+.1} to {hi:+.1} ({over}): {verdict}");
    Ok(())
}

//! Two rows at the same cost (issue 54, item 6): where a table's rows run until they
//! converge (their specs carry the paper's Table 6 counts, `converge_floor`), the report
//! shows, beside where each ended, the pair of rows at one step: the larger of their two
//! Table 6 counts, or the shorter run's last evaluation where it stopped (or is still
//! pending) before that. A reader then sees both "where each ended" and "at the same cost".
//!
//! Read from every run's evaluations (`metrics.jsonl`) in its run directory or its campaign
//! copy, pending runs included, seed by seed. The interval is a normal one from each
//! accuracy's binomial error on its evaluated examples (the per-example outcomes at that
//! step were not kept), widened to the seeds' spread of the differences where there are two
//! or more seeds.

use crate::{Cell, Plan};
use fpt_spec::table::TableSpec;
use fpt_spec::RunSpec;
use std::path::Path;

/// One column's pair of rows at one step.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EqualBudget {
    /// The column.
    pub col: String,
    /// The rows compared (`a` first).
    pub rows: (String, String),
    /// The step both are read at (the latest evaluation at or before it).
    pub step: usize,
    /// Why that step: `"the larger Table 6 count"` or `"the shorter run's last evaluation"`.
    pub why: String,
    /// Mean accuracy of each row at that step over the seeds (percent).
    pub accuracy: (f64, f64),
    /// `a - b` (points) and its 95% interval.
    pub difference: f64,
    /// Its interval.
    pub interval: (f64, f64),
    /// Seeds paired (both rows evaluated).
    pub seeds: usize,
}

/// One evaluation: step, accuracy and the examples it scored (where known).
type Eval = (usize, f64, Option<usize>);

/// How many examples the evaluation at `step` of the run in `dir` scored, for a metrics line
/// written before fpt recorded it: the spec's `eval_examples` as it stood then (a line of
/// the run's `respec.jsonl` at or after the step gives its value before the change); where
/// that is the whole split, the run's latest outcomes (`outcomes.json`, one entry an
/// example) give its size; `None` where nothing does.
fn examples_then(dir: &Path, spec: &RunSpec, step: usize) -> Option<usize> {
    let before_change = std::fs::read_to_string(dir.join("respec.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<fpt_train::Respec>(l).ok())
        .filter(|r| r.step >= step)
        .find_map(|r| {
            r.changes.iter().find_map(|c| {
                let old = c.strip_prefix("task.eval_examples: ")?.split(" -> ").next()?;
                old.trim().parse::<usize>().ok()
            })
        });
    match before_change.unwrap_or(spec.task.eval_examples) {
        0 => std::fs::read_to_string(dir.join("outcomes.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<fpt_train::outcomes::Outcomes>(&t).ok())
            .map(|o| o.correct.len())
            .filter(|&n| n > 0),
        n => Some(n),
    }
}

/// A run's evaluations from its run directory or its campaign copy, whichever has more.
fn evals(out: &Path, key: &str, spec: &RunSpec) -> Vec<Eval> {
    let read = |dir: &Path| -> Vec<Eval> {
        std::fs::read_to_string(dir.join("metrics.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<fpt_train::EvalRecord>(l).ok())
            .map(|e| {
                (
                    e.step,
                    e.test_accuracy,
                    e.examples.or_else(|| examples_then(dir, spec, e.step)),
                )
            })
            .collect()
    };
    let (a, b) = (
        read(&crate::run_dir(out, key)),
        read(&crate::campaign::saved_root(out).join(key)),
    );
    if a.len() >= b.len() {
        a
    } else {
        b
    }
}

/// The runs of a cell, seed order, with their specs.
fn runs(c: &Cell) -> Vec<(String, RunSpec)> {
    let Plan::Run { key, spec } = &c.plan else {
        return Vec::new();
    };
    std::iter::once((key.clone(), (**spec).clone()))
        .chain(c.replicas.iter().map(|(k, s)| (k.clone(), (**s).clone())))
        .collect()
}

/// The equal-budget pairs of a table at a scale: the first two rows whose runs carry
/// Table 6 counts, column by column, where both have evaluations.
pub fn compute(table: &TableSpec, cells: &[Cell], out: &Path) -> Vec<EqualBudget> {
    let floored = |c: &Cell| runs(c).first().is_some_and(|(_, s)| s.train.converge_floor.is_some());
    let mut rows: Vec<usize> = Vec::new();
    for c in cells {
        if floored(c) && !rows.contains(&c.row) {
            rows.push(c.row);
        }
    }
    rows.sort();
    let [ra, rb, ..] = rows[..] else {
        return Vec::new();
    };
    let mut pairs = Vec::new();
    for col in 0..table.cols.len() {
        let find = |r: usize| cells.iter().find(|c| c.row == r && c.col == col && floored(c));
        let (Some(ca), Some(cb)) = (find(ra), find(rb)) else {
            continue;
        };
        let (runs_a, runs_b) = (runs(ca), runs(cb));
        let floor = |rs: &[(String, RunSpec)]| rs[0].1.train.converge_floor.unwrap_or(0);
        let budget = floor(&runs_a).max(floor(&runs_b));
        // Seed by seed: (a, b, se_a, se_b) at the step, and the step used.
        let mut per_seed = Vec::new();
        let mut step = budget;
        for ((ka, sa), (kb, sb)) in runs_a.iter().zip(&runs_b) {
            let (ea, eb) = (evals(out, ka, sa), evals(out, kb, sb));
            let (Some(la), Some(lb)) = (ea.last(), eb.last()) else {
                continue;
            };
            step = step.min(la.0).min(lb.0);
            per_seed.push((ea, eb));
        }
        if per_seed.is_empty() {
            continue;
        }
        let at = |e: &[Eval]| e.iter().rev().find(|p| p.0 <= step).copied();
        let se = |p: f64, n: usize| (p * (1.0 - p) / n.max(1) as f64).sqrt();
        let mut vals = Vec::new();
        for (ea, eb) in &per_seed {
            // A seed whose evaluation at the step scored an unknown number of examples (the
            // whole split, before fpt recorded the count) gives no interval: left out.
            if let (Some((_, a, Some(na))), Some((_, b, Some(nb)))) = (at(ea), at(eb)) {
                vals.push((a, b, se(a, na), se(b, nb)));
            }
        }
        if vals.is_empty() {
            continue;
        }
        let k = vals.len() as f64;
        let a = vals.iter().map(|v| v.0).sum::<f64>() / k;
        let b = vals.iter().map(|v| v.1).sum::<f64>() / k;
        let d = a - b;
        let mut se_d = vals.iter().map(|v| v.2 * v.2 + v.3 * v.3).sum::<f64>().sqrt() / k;
        if vals.len() >= 2 {
            let sd = (vals.iter().map(|v| (v.0 - v.1 - d).powi(2)).sum::<f64>() / (k - 1.0)).sqrt();
            se_d = se_d.max(sd / k.sqrt());
        }
        pairs.push(EqualBudget {
            col: table.cols[col].label.clone(),
            rows: (table.rows[ra].label.clone(), table.rows[rb].label.clone()),
            step,
            why: if step == budget {
                "the larger Table 6 count".into()
            } else {
                "the shorter run's last evaluation".into()
            },
            accuracy: (100.0 * a, 100.0 * b),
            difference: 100.0 * d,
            interval: (100.0 * (d - 1.96 * se_d), 100.0 * (d + 1.96 * se_d)),
            seeds: vals.len(),
        });
    }
    pairs
}

/// The pairs as a Markdown section (empty where there are none).
pub fn markdown(pairs: &[EqualBudget]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let (a, b) = &pairs[0].rows;
    let mut s = format!(
        "\n## At the same step\n\nWhere each cell ended is above; here the {a} and {b} runs are read at one step: the larger of their rows' Table 6 counts, or the shorter run's last evaluation where it has not reached it (pending runs included). Accuracy at the latest evaluation at or before that step, the mean over the seeds both rows evaluated; the interval is a normal one from each accuracy's binomial error (per-example outcomes at that step were not kept), widened to the seeds' spread of the difference where there are two or more.\n\n| column | step | why | {a} | {b} | {a} - {b} (95% interval) | seeds |\n|---|---|---|---|---|---|---|\n"
    );
    for p in pairs {
        s.push_str(&format!(
            "| {} | {} | {} | {:.1}% | {:.1}% | {:+.1} ({:+.1} to {:+.1}) | {} |\n",
            p.col, p.step, p.why, p.accuracy.0, p.accuracy.1, p.difference, p.interval.0, p.interval.1, p.seeds
        ));
    }
    s
}

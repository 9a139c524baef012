//! A table in bf16 beside the same table in f32 (`fpt run-table --precision bf16`).
//!
//! [`apply`] turns every run of a table's cells into its `precision: bf16` twin (same
//! settings and seed, the frozen weight matrices stored in bf16), noting it on each cell;
//! cells whose backbone has no bf16 path (the LSTM) or no frozen weight matrix (every weight
//! trained) keep their f32 run and say why. The report goes to `<table>/<scale>-bf16/`.
//! [`compare`] then sets each bf16 cell beside its f32 twin (the same spec in f32, trained
//! by the f32 table, read from its run directory or its kept record): the accuracy
//! difference with a 95% paired bootstrap interval over the held-out examples (both runs
//! evaluated the same examples), and whether the f32 number lies within that uncertainty.

use crate::bootstrap::{mean_difference, Pair};
use crate::expand::{Cell, Plan};
use crate::{AblateError, Result};
use fpt_spec::table::TableSpec;
use fpt_spec::{Precision, RunSpec};
use std::path::Path;

/// The directory name of a scale's reports in `precision` (`cpu`, `cpu-bf16`).
pub fn scale_label(scale: &str, precision: Precision) -> String {
    match precision {
        Precision::F32 => scale.to_string(),
        p => format!("{scale}-{p}"),
    }
}

/// Why `spec` keeps f32 under `--precision bf16`, if it does.
fn stays_f32(spec: &RunSpec) -> Option<String> {
    let g = &spec.train_groups;
    if g.attention && g.feed_forward {
        return Some("f32: every weight matrix of this run trains, so none is frozen to store in bf16".into());
    }
    match fpt_backbones::param_specs(&spec.backbone) {
        Ok((config, _)) if config.architecture() == "lstm" => {
            Some("f32: the LSTM backbone has no bf16 path (its recurrent products run in f32)".into())
        }
        Ok(_) => None,
        Err(e) => Some(format!(
            "f32: the backbone could not be resolved to check for a bf16 path ({e})"
        )),
    }
}

/// Sets `precision` on every run of `cells` (and their seed replicas) that can run in it,
/// re-keying them, and notes on each cell which precision its runs use.
pub fn apply(cells: &mut [Cell], precision: Precision) {
    if precision.is_f32() {
        return;
    }
    for c in cells.iter_mut() {
        let Plan::Run { spec, key } = &mut c.plan else { continue };
        match stays_f32(spec) {
            Some(why) => c.notes.push(why),
            None => {
                spec.backbone.precision = precision;
                *key = spec.key();
                for (k, s) in c.replicas.iter_mut() {
                    s.backbone.precision = precision;
                    *k = s.key();
                }
                c.notes.push(format!(
                    "{precision}: frozen weight matrices stored in {precision}, their products with {precision} operands and f32 sums (trained parameters, norms, softmax, loss and optimizer f32)"
                ));
            }
        }
    }
}

/// One bf16 cell beside its f32 twin.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CellComparison {
    /// Row label.
    pub row: String,
    /// Column label.
    pub col: String,
    /// The bf16 run's key.
    pub bf16_run: String,
    /// The f32 twin's key.
    pub f32_run: String,
    /// Test accuracy of each (0..1), where the run is there.
    pub bf16: Option<f64>,
    /// The f32 twin's.
    pub f32: Option<f64>,
    /// bf16 minus f32, in points, with its 95% paired bootstrap interval over the held-out
    /// examples (where both runs kept their per-example outcomes).
    pub difference: Option<(f64, (f64, f64))>,
    /// `within` (the interval holds 0), `differs` (with why, where the seed spread explains
    /// it), or why there is no verdict.
    pub verdict: String,
    /// The task's measured seed spread at the scale (points), where known.
    pub seed_sd: Option<f64>,
    /// Whether each run left its task's trivial baseline (bf16, f32), where judged.
    pub left_baseline: (Option<bool>, Option<bool>),
}

/// Every bf16 run of `cells` beside its f32 twin, read from `out` (run directories, else
/// the kept records); writes `precision.json` and `precision.md` into `dir` (the bf16
/// report's directory) and returns the comparisons.
pub fn compare(table: &TableSpec, cells: &[Cell], out: &Path, dir: &Path) -> Result<Vec<CellComparison>> {
    let mut rows = Vec::new();
    for c in cells {
        let Plan::Run { spec, key } = &c.plan else { continue };
        if spec.backbone.precision.is_f32() {
            continue;
        }
        let mut twin = (**spec).clone();
        twin.backbone.precision = Precision::F32;
        let f32_key = twin.key();
        let load = |k: &str| {
            crate::record::RunRecord::load(out, k)
                .ok()
                .flatten()
                .filter(|r| r.result.is_some())
        };
        let (b, f) = (load(key), load(&f32_key));
        let acc =
            |r: &Option<crate::record::RunRecord>| r.as_ref().and_then(|r| r.result.as_ref()).map(|x| x.test_accuracy);
        let left = |r: &Option<crate::record::RunRecord>| {
            r.as_ref()
                .and_then(|r| r.result.as_ref())
                .and_then(|x| x.baseline.as_ref())
                .map(|x| x.left)
        };
        let (difference, verdict) = match (&b, &f) {
            (None, _) => (None, "no bf16 run yet".to_string()),
            (_, None) => (
                None,
                "no f32 run of the same settings (run the table in f32 first)".to_string(),
            ),
            (Some(rb), Some(rf)) => match (&rb.outcomes, &rf.outcomes) {
                (Some(ob), Some(of)) if ob.fingerprint == of.fingerprint => {
                    let (d, ci) = mean_difference(&[Pair {
                        a: std::slice::from_ref(ob),
                        b: std::slice::from_ref(of),
                        seed_sd: 0.0,
                    }]);
                    let v = if ci.0 <= 0.0 && 0.0 <= ci.1 {
                        "within".to_string()
                    } else {
                        match c.seed_sd {
                            Some(sd) if d.abs() <= sd => format!(
                                "differs (over the held-out examples; by less than the task's seed spread, {sd:.1} points, as another seed would)"
                            ),
                            _ => "differs".to_string(),
                        }
                    };
                    (Some((d, ci)), v)
                }
                (Some(_), Some(_)) => (None, "evaluated on different examples: not paired".to_string()),
                _ => (None, "a run kept no per-example outcomes".to_string()),
            },
        };
        rows.push(CellComparison {
            row: table.rows[c.row].label.clone(),
            col: table.cols[c.col].label.clone(),
            bf16_run: key.clone(),
            f32_run: f32_key,
            bf16: acc(&b),
            f32: acc(&f),
            difference,
            verdict,
            seed_sd: c.seed_sd,
            left_baseline: (left(&b), left(&f)),
        });
    }
    let write = |name: &str, text: String| -> Result<()> {
        let path = dir.join(name);
        fpt_spec::files::write_atomic(&path, text.as_bytes()).map_err(|source| AblateError::Io { path, source })
    };
    write(
        "precision.json",
        serde_json::to_string_pretty(&rows).expect("serializable") + "\n",
    )?;
    write("precision.md", markdown(table, &rows))?;
    Ok(rows)
}

fn markdown(table: &TableSpec, rows: &[CellComparison]) -> String {
    let pct = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.1}", 100.0 * v));
    let yes = |x: Option<bool>| match x {
        Some(true) => "left",
        Some(false) => "at baseline",
        None => "?",
    };
    let mut s = format!(
        "# {}: bf16 beside f32\n\nEach cell's run with its frozen weight matrices in bf16 beside the same run in f32 (same settings, seed and held-out examples). Difference: bf16 minus f32 in points, with its 95% paired bootstrap interval over the held-out examples; `within` when the interval holds 0. A single seed: a difference outside that interval can still be the trajectory's sensitivity to any perturbation (a different seed moves a cell by the task's seed spread, given where measured).\n\n| cell | bf16 | f32 | bf16 - f32 (95% interval) | verdict | seed spread | baseline (bf16 / f32) |\n|---|---|---|---|---|---|---|\n",
        table.id
    );
    for r in rows {
        let d = r
            .difference
            .map_or("-".to_string(), |(d, (lo, hi))| format!("{d:+.1} [{lo:+.1}, {hi:+.1}]"));
        s.push_str(&format!(
            "| {} / {} | {} | {} | {d} | **{}** | {} | {} / {} |\n",
            r.row,
            r.col,
            pct(r.bf16),
            pct(r.f32),
            r.verdict,
            r.seed_sd.map_or("-".to_string(), |x| format!("{x:.1}")),
            yes(r.left_baseline.0),
            yes(r.left_baseline.1),
        ));
    }
    // Only cells that learned something say anything: two runs at their trivial baseline
    // agree whatever the arithmetic.
    let learned: Vec<&CellComparison> = rows
        .iter()
        .filter(|r| r.left_baseline == (Some(true), Some(true)))
        .collect();
    let within = learned.iter().filter(|r| r.verdict == "within").count();
    let differs = learned.iter().filter(|r| r.verdict.starts_with("differs")).count();
    s.push_str(&format!(
        "\nOf the {} cells whose bf16 and f32 runs both left their task's trivial baseline, {within} are within their uncertainty of the f32 number and {differs} outside it; the other {} (a run at its baseline, or no verdict) show nothing either way.\n",
        learned.len(),
        rows.len() - learned.len()
    ));
    s
}

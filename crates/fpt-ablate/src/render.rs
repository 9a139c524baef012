//! A report as Markdown (`report.md`: the grid, the claims with their verdicts, the
//! substitutions, the differences from the paper, every cell) and as CSV (`report.csv`).

use crate::command_for;
use crate::report::{CellReport, Report};
use fpt_spec::table::Metric;
use std::path::Path;

impl Report {
    pub(crate) fn fmt(v: f64, metric: Metric) -> String {
        match metric {
            Metric::TestAccuracy | Metric::TrainAccuracy => format!("{v:.1}%"),
            Metric::StepsToConvergence => format!("{v:.0}"),
            Metric::Speedup => format!("{v:.0}×"),
            Metric::ParamsTotal | Metric::ParamsTrained | Metric::ParamsTrainedUsed => {
                if v >= 1e6 {
                    format!("{:.1}M", v / 1e6)
                } else {
                    format!("{:.1}K", v / 1e3)
                }
            }
            Metric::PaperOnly | Metric::ConfigLayers | Metric::ConfigHidden | Metric::ConfigHeads => format!("{v}"),
        }
    }

    /// The cell as shown in the grid: ours, then the paper's.
    fn grid_cell(c: &CellReport) -> String {
        let ours = match (c.ours, c.status.as_str()) {
            (Some(v), _) => Self::fmt(v, c.metric),
            (None, "ran") => "n/c".into(),
            (None, "paper-only") => "·".into(),
            (None, "unavailable") => "n/a".into(),
            (None, "not-in-paper") => "-".into(),
            (None, s) => s.to_string(),
        };
        let dagger = if c.diverged.is_some() { " [†]" } else { "" };
        let spread = c.seeds.as_ref().map_or(String::new(), |s| format!(" [{}]", s.label()));
        // Significantly below its baseline is said as such (not "at" it).
        let base = match &c.at_baseline {
            Some(_) if c.ended_at_baseline.is_some() => " [ended at baseline]",
            Some(why) if why.contains(" is below the baseline") => " [below baseline]",
            Some(_) => " [at baseline]",
            None => "",
        };
        let unfit = if c.unfit.is_some() { " [unfit]" } else { "" };
        // Every run not converged ended at its cap still rising: the number is a lower bound
        // of where the cell would end. (A run that evaluated once, or diverged, showed no
        // plateau either way.)
        let (ge, rising) = match (c.converged, c.ours.is_some(), c.metric) {
            (Some(false), true, Metric::TestAccuracy | Metric::TrainAccuracy) if c.lower_bound => ("≥", " [rising]"),
            (Some(false), true, Metric::TestAccuracy | Metric::TrainAccuracy) => ("", " [not converged]"),
            _ => ("", ""),
        };
        format!("{ge}{ours}{spread}{dagger}{base}{unfit}{rising} ({})", c.paper_text)
    }

    /// The report as Markdown.
    pub fn markdown(&self, out: &Path) -> String {
        let p = &self.provenance;
        let mut s = format!(
            "# {}: {} (scale `{}`)\n\n> {}\n\nMachine: {}. Report written by the {} build of {} on the {} kernel path; `fpt selfcheck` {}.\n",
            self.id,
            self.title,
            self.scale,
            self.caption,
            self.machine,
            p.profile,
            p.commit,
            p.kernel_path,
            if p.selfcheck.passed { "passed" } else { "FAILED" },
        );
        for (origin, n) in &self.runs_from {
            s.push_str(&format!(
                "Runs of {n} cell{}: {origin}.\n",
                if *n == 1 { "" } else { "s" }
            ));
        }
        s.push_str("\nEach cell: **ours** (paper). `n/a`: cannot run here (see below); `·`: the paper's number only; `-`: not run in the paper; `(n/p)`: a row the paper's table does not print (the critics' rows, whose claims are not the paper's; Table 6's Bit and ViT rows, of which the paper speaks in its text); `pending`: not run yet; `n/c`: did not converge; `invalid`: its run failed its self-check; `[†]`: training diverged, the number is the best before divergence; `[at baseline]`: its runs did not leave the task's trivial baseline (chance, the majority class of the evaluated split, Bit Memory's copy of the visible bits: see the cell's row below; a step count's run, not by more than the tolerance that defines its convergence), so it is no evidence that the model learned, and no claim rests on it; `[below baseline]`: the same, significantly below it; `[ended at baseline]`: its runs ended there (at the baseline and not rising across the last half of their steps, past the row's Table 6 count: flat there, or never below the trivial predictor's training loss): as the model that did not learn, it is the side to be beaten in a claim that another model beats it; `≥ ... [rising]`: its runs that did not converge ended at their step cap still rising (the trend of the last half of their steps: see the cell's row below), so the number is a lower bound, and decides a claim only the way a lower bound can (that it beats another cell, or that another cell does not beat it); `[not converged]`: its runs are not converged by the rule (not yet flat, stopped before the row's Table 6 count, evaluated fewer than three times, or diverged); only converged cells and lower bounds decide a claim; `[unfit]`: the cell's model is not what its row names (a Bit backbone that did not learn Bit Memory), so no claim rests on it.\n\n");
        let ran = self.cells.iter().filter(|c| c.status == "ran").count();
        let at = self.cells.iter().filter(|c| c.at_baseline.is_some()).count();
        if ran > 0 {
            s.push_str(&format!(
                "Of the {ran} cells with runs, {} left their task's trivial baseline and {at} did not.\n\n",
                self.cells
                    .iter()
                    .filter(|c| c.status == "ran" && c.baseline.is_some() && c.at_baseline.is_none())
                    .count()
            ));
        }
        s.push_str(&format!(
            "| | {} |\n|---|{}\n",
            self.cols.join(" | "),
            "---|".repeat(self.cols.len())
        ));
        for (i, row) in self.rows.iter().enumerate() {
            let cells: Vec<String> = self.cells[i * self.cols.len()..(i + 1) * self.cols.len()]
                .iter()
                .map(Self::grid_cell)
                .collect();
            s.push_str(&format!("| {row} | {} |\n", cells.join(" | ")));
        }
        s.push_str(&crate::equal_budget::markdown(&self.equal_budget));
        if !self.claims.is_empty() {
            s.push_str("\n## The paper's claims\n\nVerdict on our numbers, and on the paper's. `holds` / `fails`: the 95% interval of the comparison lies wholly on one side of what the claim needs; `inconclusive`: it straddles it (more examples, evaluations or seeds would be needed); `undecided`: no pair of cells can decide it; `not run`: no pair has numbers. A pair is left out and named when a cell is at its trivial baseline, when a cell on either side is not converged by the rule (not yet flat across the last half of its run, or stopped before its row's Table 6 count) or its convergence cannot be known, when both cells are at the task's ceiling, or when both ran one seed (a cell against a number: that cell) and no seed spread was measured for the backbone and task. The interval is a paired bootstrap over the held-out examples and seeds where every run kept its per-example outcomes (else a normal interval from each cell's binomial error, or its seeds' spread), widened by the task's measured seed spread where a pair ran one seed each. A cell whose runs ended at their step cap still rising is a lower bound of where it ends: on the side that must win it can make a claim hold, never fail (`at least`); on the side to be beaten, fail, never hold (`at most`).\n\n| claim | ours | decided by | paper |\n|---|---|---|---|\n");
            for c in &self.claims {
                s.push_str(&format!(
                    "| {} | **{}** | {} | {} ({}) |\n",
                    c.text.replace('|', "\\|"),
                    c.ours.verdict,
                    c.ours.detail.replace('|', "\\|"),
                    c.paper.verdict,
                    c.paper.detail.replace('|', "\\|")
                ));
            }
        }
        let mut subs: Vec<String> = self.cells.iter().flat_map(|c| c.notes.iter().cloned()).collect();
        subs.sort();
        subs.dedup();
        if !subs.is_empty() {
            s.push_str("\n## Substitutions at this scale\n\n");
            for n in subs {
                s.push_str(&format!("- {n}\n"));
            }
        }
        // What every cell that has differences shares is said once; each cell lists the rest.
        let with: Vec<&CellReport> = self.cells.iter().filter(|c| !c.differs.is_empty()).collect();
        let common: Vec<String> = match with.first() {
            Some(first) if with.len() > 1 => first
                .differs
                .iter()
                .filter(|d| with.iter().all(|c| c.differs.contains(d)))
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        if !common.is_empty() {
            s.push_str("\n## Where every cell below differs from the paper\n\n");
            for d in &common {
                s.push_str(&format!("- {d}\n"));
            }
        }
        s.push_str("\n## Cells\n\n| row | column | ours | baseline | paper | ours - paper | status | steps | seconds | why / run | differs from the paper (besides the above) |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
        for c in &self.cells {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                c.row,
                c.col,
                c.ours.map(|v| Self::fmt(v, c.metric)).unwrap_or_else(|| "-".into()),
                c.baseline.map(|b| format!("{b:.1}%")).unwrap_or_else(|| "-".into()),
                c.paper_text,
                c.diff
                    .map(|d| match c.metric {
                        Metric::TestAccuracy | Metric::TrainAccuracy => format!("{d:+.1}"),
                        m => format!("{}{}", if d < 0.0 { "-" } else { "+" }, Self::fmt(d.abs(), m)),
                    })
                    .unwrap_or_else(|| "-".into()),
                if c.at_baseline.is_some() {
                    "ran, at baseline"
                } else {
                    c.status.as_str()
                },
                c.steps.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
                c.seconds.map(|v| format!("{v:.0}")).unwrap_or_else(|| "-".into()),
                [
                    c.why.clone(),
                    c.at_baseline.as_ref().map(|b| format!("at baseline: {b}")),
                    c.ended_at_baseline.clone(),
                    c.unfit.clone(),
                    c.diverged.clone(),
                    c.curve.clone().map(|k| format!("curve {k}")),
                    c.run.clone(),
                    c.seeds.as_ref().map(|s| format!(
                        "seeds {}: {}; the other seeds' runs: {}",
                        s.label(),
                        s.values
                            .iter()
                            .map(|v| Self::fmt(*v, c.metric))
                            .collect::<Vec<_>>()
                            .join(", "),
                        s.other_runs.join(", ")
                    )),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join("; ")
                .replace('|', "\\|"),
                c.differs
                    .iter()
                    .filter(|d| !common.contains(d))
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
                    .replace('|', "\\|")
            ));
        }
        if !self.notes.is_empty() {
            s.push_str("\n## Notes\n\n");
            for n in &self.notes {
                s.push_str(&format!("- {n}\n"));
            }
        }
        let keys: Vec<&String> = self.cells.iter().filter_map(|c| c.run.as_ref()).collect();
        if let Some(first) = keys.first() {
            let key = Path::new(first).file_name().and_then(|k| k.to_str()).unwrap_or("");
            s.push_str(&format!(
                "\n## Reproducing one cell\n\nEvery run directory holds its `spec.json`; e.g. `{}`.\nThe whole table: `cargo xtask reproduce {} --scale {}`.\n",
                command_for(out, key),
                self.id,
                self.scale
            ));
        }
        s
    }

    /// The cells as CSV.
    pub fn csv(&self) -> String {
        let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
        let mut s =
            "row,column,metric,ours,paper,paper_text,diff,status,why,notes,run,seconds,diverged,curve,differs,seeds,baseline,at_baseline\n"
                .to_string();
        let num = |v: Option<f64>| v.map(|v| format!("{v}")).unwrap_or_default();
        for c in &self.cells {
            s.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                q(&c.row),
                q(&c.col),
                serde_json::to_value(c.metric)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                num(c.ours),
                num(c.paper),
                q(&c.paper_text),
                num(c.diff),
                c.status,
                q(c.why.as_deref().unwrap_or("")),
                q(&c.notes.join("; ")),
                q(c.run.as_deref().unwrap_or("")),
                num(c.seconds),
                q(c.diverged.as_deref().unwrap_or("")),
                q(c.curve.as_deref().unwrap_or("")),
                q(&c.differs.join("; ")),
                q(&c.seeds.as_ref().map_or(String::new(), |s| s
                    .values
                    .iter()
                    .map(|v| format!("{v}"))
                    .collect::<Vec<_>>()
                    .join("; "))),
                num(c.baseline),
                q(c.at_baseline.as_deref().unwrap_or(""))
            ));
        }
        s
    }
}

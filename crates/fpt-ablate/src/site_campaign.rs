//! The campaign's page of the results site (`site/campaign.html`, issue 54 item 8): every
//! run kept under `results/campaign/`, with its state as `fpt run-table --status` reads it
//! (done from a result that stands, else pending at its checkpoint's step, or damaged), the
//! rule's call, its floor (the paper's Table 6 count) and where each stretch ran; and per
//! task, the runs' held-out accuracy against the step on a log scale, the floors marked.

use crate::chart::{esc, xy_svg};
use crate::site_html::page;
use std::fmt::Write as _;
use std::path::Path;

/// One campaign run as the page shows it.
struct Row {
    key: String,
    task: String,
    what: String,
    state: String,
    call: String,
    floor: Option<usize>,
    cap: usize,
    evals: Vec<(usize, f64)>,
    stretches: Vec<fpt_train::Segment>,
    /// Its evaluations' share of its time ([`crate::campaign_time::eval_time`]).
    eval_time: Option<crate::campaign_time::EvalShare>,
}

/// The row label of a run, as Table 2 names its rows (the critics' by their shape: no
/// block, or one attention-only block).
fn row_of(spec: &fpt_spec::RunSpec) -> &'static str {
    if spec.backbone.depth == Some(0) {
        return "w/o LLM";
    }
    if spec.backbone.shape.attention_only == Some(true) {
        return "LLM2Attn";
    }
    match spec.backbone.init {
        fpt_spec::Init::Pretrained => "FPT",
        fpt_spec::Init::Random => "Random",
        fpt_spec::Init::BitPretrained => "Bit",
        _ => "other",
    }
}

fn read_row(dir: &Path) -> Option<Row> {
    let spec = fpt_train::saved_spec(dir).ok()?;
    let key = dir.file_name()?.to_string_lossy().into_owned();
    let evals: Vec<(usize, f64)> = std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<fpt_train::EvalRecord>(l).ok())
        .map(|e| (e.step, e.test_accuracy))
        .collect();
    let stretches = std::fs::read_to_string(dir.join("history.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let (state, call) = match crate::campaign::progress(dir) {
        Err(e) => ("DAMAGED".to_string(), e),
        Ok(Some((true, step))) => {
            let r = fpt_train::finished_result(dir)?;
            let call = if r.ended_at_baseline_now() {
                format!("ended at baseline after {step} steps")
            } else if r.converged == Some(true) {
                let ceiling = r.plateau.as_ref().is_some_and(|p| p.ceiling == Some(true));
                format!(
                    "converged at {step} ({:.1}%{})",
                    100.0 * r.test_accuracy,
                    if ceiling { ", at its ceiling" } else { "" }
                )
            } else if r.diverged {
                "diverged".into()
            } else {
                format!(
                    "ended at its cap, {}",
                    r.plateau.as_ref().map_or("not converged", |p| p.call())
                )
            };
            ("done".to_string(), call)
        }
        Ok(Some((false, step))) => {
            let reopened = std::fs::read_to_string(dir.join("result.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<fpt_train::RunResult>(&t).ok())
                .and_then(|r| fpt_train::reopen_reason(&r, &spec));
            (
                format!("pending (step {step})"),
                match (reopened, fpt_train::pending_call(dir)) {
                    (Some(_), _) => "reopened: an earlier rule stopped it; training on".into(),
                    (None, Some(c)) => format!("resumes from its checkpoint; now {}", c.describe()),
                    (None, None) => "resumes from its checkpoint".into(),
                },
            )
        }
        Ok(None) => ("not started".to_string(), String::new()),
    };
    Some(Row {
        what: format!("{} / {}, seed {}", row_of(&spec), spec.task.label(), spec.train.seed),
        task: spec.task.label(),
        key,
        state,
        call,
        floor: spec.train.converge_floor,
        cap: spec.train.steps,
        evals,
        stretches,
        eval_time: crate::campaign_time::eval_time(dir),
    })
}

/// The page, or `None` where `results` has no campaign.
pub(crate) fn campaign_page(results: &Path) -> Option<String> {
    let root = crate::campaign::saved_root(results);
    let mut rows: Vec<Row> = std::fs::read_dir(&root)
        .ok()?
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| read_row(&e.path()))
        .collect();
    if rows.is_empty() {
        return None;
    }
    rows.sort_by(|a, b| (&a.task, &a.what).cmp(&(&b.task, &b.what)));
    let mut b = String::from(
        "<p><a href=\"../index.html\">all tables</a></p>\n<h1>The converge campaign</h1>\n<p>Table 2's runs trained until they converge (docs/campaign.md): each run's state as <code>fpt run-table table2 --scale converge --status</code> reads it from <code>results/campaign/</code>, the rule's call (the trend of the last half of its steps; a run flat at its trivial baseline past its floor ended there), its floor (the paper's Table 6 count for its row and task), the share of its time spent evaluating (as <code>--status</code> gives it) and where each stretch ran. The curves put the step on a log scale; the vertical lines are the floors.</p>\n",
    );
    b.push_str("<table id=\"campaign-runs\">\n<tr><th>run</th><th>key</th><th>state</th><th>call</th><th>last evaluation</th><th>floor</th><th>cap</th><th>evaluating (share of its time)</th><th>stretches (steps, device, machine)</th></tr>\n");
    for r in &rows {
        let last = r
            .evals
            .last()
            .map_or("-".to_string(), |(s, a)| format!("{:.2}% at {s}", 100.0 * a));
        let stretches: Vec<String> = r
            .stretches
            .iter()
            .map(|s| {
                let replayed = if s.step.as_deref() == Some("replay") {
                    ", steps replayed"
                } else {
                    ""
                };
                format!(
                    "{}-{} on {} ({}{replayed})",
                    s.from_step, s.to_step, s.device, s.machine
                )
            })
            .collect();
        let evaluating = r.eval_time.as_ref().map_or("not timed".to_string(), |e| e.describe());
        let _ = writeln!(
            b,
            "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{last}</td><td>{}</td><td>{}</td><td>{evaluating}</td><td class=\"small\">{}</td></tr>",
            esc(&r.what),
            esc(&r.key),
            esc(&r.state),
            esc(&r.call),
            r.floor.map_or("-".into(), |f| f.to_string()),
            r.cap,
            esc(&stretches.join("; "))
        );
    }
    b.push_str("</table>\n");
    let mut tasks: Vec<&str> = rows.iter().map(|r| r.task.as_str()).collect();
    tasks.dedup();
    for task in tasks {
        let mut series: Vec<(String, Vec<(f64, f64)>)> = rows
            .iter()
            .filter(|r| r.task == task && !r.evals.is_empty())
            .map(|r| {
                let pts = r
                    .evals
                    .iter()
                    .filter(|(s, _)| *s > 0)
                    .map(|(s, a)| ((*s as f64).log10(), 100.0 * a))
                    .collect();
                (r.what.clone(), pts)
            })
            .collect();
        if series.is_empty() {
            continue;
        }
        let mut floors: Vec<(String, usize)> = rows
            .iter()
            .filter(|r| r.task == task)
            .filter_map(|r| {
                r.floor
                    .map(|f| (r.what.split(" / ").next().unwrap_or("").to_string(), f))
            })
            .collect();
        floors.sort();
        floors.dedup();
        for (row, f) in floors {
            let x = (f as f64).log10();
            series.push((format!("{row}'s Table 6 count ({f})"), vec![(x, 0.0), (x, 100.0)]));
        }
        let _ = writeln!(
            b,
            "<h2>{}</h2>\n<div class=\"figure\">{}</div>",
            esc(task),
            xy_svg(&format!("{task}: held-out accuracy (%)"), "step (log10)", &series)
        );
    }
    Some(page("fpt: the converge campaign", &b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The critics' runs are named by their shape, not by their init (w/o LLM loads the
    /// pretrained backbone, LLM2Attn a random one).
    #[test]
    fn runs_are_named_by_table_2s_rows() {
        let task = fpt_spec::TaskSpec::new(fpt_spec::TaskName::Mnist);
        let mut spec = fpt_spec::RunSpec::new(task, fpt_spec::BackboneSpec::new("gpt2", fpt_spec::Init::Pretrained));
        assert_eq!(row_of(&spec), "FPT");
        spec.backbone.depth = Some(0);
        assert_eq!(row_of(&spec), "w/o LLM");
        spec.backbone.depth = Some(1);
        spec.backbone.init = fpt_spec::Init::Random;
        assert_eq!(row_of(&spec), "Random");
        spec.backbone.shape.attention_only = Some(true);
        assert_eq!(row_of(&spec), "LLM2Attn");
    }
}

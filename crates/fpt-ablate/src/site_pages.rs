//! The site's pages other than the index: a table's page (its grid coloured by the
//! difference from the paper, claims, curves, cells), a figure's page and a run's page.

use crate::chart::{esc, xy_svg};
use crate::record::RunRecord;
use crate::site_html::*;
use crate::Report;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// A figure's page: its markdown (headings, quotes, tables, paragraphs, inline code) with
/// the figure inline where the markdown shows it, and links to the runs it names.
pub(crate) fn figure_page(e: &Entry, dir: &Path, markdown: &str, runs: &BTreeMap<String, RunRecord>) -> String {
    let mut b = String::from("<nav><a href=\"../index.html\">all reports</a></nav>\n");
    let inline = |t: &str| -> String {
        // `code` spans; everything escaped.
        let mut out = String::new();
        for (i, part) in t.split('`').enumerate() {
            if i % 2 == 1 {
                let _ = write!(out, "<code>{}</code>", esc(part));
            } else {
                out.push_str(&esc(part));
            }
        }
        out
    };
    let mut lines = markdown.lines().peekable();
    while let Some(line) = lines.next() {
        let l = line.trim_end();
        if let Some(h) = l.strip_prefix("# ") {
            let _ = writeln!(b, "<h1>{}</h1>", inline(h));
        } else if let Some(h) = l.strip_prefix("## ") {
            let _ = writeln!(b, "<h2>{}</h2>", inline(h));
        } else if let Some(q) = l.strip_prefix("> ") {
            let _ = writeln!(b, "<blockquote>{}</blockquote>", inline(q));
        } else if l.starts_with("![") {
            let file = l.rsplit_once('(').and_then(|(_, f)| f.strip_suffix(')')).unwrap_or("");
            match std::fs::read_to_string(dir.join(file)) {
                Ok(svg) if file.ends_with(".svg") => {
                    let start = svg.find("<svg").unwrap_or(0);
                    let _ = writeln!(b, "<div class=\"figure\">{}</div>", &svg[start..]);
                }
                _ => {
                    let _ = writeln!(b, "<p class=\"small\">(figure {} not found)</p>", esc(file));
                }
            }
        } else if l.starts_with('|') {
            b.push_str("<table>");
            let mut row = Some(l.to_string());
            let mut first = true;
            while let Some(r) = row {
                let cells: Vec<&str> = r.trim().trim_matches('|').split('|').map(str::trim).collect();
                if !cells.iter().all(|c| c.chars().all(|ch| ch == '-' || ch == ':')) {
                    let tag = if first { "th" } else { "td" };
                    b.push_str("<tr>");
                    for c in cells {
                        let _ = write!(b, "<{tag}>{}</{tag}>", inline(c));
                    }
                    b.push_str("</tr>");
                    first = false;
                }
                row = lines.next_if(|n| n.starts_with('|')).map(str::to_string);
            }
            b.push_str("</table>\n");
        } else if !l.is_empty() {
            let _ = writeln!(b, "<p>{}</p>", inline(l));
        }
    }
    let cited: Vec<String> = e
        .cited_runs()
        .into_iter()
        .filter(|k| runs.contains_key(k))
        .map(|k| format!("<a href=\"{}\">{}</a>", run_page(&k), esc(&k)))
        .collect();
    if !cited.is_empty() {
        let _ = writeln!(b, "<p>Runs: {}</p>", cited.join(", "));
    }
    page(&format!("{} ({})", e.title(), e.scale()), &b)
}

pub(crate) fn report_page(r: &Report, dir: &Path, results: &Path, runs: &BTreeMap<String, RunRecord>) -> String {
    let mut b = format!(
        "<nav><a href=\"../index.html\">all reports</a></nav>\n<h1>{}: {} <span class=\"small\">(scale <code>{}</code>)</span></h1>\n<p class=\"small\">{}</p>\n<p class=\"small\">Written by fpt {} at <code>{}</code> ({} build, {} kernels, {}), self-check {}; {}.</p>\n",
        esc(&r.id),
        esc(&r.title),
        esc(&r.scale),
        esc(&r.caption),
        esc(&r.provenance.fpt_version),
        esc(&r.provenance.commit),
        esc(&r.provenance.profile),
        esc(&r.provenance.kernel_path),
        esc(&r.provenance.cpu),
        if r.provenance.selfcheck.passed { "passed" } else { "FAILED" },
        esc(&r.machine)
    );
    b.push_str("<p class=\"legend small\">Ours, then <span class=\"paper\">(the paper's)</span>; colour by their difference: <span class=\"ok\">within 5 points (5% for counts and steps)</span><span class=\"near\">within 15</span><span class=\"far\">further</span><span class=\"none\">no pair</span></p>\n");
    // The grid.
    b.push_str("<table id=\"grid\"><thead><tr><th></th>");
    for c in &r.cols {
        let _ = write!(b, "<th>{}</th>", esc(c));
    }
    b.push_str("</tr></thead><tbody>\n");
    for row in &r.rows {
        let _ = write!(b, "<tr><th>{}</th>", esc(row));
        for col in &r.cols {
            let Some(c) = r.cells.iter().find(|c| &c.row == row && &c.col == col) else {
                b.push_str("<td class=\"none\"></td>");
                continue;
            };
            let mut spread = c
                .seeds
                .as_ref()
                .map(|s| format!(" <span class=\"small\">[{}]</span>", esc(&s.label())))
                .unwrap_or_default();
            if c.at_baseline.is_some() {
                spread.push_str(" <span class=\"small at-baseline\">[at baseline]</span>");
            }
            let spark = cell_run(c)
                .and_then(|k| runs.get(&k))
                .map(|rec| format!("<br><a href=\"{}\">{}</a>", run_page(&rec.key), sparkline(&rec.evals)))
                .unwrap_or_default();
            let ours_attr = c.ours.map(|v| format!(" data-ours=\"{v}\"")).unwrap_or_default();
            let paper_attr = c.paper.map(|v| format!(" data-paper=\"{v}\"")).unwrap_or_default();
            let _ = write!(
                b,
                "<td class=\"{} cell\" data-row=\"{}\" data-col=\"{}\"{ours_attr}{paper_attr}><span class=\"ours\">{}</span>{spread} <span class=\"paper\">({})</span>{spark}</td>",
                diff_class(c),
                attr(&c.row),
                attr(&c.col),
                esc(&show(c)),
                esc(&c.paper_text)
            );
        }
        b.push_str("</tr>\n");
    }
    b.push_str("</tbody></table>\n");
    // The figure or the table's curves, inline.
    for name in ["figure.svg", "curves.svg"] {
        if let Ok(svg) = std::fs::read_to_string(dir.join(name)) {
            let start = svg.find("<svg").unwrap_or(0);
            let _ = writeln!(
                b,
                "<h2>{}</h2>\n<div class=\"figure\">{}</div>",
                if name == "figure.svg" {
                    "Figure"
                } else {
                    "Learning curves"
                },
                &svg[start..]
            );
        }
    }
    if !r.claims.is_empty() {
        b.push_str("<h2>Claims</h2>\n<table id=\"claims\"><thead><tr><th>claim</th><th>ours</th><th>decided by</th><th>paper</th></tr></thead><tbody>\n");
        for c in &r.claims {
            let _ = writeln!(b, "<tr>{}</tr>", claim_cells(c));
        }
        b.push_str("</tbody></table>\n");
    }
    // Per cell: what differs from the paper, why it did not run, its run.
    b.push_str("<h2>Cells</h2>\n<table id=\"cells\"><thead><tr><th>cell</th><th>ours</th><th>paper</th><th>status</th><th>curve</th><th>run</th><th>substitutions and differences from the paper</th></tr></thead><tbody>\n");
    for c in &r.cells {
        let mut notes: Vec<String> = c
            .notes
            .iter()
            .chain(c.differs.iter())
            .map(|n| format!("<li>{}</li>", esc(n)))
            .collect();
        if let Some(why) = &c.why {
            notes.insert(0, format!("<li><b>{}</b></li>", esc(why)));
        }
        if let Some(d) = &c.diverged {
            notes.insert(0, format!("<li><b>diverged</b>: {}</li>", esc(d)));
        }
        if let Some(b) = &c.at_baseline {
            notes.insert(0, format!("<li><b>at baseline</b>: {}</li>", esc(b)));
        }
        let run = cell_run(c)
            .map(|k| match runs.contains_key(&k) {
                true => format!("<a href=\"{}\">{}</a>", run_page(&k), esc(&k)),
                false => esc(&k),
            })
            .unwrap_or_default();
        let _ = writeln!(
            b,
            "<tr><td>{} / {}</td><td class=\"num {}\">{}</td><td class=\"num\">{}</td><td>{}</td><td class=\"small\">{}</td><td class=\"small\">{run}</td><td class=\"small\"><details><summary>{} notes</summary><ul>{}</ul></details></td></tr>",
            esc(&c.row),
            esc(&c.col),
            diff_class(c),
            esc(&show(c)),
            esc(&c.paper_text),
            esc(&c.status),
            esc(c.curve.as_deref().unwrap_or("")),
            notes.len(),
            notes.join("")
        );
    }
    b.push_str("</tbody></table>\n");
    if !r.notes.is_empty() {
        b.push_str("<h2>Notes</h2>\n<ul>");
        for n in &r.notes {
            let _ = write!(b, "<li>{}</li>", esc(n));
        }
        b.push_str("</ul>\n");
    }
    // The results directory as the user would type it: relative to the working directory
    // where it lies below it (no machine's absolute path in a committed page), and no
    // `--out` for the default `results`.
    let shown = std::env::current_dir()
        .ok()
        .and_then(|cwd| results.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| results.to_path_buf());
    let out = match shown.to_string_lossy().trim_end_matches('/') {
        "results" => String::new(),
        other => format!(" --out {other}"),
    };
    let _ = writeln!(
        b,
        "<p class=\"small\">Remake this report: <code>fpt run-table {} --scale {}{}</code></p>",
        esc(&r.id),
        esc(&r.scale),
        esc(&out)
    );
    page(&format!("{} ({})", r.title, r.scale), &b)
}

fn cell_run(c: &crate::report::CellReport) -> Option<String> {
    c.run.as_ref().map(|r| r.strip_prefix("runs/").unwrap_or(r).to_string())
}

pub(crate) fn run_page_html(rec: &RunRecord, home: &str) -> String {
    let mut b = format!(
        "<nav><a href=\"{home}\">all reports</a></nav>\n<h1>Run <code>{}</code></h1>\n<p>{}</p>\n",
        esc(&rec.key),
        esc(&rec.label())
    );
    match &rec.result {
        Some(r) => {
            let mut rows: Vec<(&str, String)> = vec![
                ("test accuracy", format!("{:.2}%", 100.0 * r.test_accuracy)),
                ("test loss", opt4(r.test_loss)),
                (
                    "best accuracy (step)",
                    format!("{:.2}% ({})", 100.0 * r.best_accuracy, r.best_step),
                ),
                (
                    "converged at step",
                    r.converged_step.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
                ),
                ("final training loss", opt4(r.final_train_loss)),
                ("steps x batch", format!("{} x {}", r.steps, r.batch_size)),
                ("held-out examples", r.eval_examples.to_string()),
                (
                    "trainable / total parameters",
                    format!("{} / {}", r.trainable_params, r.total_params),
                ),
                ("wall-clock seconds", format!("{:.1}", r.wall_seconds)),
                (
                    "diverged",
                    match (r.diverged, r.diverged_at_step) {
                        (true, Some(s)) => format!("yes, at step {s}"),
                        (true, None) => "yes".into(),
                        _ => "no".into(),
                    },
                ),
                ("stopped early", if r.stopped_early { "yes" } else { "no" }.into()),
                ("seed", r.seed.to_string()),
                ("device", r.device.clone()),
            ];
            if let Some(a) = r.train_accuracy {
                rows.insert(1, ("train accuracy", format!("{:.2}%", 100.0 * a)));
            }
            if let Some(p) = &r.provenance {
                rows.push((
                    "build",
                    format!(
                        "fpt {} at {} ({}, {} kernels, {}), self-check {}",
                        p.fpt_version,
                        p.commit,
                        p.profile,
                        p.kernel_path,
                        p.cpu,
                        if p.selfcheck.passed { "passed" } else { "FAILED" }
                    ),
                ));
            }
            b.push_str("<table id=\"result\"><tbody>\n");
            for (k, v) in rows {
                let _ = writeln!(
                    b,
                    "<tr><th>{k}</th><td data-field=\"{}\">{}</td></tr>",
                    attr(k),
                    esc(&v)
                );
            }
            b.push_str("</tbody></table>\n");
        }
        None => b.push_str("<p><b>Not finished</b>: no <code>result.json</code>.</p>\n"),
    }
    if rec.evals.is_empty() {
        b.push_str("<p>No evaluations recorded (<code>metrics.jsonl</code>).</p>\n");
    } else {
        let one = [rec];
        let _ = writeln!(
            b,
            "<h2>Curves</h2>\n<div class=\"figure\">{}</div>\n<div class=\"figure\">{}</div>",
            plot(&one, PlotMetric::Accuracy),
            losses_svg(rec)
        );
    }
    let _ = writeln!(
        b,
        "<h2>Rerun it</h2>\n<pre>fpt train --spec results/runs/{}/spec.json --out runs/again</pre>\n<p class=\"small\">(Where the run directory is not kept, save the spec below as a file and give that to <code>--spec</code>.)</p>\n<h2>Spec</h2>\n<pre id=\"spec\">{}</pre>",
        esc(&rec.key),
        esc(&serde_json::to_string_pretty(&rec.spec).unwrap_or_default())
    );
    page(&format!("run {}", rec.key), &b)
}

fn opt4(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.4}")).unwrap_or_else(|| "-".into())
}

/// Training and held-out loss of one run by step.
fn losses_svg(rec: &RunRecord) -> String {
    let pts = |m: PlotMetric| {
        rec.evals
            .iter()
            .map(|e| (e.step as f64, m.of(e)))
            .filter(|p| p.1.is_finite())
            .collect()
    };
    xy_svg(
        "losses by step",
        "step",
        &[
            ("training loss".to_string(), pts(PlotMetric::TrainLoss)),
            ("held-out loss".to_string(), pts(PlotMetric::TestLoss)),
        ],
    )
}

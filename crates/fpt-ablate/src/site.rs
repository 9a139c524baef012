//! The results as a static, self-contained HTML site (`fpt report`, `cargo xtask site`):
//! `index.html` with every table and figure at each scale present (cells run, claims
//! holding or not, self-check, build, device) and every claim; a page per report with our
//! number beside the paper's, coloured by their difference, the cell's substitutions, the
//! claims and a learning-curve sparkline per cell; a page per run with its spec, its curves
//! (losses and accuracies by step), its numbers and the command that reruns it. Curves for
//! several runs on shared axes: [`plot`] (`fpt plot`).
//!
//! Everything comes from the JSON the reports and runs wrote (`report.json`, a run's
//! `spec.json`, `result.json` and `metrics.jsonl`), the same data the markdown comes from.
//! CSS, SVG and the little script (a filter and a check that it ran) are inline: the site
//! needs no network to view.
//!
//! Run directories (`runs/<key>`) stay local (see `.gitignore`), so the site keeps a
//! record of each run a report cites in `records/<key>.json` (spec, result, curve) beside
//! the reports: a fresh clone's site still has every curve, and `cargo xtask reproduce`
//! never mistakes a record for a finished run.

use crate::chart::esc;
use crate::record::{parse_json, read, record_path, RunRecord};
use crate::site_html::*;
pub use crate::site_html::{plot, Entry, PlotMetric};
use crate::site_pages::{figure_page, report_page, run_page_html};
use crate::{io, AblateError, Report, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// What [`site`] wrote.
#[derive(Debug, Clone)]
pub struct Site {
    /// The front page.
    pub index: PathBuf,
    /// Reports shown (table or figure, scale).
    pub reports: usize,
    /// Run pages written.
    pub runs: usize,
    /// Runs the reports cite that have neither a run directory nor a record.
    pub missing_runs: Vec<String>,
}

/// The reports under `results` (`<id>/<scale>/report.json`), tables in number order, then
/// figures, each by scale. A `report.json` that does not parse is an error naming it.
pub fn find_reports(results: &Path) -> Result<Vec<Entry>> {
    let mut found = Vec::new();
    let entries = std::fs::read_dir(results).map_err(io(results))?;
    for e in entries {
        let top = e.map_err(io(results))?.path();
        if !top.is_dir() {
            continue;
        }
        let Ok(scales) = std::fs::read_dir(&top) else { continue };
        for s in scales.flatten() {
            let dir = s.path();
            let path = dir.join("report.json");
            if !path.is_file() {
                continue;
            }
            let value: serde_json::Value = parse_json(&path, &read(&path)?)?;
            let name = |p: &Path| {
                p.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            };
            // A table's own report; a figure drawn from a table's cells (Figure 1) carries
            // that table's report and is shown as the figure it is.
            if value.get("cells").is_some() && value.get("id").and_then(|v| v.as_str()) == Some(&name(&top)) {
                let report: Report = serde_json::from_value(value).map_err(|e| AblateError::Spec {
                    path: path.clone(),
                    msg: format!("not a table report: {e}"),
                })?;
                found.push(Entry::Table {
                    dir,
                    report: Box::new(report),
                });
            } else {
                let md_path = dir.join("report.md");
                let markdown = read(&md_path)?;
                found.push(Entry::Figure {
                    id: name(&top),
                    scale: name(&dir),
                    dir,
                    markdown,
                });
            }
        }
    }
    found.sort_by_key(|e| (order_key(e.id()), scale_rank(e.scale())));
    Ok(found)
}

/// Tables in number order, then figures.
pub(crate) fn order_key(id: &str) -> (u8, u32, String) {
    let num = |p: &str| id.strip_prefix(p).and_then(|n| n.parse::<u32>().ok());
    match (num("table"), num("fig")) {
        (Some(n), _) => (0, n, String::new()),
        (_, Some(n)) => (1, n, String::new()),
        _ => (2, 0, id.to_string()),
    }
}

pub(crate) fn scale_rank(s: &str) -> (u8, String) {
    let r = match s {
        "smoke" => 0,
        "cpu" => 1,
        "gpu" => 2,
        "paper" => 3,
        _ => 4,
    };
    (r, s.to_string())
}

/// Writes the site for the results directory `results`: `index.html` in `out` (usually
/// `results` itself) and the other pages under `out/site/`. Each run a report cites is
/// read from its run directory or its record; a run directory present also refreshes its
/// record (`records/<key>.json` under `results`), so that the site can be rebuilt where
/// the run directories are not.
pub fn site(results: &Path, out: &Path) -> Result<Site> {
    site_with(results, out, true)
}

/// [`site`], refreshing the records of the run directories present only with
/// `refresh_records` (a test that builds the site of the checkout's `results/` writes
/// nothing into it).
pub fn site_with(results: &Path, out: &Path, refresh_records: bool) -> Result<Site> {
    let reports = find_reports(results)?;
    if reports.is_empty() {
        return Err(AblateError::Request(format!(
            "{}: no reports (`<table>/<scale>/report.json`) to make a site of; run `fpt run-table` first",
            results.display()
        )));
    }
    let pages = out.join("site");
    let mut runs: BTreeMap<String, RunRecord> = BTreeMap::new();
    let mut missing = Vec::new();
    for e in &reports {
        for key in e.cited_runs() {
            if runs.contains_key(&key) || missing.contains(&key) {
                continue;
            }
            match RunRecord::load(results, &key)? {
                Some(rec) => {
                    if refresh_records && crate::run_dir(results, &key).join("spec.json").is_file() {
                        let path = record_path(results, &key);
                        let text = serde_json::to_string(&rec).map_err(|e| AblateError::Spec {
                            path: path.clone(),
                            msg: e.to_string(),
                        })?;
                        std::fs::create_dir_all(results.join("records")).map_err(io(results))?;
                        fpt_spec::files::write_atomic(&path, text.as_bytes()).map_err(io(&path))?;
                    }
                    runs.insert(key, rec);
                }
                None => missing.push(key),
            }
        }
    }
    std::fs::create_dir_all(&pages).map_err(io(&pages))?;
    let write = |path: &Path, html: String| fpt_spec::files::write_atomic(path, html.as_bytes()).map_err(io(path));
    for e in &reports {
        let html = match e {
            Entry::Table { dir, report } => report_page(report, dir, results, &runs),
            Entry::Figure { dir, markdown, .. } => figure_page(e, dir, markdown, &runs),
        };
        write(&pages.join(e.page_name()), html)?;
    }
    for rec in runs.values() {
        write(&pages.join(run_page(&rec.key)), run_page_html(rec, "../index.html"))?;
    }
    // A run page no report cites any more (a run moved to a new key, a cell dropped) would
    // outlive what it describes: the site is rebuilt whole, so it goes.
    let wanted: std::collections::HashSet<String> = runs.keys().map(|k| run_page(k)).collect();
    for e in std::fs::read_dir(&pages).map_err(io(&pages))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("run-") && name.ends_with(".html") && !wanted.contains(&name) {
            std::fs::remove_file(e.path()).map_err(io(&e.path()))?;
        }
    }
    let campaign = crate::site_campaign::campaign_page(results);
    if let Some(html) = &campaign {
        write(&pages.join("campaign.html"), html.clone())?;
    }
    let index = out.join("index.html");
    write(&index, index_page(&reports, &runs, &missing, campaign.is_some()))?;
    Ok(Site {
        index,
        reports: reports.len(),
        runs: runs.len(),
        missing_runs: missing,
    })
}

/// Writes a site for a set of run directories (no table): `index.html` in `out` listing
/// the runs with their numbers and curves (and all of them on shared axes), and a page
/// per run under `out/site/`.
pub fn runs_site(dirs: &[PathBuf], out: &Path) -> Result<Site> {
    let recs: Vec<RunRecord> = dirs.iter().map(|d| RunRecord::from_dir(d)).collect::<Result<_>>()?;
    let pages = out.join("site");
    std::fs::create_dir_all(&pages).map_err(io(&pages))?;
    let write = |path: &Path, html: String| fpt_spec::files::write_atomic(path, html.as_bytes()).map_err(io(path));
    for rec in &recs {
        write(&pages.join(run_page(&rec.key)), run_page_html(rec, "../index.html"))?;
    }
    let mut body = String::from("<h1>fpt runs</h1>\n");
    let refs: Vec<&RunRecord> = recs.iter().collect();
    let _ = writeln!(
        body,
        "<section><h2>Held-out accuracy by step</h2>{}</section>",
        plot(&refs, PlotMetric::Accuracy)
    );
    body.push_str(&runs_table(&refs, "site/"));
    let index = out.join("index.html");
    write(&index, page("fpt runs", &body))?;
    Ok(Site {
        index,
        reports: 0,
        runs: recs.len(),
        missing_runs: Vec::new(),
    })
}

/// A table of runs: label, test accuracy, best, steps, time, diverged.
pub(crate) fn runs_table(recs: &[&RunRecord], prefix: &str) -> String {
    let mut s = String::from(
        "<table class=\"runs\"><thead><tr><th>run</th><th>what</th><th>test accuracy</th><th>best (step)</th><th>steps</th><th>seconds</th><th>diverged</th><th>curve</th></tr></thead><tbody>\n",
    );
    for rec in recs {
        let (acc, best, steps, secs, div) = match &rec.result {
            Some(r) => (
                format!("{:.1}%", 100.0 * r.test_accuracy),
                format!("{:.1}% ({})", 100.0 * r.best_accuracy, r.best_step),
                r.steps.to_string(),
                format!("{:.0}", r.wall_seconds),
                if r.diverged { "yes" } else { "no" }.to_string(),
            ),
            None => (
                "not finished".into(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ),
        };
        let _ = writeln!(
            s,
            "<tr><td><a href=\"{prefix}{}\">{}</a></td><td>{}</td><td class=\"num\">{acc}</td><td class=\"num\">{best}</td><td class=\"num\">{steps}</td><td class=\"num\">{secs}</td><td>{div}</td><td>{}</td></tr>",
            run_page(&rec.key),
            esc(&rec.key),
            esc(&rec.label()),
            sparkline(&rec.evals)
        );
    }
    s.push_str("</tbody></table>\n");
    s
}

/// Counts of the claims' verdicts on our numbers: (holds, fails, inconclusive, undecided,
/// not run).
pub(crate) fn claim_counts(r: &Report) -> (usize, usize, usize, usize, usize) {
    let n = |v: &str| r.claims.iter().filter(|c| c.ours.verdict == v).count();
    (
        n("holds"),
        n("fails"),
        n("inconclusive"),
        n("undecided"),
        r.claims.len() - n("holds") - n("fails") - n("inconclusive") - n("undecided"),
    )
}

pub(crate) fn index_page(
    entries: &[Entry],
    runs: &BTreeMap<String, RunRecord>,
    missing: &[String],
    campaign: bool,
) -> String {
    let mut b = String::from(
        "<h1>fpt: the paper's tables and figures, reproduced</h1>\n<p>Lu, Grover, Abbeel and Mordatch, <i>Pretrained Transformers as Universal Computation Engines</i> (2021). Each row is one report (<code>results/&lt;table&gt;/&lt;scale&gt;/report.json</code>); its page has our number beside the paper's per cell, what the scale substituted, the claims and each run's curve.</p>\n",
    );
    if campaign {
        b.push_str("<p id=\"campaign\"><a href=\"site/campaign.html\">The converge campaign</a>: Table 2's runs trained until they converge, each run's state, the rule's call, its curve on a log scale and where each stretch ran.</p>\n");
    }
    let tables = || {
        entries.iter().filter_map(|e| match e {
            Entry::Table { report, .. } => Some(report),
            Entry::Figure { .. } => None,
        })
    };
    let mut scales: Vec<&str> = entries.iter().map(|e| e.scale()).collect();
    scales.sort_by_key(|s| scale_rank(s));
    scales.dedup();
    let (mut cells, mut ran, mut holds, mut claims) = (0, 0, 0, 0);
    for r in tables() {
        cells += r.cells.len();
        ran += r.cells.iter().filter(|c| c.ours.is_some()).count();
        holds += claim_counts(r).0;
        claims += r.claims.len();
    }
    let _ = writeln!(
        b,
        "<p id=\"totals\">{} reports at the scale(s) {}: {ran} of {cells} cells with our number, {holds} of {claims} claims holding on our numbers, {} runs.</p>",
        entries.len(),
        scales.iter().map(|s| format!("<code>{}</code>", esc(s))).collect::<Vec<_>>().join(", "),
        runs.len()
    );
    if !missing.is_empty() {
        let _ = writeln!(
            b,
            "<p class=\"small\">{} cited runs have neither a run directory nor a record here (their cells show no curve): {}</p>",
            missing.len(),
            esc(&missing.join(", "))
        );
    }
    b.push_str("<p><label>Filter: <input id=\"filter\" type=\"search\" placeholder=\"table, title, scale, verdict\"></label></p>\n");
    b.push_str("<table id=\"reports\"><thead><tr><th>report</th><th>scale</th><th>title</th><th>cells with our number</th><th>claims: <span class=\"holds\">holds</span> / <span class=\"fails\">fails</span> / <span class=\"inconclusive\">inconclusive</span> / <span class=\"undecided\">undecided</span> / not run</th><th>self-check</th><th>build</th><th>runs from</th></tr></thead><tbody>\n");
    for e in entries {
        let (cells, claims, check, build, from) = match e {
            Entry::Table { report: r, .. } => {
                let (h, f, i, u, n) = claim_counts(r);
                let ran = r.cells.iter().filter(|c| c.ours.is_some()).count();
                let p = &r.provenance;
                let check = if p.selfcheck.passed {
                    "<span class=\"holds\">passed</span>"
                } else {
                    "<span class=\"fails\">FAILED</span>"
                };
                let from: Vec<String> = r.runs_from.iter().map(|(w, n)| format!("{} ({n})", esc(w))).collect();
                (
                    format!("{ran} of {}", r.cells.len()),
                    format!("<span class=\"holds\">{h}</span> / <span class=\"fails\">{f}</span> / <span class=\"inconclusive\">{i}</span> / <span class=\"undecided\">{u}</span> / {n}"),
                    check.to_string(),
                    format!("<code>{}</code> ({}, {})", esc(&p.commit), esc(&p.kernel_path), esc(&p.cpu)),
                    from.join("<br>"),
                )
            }
            Entry::Figure { .. } => (
                "figure".into(),
                "-".into(),
                "<span class=\"not-run\">not recorded</span>".into(),
                "-".into(),
                e.cited_runs().iter().map(|k| esc(k)).collect::<Vec<_>>().join(", "),
            ),
        };
        let _ = writeln!(
            b,
            "<tr data-filter=\"{} {} {}\" data-report=\"{}-{}\"><td><a href=\"site/{}\">{}</a></td><td>{}</td><td>{}</td><td class=\"num\">{cells}</td><td class=\"num\">{claims}</td><td>{check}</td><td>{build}</td><td class=\"small\">{from}</td></tr>",
            attr(e.id()),
            attr(e.scale()),
            attr(&e.title()),
            attr(e.id()),
            attr(e.scale()),
            e.page_name(),
            esc(e.id()),
            esc(e.scale()),
            esc(&e.title()),
        );
    }
    b.push_str("</tbody></table>\n<h2>Every claim</h2>\n<table id=\"claims\"><thead><tr><th>report</th><th>claim</th><th>ours</th><th>decided by</th><th>paper</th></tr></thead><tbody>\n");
    for r in tables() {
        for c in &r.claims {
            let _ = writeln!(
                b,
                "<tr data-filter=\"{} {} {}\"><td><a href=\"site/{}-{}.html\">{} ({})</a></td>{}</tr>",
                attr(&r.id),
                attr(&r.scale),
                attr(&c.ours.verdict),
                attr(&r.id),
                attr(&r.scale),
                esc(&r.id),
                esc(&r.scale),
                claim_cells(c)
            );
        }
    }
    b.push_str("</tbody></table>\n");
    page("fpt results", &b)
}

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

use crate::chart::{esc, xy_svg, COLORS};
use crate::record::{parse_json, read, record_path, RunRecord};
use crate::site_pages::{figure_page, report_page, run_page_html};
use crate::{io, AblateError, Report, Result};
use fpt_train::EvalRecord;
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

/// A report under the results directory: a table's (or Figure 1's) cells, or a figure
/// drawn from one run (Figures 3-6: attention maps, parameter statistics), shown from its
/// markdown and figure.
#[derive(Debug, Clone)]
pub enum Entry {
    /// A report of cells beside the paper's (`report.json` as [`Report`]).
    Table {
        /// Its directory (`<id>/<scale>`).
        dir: PathBuf,
        /// The report.
        report: Box<Report>,
    },
    /// A figure's report: drawn from one run, or from a table's cells (whose report it
    /// carries; the table has its own page).
    Figure {
        /// Its directory (`<id>/<scale>`).
        dir: PathBuf,
        /// The figure's id (the directory above `dir`).
        id: String,
        /// The scale (`dir`'s name).
        scale: String,
        /// `report.md`.
        markdown: String,
    },
}

impl Entry {
    /// Table or figure id.
    pub fn id(&self) -> &str {
        match self {
            Entry::Table { report, .. } => &report.id,
            Entry::Figure { id, .. } => id,
        }
    }

    /// Scale.
    pub fn scale(&self) -> &str {
        match self {
            Entry::Table { report, .. } => &report.scale,
            Entry::Figure { scale, .. } => scale,
        }
    }

    pub(crate) fn page_name(&self) -> String {
        format!("{}-{}.html", self.id(), self.scale())
    }

    /// The title: the report's, or the first heading of a figure's markdown.
    pub(crate) fn title(&self) -> String {
        match self {
            Entry::Table { report, .. } => report.title.clone(),
            Entry::Figure { markdown, id, .. } => markdown
                .lines()
                .find_map(|l| l.strip_prefix("# "))
                .map(|t| {
                    let t = t.strip_prefix(&format!("{id}: ")).unwrap_or(t);
                    t.split(" (scale").next().unwrap_or(t).to_string()
                })
                .unwrap_or_default(),
        }
    }

    /// The run keys the report cites: each cell's run and its other seeds' runs, or the
    /// runs a figure's markdown names (`results/runs/<key>`).
    pub(crate) fn cited_runs(&self) -> Vec<String> {
        let mut keys: Vec<String> = Vec::new();
        let mut add = |k: &str| {
            if !k.is_empty() && !keys.iter().any(|x| x == k) {
                keys.push(k.to_string());
            }
        };
        match self {
            Entry::Table { report, .. } => {
                for c in &report.cells {
                    let others = c.seeds.iter().flat_map(|s| s.other_runs.iter());
                    for run in c.run.iter().chain(others) {
                        add(run.strip_prefix("runs/").unwrap_or(run));
                    }
                }
            }
            Entry::Figure { markdown, .. } => {
                for part in markdown.split("runs/").skip(1) {
                    let key: String = part.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
                    if key.len() == 16 {
                        add(&key);
                    }
                }
            }
        }
        keys
    }
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

pub(crate) fn run_page(key: &str) -> String {
    format!("run-{key}.html")
}

/// Writes the site for the results directory `results`: `index.html` in `out` (usually
/// `results` itself) and the other pages under `out/site/`. Each run a report cites is
/// read from its run directory or its record; a run directory present also refreshes its
/// record (`records/<key>.json` under `results`), so that the site can be rebuilt where
/// the run directories are not.
pub fn site(results: &Path, out: &Path) -> Result<Site> {
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
                    if crate::run_dir(results, &key).join("spec.json").is_file() {
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
    let index = out.join("index.html");
    write(&index, index_page(&reports, &runs, &missing))?;
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

/// Which curve [`plot`] draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlotMetric {
    /// Held-out accuracy (percent).
    Accuracy,
    /// Training loss (mean over the steps since the previous evaluation).
    TrainLoss,
    /// Held-out loss.
    TestLoss,
}

impl std::str::FromStr for PlotMetric {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "accuracy" => Ok(PlotMetric::Accuracy),
            "train-loss" => Ok(PlotMetric::TrainLoss),
            "test-loss" => Ok(PlotMetric::TestLoss),
            _ => Err(format!(
                "unknown metric `{s}`: expected accuracy, train-loss or test-loss"
            )),
        }
    }
}

impl PlotMetric {
    pub(crate) fn of(self, e: &EvalRecord) -> f64 {
        match self {
            PlotMetric::Accuracy => 100.0 * e.test_accuracy,
            PlotMetric::TrainLoss => e.train_loss,
            PlotMetric::TestLoss => e.test_loss,
        }
    }

    pub(crate) fn title(self) -> &'static str {
        match self {
            PlotMetric::Accuracy => "held-out accuracy (%)",
            PlotMetric::TrainLoss => "training loss",
            PlotMetric::TestLoss => "held-out loss",
        }
    }
}

/// The curves of `runs` on shared axes (one line per run, by step), as SVG.
pub fn plot(runs: &[&RunRecord], metric: PlotMetric) -> String {
    let series: Vec<(String, Vec<(f64, f64)>)> = runs
        .iter()
        .map(|r| {
            let pts = r
                .evals
                .iter()
                .map(|e| (e.step as f64, metric.of(e)))
                .filter(|p| p.1.is_finite())
                .collect();
            (format!("{} ({})", r.label(), r.key), pts)
        })
        .collect();
    xy_svg(&format!("{} by step", metric.title()), "step", &series)
}

/// A small inline SVG of held-out accuracy by step (empty when there are no evaluations).
pub(crate) fn sparkline(evals: &[EvalRecord]) -> String {
    let pts: Vec<(f64, f64)> = evals.iter().map(|e| (e.step as f64, e.test_accuracy)).collect();
    let Some(last) = pts.last() else {
        return String::new();
    };
    let (w, h) = (90.0, 22.0);
    let x0 = pts[0].0;
    let span = (last.0 - x0).max(1.0);
    let (lo, hi) = pts
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let range = (hi - lo).max(1e-9);
    let xy = |p: &(f64, f64)| {
        (
            2.0 + (w - 4.0) * (p.0 - x0) / span,
            h - 2.0 - (h - 4.0) * (p.1 - lo) / range,
        )
    };
    let line: Vec<String> = pts
        .iter()
        .map(|p| {
            let (x, y) = xy(p);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    let (ex, ey) = xy(last);
    format!(
        "<svg class=\"spark\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\"><title>held-out accuracy {:.1}% to {:.1}% over steps {} to {}</title><polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"/><circle cx=\"{ex:.1}\" cy=\"{ey:.1}\" r=\"2\" fill=\"{}\"/></svg>",
        100.0 * pts[0].1,
        100.0 * last.1,
        pts[0].0,
        last.0,
        line.join(" "),
        COLORS[0],
        COLORS[3]
    )
}

pub(crate) const CSS: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#222;line-height:1.4}\
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:1.6em}table{border-collapse:collapse;margin:.6em 0}\
th,td{border:1px solid #ccc;padding:.25em .5em;vertical-align:top}th{background:#f3f3f3;text-align:left}\
td.num{text-align:right;font-variant-numeric:tabular-nums}.small{font-size:.85em;color:#555}\
.ok{background:#d9f2d9}.near{background:#fff3c4}.far{background:#f9d0d0}.none{background:#f3f3f3;color:#777}\
.holds{color:#17702a;font-weight:600}.fails{color:#b00020;font-weight:600}.inconclusive{color:#8a6d00;font-weight:600}.undecided{color:#5a4a8a;font-weight:600}.at-baseline{color:#b00020}.not-run{color:#777}\
.paper{color:#555}details{margin:.2em 0}summary{cursor:pointer}pre{background:#f6f6f6;padding:.6em;overflow:auto;font-size:.85em}\
nav a{margin-right:1em}.legend span{padding:0 .5em;margin-right:.5em}input#filter{padding:.3em;width:20em}\
svg.spark{vertical-align:middle}.hidden{display:none}";

/// The script every page runs: a filter over rows marked `data-filter` (where the page has
/// a `#filter` box), then `data-ready="1"` on the body, which the browser test checks (a
/// script error would leave it unset).
pub(crate) const SCRIPT: &str = "(function(){var f=document.getElementById('filter');\
if(f){f.addEventListener('input',function(){var q=f.value.toLowerCase();\
document.querySelectorAll('[data-filter]').forEach(function(r){\
r.classList.toggle('hidden',q!==''&&r.getAttribute('data-filter').toLowerCase().indexOf(q)<0);});});}\
document.body.setAttribute('data-ready','1');})();";

pub(crate) fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n<script>{SCRIPT}</script>\n</body>\n</html>\n",
        esc(title)
    )
}

pub(crate) fn attr(s: &str) -> String {
    esc(s).replace('"', "&quot;")
}

/// The CSS class of a cell by how far our number is from the paper's: within 5 points
/// (`ok`), within 15 (`near`), further (`far`); for counts and steps the same bands of
/// relative difference (5%, 15%). `none` without both numbers.
pub(crate) fn diff_class(c: &crate::report::CellReport) -> &'static str {
    let (Some(ours), Some(paper)) = (c.ours, c.paper) else {
        return "none";
    };
    let d = if c.metric.is_percent() {
        (ours - paper).abs()
    } else {
        100.0 * (ours - paper).abs() / paper.abs().max(1e-9)
    };
    if d <= 5.0 {
        "ok"
    } else if d <= 15.0 {
        "near"
    } else {
        "far"
    }
}

/// Our number as the table shows it.
pub(crate) fn show(c: &crate::report::CellReport) -> String {
    match c.ours {
        Some(v) if c.metric.is_percent() => format!("{v:.1}%"),
        Some(v) if v.fract() == 0.0 && v.abs() < 1e15 => format!("{v:.0}"),
        Some(v) => format!("{v:.3}"),
        None => c.status.clone(),
    }
}

pub(crate) fn verdict_span(v: &crate::claims::Verdict) -> String {
    format!(
        "<span class=\"{}\">{}</span>",
        v.verdict.replace(' ', "-"),
        esc(&v.verdict)
    )
}

/// A claim's table cells: its text, our verdict, what decided it, the paper's verdict.
pub(crate) fn claim_cells(c: &crate::claims::ClaimReport) -> String {
    format!(
        "<td>{}</td><td>{}</td><td class=\"small\">{}</td><td>{} <span class=\"small\">{}</span></td>",
        esc(&c.text),
        verdict_span(&c.ours),
        esc(&c.ours.detail),
        verdict_span(&c.paper),
        esc(&c.paper.detail)
    )
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

pub(crate) fn index_page(entries: &[Entry], runs: &BTreeMap<String, RunRecord>, missing: &[String]) -> String {
    let mut b = String::from(
        "<h1>fpt: the paper's tables and figures, reproduced</h1>\n<p>Lu, Grover, Abbeel and Mordatch, <i>Pretrained Transformers as Universal Computation Engines</i> (2021). Each row is one report (<code>results/&lt;table&gt;/&lt;scale&gt;/report.json</code>); its page has our number beside the paper's per cell, what the scale substituted, the claims and each run's curve.</p>\n",
    );
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

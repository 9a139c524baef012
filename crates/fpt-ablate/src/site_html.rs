//! What the site's index and pages share: the report entries found under a results
//! directory, page chrome (CSS, the filter script), cells and verdicts as HTML, sparklines,
//! and run curves on shared axes (`fpt plot`).

use crate::chart::{esc, xy_svg, COLORS};
use crate::record::RunRecord;
use crate::Report;
use fpt_train::EvalRecord;
use std::path::PathBuf;

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
                // A cell that cannot run on the machine that rendered the report names its
                // run's key but cites no run. (A pending one cites its run: a local run
                // directory finished since gives the records their copy.)
                for c in report.cells.iter().filter(|c| c.status != "unavailable") {
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

pub(crate) fn run_page(key: &str) -> String {
    format!("run-{key}.html")
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

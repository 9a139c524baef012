//! `fpt report` (the results as a static HTML site) and `fpt plot` (learning curves of
//! runs on shared axes).

use anyhow::{bail, Result};
use clap::Args;
use fpt_ablate::record::RunRecord;
use fpt_ablate::site::{self, PlotMetric};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct ReportArgs {
    /// A results directory (`<table>/<scale>/report.json` and `runs/`), or one or more run
    /// directories (each with `spec.json`).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Where `index.html` goes (pages under `site/` beside it) [default: the results
    /// directory; for run directories, `report`].
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args)]
pub struct PlotArgs {
    /// Run directories (each with `spec.json` and `metrics.jsonl`).
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// `accuracy` (held-out, percent), `train-loss` or `test-loss`.
    #[arg(long, default_value = "accuracy")]
    metric: String,
    /// The SVG to write (a PNG beside it where the build has the `png` feature).
    #[arg(long, default_value = "curves.svg")]
    out: PathBuf,
}

fn is_run_dir(p: &Path) -> bool {
    p.join("spec.json").is_file()
}

pub fn report(a: ReportArgs) -> Result<()> {
    let written = match a.paths.as_slice() {
        [results] if !is_run_dir(results) => {
            if !results.is_dir() {
                bail!("{}: not a directory", results.display());
            }
            site::site(results, a.out.as_deref().unwrap_or(results))?
        }
        paths => {
            if let Some(p) = paths.iter().find(|p| !is_run_dir(p)) {
                bail!(
                    "{}: not a run directory (no spec.json); give one results directory, or run directories only",
                    p.display()
                );
            }
            site::runs_site(paths, a.out.as_deref().unwrap_or(Path::new("report")))?
        }
    };
    println!(
        "wrote {} ({} reports, {} run pages)",
        written.index.display(),
        written.reports,
        written.runs
    );
    if !written.missing_runs.is_empty() {
        eprintln!(
            "note: {} runs the reports cite have neither a run directory nor a record here; their cells have no curve",
            written.missing_runs.len()
        );
    }
    Ok(())
}

pub fn plot(a: PlotArgs) -> Result<()> {
    let metric: PlotMetric = a.metric.parse().map_err(|e: String| anyhow::anyhow!("--metric: {e}"))?;
    if let Some(p) = a.runs.iter().find(|p| !is_run_dir(p)) {
        bail!("{}: not a run directory (no spec.json)", p.display());
    }
    let runs: Vec<RunRecord> = a
        .runs
        .iter()
        .map(|d| RunRecord::from_dir(d))
        .collect::<Result<_, _>>()?;
    if let Some(r) = runs.iter().find(|r| r.evals.is_empty()) {
        bail!("{}: no evaluations in metrics.jsonl to plot", r.key);
    }
    let refs: Vec<&RunRecord> = runs.iter().collect();
    let svg = site::plot(&refs, metric);
    fpt_spec::files::write_atomic(&a.out, svg.as_bytes())?;
    println!("wrote {}", a.out.display());
    match fpt_ablate::chart::png(&svg) {
        Ok(png) => {
            let p = a.out.with_extension("png");
            fpt_spec::files::write_atomic(&p, &png)?;
            println!("wrote {}", p.display());
        }
        Err(e) => eprintln!("note: no PNG: {e}"),
    }
    Ok(())
}

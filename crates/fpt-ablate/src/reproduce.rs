//! The whole of `fpt run-table` as library calls: which tables, at which scale, how runs
//! are spread over the machine ([`run_options`]), and per table either a report (train the
//! missing runs, write `report.{md,json,csv}`) or a figure, a listing ([`listing`]) or the
//! settings every cell would run with ([`dry_run`]). The CLI parses flags, calls these and
//! prints what they return.

use crate::{
    describe, expand, expand_unchecked, figure, list, load_scales, load_table, run, runs_of, worker, AblateError, Plan,
    Report, Result, RunOptions, Trained,
};
use candle_core::Device;
use fpt_spec::table::{Kind, ScaleSettings, TableSpec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What [`reproduce`] does.
#[derive(Debug, Clone)]
pub struct Request {
    /// The directory of the table specs (`data/tables`).
    pub tables: PathBuf,
    /// Table and figure ids; empty or `all`: every one.
    pub ids: Vec<String>,
    /// `smoke`, `cpu`, `paper`, or another scale of `scales.toml`.
    pub scale: String,
    /// The results directory (runs under `runs/<key>`, reports under `<id>/<scale>/`).
    pub out: PathBuf,
    /// How runs train.
    pub opts: RunOptions,
    /// The frozen weights' number format: `bf16` runs every cell that can in bf16 and
    /// reports under `<id>/<scale>-bf16/`, beside the f32 table (`precision.md`).
    pub precision: fpt_spec::Precision,
}

/// What [`reproduce`] made of one table or figure.
#[derive(Debug, Clone)]
pub enum Done {
    /// A table: its report directory and the runs trained for it.
    Table {
        /// Table id.
        id: String,
        /// `<out>/<id>/<scale>`.
        dir: PathBuf,
        /// The runs trained (none where every run had its result).
        trained: Trained,
    },
    /// A figure: its directory.
    Figure {
        /// Figure id.
        id: String,
        /// `<out>/<id>/<scale>`.
        dir: PathBuf,
    },
}

/// What [`reproduce`] reports as it goes.
#[derive(Debug)]
pub enum Progress<'a> {
    /// A progress line of table or figure `id` (a run started, an evaluation, a run done).
    Line {
        /// Table or figure id.
        id: &'a str,
        /// The line.
        line: &'a str,
    },
    /// A table or figure is written.
    Done(&'a Done),
}

fn bad(msg: String) -> AblateError {
    AblateError::Request(msg)
}

/// The ids `ids` names in `tables` (empty or `all`: every one, in paper order); an unknown
/// id is an error listing the known ones.
pub fn table_ids(tables: &Path, ids: &[String]) -> Result<Vec<String>> {
    let all = list(tables)?;
    if ids.is_empty() || ids.iter().any(|i| i == "all") {
        return Ok(all);
    }
    for id in ids {
        if !all.contains(id) {
            return Err(bad(format!(
                "no table `{id}` in {} (known: {})",
                tables.display(),
                all.join(", ")
            )));
        }
    }
    Ok(ids.to_vec())
}

/// The scales of `tables`, checked to have `scale`.
pub fn scales_with(tables: &Path, scale: &str) -> Result<BTreeMap<String, ScaleSettings>> {
    let scales = load_scales(tables)?;
    if !scales.contains_key(scale) {
        return Err(bad(format!(
            "unknown scale `{scale}` (known: {})",
            scales.keys().cloned().collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(scales)
}

/// How runs spread over `device`: on a CPU, `jobs` runs at once (default
/// [`worker::auto_jobs`] of the machine's cores), each in a child process of `exe` (the
/// binary with the `run-cell` subcommand) on cores / jobs threads, or one at a time in this
/// process on every core (`jobs` 1); on a GPU, `jobs` runs in this process (default 1), each
/// job on a stream of its own.
pub fn run_options(
    device: Device,
    jobs: Option<usize>,
    exe: &dyn Fn() -> std::io::Result<PathBuf>,
) -> Result<RunOptions> {
    let cores = fpt_nn::num_threads();
    let (jobs, threads) = match (jobs, device.is_cpu()) {
        (Some(0), _) => return Err(bad("jobs 0: need at least 1".into())),
        (Some(1), _) => (1, None),
        (Some(n), true) => (n, Some((cores / n).max(1))),
        (Some(n), false) => (n, None),
        (None, true) => {
            let (n, threads) = worker::auto_jobs(cores);
            (n, (n > 1).then_some(threads))
        }
        (None, false) => (1, None),
    };
    let workers = match threads {
        Some(threads) => Some(worker::Workers {
            exe: exe().map_err(|source| AblateError::Io {
                path: PathBuf::from("the fpt binary (to run each run in a child process)"),
                source,
            })?,
            threads,
        }),
        None => None,
    };
    Ok(RunOptions {
        jobs,
        device: Some(device),
        workers,
        ..RunOptions::default()
    })
}

/// One line per table: its title, what the scale runs, counts and cannot run here (with
/// the reasons).
pub fn listing(table: &TableSpec, scales: &BTreeMap<String, ScaleSettings>, scale: &str) -> Result<Vec<String>> {
    if table.kind != Kind::Table {
        return Ok(vec![format!(
            "{}: {} | figure ({:?})",
            table.id, table.title, table.kind
        )]);
    }
    let cells = expand(table, scales, scale)?;
    let count = |f: &dyn Fn(&Plan) -> bool| cells.iter().filter(|c| f(&c.plan)).count();
    let mut lines = vec![format!(
        "{}: {} | {} cells: {} runs, {} counted, {} paper-only, {} not in the paper, {} unavailable",
        table.id,
        table.title,
        cells.len(),
        runs_of(&cells).len(),
        count(&|p| matches!(p, Plan::Count(_))),
        count(&|p| matches!(p, Plan::PaperOnly(_))),
        count(&|p| matches!(p, Plan::NotInPaper)),
        count(&|p| matches!(p, Plan::Unavailable(_))),
    )];
    let mut why: Vec<String> = cells
        .iter()
        .filter_map(|c| match &c.plan {
            Plan::Unavailable(w) => Some(w.clone()),
            _ => None,
        })
        .collect();
    why.sort();
    why.dedup();
    lines.extend(why.into_iter().map(|w| format!("    unavailable: {w}")));
    Ok(lines)
}

/// Every cell's settings at `scale` as it would run, whether or not its data and weights
/// are here, and where they differ from the paper's; nothing trains. Empty for figures.
pub fn dry_run(
    table: &TableSpec,
    scales: &BTreeMap<String, ScaleSettings>,
    scale: &str,
    precision: fpt_spec::Precision,
) -> Result<Vec<String>> {
    if table.kind != Kind::Table {
        return Ok(Vec::new());
    }
    let mut lines = vec![format!(
        "## {}: {} (scale `{}`)",
        table.id,
        table.title,
        crate::precision::scale_label(scale, precision)
    )];
    let table = &crate::at_scale(table, scales, scale)?;
    let mut cells = expand_unchecked(table, scales, scale)?;
    crate::precision::apply(&mut cells, precision);
    for c in cells {
        lines.push(format!(
            "{} / {}: {}",
            table.rows[c.row].label,
            table.cols[c.col].label,
            describe(&c.plan)
        ));
        lines.extend(c.notes.iter().map(|n| format!("    note: {n}")));
        lines.extend(c.differs.iter().map(|d| format!("    differs from the paper: {d}")));
    }
    Ok(lines)
}

/// Reproduces every table and figure `req` names: trains what has no result (nothing with
/// `opts.report_only`), writes each report or figure, and returns what it made. `on`
/// receives progress lines, and each table or figure as soon as it is written.
pub fn reproduce(req: &Request, on: &mut (dyn FnMut(Progress) + Send)) -> Result<Vec<Done>> {
    let ids = table_ids(&req.tables, &req.ids)?;
    let scales = scales_with(&req.tables, &req.scale)?;
    // Rendering only: runs whose directories are not here are read from their records.
    let sources = if req.opts.report_only {
        crate::report::Sources::RunDirsOrRecords
    } else {
        crate::report::Sources::RunDirs
    };
    let mut done = Vec::new();
    for id in &ids {
        let table = crate::at_scale(&load_table(&req.tables, id)?, &scales, &req.scale)?;
        if table.kind != Kind::Table {
            if table.kind == Kind::AttentionMap && !req.opts.report_only {
                // The figure draws from one trained run: train it first (shared with any
                // table cell of the same spec).
                let cells = expand(&table, &scales, &req.scale)?;
                run(&cells, &req.out, &req.opts, &mut |line| on(Progress::Line { id, line }))?;
            }
            let dir = figure::render(&table, &req.tables, &scales, &req.scale, &req.out, sources)?;
            done.push(Done::Figure { id: id.clone(), dir });
            on(Progress::Done(done.last().expect("just pushed")));
            continue;
        }
        // Training takes the cells this machine can run; the report every cell as the scale
        // defines it, so that a committed record shows whatever this machine holds (a cell
        // without one says why it cannot run here) and reads the same on every machine.
        let mut cells = expand(&table, &scales, &req.scale)?;
        crate::precision::apply(&mut cells, req.precision);
        let mut report_cells = crate::expand::expand_unchecked(&table, &scales, &req.scale)?;
        crate::precision::apply(&mut report_cells, req.precision);
        let label = crate::precision::scale_label(&req.scale, req.precision);
        on(Progress::Line {
            id,
            line: &format!("at scale {label} ({} cells)", cells.len()),
        });
        // `--rows`: train only the cells of the rows named (the report shows them all).
        let unknown: Vec<&String> = req
            .opts
            .rows
            .iter()
            .filter(|r| !table.rows.iter().any(|t| &t.label == *r))
            .collect();
        if !unknown.is_empty() {
            return Err(bad(format!(
                "{id} at scale {}: no row {:?} (its rows: {})",
                req.scale,
                unknown,
                table
                    .rows
                    .iter()
                    .map(|r| r.label.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let to_train: Vec<_> = cells
            .iter()
            .filter(|c| req.opts.rows.is_empty() || req.opts.rows.contains(&table.rows[c.row].label))
            .cloned()
            .collect();
        // A campaign scale trains in its own order (`campaign_order`).
        let mut opts = req.opts.clone();
        opts.campaign = crate::runner::CampaignOrder::of(&crate::scale_of(&table, &scales, &req.scale)?);
        let trained = run(&to_train, &req.out, &opts, &mut |line| on(Progress::Line { id, line }))?;
        let dir = Report::from_runs(&table, &label, &report_cells, &req.out, sources).write(&req.out)?;
        if !req.precision.is_f32() {
            crate::precision::compare(&table, &report_cells, &req.out, &dir)?;
        }
        done.push(Done::Table {
            id: id.clone(),
            dir,
            trained,
        });
        on(Progress::Done(done.last().expect("just pushed")));
    }
    Ok(done)
}

/// Every claim of the tables `ids` at `scale`, with its verdicts, read from their written
/// reports (`<out>/<id>/<scale>/report.json`, the same data `report.md` shows), as one
/// Markdown table, after a line that counts the cells with runs that left their task's
/// trivial baseline and the claims by verdict; a table that carries claims but has no
/// report at the scale gets a row saying so. Tables without claims are left out of the
/// table (their cells are counted).
pub fn claims_summary(tables: &Path, ids: &[String], scale: &str, out: &Path) -> Result<String> {
    let mut rows = String::new();
    let cell = |t: &str| t.replace('|', "\\|");
    let (mut ran, mut left, mut reports) = (0usize, 0usize, 0usize);
    let mut verdicts: BTreeMap<String, usize> = BTreeMap::new();
    let scales = scales_with(tables, scale)?;
    for id in table_ids(tables, ids)? {
        let table = crate::at_scale(&load_table(tables, &id)?, &scales, scale)?;
        // A figure takes part through its statements (judged in its report like claims).
        if table.kind != Kind::Table && table.statements.is_empty() {
            continue;
        }
        let path = out.join(&id).join(scale).join("report.json");
        let report: Option<serde_json::Value> = match std::fs::read_to_string(&path) {
            Ok(text) => Some(serde_json::from_str(&text).map_err(|e| AblateError::Spec {
                path: path.clone(),
                msg: format!("not a report: {e}"),
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(AblateError::Io { path, source }),
        };
        if let Some(r) = &report {
            reports += 1;
            for c in r["cells"].as_array().into_iter().flatten() {
                if c["status"] == "ran" && !c["baseline"].is_null() {
                    ran += 1;
                    left += usize::from(c["at_baseline"].is_null());
                }
            }
        }
        // What the report judges: a table's claims, or a figure's statements.
        let texts: Vec<&str> = match table.kind {
            Kind::Table => table.claims.iter().map(|c| c.text.as_str()).collect(),
            _ => table.statements.iter().map(|s| s.text.as_str()).collect(),
        };
        if texts.is_empty() {
            continue;
        }
        match report.as_ref().and_then(|r| r["claims"].as_array().cloned()) {
            None => {
                for text in &texts {
                    *verdicts.entry("without a report".into()).or_insert(0) += 1;
                    rows.push_str(&format!(
                        "| {id} | {} | no report at this scale | `fpt run-table {id} --scale {scale}` | |\n",
                        cell(text)
                    ));
                }
            }
            Some(claims) => {
                for c in claims {
                    let v = |who: &str, what: &str| c[who][what].as_str().unwrap_or("").to_string();
                    *verdicts.entry(v("ours", "verdict")).or_insert(0) += 1;
                    rows.push_str(&format!(
                        "| {id} | {} | **{}** | {} | {} |\n",
                        cell(c["text"].as_str().unwrap_or("")),
                        v("ours", "verdict"),
                        cell(&v("ours", "detail")),
                        v("paper", "verdict"),
                    ));
                }
            }
        }
    }
    let total: usize = verdicts.values().sum();
    let decided = verdicts.get("holds").unwrap_or(&0) + verdicts.get("fails").unwrap_or(&0);
    let by: Vec<String> = verdicts.iter().map(|(v, n)| format!("{n} {v}")).collect();
    Ok(format!(
        "{reports} reports at the `{scale}` scale: of the {ran} cells with runs whose baseline is known, {left} left their task's trivial baseline and {} did not; of {total} claims, {decided} decided ({}).\n\n| table | claim | ours (`{scale}` scale) | decided by | paper |\n|---|---|---|---|---|\n{rows}",
        ran - left,
        by.join(", ")
    ))
}

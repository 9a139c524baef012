//! `fpt run-table` (the paper's tables at a scale, beside its numbers) and the hidden
//! `fpt run-cell` that trains one of its runs in a child process (`--jobs N` on a CPU).

use crate::parse_device;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct RunTableArgs {
    /// Table ids (`table1` ... `table22`), or `all`.
    ids: Vec<String>,
    /// `smoke`, `cpu` or `paper`.
    #[arg(long, default_value = "cpu")]
    scale: String,
    /// Directory of the table specs.
    #[arg(long, default_value = "data/tables")]
    tables: PathBuf,
    /// Results directory (runs under runs/<hash>, reports under <table>/<scale>/).
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Runs trained at once. On a CPU each run gets a child process and cores / N threads
    /// (default: one single-threaded run per core, up to 4); `--jobs 1` trains one run at a
    /// time on every core. On a GPU, runs share the device (default 1).
    #[arg(long)]
    jobs: Option<usize>,
    /// Run only shard I of N (`I/N`, 0-based): every N-th run by hash order.
    #[arg(long)]
    shard: Option<String>,
    /// Rerun cells that already have a result.
    #[arg(long)]
    force: bool,
    /// Render the reports from the runs present; train nothing.
    #[arg(long)]
    report_only: bool,
    /// List every table and what the scale runs, counts and cannot run here.
    #[arg(long)]
    list: bool,
    /// Print every cell's settings at the scale (as it would run, whether or not its data
    /// and weights are here) and where they differ from the paper; train nothing.
    #[arg(long)]
    dry_run: bool,
    /// Device: `cpu`, or `cuda` / `cuda:N` when built with `--features cuda`.
    #[arg(long, default_value = "cpu")]
    device: String,
}

fn parse_shard(s: &str) -> Result<(usize, usize)> {
    let (i, n) = s
        .split_once('/')
        .with_context(|| format!("--shard `{s}`: expected I/N, e.g. 0/4"))?;
    let (i, n): (usize, usize) = (
        i.parse().with_context(|| format!("--shard `{s}`: bad I"))?,
        n.parse().with_context(|| format!("--shard `{s}`: bad N"))?,
    );
    if n == 0 || i >= n {
        bail!("--shard `{s}`: need 0 <= I < N");
    }
    Ok((i, n))
}

pub fn run_table(a: RunTableArgs) -> Result<()> {
    let all = fpt_ablate::list(&a.tables)?;
    let ids: Vec<String> = if a.ids.is_empty() || a.ids.iter().any(|i| i == "all") {
        all.clone()
    } else {
        for id in &a.ids {
            if !all.contains(id) {
                bail!("no table `{id}` in {} (known: {})", a.tables.display(), all.join(", "));
            }
        }
        a.ids.clone()
    };
    let scales = fpt_ablate::load_scales(&a.tables)?;
    if !scales.contains_key(&a.scale) {
        bail!(
            "unknown --scale `{}` (known: {})",
            a.scale,
            scales.keys().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    let shard = a.shard.as_deref().map(parse_shard).transpose()?;
    let device = parse_device(&a.device)?;
    let cores = fpt_nn::num_threads();
    let (jobs, workers) = match (a.jobs, device.is_cpu()) {
        (Some(0), _) => bail!("--jobs 0: need at least 1"),
        (Some(1), _) => (1, None),
        (Some(n), true) => (n, Some((cores / n).max(1))),
        (Some(n), false) => (n, None),
        (None, true) => {
            let (n, threads) = fpt_ablate::worker::auto_jobs(cores);
            (n, (n > 1).then_some(threads))
        }
        (None, false) => (1, None),
    };
    let workers = match workers {
        Some(threads) => Some(fpt_ablate::worker::Workers {
            exe: std::env::current_exe().context("finding the fpt binary to run each run in a child process")?,
            threads,
        }),
        None => None,
    };
    let opts = fpt_ablate::RunOptions {
        force: a.force,
        shard,
        jobs,
        report_only: a.report_only,
        device: Some(device),
        workers,
    };
    for id in &ids {
        let table = fpt_ablate::load_table(&a.tables, id)?;
        if table.kind != fpt_spec::table::Kind::Table {
            if a.list {
                println!("{id}: {} | figure ({:?})", table.title, table.kind);
                continue;
            }
            if table.kind == fpt_spec::table::Kind::AttentionMap && !a.report_only {
                // The figure draws from one trained run: train it first (shared with any
                // table cell of the same spec).
                let cells = fpt_ablate::expand(&table, &scales, &a.scale)?;
                let mut log = |line: &str| eprintln!("fpt run-table: {id}: {line}");
                fpt_ablate::run(&cells, &a.out, &opts, &mut log)?;
            }
            let dir = fpt_ablate::figure::render(&table, &a.tables, &scales, &a.scale, &a.out)?;
            println!("{id}: {}", dir.join("report.md").display());
            continue;
        }
        if a.dry_run {
            let cells = fpt_ablate::expand_unchecked(&table, &scales, &a.scale)?;
            println!("## {id}: {} (scale `{}`)", table.title, a.scale);
            for c in &cells {
                println!(
                    "{} / {}: {}",
                    table.rows[c.row].label,
                    table.cols[c.col].label,
                    fpt_ablate::describe(&c.plan)
                );
                for d in &c.differs {
                    println!("    differs from the paper: {d}");
                }
            }
            continue;
        }
        let cells = fpt_ablate::expand(&table, &scales, &a.scale)?;
        if a.list {
            let runs = fpt_ablate::runs_of(&cells).len();
            let count = |f: &dyn Fn(&fpt_ablate::Plan) -> bool| cells.iter().filter(|c| f(&c.plan)).count();
            println!(
                "{id}: {} | {} cells: {runs} runs, {} counted, {} paper-only, {} not in the paper, {} unavailable",
                table.title,
                cells.len(),
                count(&|p| matches!(p, fpt_ablate::Plan::Count(_))),
                count(&|p| matches!(p, fpt_ablate::Plan::PaperOnly(_))),
                count(&|p| matches!(p, fpt_ablate::Plan::NotInPaper)),
                count(&|p| matches!(p, fpt_ablate::Plan::Unavailable(_))),
            );
            let mut why: Vec<String> = cells
                .iter()
                .filter_map(|c| match &c.plan {
                    fpt_ablate::Plan::Unavailable(w) => Some(w.clone()),
                    _ => None,
                })
                .collect();
            why.sort();
            why.dedup();
            for w in why {
                println!("    unavailable: {w}");
            }
            continue;
        }
        eprintln!("fpt run-table: {id} at scale {} ({} cells)", a.scale, cells.len());
        let mut log = |line: &str| eprintln!("fpt run-table: {id}: {line}");
        let trained = fpt_ablate::run(&cells, &a.out, &opts, &mut log)?;
        let report = fpt_ablate::Report::new(&table, &a.scale, &cells, &a.out);
        let dir = report.write(&a.out)?;
        println!("{id}: {}", dir.join("report.md").display());
        for line in trained.time_lines() {
            println!("{id} {line}");
        }
    }
    Ok(())
}

#[derive(Args)]
pub struct RunCellArgs {
    /// The run directory (resumed from its checkpoint if it has one).
    #[arg(long)]
    dir: PathBuf,
    /// Start the run over even if its directory holds one.
    #[arg(long)]
    force: bool,
}

/// Reads a run spec on stdin and trains it on the CPU (see `fpt_ablate::worker`).
pub fn run_cell(a: RunCellArgs) -> Result<()> {
    let stdout = std::io::stdout();
    fpt_ablate::worker::serve(&a.dir, a.force, &mut std::io::stdin().lock(), &mut stdout.lock())?;
    Ok(())
}

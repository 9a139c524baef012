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
    /// Train only the cells of these rows (labels, comma-separated, e.g. `--rows Bit`); the
    /// report still shows every cell (the others from runs already there, or pending).
    #[arg(long, value_delimiter = ',')]
    rows: Vec<String>,
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
    /// Print every claim of the tables at the scale with its verdicts, from their written
    /// reports, as one Markdown table; train nothing.
    #[arg(long)]
    claims: bool,
    /// Print what `fpt fetch` would bring for the tables at the scale (datasets and models,
    /// one per line, whether here or not); train nothing.
    #[arg(long)]
    assets: bool,
    /// Device: `cpu`, or `cuda` / `cuda:N` when built with `--features cuda`.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// A time budget (`2h`, `45m`, `2h30m`): at its end every running cell stops with a
    /// checkpoint and no further cell starts; the next call (on this machine or another that
    /// has the run directories) resumes them. The reports are written either way, the
    /// unfinished cells as `pending (step N)`.
    #[arg(long, value_parser = parse_budget)]
    budget: Option<std::time::Duration>,
    /// Train only these runs (keys, as `--status` prints them, comma-separated); the report
    /// still shows every cell.
    #[arg(long, value_delimiter = ',')]
    runs: Vec<String>,
    /// A campaign: first bring in the committed copies of the scale's runs
    /// (`<out>/campaign/<key>/`) where the local run directories are missing or behind, and
    /// at the end copy the runs back there (their files and latest checkpoint only), to be
    /// committed so that any machine resumes them.
    #[arg(long)]
    campaign: bool,
    /// Print the campaign's state at the scale (cells done, pending at step N of their cap,
    /// steps left and the hours they take at this machine's measured pace); train nothing.
    #[arg(long)]
    status: bool,
    /// The frozen weights' number format: `bf16` runs each cell that can with its frozen
    /// weight matrices in bf16 (`fpt train --precision`) and reports under
    /// `<table>/<scale>-bf16/`, with `precision.md` setting each cell beside its f32 twin.
    #[arg(long, default_value = "f32")]
    precision: fpt_spec::Precision,
}

fn parse_budget(s: &str) -> Result<std::time::Duration, String> {
    let d = fpt_train::stop::parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("`{s}`: a budget of 0 trains nothing; give a time such as 2h"));
    }
    Ok(d)
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
    use fpt_ablate::reproduce::{self, Done, Progress};
    let ids = reproduce::table_ids(&a.tables, &a.ids)?;
    let scales = reproduce::scales_with(&a.tables, &a.scale)?;
    if a.claims {
        print!("{}", reproduce::claims_summary(&a.tables, &ids, &a.scale, &a.out)?);
        return Ok(());
    }
    if a.assets {
        let mut all = std::collections::BTreeSet::new();
        for id in &ids {
            let table = fpt_ablate::load_table(&a.tables, id)?;
            all.extend(fpt_ablate::assets(&fpt_ablate::expand_unchecked(
                &table, &scales, &a.scale,
            )?));
        }
        for asset in all {
            println!("{asset}");
        }
        return Ok(());
    }
    if a.list || a.dry_run {
        for id in &ids {
            let table = fpt_ablate::load_table(&a.tables, id)?;
            let lines = match a.list {
                true => reproduce::listing(&table, &scales, &a.scale)?,
                false => reproduce::dry_run(&table, &scales, &a.scale, a.precision)?,
            };
            for line in lines {
                println!("{line}");
            }
        }
        return Ok(());
    }
    if a.status {
        for id in &ids {
            let table = fpt_ablate::at_scale(&fpt_ablate::load_table(&a.tables, id)?, &scales, &a.scale)?;
            // The runs this machine can train (cells it cannot are not the campaign's).
            let cells = fpt_ablate::expand(&table, &scales, &a.scale)?;
            let order = fpt_ablate::CampaignOrder::of(&fpt_ablate::scale_of(&table, &scales, &a.scale)?);
            let rows: Vec<String> = table.rows.iter().map(|r| r.label.clone()).collect();
            let cols: Vec<String> = table.cols.iter().map(|c| c.label.clone()).collect();
            let states = fpt_ablate::campaign::status(&cells, &rows, &cols, &a.out, &order);
            let jobs = a
                .jobs
                .unwrap_or_else(|| fpt_ablate::worker::auto_jobs(fpt_nn::num_threads()).0);
            println!("{id} at scale {} ({} runs):", a.scale, states.len());
            for line in fpt_ablate::campaign::status_lines(&states, jobs) {
                println!("  {line}");
            }
            for mv in fpt_ablate::campaign::moves(&cells, &a.out) {
                println!(
                    "  to move   {} -> {}: begun under the scale's earlier evaluation or cap ({}); the next stretch moves it, its steps kept",
                    mv.dir.display(),
                    mv.key,
                    mv.changes.join("; ")
                );
            }
        }
        return Ok(());
    }
    let mut opts = reproduce::run_options(parse_device(&a.device)?, a.jobs, &std::env::current_exe)?;
    opts.force = a.force;
    opts.report_only = a.report_only;
    opts.shard = a.shard.as_deref().map(parse_shard).transpose()?;
    opts.rows = a.rows;
    let campaign_only = a.runs.clone();
    opts.only = a.runs;
    // `--runs`: keys that are no run here (unknown, or of a cell that cannot run on this
    // machine: its data missing) are named; the others train; the command then exits
    // non-zero. None left: nothing to do, an error now.
    let mut problems: Vec<(String, String)> = Vec::new();
    if !opts.only.is_empty() {
        let mut here = std::collections::BTreeSet::new();
        for id in &ids {
            let table = fpt_ablate::at_scale(&fpt_ablate::load_table(&a.tables, id)?, &scales, &a.scale)?;
            here.extend(
                fpt_ablate::runs_of(&fpt_ablate::expand(&table, &scales, &a.scale)?)
                    .into_iter()
                    .map(|(k, _)| k),
            );
        }
        let (known, unknown): (Vec<String>, Vec<String>) = opts.only.iter().cloned().partition(|k| here.contains(k));
        for k in &unknown {
            eprintln!(
                "fpt run-table: no run {k} at scale {} here (an unknown key, or a cell this machine cannot run: its data or weights missing; `--status` lists the keys)",
                a.scale
            );
            problems.push((k.clone(), "no such run here".into()));
        }
        if known.is_empty() {
            bail!("none of the runs named by --runs can train here (named above)");
        }
        opts.only = known;
    }
    opts.deadline = a.budget.map(|b| std::time::SystemTime::now() + b);
    // Runs a campaign leaves alone (a damaged checkpoint pointer, copies that would lose a
    // stretch): named as found, and the command exits non-zero at the end. The cells are
    // read once, here: the save at the end uses them, whatever happened to the table files
    // in the hours between (an edit this build cannot read must not cost the stretch).
    let mut campaign_cells: Vec<(String, Vec<fpt_ablate::Cell>)> = Vec::new();
    if a.campaign {
        for id in &ids {
            let table = fpt_ablate::at_scale(&fpt_ablate::load_table(&a.tables, id)?, &scales, &a.scale)?;
            let cells = fpt_ablate::expand_unchecked(&table, &scales, &a.scale)?;
            // Runs begun under an earlier evaluation of the scale continue at their new key.
            let migrated = fpt_ablate::campaign::migrate(&cells, &a.out)?;
            for (moved, step) in &migrated.moved {
                eprintln!("fpt run-table: {id}: run {moved}: the scale's evaluation or cap changed; it continues from step {step} (see its respec.jsonl)");
            }
            for (moved, why) in &migrated.problems {
                eprintln!("fpt run-table: {id}: run {moved} {why}");
            }
            problems.extend(migrated.problems);
            let restored = fpt_ablate::campaign::restore(&cells, &a.out)?;
            for (key, step) in &restored.moved {
                eprintln!("fpt run-table: {id}: run {key} brought in from its committed copy (step {step})");
            }
            for (key, why) in &restored.problems {
                eprintln!("fpt run-table: {id}: run {key} left alone, not trained: {why}");
                opts.skip.push(key.clone());
            }
            problems.extend(restored.problems);
            campaign_cells.push((id.clone(), cells));
        }
    }
    let out_dir = a.out.clone();
    let req = reproduce::Request {
        tables: a.tables,
        ids,
        scale: a.scale,
        out: a.out,
        opts,
        precision: a.precision,
    };
    // Progress on stderr; each table's report path and run times on stdout as soon as it is
    // written (`cargo xtask reproduce` reads them).
    // Runs that failed (not those a budget or a signal stopped with a checkpoint).
    let mut failed = 0usize;
    let outcome = reproduce::reproduce(&req, &mut |p| match p {
        Progress::Line { id, line } => eprintln!("fpt run-table: {id}: {line}"),
        Progress::Done(Done::Figure { id, dir }) => println!("{id}: {}", dir.join("report.md").display()),
        Progress::Done(Done::Table { id, dir, trained }) => {
            println!("{id}: {}", dir.join("report.md").display());
            for line in trained.time_lines() {
                println!("{id} {line}");
            }
            failed += trained
                .times
                .iter()
                .filter(|(what, _, ok)| !ok && !trained.stopped.iter().any(|s| what.starts_with(&s.0)))
                .count();
        }
    });
    // A campaign's runs are saved whatever became of the reports (a failed self-check, a
    // report that cannot be written): the hours they hold are not lost with them.
    if a.campaign {
        for (id, cells) in &campaign_cells {
            let saved = fpt_ablate::campaign::save(cells, &out_dir)?;
            let root = fpt_ablate::campaign::saved_root(&out_dir);
            if saved.moved.is_empty() {
                eprintln!(
                    "fpt run-table: {id}: no run had anything new to copy to {}",
                    root.display()
                );
            } else {
                eprintln!(
                    "fpt run-table: {id}: {} run(s) copied to {} (commit it): {}",
                    saved.moved.len(),
                    root.display(),
                    saved
                        .moved
                        .iter()
                        .map(|(k, s)| format!("{k} at step {s}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            for (key, why) in &saved.problems {
                eprintln!("fpt run-table: {id}: run {key} {why}");
            }
            for p in saved.problems {
                if !problems.contains(&p) {
                    problems.push(p);
                }
            }
        }
    }
    outcome?;
    if fpt_train::stop::due() == Some(fpt_train::stop::Why::Requested) {
        eprintln!("fpt run-table: interrupted: the running runs stopped with a checkpoint; the next call resumes them");
        std::process::exit(130);
    }
    if (a.campaign || !campaign_only.is_empty()) && failed > 0 {
        anyhow::bail!("{failed} run(s) failed (named above with FAILED)");
    }
    if !problems.is_empty() {
        anyhow::bail!(
            "{} run(s) left alone (named above: a damaged checkpoint pointer, copies that would lose a stretch, or no such run here); nothing of them was replaced",
            problems.len()
        );
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

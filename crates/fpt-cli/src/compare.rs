//! `fpt compare`: two sets of finished runs, paired by order (seed i of one with seed i of
//! the other), through `fpt_ablate::compare` (each run's accuracy, and the mean difference
//! in points with its 95% paired bootstrap interval over examples and seeds).

use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct CompareArgs {
    /// Run directories of the model that should be ahead (one per seed).
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Run directories it is compared with, paired with the first ones in order (seed i with
    /// seed i).
    #[arg(long = "vs", required = true, num_args = 1..)]
    pub vs: Vec<PathBuf>,
    /// The task's spread across seeds (standard deviation, points), added where each side
    /// ran one seed, as the table reports do (`seed_spread` in data/tables/scales.toml);
    /// 0 leaves it out: the interval is then over the held-out examples only.
    #[arg(long, default_value_t = 0.0)]
    pub seed_sd: f64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn compare(a: CompareArgs) -> Result<()> {
    let c = fpt_ablate::compare::compare_runs(&a.runs, &a.vs, a.seed_sd)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&c)?);
        return Ok(());
    }
    let line = |r: &fpt_ablate::compare::RunSummary| {
        format!(
            "  {}{}: {}{:.1}% (step {}, {} examples){}",
            r.dir.display(),
            r.seed.map_or(String::new(), |s| format!(" (seed {s})")),
            if r.converged == Some(false) { ">=" } else { "" },
            r.accuracy,
            r.step,
            r.examples,
            match (r.converged == Some(false), r.left_baseline == Some(false)) {
                (_, true) => " [at its task's trivial baseline]",
                (true, false) => " [rising at its cap: a lower bound]",
                (false, false) => "",
            }
        )
    };
    println!("runs:");
    c.runs.iter().for_each(|r| println!("{}", line(r)));
    println!("vs:");
    c.vs.iter().for_each(|r| println!("{}", line(r)));
    let [lo, hi] = c.interval;
    println!(
        "difference: {:+.1} points, 95% interval {lo:+.1} to {hi:+.1} ({}): {}",
        c.difference, c.over, c.verdict
    );
    if c.runs.iter().chain(&c.vs).any(|r| r.left_baseline == Some(false)) {
        println!("note: a run at its task's trivial baseline learned nothing: the difference says the other side learned, not how two learned models compare");
    }
    if c.vs.iter().any(|r| r.converged == Some(false)) {
        println!("note: a run compared against was still rising at its cap: it could close the gap with more steps");
    } else if c.runs.iter().any(|r| r.converged == Some(false)) {
        println!("note: a run ahead was still rising at its cap: more steps could only widen the gap");
    }
    Ok(())
}

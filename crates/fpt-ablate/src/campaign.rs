//! A campaign: a table's scale whose runs take hours (Table 2's `converge` scale), trained
//! in stretches on whatever machine is at hand and carried between them in git.
//!
//! Run directories stay local (`results/runs/`, ignored); a campaign keeps a copy of each of
//! its runs under `results/campaign/<key>/` that is committed: the spec, metrics, result,
//! outcomes, history (`history.jsonl`: where each stretch ran) and the latest checkpoint
//! only (trained tensors, optimizer moments and the loop's state: a few MB a run).
//! [`restore`] brings those into `runs/` where the local copy is missing or behind,
//! `fpt run-table --budget` trains until the deadline and checkpoints, and [`save`] copies
//! the runs back. [`status`] says what is done, what is pending and at which step, and the
//! hours left at the pace measured.

use crate::{io, run_dir, runs_of, AblateError, CampaignOrder, Cell, Result};
use std::path::{Path, PathBuf};

/// Where a campaign's committed copies live under the results directory.
pub fn saved_root(out: &Path) -> PathBuf {
    out.join("campaign")
}

/// The files of a run directory a campaign keeps (besides the latest checkpoint).
const KEPT: &[&str] = &[
    "spec.json",
    "metrics.jsonl",
    "result.json",
    "outcomes.json",
    "history.jsonl",
    "respec.jsonl",
];

/// How far a run directory got: `(finished, step)`. `Ok(None)`: nothing there. An error
/// (in words, naming the file) where its checkpoint pointer is damaged: such a run is neither
/// "not started" nor to be replaced ([`fpt_train::checkpoint::latest`]).
pub fn progress(dir: &Path) -> std::result::Result<Option<(bool, usize)>, String> {
    // A result an older convergence rule wrote, with a checkpoint to go on from, is not
    // finished ([`fpt_train::reopen_reason`]).
    if let Some(seg) = raced_stretch(dir) {
        return Err(format!(
            "{}: steps {}-{} ran on {} under a build ({}) whose GPU steps raced their uploads \
             (per-thread streams, fixed in 2cadb44): not evidence; remove the run (its committed copy \
             and results/runs/<key>) to train it again",
            dir.join("history.jsonl").display(),
            seg.from_step,
            seg.to_step,
            seg.device,
            seg.commit
        ));
    }
    if let Some(r) = fpt_train::finished_result(dir) {
        return Ok(Some((true, r.steps)));
    }
    let Some(latest) = fpt_train::checkpoint::latest(dir).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let name = latest.file_name().unwrap_or_default().to_string_lossy().into_owned();
    Ok(name
        .strip_prefix("step-")
        .and_then(|s| s.parse().ok())
        .map(|s| (false, s)))
}

/// The first stretch of a run that ran on a GPU under the stream race
/// ([`fpt_train::Segment::raced`]).
fn raced_stretch(dir: &Path) -> Option<fpt_train::Segment> {
    stretches(dir)
        .iter()
        .filter_map(|l| serde_json::from_str::<fpt_train::Segment>(l).ok())
        .find(fpt_train::Segment::raced)
}

/// The stretches of a run's `history.jsonl`, one per whole line that parses (a torn or
/// garbage line is not a stretch).
fn stretches(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("history.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter(|l| serde_json::from_str::<fpt_train::Segment>(l).is_ok())
        .map(str::to_string)
        .collect()
}

/// Why run directory `copy` must not be replaced by `local`: it holds a stretch `local`
/// lacks (another machine trained the same run from the same start, and both saved), so
/// replacing it would lose that stretch. `None` where every stretch of `copy` is in
/// `local`'s history. (Saving passes the committed copy as `copy`; restoring, the local run.)
pub fn would_lose(local: &Path, copy: &Path) -> Option<String> {
    let mine: std::collections::HashSet<String> = stretches(local).into_iter().collect();
    let lost: Vec<String> = stretches(copy).into_iter().filter(|l| !mine.contains(l)).collect();
    (!lost.is_empty()).then(|| {
        format!(
            "{} has {} stretch(es) that {} lacks (another machine trained the run too; the first: {}): keep the copy that went further and delete the other by hand",
            copy.display(),
            lost.len(),
            local.display(),
            lost[0]
        )
    })
}

fn copy_file(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to).map_err(io(from))?;
    Ok(())
}

/// Copies what a campaign keeps of run directory `from` into a new directory `to` (which
/// must not exist): [`KEPT`] files and the latest checkpoint.
fn copy_run(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).map_err(io(to))?;
    for f in KEPT {
        let p = from.join(f);
        if p.is_file() {
            copy_file(&p, &to.join(f))?;
        }
    }
    // The results a run had at the caps it outgrew ([`migrate`]).
    for e in std::fs::read_dir(from).map_err(io(from))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("result-cap-") && name.ends_with(".json") && e.path().is_file() {
            copy_file(&e.path(), &to.join(&name))?;
        }
    }
    if let Some(ck) = fpt_train::checkpoint::latest(from)? {
        let name = ck.file_name().expect("a checkpoint has a name");
        let root = fpt_train::checkpoint::root(to);
        let dst = root.join(name);
        std::fs::create_dir_all(&dst).map_err(io(&dst))?;
        for e in std::fs::read_dir(&ck).map_err(io(&ck))? {
            let e = e.map_err(io(&ck))?;
            if e.path().is_file() {
                copy_file(&e.path(), &dst.join(e.file_name()))?;
            }
        }
        std::fs::write(root.join("LATEST"), name.to_string_lossy().as_bytes()).map_err(io(&root))?;
    }
    Ok(())
}

/// Replaces directory `dst` with a copy of run `src`, through a temporary directory beside
/// it and a rename, so that an interrupted copy never leaves half a run.
fn replace_with_copy(src: &Path, dst: &Path) -> Result<()> {
    let parent = dst.parent().expect("a run directory has a parent");
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let tmp = parent.join(format!(
        ".{}.tmp-{}",
        dst.file_name().expect("named").to_string_lossy(),
        std::process::id()
    ));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    copy_run(src, &tmp)?;
    let old = parent.join(format!(
        ".{}.old-{}",
        dst.file_name().expect("named").to_string_lossy(),
        std::process::id()
    ));
    if dst.exists() {
        std::fs::rename(dst, &old).map_err(io(dst))?;
    }
    std::fs::rename(&tmp, dst).map_err(io(dst))?;
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(io(&old))?;
    }
    Ok(())
}

/// Whether `a` is further than `b` (a finished run beats an unfinished one; then steps).
fn ahead(a: Option<(bool, usize)>, b: Option<(bool, usize)>) -> bool {
    match (a, b) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(a), Some(b)) => a > b,
    }
}

/// What [`restore`] and [`save`] did: the runs moved (key, step) and the runs left alone
/// with the reason (a damaged checkpoint pointer, a copy that would lose a stretch). A
/// campaign with problems trains none of those runs and exits non-zero.
#[derive(Debug, Default, Clone)]
pub struct Moved {
    /// Runs copied, with their step.
    pub moved: Vec<(String, usize)>,
    /// Runs left alone, with why.
    pub problems: Vec<(String, String)>,
}

/// Brings the committed copies of `cells`' runs into `out/runs/` where the local directory
/// is missing or behind (fewer steps, or unfinished where the copy finished). A run whose
/// copy or local directory has a damaged checkpoint pointer is left alone and named.
pub fn restore(cells: &[Cell], out: &Path) -> Result<Moved> {
    // Two stretches started together on one results directory restore one at a time (the
    // OS's lock on `out/runs/` itself, no file of its own): the second sees the first's copy
    // in place, never replaces a directory the first has begun to train.
    let runs = out.join("runs");
    std::fs::create_dir_all(&runs).map_err(io(&runs))?;
    let _serial = std::fs::File::open(&runs)
        .and_then(|f| f.lock().map(|()| f))
        .map_err(io(&runs))?;
    let mut m = Moved::default();
    for (key, _) in runs_of(cells) {
        let saved = saved_root(out).join(&key);
        let local = run_dir(out, &key);
        let (s, l) = match (progress(&saved), progress(&local)) {
            (Err(e), _) => {
                m.problems.push((key, format!("committed copy: {e}")));
                continue;
            }
            (_, Err(e)) => {
                m.problems.push((key, format!("local run: {e}")));
                continue;
            }
            (Ok(s), Ok(l)) => (s, l),
        };
        if ahead(s, l) {
            if fpt_train::in_use_by(&local).is_some() {
                continue;
            }
            if local.exists() {
                if let Some(why) = would_lose(&saved, &local) {
                    m.problems
                        .push((key, format!("local run {} not replaced: {why}", local.display())));
                    continue;
                }
            }
            replace_with_copy(&saved, &local)?;
            m.moved.push((key, s.map_or(0, |p| p.1)));
        }
    }
    Ok(m)
}

/// Copies `cells`' runs from `out/runs/` into the committed copies where the local one is
/// ahead. Never replaces a copy whose checkpoint pointer is damaged, or one holding a stretch
/// the local run lacks ([`would_lose`]): those are named in the problems.
pub fn save(cells: &[Cell], out: &Path) -> Result<Moved> {
    let mut m = Moved::default();
    for (key, _) in runs_of(cells) {
        let local = run_dir(out, &key);
        let copy = saved_root(out).join(&key);
        let (l, s) = match (progress(&local), progress(&copy)) {
            (_, Err(e)) => {
                if local.exists() {
                    m.problems.push((key, format!("not saved: its committed copy: {e}")));
                }
                continue;
            }
            (Err(e), _) => {
                m.problems.push((key, format!("not saved: {e}")));
                continue;
            }
            (Ok(l), Ok(s)) => (l, s),
        };
        if ahead(l, s) {
            if let Some(why) = would_lose(&local, &copy) {
                m.problems.push((key, format!("not saved: {why}")));
                continue;
            }
            replace_with_copy(&local, &copy)?;
            m.moved.push((key, l.map_or(0, |p| p.1)));
        }
    }
    Ok(m)
}

/// The spec fields a run may change and keep every step it trained: what it is evaluated on
/// and how often. An evaluation draws from none of the streams training uses, so the run
/// trains the same steps (fpt-train's `a_run_whose_evaluation_grew_trains_the_same_steps`).
pub const EVALUATION_FIELDS: [&str; 2] = ["task.eval_examples", "train.eval_every"];

/// Why a moved run could keep its steps (its `respec.jsonl`).
const MOVED_WHY: &str = "the scale's evaluation changed; an evaluation draws from none of the streams training uses, so every step trained stands and the run continues from its checkpoint";

/// Why a run could keep its steps under a larger cap.
const CAP_WHY: &str = "the scale's cap grew; at a constant learning rate no step depends on the cap (the data order, dropout and evaluations draw from streams that do not know it), so every step trained stands and the run continues from its checkpoint";

/// A larger cap, `train.steps: A -> B` with `B > A`: `Some((A, B))`.
fn cap_growth(diff: &str) -> Option<(usize, usize)> {
    let (a, b) = diff.strip_prefix("train.steps: ")?.split_once(" -> ")?;
    let (a, b) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (b > a).then_some((a, b))
}

/// Whether a run of spec `was` can become one of `now` and keep every step it trained: they
/// differ only in how it is evaluated ([`EVALUATION_FIELDS`]) and in a larger cap where the
/// learning rate is constant (a schedule's shape depends on the cap).
fn movable(was: &fpt_spec::RunSpec, now: &fpt_spec::RunSpec) -> bool {
    let diffs = was.differences(now);
    let constant = now.train.lr_schedule == fpt_spec::LrSchedule::Constant;
    !diffs.is_empty()
        && diffs.iter().all(|d| {
            EVALUATION_FIELDS.iter().any(|f| d.starts_with(&format!("{f}: "))) || (constant && cap_growth(d).is_some())
        })
}

/// A run begun under an earlier evaluation of its scale ([`moves`]).
#[derive(Debug, Clone)]
pub struct Move {
    /// Its directory (a committed copy, or a local run directory).
    pub dir: PathBuf,
    /// Its key now.
    pub old: String,
    /// Its cell's key.
    pub key: String,
    /// Its cell's spec.
    pub spec: fpt_spec::RunSpec,
    /// What differs (evaluation fields, a larger cap).
    pub changes: Vec<String>,
}

impl Move {
    /// The cap it grew from, where it grew.
    fn old_cap(&self) -> Option<usize> {
        self.changes.iter().find_map(|d| cap_growth(d)).map(|(a, _)| a)
    }

    /// Whether only the cap changed (its evaluations are the new spec's).
    fn cap_only(&self) -> bool {
        self.changes.iter().all(|d| cap_growth(d).is_some())
    }
}

/// Committed campaign runs whose spec differs from one of `cells`' only in
/// [`EVALUATION_FIELDS`] or a larger cap at a constant learning rate (begun before the
/// scale's evaluation or cap changed, to continue at their cell's key: [`migrate`]), and
/// the local run directories of the same keys. (Only the
/// campaign's own: a local run of another table with such a spec is not the campaign's to
/// move.)
pub fn moves(cells: &[Cell], out: &Path) -> Vec<Move> {
    let specs = runs_of(cells);
    let mut found: Vec<Move> = Vec::new();
    for root in [saved_root(out), out.join("runs")] {
        let campaign = root == saved_root(out);
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
        dirs.sort();
        for dir in dirs {
            let old = dir.file_name().expect("named").to_string_lossy().into_owned();
            if old.starts_with('.') || specs.iter().any(|(k, _)| *k == old) {
                continue;
            }
            if !campaign && !found.iter().any(|m| m.old == old) {
                continue;
            }
            let Ok(was) = fpt_train::saved_spec(&dir) else {
                continue;
            };
            if let Some((key, spec)) = specs.iter().find(|(_, s)| movable(&was, s)) {
                found.push(Move {
                    changes: was.differences(spec),
                    dir,
                    old,
                    key: key.clone(),
                    spec: spec.clone(),
                });
            }
        }
    }
    found
}

/// Moves each of [`moves`] to its cell's key: given its cell's spec
/// ([`fpt_train::respec_run`]: `spec.json`, the checkpoint, a line in `respec.jsonl`)
/// through a temporary directory and a rename, so that it continues where it stood.
/// `moved` names each as `old -> new` with its step. A run that ended at its old cap (not
/// stopped on its plateau) reopens under the larger one, its evaluation changed or not:
/// its `result.json` is kept aside as `result-cap-<A>.json` and it trains on from its last
/// checkpoint; one that stopped before its old cap keeps its result where only the cap
/// changed (under either cap it stopped there). Left where it is, and named: a run in use,
/// one that stopped on its plateau under its old evaluation (its number is not the new
/// evaluation's), one whose new key is taken, one whose checkpoint does not verify.
pub fn migrate(cells: &[Cell], out: &Path) -> Result<Moved> {
    let mut m = Moved::default();
    for mv in moves(cells, out) {
        let (dir, key) = (&mv.dir, &mv.key);
        let root = dir.parent().expect("a run directory has a parent");
        let place = if root == saved_root(out) {
            "committed copy"
        } else {
            "local run"
        };
        let name = format!("{} -> {key} ({place})", mv.old);
        let target = root.join(key);
        let finished = fpt_train::finished_result(dir);
        // Ended at its old cap: reopened under the larger one (its checkpoint is that step).
        let at_cap = match (&finished, mv.old_cap()) {
            (Some(r), Some(cap)) => r.steps >= cap && !r.stopped_early && !r.diverged,
            _ => false,
        };
        let refuse = if let Some(holder) = fpt_train::in_use_by(dir) {
            Some(format!("{} is in use by {holder}", dir.display()))
        } else if finished.is_some() && !at_cap && !mv.cap_only() {
            Some(format!(
                "{} finished under its old evaluation ({}): its number is not the new one's; rerun it under the new key",
                dir.display(),
                mv.changes.join("; ")
            ))
        } else if target.exists() {
            Some(format!(
                "{} and {} both exist: keep the one further along and delete the other by hand",
                dir.display(),
                target.display()
            ))
        } else {
            None
        };
        if let Some(why) = refuse {
            m.problems.push((name, format!("not moved: {why}")));
            continue;
        }
        let tmp = root.join(format!(".{key}.tmp-{}", std::process::id()));
        let moved = (|| -> std::result::Result<usize, String> {
            if tmp.exists() {
                std::fs::remove_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
            }
            copy_run(dir, &tmp).map_err(|e| e.to_string())?;
            if at_cap {
                let kept = tmp.join(format!("result-cap-{}.json", mv.old_cap().unwrap_or(0)));
                std::fs::rename(tmp.join("result.json"), &kept).map_err(|e| format!("{}: {e}", kept.display()))?;
            }
            let why = if mv.cap_only() { CAP_WHY } else { MOVED_WHY };
            let step = fpt_train::respec_run(&tmp, &mv.spec, why).map_err(|e| e.to_string())?;
            std::fs::rename(&tmp, &target).map_err(|e| format!("{}: {e}", target.display()))?;
            Ok(step)
        })();
        match moved {
            Ok(step) => {
                std::fs::remove_dir_all(dir).map_err(io(dir))?;
                // The record of the old key (a pending run's curve) is the new key's now.
                let _ = std::fs::remove_file(out.join("records").join(format!("{}.json", mv.old)));
                m.moved.push((name, step));
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                m.problems.push((name, format!("not moved: {e}")));
            }
        }
    }
    Ok(m)
}

/// One run of a campaign, as [`status`] sees it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunState {
    /// The run's key.
    pub key: String,
    /// `row / column, seed N`.
    pub what: String,
    /// The task's name.
    pub task: String,
    /// `done`, `pending` (a checkpoint) or `not started`.
    pub state: String,
    /// Steps done.
    pub step: usize,
    /// The cap.
    pub cap: usize,
    /// The floor (the paper's Table 6 count), if any.
    pub floor: Option<usize>,
    /// Seconds per step measured on this run on a CPU, if any.
    pub secs_per_step: Option<f64>,
    /// For a done run: its accuracy, converged or not.
    pub outcome: Option<String>,
    /// The share of its time the run spent evaluating ([`crate::campaign_time::eval_time`]).
    pub eval_time: Option<crate::campaign_time::EvalShare>,
    /// For a pending run: the convergence rule's call as of its checkpoint
    /// ([`fpt_train::pending_call`], described).
    pub call: Option<String>,
}

/// Seconds a step on a CPU: from the run's CPU stretches in `history.jsonl` where it has
/// them (a stretch on a GPU says nothing of this machine's pace), else from its metrics'
/// elapsed time where it has no history (runs made before fpt kept one); `None` for a run
/// trained only on a GPU so far.
fn secs_per_step(dir: &Path) -> Option<f64> {
    if let Ok(h) = std::fs::read_to_string(dir.join("history.jsonl")) {
        let (mut secs, mut steps) = (0f64, 0usize);
        for seg in h
            .lines()
            .filter_map(|l| serde_json::from_str::<fpt_train::Segment>(l).ok())
        {
            if seg.device == "cpu" && seg.to_step > seg.from_step {
                secs += seg.seconds;
                steps += seg.to_step - seg.from_step;
            }
        }
        return (steps > 0).then(|| secs / steps as f64);
    }
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).ok()?;
    let last: fpt_train::EvalRecord = text.lines().rev().find_map(|l| serde_json::from_str(l).ok())?;
    (last.step > 0 && last.elapsed_s > 0.0).then(|| last.elapsed_s / last.step as f64)
}

/// Every run of `cells` (the table's row and column labels to name them) with its state,
/// in the order the campaign trains them.
pub fn status(cells: &[Cell], rows: &[String], cols: &[String], out: &Path, order: &CampaignOrder) -> Vec<RunState> {
    let mut todo = runs_of(cells);
    crate::runner::order_for_campaign(&mut todo, order);
    let name = |key: &str| {
        cells.iter().find_map(|c| {
            let own = matches!(&c.plan, crate::Plan::Run { key: k, .. } if k == key);
            (own || c.replicas.iter().any(|(k, _)| k == key)).then(|| format!("{} / {}", rows[c.row], cols[c.col]))
        })
    };
    todo.into_iter()
        .map(|(key, spec)| {
            let local = run_dir(out, &key);
            let saved = saved_root(out).join(&key);
            let (pl, ps) = (progress(&local), progress(&saved));
            let damaged = match (&pl, &ps) {
                (Err(e), _) => Some(format!("local run: {e}")),
                (_, Err(e)) => Some(format!("committed copy: {e}")),
                _ => None,
            };
            let (dir, p) = match (pl.unwrap_or(None), ps.unwrap_or(None)) {
                (l, s) if ahead(s, l) => (saved, s),
                (l, _) => (local, l),
            };
            let outcome = p.filter(|p| p.0).and_then(|_| {
                let r: fpt_train::RunResult =
                    serde_json::from_str(&std::fs::read_to_string(dir.join("result.json")).ok()?).ok()?;
                Some(format!(
                    "{:.1}% at step {}, {}",
                    100.0 * r.test_accuracy,
                    r.steps,
                    match r.converged {
                        _ if r.ended_at_baseline_now() => "ended at baseline".to_string(),
                        Some(true) if r.plateau.as_ref().is_some_and(|p| p.ceiling == Some(true)) => {
                            "converged at its ceiling".to_string()
                        }
                        Some(true) => "converged".to_string(),
                        Some(false) => "not converged".to_string(),
                        None => "convergence not recorded".to_string(),
                    }
                ))
            });
            RunState {
                what: format!(
                    "{}, seed {}",
                    name(&key).unwrap_or_else(|| spec.task.label()),
                    spec.train.seed
                ),
                key,
                task: spec.task.name.to_string(),
                state: match p {
                    _ if damaged.is_some() => format!("DAMAGED ({})", damaged.unwrap_or_default()),
                    Some((true, _)) => "done".into(),
                    Some((false, _)) => "pending".into(),
                    None => "not started".into(),
                },
                step: p.map_or(0, |p| p.1),
                cap: spec.train.steps,
                floor: spec.train.converge_floor,
                secs_per_step: secs_per_step(&dir),
                eval_time: crate::campaign_time::eval_time(&dir),
                call: p
                    .filter(|p| !p.0)
                    .and_then(|_| fpt_train::pending_call(&dir))
                    .map(|c| c.describe()),
                outcome,
            }
        })
        .collect()
}

/// [`status`] as lines: one per run, then the totals (steps left to the caps and to the
/// floors, and the hours those take at the measured pace with `jobs` runs at once).
pub fn status_lines(states: &[RunState], jobs: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let (mut done, mut pending, mut fresh, mut damaged) = (0, 0, 0, 0);
    let (mut left_cap, mut left_floor, mut secs_cap, mut secs_floor) = (0usize, 0usize, 0f64, 0f64);
    // The pace of runs without their own: the median of the same task's runs (their steps
    // cost the same), else of all runs; none before any was measured.
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let fallback = median(states.iter().filter_map(|s| s.secs_per_step).collect());
    let task_pace = |task: &str| {
        median(
            states
                .iter()
                .filter(|s| s.task == task)
                .filter_map(|s| s.secs_per_step)
                .collect(),
        )
    };
    for s in states {
        let pace = s.secs_per_step.or_else(|| task_pace(&s.task)).or(fallback);
        let line = match s.state.as_str() {
            "done" => {
                done += 1;
                format!("done      {}  {}", s.what, s.outcome.as_deref().unwrap_or(""))
            }
            st => {
                if st == "pending" {
                    pending += 1;
                } else if st.starts_with("DAMAGED") {
                    damaged += 1;
                } else {
                    fresh += 1;
                }
                let to_cap = s.cap.saturating_sub(s.step);
                let to_floor = s.floor.unwrap_or(0).saturating_sub(s.step);
                left_cap += to_cap;
                left_floor += to_floor;
                if let Some(p) = pace {
                    secs_cap += to_cap as f64 * p;
                    secs_floor += to_floor as f64 * p;
                }
                format!(
                    "{:<9} {}  step {} of {}{}{}{}{}",
                    st,
                    s.what,
                    s.step,
                    s.cap,
                    s.floor.map_or(String::new(), |f| format!(" (floor {f})")),
                    s.secs_per_step
                        .map_or(String::new(), |p| format!(", {p:.3} s a step on a CPU")),
                    s.eval_time
                        .as_ref()
                        .map_or(String::new(), |e| format!(", evaluating {}", e.describe())),
                    s.call.as_ref().map_or(String::new(), |c| format!("; now {c}")),
                )
            }
        };
        lines.push(format!("{line}  [{}]", s.key));
    }
    let mut unpaced: Vec<&str> = states
        .iter()
        .filter(|s| s.state != "done" && task_pace(&s.task).is_none())
        .map(|s| s.task.as_str())
        .collect();
    unpaced.sort();
    unpaced.dedup();
    let jobs = jobs.max(1) as f64;
    let timed: Vec<&crate::campaign_time::EvalShare> = states.iter().filter_map(|s| s.eval_time.as_ref()).collect();
    if !timed.is_empty() {
        let all = crate::campaign_time::EvalShare {
            shares: timed.iter().flat_map(|t| t.shares.iter().copied()).collect(),
        };
        lines.push(format!(
            "evaluations took {:.0}% of the time between timed evaluations (the median of {} evaluations of {} runs; the converge scale spaces them to keep this under a fifth)",
            100.0 * all.typical(),
            all.shares.len(),
            timed.len()
        ));
    }
    if damaged > 0 {
        lines.push(format!(
            "{damaged} run(s) DAMAGED (named above): the campaign leaves them alone until mended (`fpt repair DIR` rebuilds a checkpoint pointer)"
        ));
    }
    lines.push(format!(
        "{done} done, {pending} pending, {fresh} not started; {left_floor} steps left to the floors (the paper's Table 6 counts) and {left_cap} to the caps: {:.1} to {:.1} hours on this machine at the measured pace, {} runs at once{}",
        secs_floor / 3600.0 / jobs,
        secs_cap / 3600.0 / jobs,
        jobs,
        if fallback.is_none() { " (no pace measured yet: hours unknown)" } else { "" }
    ));
    if fallback.is_some() && !unpaced.is_empty() {
        lines.push(format!(
            "no CPU pace measured yet for {}: their hours use the median of the other tasks' pace, an underestimate where their steps cost more",
            unpaced.join(", ")
        ));
    }
    lines
}

/// An error for a campaign request.
pub fn bad(msg: impl Into<String>) -> AblateError {
    AblateError::Request(msg.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A larger cap keeps a run's steps only at a constant learning rate (a schedule's shape
    /// depends on the cap); a smaller cap, or anything but evaluations and the cap, never.
    #[test]
    fn a_larger_cap_moves_a_run_only_at_a_constant_learning_rate() {
        let task = fpt_spec::TaskSpec::new(fpt_spec::TaskName::Mnist);
        let was = fpt_spec::RunSpec::new(task, fpt_spec::BackboneSpec::new("gpt2", fpt_spec::Init::Random));
        let mut now = was.clone();
        now.train.steps = was.train.steps * 2;
        assert!(movable(&was, &now));
        now.task.eval_examples = 0;
        assert!(movable(&was, &now), "with the evaluation too");
        let mut shorter = was.clone();
        shorter.train.steps = was.train.steps / 2;
        assert!(!movable(&was, &shorter));
        let mut scheduled = (was.clone(), now.clone());
        scheduled.0.train.lr_schedule = fpt_spec::LrSchedule::Linear { warmup_steps: 10 };
        scheduled.1.train.lr_schedule = fpt_spec::LrSchedule::Linear { warmup_steps: 10 };
        assert!(!movable(&scheduled.0, &scheduled.1));
        let mut lr = now.clone();
        lr.train.lr = 0.5;
        assert!(!movable(&was, &lr));
        assert!(!movable(&was, &was), "nothing to move");
    }

    /// A fake run directory at `step`, finished or not (a checkpoint either way).
    /// A run with a GPU stretch from before the one-stream fix is refused, naming the file
    /// and the stretch; the same stretch marked as run on the device's own stream is not.
    #[test]
    fn gpu_stretches_from_the_racing_builds_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let a = t.path().join("a");
        fake_run(&a, 10, false);
        let seg = |stream: &str| {
            format!(
                "{{\"ended_utc\":\"2026-11-27T01:27:44Z\",\"from_step\":0,\"to_step\":10,\"seconds\":1.0,\"device\":\"cuda:0\",\"machine\":\"cuda:0\",\"commit\":\"b1a994f\",\"how\":\"stopped\"{stream}}}\n"
            )
        };
        std::fs::write(a.join("history.jsonl"), seg("")).unwrap();
        let e = progress(&a).unwrap_err();
        assert!(
            e.contains("history.jsonl") && e.contains("steps 0-10") && e.contains("b1a994f"),
            "{e}"
        );
        std::fs::write(a.join("history.jsonl"), seg(",\"cuda_stream\":\"own\"")).unwrap();
        assert_eq!(progress(&a), Ok(Some((false, 10))));
    }

    fn fake_run(dir: &Path, step: usize, finished: bool) {
        let _ = std::fs::remove_dir_all(dir);
        let ck = fpt_train::checkpoint::root(dir).join(format!("step-{step:06}"));
        std::fs::create_dir_all(&ck).unwrap();
        for f in [
            "trainable.safetensors",
            "optimizer.safetensors",
            "state.json",
            "manifest.json",
        ] {
            std::fs::write(ck.join(f), format!("{f} at {step}")).unwrap();
        }
        // An older checkpoint's leftovers and tensorboard events are not carried.
        std::fs::create_dir_all(fpt_train::checkpoint::root(dir).join("step-000001")).unwrap();
        std::fs::write(dir.join("events.out.tfevents.1"), "x").unwrap();
        std::fs::write(
            fpt_train::checkpoint::root(dir).join("LATEST"),
            format!("step-{step:06}"),
        )
        .unwrap();
        std::fs::write(dir.join("spec.json"), "{}").unwrap();
        std::fs::write(dir.join("metrics.jsonl"), format!("{{\"step\": {step}}}\n")).unwrap();
        if finished {
            let mut r: serde_json::Value =
                serde_json::from_str(include_str!("../tests/data/result-template.json")).unwrap();
            r["steps"] = serde_json::json!(step);
            std::fs::write(dir.join("result.json"), r.to_string()).unwrap();
        }
    }

    #[test]
    fn progress_orders_runs_and_copies_keep_only_the_latest_checkpoint() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        assert_eq!(progress(&a), Ok(None));
        fake_run(&a, 10, false);
        assert_eq!(progress(&a), Ok(Some((false, 10))));
        replace_with_copy(&a, &b).unwrap();
        assert_eq!(progress(&b), Ok(Some((false, 10))));
        let root = fpt_train::checkpoint::root(&b);
        let names: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}"); // LATEST and step-000010
        assert!(!b.join("events.out.tfevents.1").exists());
        assert_eq!(
            std::fs::read_to_string(root.join("step-000010/state.json")).unwrap(),
            "state.json at 10"
        );
        // Further beats behind; finished beats unfinished.
        assert!(ahead(Some((false, 20)), Some((false, 10))));
        assert!(!ahead(Some((false, 10)), Some((false, 20))));
        assert!(ahead(Some((true, 5)), Some((false, 20))));
        assert!(!ahead(None, Some((false, 1))));
        fake_run(&a, 30, true);
        assert_eq!(progress(&a), Ok(Some((true, 30))));
        replace_with_copy(&a, &b).unwrap();
        assert_eq!(progress(&b), Ok(Some((true, 30))));
        // No temporary directory is left beside it.
        let left: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left.len(), 2, "{left:?}");
    }
}

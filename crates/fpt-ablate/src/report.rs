//! Reports: for every cell our number, the paper's, the difference, what the scale
//! substituted, and why a cell did not run; as `report.md`, `report.json` and `report.csv`
//! under `<out>/<table>/<scale>/`.

use crate::record::RunRecord;
use crate::{io, run_dir, AblateError, Cell, Plan, Result};
use fpt_spec::table::{Metric, TableSpec};
use fpt_spec::RunSpec;
use fpt_train::selfcheck::Provenance;
use std::path::Path;

pub use crate::seeds::Seeds;

/// A cell as reported.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CellReport {
    /// Row label.
    pub row: String,
    /// Column label.
    pub col: String,
    /// What the cell reports.
    pub metric: Metric,
    /// Our number (percent for accuracies), where there is one.
    pub ours: Option<f64>,
    /// The paper's number as printed.
    pub paper_text: String,
    /// The paper's number parsed (percent, steps or parameters).
    pub paper: Option<f64>,
    /// `ours - paper`.
    pub diff: Option<f64>,
    /// `ran`, `counted`, `pending`, `failed`, `unavailable` or `paper-only`.
    pub status: String,
    /// Why it did not run, or what failed.
    pub why: Option<String>,
    /// Substitutions the scale made.
    pub notes: Vec<String>,
    /// Every setting of the cell that differs from the paper's (see [`crate::Cell::differs`]).
    pub differs: Vec<String>,
    /// The run directory, relative to the results directory (runs only).
    pub run: Option<String>,
    /// Wall-clock seconds of the run.
    pub seconds: Option<f64>,
    /// Steps the run trained.
    pub steps: Option<usize>,
    /// When the run diverged: where, why, and that the number is the best evaluation
    /// before it (the paper's dagger, Table 13).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diverged: Option<String>,
    /// The held-out accuracy's last two evaluations: `flat` (within two standard errors of
    /// each other), `rising` or `falling`, with the numbers: whether more steps would likely
    /// change the cell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub curve: Option<String>,
    /// Held-out examples the number was measured on (for its sampling noise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_examples: Option<usize>,
    /// Steps between evaluations (a convergence step is known to this resolution).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_every: Option<usize>,
    /// Where the cell runs several seeds: each seed's number, and `ours` is their mean.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seeds: Option<Seeds>,
    /// The task's trivial baseline on the evaluated examples (percent; the mean over the
    /// cell's runs), where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<f64>,
    /// What the trivial baseline is (`majority class 3 (17.5% of the evaluated labels)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_kind: Option<String>,
    /// Why the cell is at its task's trivial baseline (its runs learned nothing measurable);
    /// absent when it left it or its baseline is not known. No claim rests on such a cell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_baseline: Option<String>,
    /// Set when every run of the cell **ended at its baseline** (`result.json`'s
    /// `ended_at_baseline`: flat at the trivial baseline across the last half of its steps,
    /// at or past its row's Table 6 count): the words for it. Such a cell decides a claim as
    /// the side that did not learn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_baseline: Option<String>,
    /// The task's measured accuracy spread across seeds at the scale (points), where known
    /// for the cell's backbone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_sd: Option<f64>,
    /// Whether the cell's runs ended on a plateau of their held-out accuracy (the paired test
    /// of `result.json`'s `converged`): `false` when one ended at its cap still rising (the
    /// number is then a lower bound), absent where not recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub converged: Option<bool>,
    /// Not converged, but every run of it that did not converge ended at its cap still
    /// rising by the rule: the number is a lower bound of where the cell ends, and decides a
    /// claim one way only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lower_bound: bool,
    /// Why the cell's model is not what its row claims (a Bit backbone that did not learn
    /// Bit Memory, or whose pretraining was not recorded): no claim rests on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unfit: Option<String>,
    /// The per-example outcomes of the cell's runs, seed order (all of them, or none where a
    /// run did not record them): what the claims resample. Not written to `report.json`.
    #[serde(skip)]
    pub outcomes: Vec<fpt_train::outcomes::Outcomes>,
}

/// Where a report reads its runs from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sources {
    /// Run directories only (`runs/<key>`): a report of what was trained here.
    RunDirs,
    /// Run directories, else the records kept beside the reports (`records/<key>.json`):
    /// re-rendering committed reports where the run directories are not kept.
    RunDirsOrRecords,
}

/// The finished run `key` under `out`, from where `sources` allows.
fn load_run(out: &Path, key: &str, sources: Sources) -> Option<RunRecord> {
    let rec = match sources {
        Sources::RunDirs => {
            let dir = run_dir(out, key);
            dir.join("spec.json")
                .is_file()
                .then(|| RunRecord::from_dir(&dir).ok())
                .flatten()
        }
        Sources::RunDirsOrRecords => RunRecord::load(out, key).ok().flatten(),
    };
    rec.filter(|r| r.result.is_some())
}

/// Trivial baselines of the tasks a report's runs evaluated, built once per task and seed.
#[derive(Default)]
struct Baselines(std::collections::HashMap<String, Option<fpt_tasks::Baseline>>);

impl Baselines {
    /// Whether the run `rec` of `spec` left its baseline: as its result says, or (results
    /// written before fpt judged runs) judged now from its accuracy, with the task rebuilt
    /// to find its baseline; `None` where the task's data is not here.
    fn check(&mut self, rec: &RunRecord, spec: &RunSpec) -> Option<fpt_train::outcomes::BaselineCheck> {
        let res = rec.result.as_ref()?;
        if let Some(b) = &res.baseline {
            let mut b = b.clone();
            // Results written before fpt told "below" from "within the noise": said now,
            // from the interval they recorded.
            if b.margin_interval.1 < 0.0 {
                for r in &mut b.reasons {
                    *r = r.replace("is within the uncertainty of the baseline's", "is below the baseline's");
                }
            }
            return Some(b);
        }
        let key = format!(
            "{}#{}",
            serde_json::to_string(&spec.task).unwrap_or_default(),
            spec.train.seed
        );
        let base = self
            .0
            .entry(key)
            .or_insert_with(|| {
                let task = fpt_tasks::build(&spec.task, &fpt_train::root_rng(spec)).ok()?;
                task.baseline(fpt_tasks::Split::Test).ok()
            })
            .as_ref()?;
        let losses: Vec<f64> = rec.evals.iter().map(|e| e.train_loss).collect();
        Some(fpt_train::outcomes::judge_summary(
            base,
            res.test_accuracy,
            res.eval_examples,
            &losses,
        ))
    }
}

/// A run's number for `metric` (percent for accuracies).
fn metric_of(res: &fpt_train::RunResult, metric: Metric) -> Option<f64> {
    match metric {
        Metric::TrainAccuracy => res.train_accuracy.map(|a| 100.0 * a),
        // A run that ended at its cap still rising did not converge, whatever its curve's
        // last evaluations looked like: its steps to convergence are "more than it ran".
        Metric::StepsToConvergence if res.converged != Some(true) => None,
        Metric::StepsToConvergence => res.converged_step.map(|s| s as f64),
        Metric::Speedup => res.cached.as_ref().map(|c| c.speedup),
        _ => Some(100.0 * res.test_accuracy),
    }
}

/// A rendered table.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// Table id.
    pub id: String,
    /// Title.
    pub title: String,
    /// The paper's caption.
    pub caption: String,
    /// Scale.
    pub scale: String,
    /// Column labels.
    pub cols: Vec<String>,
    /// Row labels.
    pub rows: Vec<String>,
    /// Cells, row-major.
    pub cells: Vec<CellReport>,
    /// The table's notes.
    pub notes: Vec<String>,
    /// Where and when.
    pub machine: String,
    /// The build that wrote the report: commit, profile, kernel path, CPU, self-check.
    pub provenance: Provenance,
    /// The builds, kernel paths, CPUs and devices the cells' runs recorded (runs may come
    /// from other machines through shards), with how many cells each.
    pub runs_from: Vec<(String, usize)>,
    /// The paper's claims this table tests, with verdicts on our numbers and the paper's.
    pub claims: Vec<crate::claims::ClaimReport>,
    /// Where rows run until they converge (the `converge` scale): each pair of them at the
    /// same step ([`crate::equal_budget`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub equal_budget: Vec<crate::equal_budget::EqualBudget>,
}

pub use crate::paper::parse_paper;

fn machine() -> String {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let date = std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .unwrap_or_default();
    format!(
        "{} {}, {cores} cores, {}, fpt {}, {}",
        std::env::consts::OS,
        std::env::consts::ARCH,
        fpt_nn::kernels::cpu_model(),
        env!("CARGO_PKG_VERSION"),
        date.trim()
    )
}

/// One line on where a run's numbers came from.
fn run_origin(res: &fpt_train::RunResult) -> String {
    match &res.provenance {
        Some(p) => format!(
            "{} build of {}, {} kernels on {}, device {}, self-check {}",
            p.profile,
            p.commit,
            p.kernel_path,
            p.cpu,
            res.device,
            if p.selfcheck.passed { "passed" } else { "FAILED" }
        ),
        None => format!(
            "device {} (build and self-check not recorded: an older fpt)",
            res.device
        ),
    }
}

/// A counted cell's number and, for trained counts, how it adds up (computed, printed
/// beside the cell).
fn count(plan: &Plan, metric: Metric) -> std::result::Result<(f64, Option<String>), String> {
    let Plan::Count(c) = plan else {
        return Err("not a count".into());
    };
    let (backbone, task, groups) = (&c.backbone, &c.task, &c.groups);
    let (config, specs) = fpt_backbones::param_specs(backbone).map_err(|e| e.to_string())?;
    let dims = || fpt_tasks::dims_of(task).ok_or("the trained count needs a task of fixed shapes (not custom data)");
    let hidden = config.hidden_size();
    Ok(match metric {
        Metric::ParamsTotal => (specs.iter().map(|s| s.numel()).sum::<usize>() as f64, None),
        Metric::ConfigLayers => (config.layers() as f64, None),
        Metric::ConfigHidden => (hidden as f64, None),
        Metric::ConfigHeads => (config.heads() as f64, None),
        _ => {
            let mut d = dims()?;
            let used = metric == Metric::ParamsTrainedUsed;
            if let (true, Some(w), fpt_tasks::InputKind::Vectors { .. }) = (used, c.input_width, d.input) {
                d.input = fpt_tasks::InputKind::Vectors { width: w };
            }
            let counts = fpt_model::count_params(&specs, hidden, &d, groups);
            let trained = |r: fpt_spec::Role| counts.by_role.get(&r).map_or(0, |v| v.1);
            let mut pos = trained(fpt_spec::Role::Positions);
            let rows = pos / hidden.max(1);
            if used && rows > d.seq_len {
                pos = d.seq_len * hidden;
            }
            let total = counts.trainable - trained(fpt_spec::Role::Positions) + pos;
            let mut parts = vec![
                format!("LayerNorm {}", trained(fpt_spec::Role::LayerNorm)),
                if used && rows > d.seq_len {
                    format!("positions {pos} ({} of {rows} rows: the task's tokens)", d.seq_len)
                } else {
                    format!("positions {pos} ({rows} rows)")
                },
                format!(
                    "input {}{}",
                    trained(fpt_spec::Role::Input),
                    match d.input {
                        fpt_tasks::InputKind::Vectors { width } => format!(" ({width} wide)"),
                        fpt_tasks::InputKind::Tokens { vocab } => format!(" ({vocab} tokens)"),
                    }
                ),
                format!("output {}", trained(fpt_spec::Role::Output)),
            ];
            let rest = total
                - trained(fpt_spec::Role::LayerNorm)
                - pos
                - trained(fpt_spec::Role::Input)
                - trained(fpt_spec::Role::Output);
            if rest > 0 {
                parts.push(format!("other {rest}"));
            }
            (total as f64, Some(format!("computed: {} = {total}", parts.join(" + "))))
        }
    })
}

impl Report {
    /// Collects the results of `cells` (from `out/runs/`) for `table` at `scale`.
    pub fn new(table: &TableSpec, scale: &str, cells: &[Cell], out: &Path) -> Report {
        Self::from_runs(table, scale, cells, out, Sources::RunDirs)
    }

    /// [`Report::new`], reading each run from where `sources` allows.
    pub fn from_runs(table: &TableSpec, scale: &str, cells: &[Cell], out: &Path, sources: Sources) -> Report {
        let mut baselines = Baselines::default();
        let mut reports = Vec::new();
        let mut origins: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
        for c in cells {
            let paper = parse_paper(&c.paper);
            let mut r = CellReport {
                row: table.rows[c.row].label.clone(),
                col: table.cols[c.col].label.clone(),
                metric: c.metric,
                ours: None,
                paper_text: c.paper.clone(),
                paper,
                diff: None,
                status: String::new(),
                why: None,
                notes: c.notes.clone(),
                differs: c.differs.clone(),
                run: None,
                seconds: None,
                steps: None,
                diverged: None,
                curve: None,
                eval_examples: None,
                eval_every: None,
                seeds: None,
                baseline: None,
                baseline_kind: None,
                at_baseline: None,
                ended_at_baseline: None,
                seed_sd: None,
                converged: None,
                lower_bound: false,
                unfit: None,
                outcomes: Vec::new(),
            };
            match &c.plan {
                Plan::PaperOnly(why) => {
                    r.status = "paper-only".into();
                    r.why = Some(why.clone());
                }
                Plan::NotInPaper => {
                    r.status = "not-in-paper".into();
                    r.why = Some("not run in the paper (its table shows -); not run here either".into());
                }
                Plan::Unavailable(why) => {
                    r.status = "unavailable".into();
                    r.why = Some(why.clone());
                }
                Plan::Count(_) => match count(&c.plan, c.metric) {
                    Ok((v, how)) => {
                        r.status = "counted".into();
                        r.ours = Some(v);
                        r.why = how;
                    }
                    Err(e) => {
                        r.status = "failed".into();
                        r.why = Some(e);
                    }
                },
                Plan::Run { key, spec } => {
                    let dir = run_dir(out, key);
                    // Relative to the results directory, so a report reads the same anywhere.
                    r.run = Some(format!("runs/{key}"));
                    r.steps = Some(spec.train.steps);
                    r.eval_every = Some(spec.train.eval_every);
                    r.seed_sd = c.seed_sd;
                    match load_run(out, key, sources) {
                        Some(rec)
                            if rec
                                .result
                                .as_ref()
                                .and_then(|r| r.provenance.as_ref())
                                .is_some_and(|p| !p.selfcheck.passed) =>
                        {
                            r.status = "invalid".into();
                            r.why = Some(format!(
                                "its run recorded a failed self-check ({}); rerun it with a build that passes (`--force`)",
                                run_origin(rec.result.as_ref().expect("loaded runs have a result"))
                            ));
                        }
                        None => {
                            // A run with a checkpoint (here, or in a campaign's committed
                            // copy) is pending at its step, never a result.
                            let at = [dir.clone(), crate::campaign::saved_root(out).join(key)]
                                .iter()
                                .filter_map(|d| crate::campaign::progress(d).ok().flatten())
                                .filter(|p| !p.0)
                                .map(|p| p.1)
                                .max();
                            match at {
                                Some(step) => {
                                    r.status = format!("pending (step {step})");
                                    r.why = Some(format!(
                                        "pending: stopped at step {step} of {} with a checkpoint; the next call resumes it",
                                        spec.train.steps
                                    ));
                                }
                                // A cell without a run that this machine could not run says
                                // why (reports expand every cell as its scale defines it).
                                None if !dir.exists() => (r.status, r.why) = crate::here::never_run(spec),
                                None => {
                                    r.status = if dir.exists() { "failed" } else { "pending" }.into();
                                    r.why = Some(if dir.exists() {
                                        "the run did not finish (see its directory)".into()
                                    } else {
                                        "not run yet (or run by another shard)".into()
                                    });
                                }
                            }
                        }
                        Some(rec) => {
                            let res = rec.result.as_ref().expect("loaded runs have a result");
                            *origins.entry(run_origin(res)).or_insert(0) += 1;
                            r.status = "ran".into();
                            r.seconds = Some(res.wall_seconds);
                            // The steps it trained (fewer than the spec's where it stopped early).
                            r.steps = Some(res.steps);
                            if res.diverged {
                                r.diverged = Some(crate::convergence::diverged_words(res));
                            }
                            // The row's Table 6 count for the cell's task, where the table gives one.
                            let floor = c
                                .settings
                                .converge_floor
                                .as_ref()
                                .and_then(|m| m.get(&spec.task.name.to_string()))
                                .copied();
                            let (_, words) = crate::convergence::converged_by_rule(res, &rec.evals, floor);
                            r.curve = Some(match &res.plateau {
                                Some(_) => words,
                                None => crate::convergence::curve_state(
                                    &rec.evals,
                                    res.eval_examples,
                                    rec.outcomes.as_ref(),
                                )
                                .map_or(words.clone(), |c| format!("{c}; {words}")),
                            });
                            r.eval_examples = Some(res.eval_examples);
                            r.ours = metric_of(res, c.metric);
                            if c.metric == Metric::StepsToConvergence && r.ours.is_none() {
                                r.why = Some(if res.converged == Some(false) {
                                    format!("> {} steps: still rising at its cap", res.steps)
                                } else {
                                    format!("did not converge in {} steps", res.steps)
                                });
                            }
                            // Every run of the cell: its own, then the other seeds'.
                            let mut runs = vec![(rec.clone(), (**spec).clone())];
                            for (k, sp) in &c.replicas {
                                if let Some(other) = load_run(out, k, sources).filter(|o| {
                                    o.result
                                        .as_ref()
                                        .and_then(|r| r.provenance.as_ref())
                                        .is_none_or(|p| p.selfcheck.passed)
                                }) {
                                    *origins
                                        .entry(run_origin(other.result.as_ref().expect("loaded runs have a result")))
                                        .or_insert(0) += 1;
                                    runs.push((other, (**sp).clone()));
                                }
                            }
                            if !c.replicas.is_empty() {
                                let values = runs
                                    .iter()
                                    .filter_map(|(o, _)| metric_of(o.result.as_ref()?, c.metric))
                                    .collect();
                                let others = c.replicas.iter().map(|(k, _)| format!("runs/{k}")).collect();
                                let seeds = Seeds::new(c.replicas.len() + 1, values, others);
                                r.ours = seeds.mean();
                                r.seeds = Some(seeds);
                            }
                            // Whether the runs learned: for the numbers that measure learning
                            // (a speedup or a count is measured whatever the model learned).
                            // A speedup of a model that learned nothing is no evidence either.
                            let learning = matches!(
                                c.metric,
                                Metric::TestAccuracy
                                    | Metric::TrainAccuracy
                                    | Metric::StepsToConvergence
                                    | Metric::Speedup
                            );
                            let checks: Vec<_> = match learning {
                                true => runs
                                    .iter()
                                    .filter_map(|(o, sp)| {
                                        let b = baselines.check(o, sp)?;
                                        Some(match c.metric {
                                            Metric::StepsToConvergence => crate::convergence::steps_measure_nothing(
                                                b,
                                                sp.train.convergence_tolerance,
                                            ),
                                            _ => b,
                                        })
                                    })
                                    .collect(),
                                false => Vec::new(),
                            };
                            if !checks.is_empty() {
                                r.baseline =
                                    Some(100.0 * checks.iter().map(|b| b.accuracy).sum::<f64>() / checks.len() as f64);
                                r.baseline_kind = Some(checks[0].describe.clone());
                                let unseen = &checks[0].classes_only_in_eval;
                                if !unseen.is_empty() {
                                    r.notes.push(format!(
                                        "classes {unseen:?} occur in the evaluated split but never in training: they cannot be learned, and count against the accuracy"
                                    ));
                                }
                                let at: Vec<_> = checks.iter().filter(|b| !b.left).collect();
                                // A cell of several seeds is at baseline when at least half of them are.
                                if !at.is_empty() && 2 * at.len() >= checks.len() {
                                    let why = at[0].reasons.join("; ");
                                    r.at_baseline = Some(if checks.len() > 1 {
                                        format!("{} of {} seeds at baseline; the first: {why}", at.len(), checks.len())
                                    } else {
                                        why
                                    });
                                }
                            }
                            // Every run ended at its baseline (not rising there past its floor).
                            let ended: Vec<usize> = runs
                                .iter()
                                .filter_map(|(o, _)| {
                                    o.result.as_ref().filter(|r| r.ended_at_baseline_now()).map(|r| r.steps)
                                })
                                .collect();
                            if r.at_baseline.is_some() && !ended.is_empty() && ended.len() == runs.len() {
                                let steps: Vec<String> = ended.iter().map(|s| s.to_string()).collect();
                                r.ended_at_baseline = Some(format!(
                                    "ended at baseline after {} steps (at the task's trivial baseline and not rising across the last half of its steps, past its row's Table 6 count: flat there, or its training loss never below the trivial predictor's)",
                                    steps.join(", ")
                                ));
                            }
                            // A Bit backbone says how its pretraining ended; one that did not
                            // learn Bit Memory is not the paper's Bit backbone.
                            if spec.backbone.init == fpt_spec::Init::BitPretrained {
                                match &res.bit_backbone {
                                    Some(b) => {
                                        r.notes.push(b.describe());
                                        if !b.solved {
                                            r.unfit = Some(format!(
                                                "its Bit backbone did not learn Bit Memory ({:.1}% after {} steps, {:.0}% needed)",
                                                100.0 * b.bit_accuracy,
                                                b.steps,
                                                100.0 * b.target
                                            ));
                                        }
                                    }
                                    None => {
                                        r.unfit = Some(
                                            "its Bit backbone's pretraining was not recorded (a run from before fpt recorded it)"
                                                .into(),
                                        )
                                    }
                                }
                            }
                            // Converged only when every seed's run did, by the rule; a run that
                            // ended at its baseline has ended (where it ends is known), flat
                            // or not.
                            use crate::convergence::Call;
                            let calls: Vec<Call> = runs
                                .iter()
                                .map(|(o, _)| match o.result.as_ref() {
                                    Some(r) if r.ended_at_baseline_now() => Call::Converged,
                                    Some(r) => crate::convergence::call_by_rule(r, &o.evals, floor).0,
                                    None => Call::Unknown,
                                })
                                .collect();
                            let conv: Vec<Option<bool>> = calls.iter().map(|c| c.converged()).collect();
                            r.lower_bound = calls.contains(&Call::Rising)
                                && calls.iter().all(|c| matches!(c, Call::Rising | Call::Converged));
                            r.converged = if conv.contains(&Some(false)) {
                                Some(false)
                            } else if conv.iter().all(|c| *c == Some(true)) {
                                Some(true)
                            } else {
                                None
                            };
                            if runs.iter().all(|(o, _)| o.outcomes.is_some()) {
                                r.outcomes = runs.into_iter().filter_map(|(o, _)| o.outcomes).collect();
                            }
                        }
                    }
                }
            }
            r.diff = match (r.ours, r.paper) {
                (Some(a), Some(b)) => Some(a - b),
                _ => None,
            };
            reports.push(r);
        }
        let claims = table
            .claims
            .iter()
            .zip(crate::claims::on_paper(table))
            .map(|(claim, (text, paper))| {
                let ncols = table.cols.len();
                let ours = crate::claims::check(table, claim, &|r, c| {
                    let cell = &reports[r * ncols + c];
                    let v = cell.ours?;
                    let accuracy = matches!(cell.metric, Metric::TestAccuracy | Metric::TrainAccuracy);
                    let learned = accuracy || matches!(cell.metric, Metric::StepsToConvergence | Metric::Speedup);
                    let se = match (accuracy, cell.metric, cell.eval_examples) {
                        (true, _, Some(n)) if n > 0 => {
                            // The binomial error, with one success and one failure added so
                            // that a cell at 0% or 100% is not taken as exact.
                            let p = ((v / 100.0) * n as f64 + 1.0) / (n as f64 + 2.0);
                            100.0 * (p * (1.0 - p) / n as f64).sqrt()
                        }
                        // A convergence step is known to the evaluation interval.
                        (_, Metric::StepsToConvergence, _) => cell.eval_every.map_or(0.0, |e| e as f64 / 2.0),
                        _ => 0.0,
                    };
                    // At the ceiling: 100% within one evaluation's noise.
                    let at_ceiling = accuracy && v + 1.96 * se >= 100.0;
                    // Over several seeds: the standard error of their mean, from the larger
                    // of their spread and one evaluation's own noise (three seeds' spread
                    // alone can be small by chance).
                    let se = match &cell.seeds {
                        Some(s) if s.values.len() > 1 => s.sd.max(se) / (s.values.len() as f64).sqrt(),
                        _ => se,
                    };
                    Some(crate::claims::CellValue {
                        value: v,
                        se,
                        at_baseline: cell.at_baseline.clone(),
                        ended_at_baseline: cell.ended_at_baseline.is_some(),
                        // Per-example outcomes are of the test split: they resample test accuracies.
                        runs: if cell.metric == Metric::TestAccuracy {
                            &cell.outcomes
                        } else {
                            &[]
                        },
                        seed_sd: if accuracy { cell.seed_sd.unwrap_or(0.0) } else { 0.0 },
                        // Whether the runs reached their plateau matters for what they learned.
                        convergence: match (learned, cell.converged) {
                            (false, _) | (true, Some(true)) => crate::claims::Convergence::Reached,
                            // Only an accuracy is a lower bound while it rises (a speedup is not).
                            (true, Some(false)) if accuracy && cell.lower_bound => crate::claims::Convergence::Rising,
                            (true, Some(false)) => crate::claims::Convergence::NotConverged,
                            (true, None) => crate::claims::Convergence::Unknown,
                        },
                        at_ceiling,
                        unfit: cell.unfit.clone(),
                        // Steps to convergence vary with the seed as accuracies do: a pair of
                        // single runs decides nothing without a measured spread (none is
                        // measured for steps).
                        seeds: if accuracy || cell.metric == Metric::StepsToConvergence {
                            cell.seeds.as_ref().map_or(1, |s| s.values.len().max(1))
                        } else {
                            0
                        },
                        spread_known: accuracy && cell.seed_sd.is_some(),
                    })
                });
                // Where ours ran on some pairs only, the paper's verdict on the same cells too.
                let paper = if ours.verdict != "not run" {
                    let same = crate::claims::check(table, claim, &|r, c| {
                        reports[r * ncols + c].ours?;
                        parse_paper(&table.paper[r][c]).map(crate::claims::CellValue::exact)
                    });
                    if same.detail == paper.detail {
                        paper
                    } else {
                        crate::claims::Verdict {
                            verdict: paper.verdict,
                            detail: format!(
                                "{}; on the cells we ran: {}, {}",
                                paper.detail, same.verdict, same.detail
                            ),
                        }
                    }
                } else {
                    paper
                };
                crate::claims::ClaimReport { text, ours, paper }
            })
            .collect();
        Report {
            id: table.id.clone(),
            title: table.title.clone(),
            caption: table.caption.clone(),
            scale: scale.to_string(),
            cols: table.cols.iter().map(|c| c.label.clone()).collect(),
            rows: table.rows.iter().map(|r| r.label.clone()).collect(),
            cells: reports,
            notes: table.notes.clone(),
            machine: machine(),
            provenance: fpt_train::selfcheck::provenance(),
            runs_from: origins.into_iter().collect(),
            claims,
            equal_budget: crate::equal_budget::compute(table, cells, out),
        }
    }

    /// Writes `report.md`, `report.json` and `report.csv` under `out/<id>/<scale>/`
    /// (each to a temporary file renamed into place); returns the directory.
    /// Refuses (writing nothing) when this build failed its self-check.
    pub fn write(&self, out: &Path) -> Result<std::path::PathBuf> {
        if !self.provenance.selfcheck.passed {
            return Err(AblateError::SelfCheck {
                table: self.id.clone(),
                summary: format!("failed: {}", self.provenance.selfcheck.failed.join(", ")),
            });
        }
        let dir = out.join(&self.id).join(&self.scale);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let json = serde_json::to_string_pretty(self).expect("report serialises");
        let mut md = self.markdown(out);
        let curves = learning_curves(self, out);
        if curves.is_some() {
            md.push_str("\n## Learning curves\n\n![learning curves](curves.svg)\n");
        }
        let mut files = vec![("report.md", md), ("report.json", json), ("report.csv", self.csv())];
        if let Some(svg) = curves {
            files.push(("curves.svg", svg));
        }
        crate::chart::write_all(&dir, &files)?;
        Ok(dir)
    }
}

/// The learning curves (held-out accuracy by step) of a table's finished runs (under the
/// results directory `out`), one line per cell that ran, as SVG; `None` when no cell has a
/// `metrics.jsonl`.
fn learning_curves(report: &Report, out: &Path) -> Option<String> {
    let mut series = Vec::new();
    for c in &report.cells {
        let Some(run) = &c.run else { continue };
        let Ok(text) = std::fs::read_to_string(out.join(run).join("metrics.jsonl")) else {
            continue;
        };
        let pts: Vec<(f64, f64)> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<fpt_train::EvalRecord>(l).ok())
            .map(|r| (r.step as f64, 100.0 * r.test_accuracy))
            .collect();
        if !pts.is_empty() {
            series.push((format!("{} / {}", c.row, c.col), pts));
        }
    }
    (!series.is_empty()).then(|| {
        crate::chart::xy_svg(
            &format!("{}: held-out accuracy (%) by step, scale {}", report.id, report.scale),
            "step",
            &series,
        )
    })
}

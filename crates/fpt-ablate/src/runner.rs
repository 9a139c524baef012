//! Training a table's runs: the missing ones, sharded, side by side in child processes on
//! a CPU, resuming interrupted ones; each run's time.

#[allow(unused_imports)]
use super::*;

/// How [`run`] runs.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Rerun cells that have a result.
    pub force: bool,
    /// Run only shard `i` of `n` (`(i, n)`): every `n`-th runnable run, by key order.
    pub shard: Option<(usize, usize)>,
    /// Train only the cells of these rows (by label; empty: every row). The reports still
    /// show every cell: the others from the runs already there, or pending.
    pub rows: Vec<String>,
    /// Runs trained at once: in threads of this process, or with `workers` in child
    /// processes.
    pub jobs: usize,
    /// Render only; train nothing.
    pub report_only: bool,
    /// Where runs train (`None`: the CPU).
    pub device: Option<candle_core::Device>,
    /// Train each run in a child process (CPU only; see [`worker`]).
    pub workers: Option<worker::Workers>,
    /// A campaign's order (the scale's `campaign_order` and `campaign_later`): when set,
    /// runs go by row kind (FPT and Random, then the Bit row, then the critics' and other
    /// rows), then seed, then task ([`order_for_campaign`]); otherwise by key.
    pub campaign: CampaignOrder,
    /// Train only these runs (keys; empty: every run): a lent GPU takes some of a campaign's
    /// runs while the CPU trains others.
    pub only: Vec<String>,
    /// Train none of these runs (keys): a campaign's runs whose committed copy or local
    /// directory is damaged, left alone until mended.
    pub skip: Vec<String>,
    /// Stop every running cell with a checkpoint at this time, and start none after it
    /// (`--budget`); the next call resumes them.
    pub deadline: Option<std::time::SystemTime>,
}

/// Where the run of `key` lives under `out`.
pub fn run_dir(out: &Path, key: &str) -> PathBuf {
    out.join("runs").join(key)
}

/// The distinct runs of `cells`, by key, in key order.
pub fn runs_of(cells: &[Cell]) -> Vec<(String, RunSpec)> {
    let mut m: BTreeMap<String, RunSpec> = BTreeMap::new();
    for c in cells {
        if let Plan::Run { spec, key } = &c.plan {
            m.insert(key.clone(), (**spec).clone());
        }
        for (key, spec) in &c.replicas {
            m.insert(key.clone(), (**spec).clone());
        }
    }
    m.into_iter().collect()
}

/// Trains every run of `cells` that has no `result.json` under `out/runs/` (or all with
/// `force`), honouring the shard. A run directory left by an interrupted run is resumed
/// from its checkpoint, or started again when it has none. `log` receives progress lines.
/// Returns the runs trained and each run's time; a failed run is logged and counted in the
/// report, not fatal.
pub fn run(cells: &[Cell], out: &Path, opts: &RunOptions, log: &mut (dyn FnMut(&str) + Send)) -> Result<Trained> {
    if opts.report_only {
        return Ok(Trained::default());
    }
    let mut todo: Vec<(String, RunSpec)> = runs_of(cells);
    if let Some((i, n)) = opts.shard {
        todo = todo
            .into_iter()
            .enumerate()
            .filter(|(k, _)| k % n == i)
            .map(|(_, r)| r)
            .collect();
    }
    // Finished runs stay as they are; a run an older convergence rule stopped early trains on
    // from its checkpoint ([`fpt_train::reopen_reason`]).
    todo.retain(|(key, _)| opts.force || fpt_train::finished_result(&run_dir(out, key)).is_none());
    if !opts.only.is_empty() {
        todo.retain(|(key, _)| opts.only.contains(key));
    }
    todo.retain(|(key, _)| !opts.skip.contains(key));
    if opts.campaign.is_empty() {
        order_for_builds(&mut todo);
    } else {
        order_for_campaign(&mut todo, &opts.campaign);
    }
    if opts.deadline.is_some() {
        fpt_train::stop::set_deadline(opts.deadline);
    }
    let total = todo.len();
    let on_cpu = opts.device.as_ref().is_none_or(|d| d.is_cpu());
    let workers = opts.workers.as_ref().filter(|_| on_cpu);
    let times = std::sync::Mutex::new(Vec::new());
    let queue = std::sync::Mutex::new(todo.into_iter().enumerate());
    let log = std::sync::Mutex::new(log);
    let say = |s: String| (log.lock().expect("log lock"))(&s);
    let done = std::sync::atomic::AtomicUsize::new(0);
    let stopped = std::sync::Mutex::new(Vec::new());
    let jobs = opts.jobs.max(1);
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                // On a GPU each job trains on a device of its own: a stream of its own
                // (`fpt_nn::device::parse` makes one per call), so the jobs' kernels may
                // overlap on the GPU instead of queueing on one stream.
                let device = match job_device(opts.device.as_ref(), jobs) {
                    Ok(d) => d,
                    Err(e) => return say(format!("a job could not open its device: {e}; it trains nothing")),
                };
                loop {
                    if let Some(why) = fpt_train::stop::due() {
                        say(format!("no further run starts: {why}"));
                        break;
                    }
                    let Some((i, (key, spec))) = queue.lock().expect("queue lock").next() else {
                        break;
                    };
                    let dir = run_dir(out, &key);
                    say(format!(
                        "[{}/{total}] run {key}: {} on {} ({}, train {}), {} steps",
                        i + 1,
                        spec.task.label(),
                        spec.backbone.source,
                        spec.backbone.init,
                        spec.train_groups,
                        spec.train.steps
                    ));
                    let t0 = std::time::Instant::now();
                    let eval_line = |step: usize, acc: f64, secs: f64| {
                        say(format!(
                            "[{}/{total}]     step {step}/{}: test_accuracy {acc:.4}, {secs:.0} s",
                            i + 1,
                            spec.train.steps,
                        ))
                    };
                    let mut progress = |e: &fpt_train::Event| {
                        if let fpt_train::Event::Eval(r) = e {
                            eval_line(r.step, r.test_accuracy, r.elapsed_s)
                        }
                    };
                    // A panic inside one run is that run's failure, not the table's.
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match workers {
                        Some(w) => w.train(&spec, &dir, opts.force, &mut |e| {
                            eval_line(e.step, e.test_accuracy, e.elapsed_s)
                        }),
                        None => run_one(&spec, &dir, opts.force, &device, &mut progress),
                    }))
                    .unwrap_or_else(|p| {
                        let why = p
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "a panic".into());
                        Err(AblateError::Panicked {
                            dir: dir.clone(),
                            msg: format!("the run panicked: {why}"),
                        })
                    });
                    let secs = t0.elapsed().as_secs_f64();
                    let what = format!("{} {} ({})", key, spec.task.label(), spec.backbone.init);
                    times.lock().expect("times lock").push((what, secs, outcome.is_ok()));
                    if let Err(AblateError::Train(fpt_train::TrainError::Stopped { step, steps, why, .. })) = &outcome {
                        stopped.lock().expect("stopped lock").push((key.clone(), *step, *steps));
                        say(format!(
                            "[{}/{total}] run {key}: stopped at step {step} of {steps} ({why}); its checkpoint is written, the next call resumes it",
                            i + 1
                        ));
                        continue;
                    }
                    match outcome {
                        Ok(r) => {
                            done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            say(format!(
                                "[{}/{total}] run {key}: test_accuracy {:.4} in {:.0} s",
                                i + 1,
                                r.test_accuracy,
                                t0.elapsed().as_secs_f64()
                            ))
                        }
                        Err(e) => say(format!("[{}/{total}] run {key} FAILED: {e}", i + 1)),
                    }
                }
            });
        }
    });
    Ok(Trained {
        count: done.into_inner(),
        stopped: stopped.into_inner().expect("stopped lock"),
        times: times.into_inner().expect("times lock"),
        how: match workers {
            Some(w) => format!(
                "{} at once in child processes, {} thread(s) each",
                opts.jobs.max(1),
                w.threads
            ),
            None => format!("{} at once in this process", opts.jobs.max(1)),
        },
    })
}

/// The device one of `jobs` jobs trains on: `device` itself on a CPU or for one job; on a
/// GPU with several jobs, the same GPU opened again, a stream of its own.
fn job_device(device: Option<&candle_core::Device>, jobs: usize) -> Result<candle_core::Device> {
    match device {
        None => Ok(candle_core::Device::Cpu),
        Some(d) if d.is_cpu() || jobs == 1 => Ok(d.clone()),
        Some(d) => fpt_nn::device::parse(&fpt_nn::device::name(d))
            .map_err(|e| AblateError::Train(fpt_train::TrainError::Candle(e))),
    }
}

/// What [`run`] trained.
#[derive(Debug, Clone, Default)]
pub struct Trained {
    /// Runs that finished.
    pub count: usize,
    /// Every run started, in the order it finished: what it was (key, task, init), its
    /// wall-clock seconds, and whether it finished.
    pub times: Vec<(String, f64, bool)>,
    /// How the runs were spread (jobs, processes, threads).
    pub how: String,
    /// Runs stopped before their end by a deadline or an interrupt (key, step, cap): their
    /// checkpoints are written, the next call resumes them.
    pub stopped: Vec<(String, usize, usize)>,
}

impl Trained {
    /// The time of each run, one line each under a heading; empty when nothing ran.
    pub fn time_lines(&self) -> Vec<String> {
        if self.times.is_empty() {
            return Vec::new();
        }
        let total: f64 = self.times.iter().map(|t| t.1).sum();
        let mut lines = vec![format!("time per run ({}; {:.0} s of runs in all):", self.how, total)];
        for (what, secs, ok) in &self.times {
            let stopped = self.stopped.iter().find(|s| what.starts_with(&s.0));
            let mark = match (ok, stopped) {
                (true, _) => String::new(),
                (false, Some((_, step, steps))) => format!("  stopped at step {step} of {steps}"),
                (false, None) => "  FAILED".into(),
            };
            lines.push(format!("    {secs:6.0} s  {what}{mark}"));
        }
        lines
    }
}

/// Orders the runs so that a backbone fpt trains itself (the Bit init) is built early and
/// the runs that wait for it come last: first one run per backbone still to build, then
/// the runs that need no build, then the rest; by key within each group. With several jobs,
/// the others train meanwhile instead of waiting on the build's lock.
pub(crate) fn order_for_builds(todo: &mut [(String, RunSpec)]) {
    let mut first = std::collections::BTreeSet::new();
    let rank: Vec<u8> = todo
        .iter()
        .map(|(_, spec)| match fpt_train::pretrain::self_built_dir(&spec.backbone) {
            Some(dir) if !dir.join("config.json").is_file() => {
                if first.insert(dir) {
                    0
                } else {
                    2
                }
            }
            _ => 1,
        })
        .collect();
    let mut ranked: Vec<(u8, (String, RunSpec))> = rank.into_iter().zip(todo.iter().cloned()).collect();
    ranked.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1 .0.cmp(&b.1 .0)));
    for (slot, (_, r)) in todo.iter_mut().zip(ranked) {
        *slot = r;
    }
}

/// A campaign's order of runs: a scale's `campaign_order` (tasks) and `campaign_later`
/// (tasks whose seeds past the first wait behind the Bit row).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CampaignOrder {
    /// Tasks in the order their runs train within a row kind (first seeds, then each task's
    /// other seeds together); tasks not named train after those named.
    pub tasks: Vec<String>,
    /// Tasks whose seeds past the first train after the Bit row (and a critic's after the
    /// critics' other runs).
    pub later: Vec<String>,
}

impl CampaignOrder {
    /// The order a scale sets.
    pub fn of(scale: &fpt_spec::table::ScaleSettings) -> CampaignOrder {
        CampaignOrder {
            tasks: scale.campaign_order.clone(),
            later: scale.campaign_later.clone(),
        }
    }

    /// No campaign order: runs go by key.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty() && self.later.is_empty()
    }
}

/// A campaign's order ([`RunOptions::campaign`]): the paper's FPT and Random rows first,
/// every seed of them (every task's first seed, then the other seeds task by task, tasks in
/// `order.tasks`' order, those not in it after those in it); then the Bit row the same way;
/// then the paper's rows' seeds past the first of the tasks in `order.later`, then the Bit
/// row's; then the critics' rows and every other model the same way (their `later` seeds
/// last); then key. The claims the campaign decides need three seeds of FPT and Random
/// before any other row.
pub(crate) fn order_for_campaign(todo: &mut [(String, RunSpec)], order: &CampaignOrder) {
    let rank = |spec: &RunSpec| {
        // The critics' rows (no block at all, or attention-only blocks) after the paper's.
        let critic = spec.backbone.depth == Some(0) || spec.backbone.shape.attention_only == Some(true);
        let name = spec.task.name.to_string();
        let task = order.tasks.iter().position(|t| *t == name).unwrap_or(order.tasks.len());
        let seed = spec.train.seed;
        let later = seed > 0 && order.later.contains(&name);
        let tier = match spec.backbone.init {
            _ if critic => 4,
            fpt_spec::Init::Pretrained | fpt_spec::Init::Random if spec.model == fpt_spec::ModelKind::Fpt => 0,
            fpt_spec::Init::BitPretrained => 1,
            _ => 4,
        };
        // A later task's seeds past the first: the paper's rows' (tier 2) after the Bit
        // row's other runs, the Bit row's (3) after them, a critic's (5) after the rest.
        let tier = match (tier, later) {
            (t, false) => t,
            (4, true) => 5,
            (t, true) => t + 2,
        };
        // Every task's first seed first; then its other seeds claim by claim (task, then
        // seed): a claim needs all of one task's seeds, so its cells end together, and the
        // tasks named first (the cheapest claims) decide before the dearest begins.
        let group = if seed == 0 { 0 } else { 1 + task };
        (tier, group, seed, task)
    };
    todo.sort_by(|a, b| rank(&a.1).cmp(&rank(&b.1)).then_with(|| a.0.cmp(&b.0)));
}

pub(crate) fn run_one(
    spec: &RunSpec,
    dir: &Path,
    force: bool,
    device: &candle_core::Device,
    on_event: &mut dyn FnMut(&fpt_train::Event),
) -> Result<fpt_train::RunResult> {
    // Another process (a second `run-table` on the same results, a table sharing this run)
    // is training it: leave its directory alone; the cell is reported once that run ends.
    if let Some(holder) = fpt_train::in_use_by(dir) {
        return Err(crate::AblateError::Worker {
            dir: dir.to_path_buf(),
            msg: format!(
                "is being trained by {holder} (another fpt on the same results); left to it: render the report again (`--report-only`) once it ends"
            ),
        });
    }
    // Finished since the queue was made (by another process): its result stands; resuming
    // it would train past where it stopped.
    if !force {
        if let Some(done) = fpt_train::finished_result(dir) {
            return Ok(done);
        }
    }
    // Started over only with --force, or where the run never wrote a checkpoint; a damaged
    // checkpoint pointer is an error naming it (nothing removed, nothing retrained).
    if dir.exists() && (force || fpt_train::checkpoint::latest(dir)?.is_none()) {
        std::fs::remove_dir_all(dir).map_err(io(dir))?;
    }
    if dir.exists() {
        return Ok(fpt_train::resume(dir, Some(spec), device, on_event)?);
    }
    Ok(fpt_train::train(spec, dir, device, on_event)?)
}

/// The shell command that reproduces one run by hand.
pub fn command_for(out: &Path, key: &str) -> String {
    let d = run_dir(out, key);
    format!("fpt train --spec {}/spec.json --out <new dir>", d.display())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fpt_spec::{BackboneSpec, Init, TaskName, TaskSpec};

    /// FPT and Random, every seed, first; then the Bit row; then the critics'.
    #[test]
    fn campaigns_train_the_paper_rows_seeds_first() {
        let run = |row: &str, task: TaskName, seed: u64| {
            let init = match row {
                "FPT" => Init::Pretrained,
                "Bit" => Init::BitPretrained,
                _ => Init::Random,
            };
            let mut spec = RunSpec::new(TaskSpec::new(task), BackboneSpec::new("minilm", init));
            spec.train.seed = seed;
            if row == "w/o LLM" {
                spec.backbone.depth = Some(0);
            }
            (format!("{row} / {task} / {seed}"), spec)
        };
        let mut todo = Vec::new();
        for seed in [2, 1, 0] {
            for row in ["w/o LLM", "Bit", "Random", "FPT"] {
                for task in [TaskName::ListOps, TaskName::BitMemory, TaskName::Mnist] {
                    todo.push(run(row, task, seed));
                }
            }
        }
        let tasks: Vec<String> = ["mnist", "bit-memory", "listops"].map(String::from).to_vec();
        let order = |later: &[&str]| {
            let mut todo = todo.clone();
            order_for_campaign(
                &mut todo,
                &CampaignOrder {
                    tasks: tasks.clone(),
                    later: later.iter().map(|s| s.to_string()).collect(),
                },
            );
            todo.into_iter().map(|(n, _)| n).collect::<Vec<String>>()
        };
        let names = order(&[]);
        let at = |names: &[String], n: &str| {
            names
                .iter()
                .position(|x| *x == n)
                .unwrap_or_else(|| panic!("{n} in {names:?}"))
        };
        assert!(
            at(&names, "FPT / listops / 0") < at(&names, "FPT / mnist / 1"),
            "{names:?}"
        );
        assert!(
            at(&names, "Random / mnist / 1") < at(&names, "Random / bit-memory / 1"),
            "{names:?}"
        );
        // Past the first seed, claim by claim: all of MNIST's seeds before Bit Memory's
        // second, and every task's first seed before any second.
        assert!(
            at(&names, "Random / mnist / 2") < at(&names, "FPT / bit-memory / 1"),
            "{names:?}"
        );
        assert!(
            at(&names, "Random / listops / 0") < at(&names, "FPT / mnist / 1"),
            "{names:?}"
        );
        assert!(
            at(&names, "Random / listops / 2") < at(&names, "Bit / mnist / 0"),
            "{names:?}"
        );
        assert!(
            at(&names, "Bit / listops / 2") < at(&names, "w/o LLM / mnist / 0"),
            "{names:?}"
        );
        assert_eq!(names.len(), 36);

        // ListOps later: its first seed where it was, its others behind the Bit row's other
        // runs (the paper's rows' first, then the Bit row's), a critic's behind the critics'.
        let names = order(&["listops"]);
        assert!(
            at(&names, "FPT / listops / 0") < at(&names, "FPT / mnist / 1"),
            "{names:?}"
        );
        assert!(
            at(&names, "Random / mnist / 2") < at(&names, "Random / listops / 1"),
            "{names:?}"
        );
        assert!(
            at(&names, "Bit / bit-memory / 2") < at(&names, "FPT / listops / 1"),
            "{names:?}"
        );
        assert!(
            at(&names, "Bit / listops / 0") < at(&names, "Bit / mnist / 1"),
            "{names:?}"
        );
        assert!(
            at(&names, "Random / listops / 2") < at(&names, "Bit / listops / 1"),
            "{names:?}"
        );
        assert!(
            at(&names, "Bit / listops / 2") < at(&names, "w/o LLM / mnist / 0"),
            "{names:?}"
        );
        assert!(
            at(&names, "w/o LLM / bit-memory / 2") < at(&names, "w/o LLM / listops / 1"),
            "{names:?}"
        );
        assert_eq!(names.len(), 36);
    }
}

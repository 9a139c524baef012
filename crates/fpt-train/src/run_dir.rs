//! The run directory's files: atomic writes, `metrics.jsonl`, `result.json`, the saved
//! spec, and the lock (`.lock`, the holder's pid) that keeps a second process off a run.

#[allow(unused_imports)]
use super::*;

/// Writes `bytes` to `path` atomically (temporary file in the same directory, synced, then
/// renamed), so a reader never sees a half-written file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    fpt_spec::files::write_atomic(path, bytes).map_err(|source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    })
}

pub(crate) fn metrics_append(path: &Path, rec: &EvalRecord) -> Result<()> {
    let io = |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    writeln!(f, "{}", serde_json::to_string(rec).expect("record serialises")).map_err(io)?;
    f.flush().map_err(io)?;
    // The same evaluation in the run's TensorBoard event file.
    match path.parent() {
        Some(dir) => crate::tensorboard::log_eval(dir, rec),
        None => Ok(()),
    }
}

/// Keeps the first `lines` lines of `metrics.jsonl` (those a checkpoint accounts for).
pub(crate) fn metrics_truncate(path: &Path, lines: usize) -> Result<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(TrainError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let kept: String = text.lines().take(lines).map(|l| format!("{l}\n")).collect();
    write_atomic(path, kept.as_bytes())
}

/// Writes `result.json` atomically.
pub(crate) fn write_result(out_dir: &Path, result: &RunResult) -> Result<()> {
    write_atomic(
        &out_dir.join("result.json"),
        serde_json::to_string_pretty(result)
            .expect("result serialises")
            .as_bytes(),
    )
}

pub(crate) fn run_dir_err(path: &Path, msg: impl Into<String>) -> TrainError {
    TrainError::RunDir {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// The lock a run or resume holds on its directory (`.lock`, holding the process id), so
/// two processes never write one run; removed when dropped. A lock left by a process that
/// no longer runs (killed) is taken over.
pub(crate) struct RunLock {
    path: PathBuf,
}

impl RunLock {
    pub(crate) fn acquire(dir: &Path) -> Result<Self> {
        let path = dir.join(".lock");
        let io = |source| TrainError::Io {
            path: path.clone(),
            source,
        };
        for _ in 0..3 {
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    write!(f, "{}", std::process::id()).map_err(io)?;
                    return Ok(Self { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(&path)
                        .ok()
                        .and_then(|s| s.trim().parse::<u32>().ok());
                    match holder {
                        Some(pid) if pid != std::process::id() && process_alive(pid) => {
                            return Err(run_dir_err(
                                dir,
                                format!("is in use by process {pid} (another fpt run or resume of it); wait for it to end or stop it"),
                            ))
                        }
                        // A lock its process left behind (killed): take it over.
                        _ => {
                            let _ = std::fs::remove_file(&path);
                        }
                    }
                }
                Err(e) => return Err(io(e)),
            }
        }
        Err(run_dir_err(dir, "could not take its lock (.lock keeps reappearing)"))
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The process that holds `dir`'s run lock (`.lock`) and still runs, when it is another
/// than this one: a run or resume of this directory is in progress elsewhere, and the
/// directory must be left alone (not resumed, not removed).
pub fn in_use_by(dir: &Path) -> Option<u32> {
    let pid = std::fs::read_to_string(dir.join(".lock"))
        .ok()?
        .trim()
        .parse::<u32>()
        .ok()?;
    (pid != std::process::id() && process_alive(pid)).then_some(pid)
}

/// Whether process `pid` is running (Linux: `/proc/<pid>`; elsewhere assumed so, and a
/// stale `.lock` is then removed by hand, as the error says).
pub(crate) fn process_alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new(&format!("/proc/{pid}")).exists()
    } else {
        true
    }
}

/// Reads the run spec saved in a run directory.
pub fn saved_spec(out_dir: &Path) -> Result<RunSpec> {
    let p = out_dir.join("spec.json");
    let text = std::fs::read_to_string(&p).map_err(|source| TrainError::Io {
        path: p.clone(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| run_dir_err(&p, format!("not a valid run spec: {e}")))
}

/// Why a finished run must train on although it has a `result.json`: it stopped early on a
/// convergence call by a rule older than fpt's trend rule ([`outcomes::convergence`]), which
/// one evaluation could make; it continues from its last checkpoint, judged by today's rule.
/// `None` for a run whose ending stands (at its cap, diverged, stopped on a target accuracy,
/// or called converged by the trend rule).
pub fn reopen_reason(res: &RunResult, spec: &RunSpec) -> Option<String> {
    let t = &spec.train;
    let older_rule = res.plateau.as_ref().is_none_or(|p| p.rule.as_deref() != Some("trend"));
    (t.stop_on_plateau && res.stopped_early && !res.diverged && t.stop_at_accuracy.is_none() && res.steps < t.steps && older_rule)
        .then(|| {
            format!(
                "it stopped at step {} of {} on an earlier convergence rule (`{}`: two evaluations, so one low evaluation could end it); it trains on under the trend rule",
                res.steps,
                t.steps,
                res.plateau.as_ref().and_then(|p| p.rule.clone()).unwrap_or_else(|| "window".into())
            )
        })
}

/// The result of the run in `dir` if it is finished for good: a `result.json` that parses
/// and that [`reopen_reason`] does not reopen (one it reopens counts as unfinished only
/// where a checkpoint to continue from is there).
pub fn finished_result(dir: &Path) -> Option<RunResult> {
    let res: RunResult = serde_json::from_str(&std::fs::read_to_string(dir.join("result.json")).ok()?).ok()?;
    let reopen = saved_spec(dir)
        .ok()
        .and_then(|spec| reopen_reason(&res, &spec))
        .is_some()
        && matches!(crate::checkpoint::latest(dir), Ok(Some(_)));
    (!reopen).then_some(res)
}

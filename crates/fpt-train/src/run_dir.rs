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

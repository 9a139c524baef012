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

/// Appends `line` (without its newline) to the JSON Lines file `path` as one write of the
/// whole line. A torn last line already there (a process killed mid-write, a file cut
/// short) is never appended onto: it is moved to `<path>.bad` and said on stderr first.
pub(crate) fn append_line(path: &Path, line: &str) -> Result<()> {
    let io = |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    };
    // Only a file that does not end in a newline is read whole (the last byte tells).
    let torn = match std::fs::File::open(path) {
        Ok(mut f) => {
            use std::io::{Read, Seek, SeekFrom};
            let len = f.metadata().map_err(io)?.len();
            let mut last = [b'\n'];
            if len > 0 {
                f.seek(SeekFrom::End(-1)).map_err(io)?;
                f.read_exact(&mut last).map_err(io)?;
            }
            last[0] != b'\n'
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(io(e)),
    };
    match if torn { std::fs::read(path).map(Some) } else { Ok(None) } {
        Ok(Some(bytes)) => {
            let cut = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            set_aside(path, &[String::from_utf8_lossy(&bytes[cut..]).into_owned()])?;
            write_atomic(path, &bytes[..cut])?;
        }
        Ok(None) => {}
        Err(e) => return Err(io(e)),
    }
    let mut whole = String::with_capacity(line.len() + 1);
    whole.push_str(line);
    whole.push('\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    f.write_all(whole.as_bytes()).map_err(io)?;
    f.flush().map_err(io)
}

/// Appends `lines` to `<path>.bad` (where a run's torn or garbage lines are kept aside) and
/// says so on stderr.
pub(crate) fn set_aside(path: &Path, lines: &[String]) -> Result<()> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut bad = path.as_os_str().to_owned();
    bad.push(".bad");
    let bad = PathBuf::from(bad);
    eprintln!(
        "fpt: {}: {} torn or unreadable line(s) moved to {} (the first: {:?})",
        path.display(),
        lines.len(),
        bad.display(),
        lines[0].chars().take(80).collect::<String>()
    );
    let mut text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    if let Ok(old) = std::fs::read_to_string(&bad) {
        text = old + &text;
    }
    write_atomic(&bad, text.as_bytes())
}

/// Keeps the lines of the JSON Lines file `path` that parse as `T`, and sets the others
/// aside ([`set_aside`]): what a resume does to `history.jsonl` before appending to it.
pub(crate) fn mend_lines<T: serde::de::DeserializeOwned>(path: &Path) -> Result<()> {
    let text = match std::fs::read(path) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(TrainError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let (good, bad): (Vec<&str>, Vec<&str>) = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .partition(|l| serde_json::from_str::<T>(l).is_ok());
    let torn = !text.is_empty() && !text.ends_with('\n');
    if bad.is_empty() && !torn {
        return Ok(());
    }
    set_aside(path, &bad.iter().map(|l| l.to_string()).collect::<Vec<_>>())?;
    let kept: String = good.iter().map(|l| format!("{l}\n")).collect();
    write_atomic(path, kept.as_bytes())
}

pub(crate) fn metrics_append(path: &Path, rec: &EvalRecord) -> Result<()> {
    append_line(path, &serde_json::to_string(rec).expect("record serialises"))?;
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
    // The first `lines` records that parse; lines that do not (garbage, a torn line) are
    // set aside, never kept.
    let (mut kept, mut bad) = (String::new(), Vec::new());
    let mut n = 0;
    for l in text.lines() {
        if n == lines {
            break;
        }
        if serde_json::from_str::<EvalRecord>(l).is_ok() {
            kept.push_str(l);
            kept.push('\n');
            n += 1;
        } else {
            bad.push(l.to_string());
        }
    }
    set_aside(path, &bad)?;
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
/// two processes never write one run; removed when dropped. The exclusion is the OS's
/// advisory lock on the file (`flock`), taken without waiting: two processes starting
/// together cannot both win, and a holder that dies (killed) releases it with its process.
/// A `.lock` whose id names another live process but is not locked (written by hand, or by
/// an fpt before the OS lock) is honoured too; one naming a dead process is taken over.
pub(crate) struct RunLock {
    path: PathBuf,
    _file: std::fs::File,
}

/// Who holds a run directory's lock: the process id it wrote, when it could be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder(pub Option<u32>);

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(pid) => write!(f, "process {pid}"),
            None => write!(f, "another process (its id not yet in .lock)"),
        }
    }
}

/// The process id a `.lock` holds, read through `f` (a holder writes it right after taking
/// the lock: a few short waits cover that moment).
fn lock_pid(f: &mut std::fs::File, wait: bool) -> Option<u32> {
    use std::io::{Read, Seek};
    for _ in 0..if wait { 50 } else { 1 } {
        let mut s = String::new();
        if f.rewind().is_ok() && f.read_to_string(&mut s).is_ok() {
            if let Ok(pid) = s.trim().parse::<u32>() {
                return Some(pid);
            }
        }
        if wait {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    None
}

/// Whether `f` (open) is still the file at `path`: a holder that ended removes its
/// `.lock`, and a process that opened it just before then must start over on a new one.
fn still_at(f: &std::fs::File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (f.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (f, path);
        true
    }
}

/// A `.lock` not locked by the OS but naming another live process (see [`RunLock`]).
fn named_live(f: &mut std::fs::File) -> Option<u32> {
    lock_pid(f, false).filter(|&pid| pid != std::process::id() && process_alive(pid))
}

impl RunLock {
    pub(crate) fn acquire(dir: &Path) -> Result<Self> {
        use std::io::{Seek, Write};
        let path = dir.join(".lock");
        let io = |source| TrainError::Io {
            path: path.clone(),
            source,
        };
        let in_use = |holder: Holder| {
            run_dir_err(
                dir,
                format!("is in use by {holder} (another fpt run or resume of it); wait for it to end or stop it"),
            )
        };
        // A probe ([`in_use_by`]) holds a shared lock for a moment: a refusal is only
        // believed after it lasts a few tries.
        let mut busy = 0;
        for _ in 0..20 {
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io)?;
            match f.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    busy += 1;
                    if busy >= 5 {
                        return Err(in_use(Holder(lock_pid(&mut f, true))));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    continue;
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
            }
            if !still_at(&f, &path) {
                continue;
            }
            if let Some(pid) = named_live(&mut f) {
                return Err(in_use(Holder(Some(pid))));
            }
            f.set_len(0).map_err(io)?;
            f.rewind().map_err(io)?;
            write!(f, "{}", std::process::id()).map_err(io)?;
            f.flush().map_err(io)?;
            return Ok(Self { path, _file: f });
        }
        Err(run_dir_err(
            dir,
            "could not take its lock (.lock keeps changing under it)",
        ))
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Removed while still locked: a process waiting on this file finds it gone
        // ([`still_at`]) and starts over on a new one.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Who holds `dir`'s run lock, when another process does: a run or resume of this
/// directory is in progress elsewhere, and the directory must be left alone (not resumed,
/// not removed). This process's own lock is not counted.
pub fn in_use_by(dir: &Path) -> Option<Holder> {
    let path = dir.join(".lock");
    let mut f = std::fs::OpenOptions::new().read(true).open(&path).ok()?;
    match f.try_lock_shared() {
        Ok(()) => {
            let live = named_live(&mut f);
            drop(f);
            live.map(|pid| Holder(Some(pid)))
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let pid = lock_pid(&mut f, true);
            (pid != Some(std::process::id())).then_some(Holder(pid))
        }
        Err(std::fs::TryLockError::Error(_)) => None,
    }
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

/// The convergence rule's call on the unfinished run in `dir` as of its latest checkpoint:
/// its evaluations judged as the run's loop judged them at the last one
/// ([`crate::convergence::convergence`] over the checkpoint's kept per-example scores, the
/// spec's patience and floor). `None` where the run has no readable checkpoint or too few
/// evaluations for a window. For reports of a run in progress; it decides nothing.
pub fn pending_call(dir: &Path) -> Option<crate::convergence::Plateau> {
    let ckpt = crate::checkpoint::latest(dir).ok()??;
    let text = std::fs::read_to_string(ckpt.join(crate::checkpoint::STATE_FILE)).ok()?;
    let state: crate::checkpoint::CheckpointState = serde_json::from_str(&text).ok()?;
    let t = &state.spec.train;
    crate::convergence::convergence(&state.run.recent, crate::run_loop::plateau_window(t), t.converge_floor)
}

/// One line of a run's `respec.jsonl`: its spec was changed in place, at a step.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Respec {
    /// When (UTC, `YYYY-MM-DDTHH:MM:SSZ`).
    pub utc: String,
    /// The run's step then (its latest checkpoint's).
    pub step: usize,
    /// What changed, field by field (`task.eval_examples: 2000 -> 0`).
    pub changes: Vec<String>,
    /// Why it could change without a new start.
    pub why: String,
}

/// Gives the run in `dir` the spec `spec`: `spec.json` and every checkpoint's state
/// ([`checkpoint::respec`], each verified first), and a line in `respec.jsonl` saying what
/// changed and `why`. Returns the run's latest step. The caller checks that the change
/// leaves the steps trained as they were, and moves the directory to the new spec's key.
pub fn respec_run(dir: &Path, spec: &RunSpec, why: &str) -> Result<usize> {
    let changes = saved_spec(dir)?.differences(spec);
    let steps = crate::checkpoint::step_dirs(dir);
    for (_, step_dir) in &steps {
        crate::checkpoint::respec(step_dir, spec)?;
    }
    write_atomic(
        &dir.join("spec.json"),
        serde_json::to_string_pretty(spec).expect("spec serialises").as_bytes(),
    )?;
    let step = match crate::checkpoint::latest(dir)? {
        Some(d) => steps.iter().find(|(_, p)| *p == d).map_or(0, |(s, _)| *s),
        None => 0,
    };
    let line = Respec {
        utc: crate::history::utc_now(),
        step,
        changes,
        why: why.to_string(),
    };
    append_line(
        &dir.join("respec.jsonl"),
        &serde_json::to_string(&line).expect("a line serialises"),
    )?;
    Ok(step)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A torn last line (a process killed mid-write) is set aside, never appended onto; a
    /// resume's mending keeps only the lines that parse.
    #[test]
    fn torn_and_garbage_lines_are_set_aside() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("history.jsonl");
        std::fs::write(&p, "{\"a\": 1}\n{\"a\": 2, \"b").unwrap();
        append_line(&p, "{\"a\": 3}").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"a\": 1}\n{\"a\": 3}\n");
        let bad = d.path().join("history.jsonl.bad");
        assert_eq!(std::fs::read_to_string(&bad).unwrap(), "{\"a\": 2, \"b\n");
        // Garbage among whole lines, and a torn end: only what parses stays.
        std::fs::write(&p, "{\"a\": 1}\nnot json\n{\"a\": 4}\n{\"a\"").unwrap();
        mend_lines::<serde_json::Value>(&p).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"a\": 1}\n{\"a\": 4}\n");
        let kept_aside = std::fs::read_to_string(&bad).unwrap();
        assert!(kept_aside.ends_with("not json\n{\"a\"\n"), "{kept_aside}");
        // A whole file is left as it is.
        mend_lines::<serde_json::Value>(&p).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"a\": 1}\n{\"a\": 4}\n");
    }

    /// Metrics are cut to what a checkpoint accounts for, counting only records that parse.
    #[test]
    fn metrics_keep_the_checkpointed_records_that_parse() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("metrics.jsonl");
        let rec = |step: usize| {
            serde_json::json!({"step": step, "train_loss": 1.0, "test_loss": 1.0, "test_accuracy": 0.5, "lr": 0.001, "grad_norm": 1.0, "elapsed_s": 1.0})
                .to_string()
        };
        std::fs::write(&p, format!("{}\ngarbage\n{}\n{}\n", rec(10), rec(20), rec(30))).unwrap();
        metrics_truncate(&p, 2).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            format!("{}\n{}\n", rec(10), rec(20))
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join("metrics.jsonl.bad")).unwrap(),
            "garbage\n"
        );
    }
}

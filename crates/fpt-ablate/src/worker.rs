//! Runs trained in child processes, several at once: how `fpt run-table --jobs N` uses a
//! CPU's cores.
//!
//! On a CPU, N single-threaded runs side by side do more work per second than one run on N
//! threads: a training step is a chain of products and element-wise ops, each split over
//! the threads and joined before the next, and the joins leave cores idle. Measured on a
//! 2-core AMD EPYC (AVX2 path), two MiniLM Bit Memory runs of 40 steps: 64 s one after the
//! other on 2 threads each, 46 s side by side on 1 thread each, with the same test loss to
//! the last digit (a run's arithmetic does not depend on its thread count: products split
//! rows and columns between threads, never a sum).
//!
//! Each run gets a process of its own (the `fpt` binary's hidden `run-cell` subcommand, which
//! calls [`serve`]): thread counts are per process (kernels and candle's element-wise pool
//! read `RAYON_NUM_THREADS` once), and a crash takes down one run, not the table. The spec
//! goes to the child on stdin, progress comes back on its stdout as `fpt-eval` lines, and
//! the result is the run directory's `result.json`, as for a run in the process.

use crate::{AblateError, Result};
use fpt_spec::RunSpec;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};

/// Child processes that train runs: `exe run-cell ...`, each on `threads` threads.
#[derive(Debug, Clone)]
pub struct Workers {
    /// A binary with the `run-cell` subcommand (the `fpt` binary: `std::env::current_exe()`
    /// in it).
    pub exe: PathBuf,
    /// Kernel threads per child (`RAYON_NUM_THREADS` in its environment).
    pub threads: usize,
}

/// Runs at once and threads per run on a CPU with `cores` cores: one single-threaded run
/// per core up to 4 runs (each holds its activations: 0.42 GB peak for a MiniLM Bit Memory
/// run at the cpu scale, measured with `/usr/bin/time`; 1.4 GB before evaluation stopped
/// keeping the autograd graph), the cores shared out between them beyond that.
pub fn auto_jobs(cores: usize) -> (usize, usize) {
    let jobs = cores.clamp(1, 4);
    (jobs, (cores / jobs).max(1))
}

const EVAL: &str = "fpt-eval ";
const ERROR: &str = "fpt-error ";
const STOPPED: &str = "fpt-stopped ";

/// A child's run that stopped before its end (a deadline or an interrupt), as it reports it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoppedLine {
    /// Steps done (its checkpoint's).
    pub step: usize,
    /// The run's cap.
    pub steps: usize,
    /// True when the deadline was the reason (else an interrupt).
    pub deadline: bool,
}

/// One evaluation of a child's run, as it reports it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EvalLine {
    /// Optimizer steps done.
    pub step: usize,
    /// Held-out accuracy, 0..1.
    pub test_accuracy: f64,
    /// Seconds of training so far.
    pub elapsed_s: f64,
}

impl Workers {
    /// Trains `spec` into `dir` in a child process (resuming what is there, or starting
    /// over with `force`, as [`crate::run`] does in process) and returns its result;
    /// `on_eval` sees each evaluation as it happens. The child's stderr (its log) passes
    /// through to ours.
    pub fn train(
        &self,
        spec: &RunSpec,
        dir: &Path,
        force: bool,
        on_eval: &mut dyn FnMut(&EvalLine),
    ) -> Result<fpt_train::RunResult> {
        // The child's own errors name the run directory already: said once.
        let prefix = format!("{}: ", dir.display());
        let fail = |msg: String| AblateError::Worker {
            dir: dir.to_path_buf(),
            msg: msg.strip_prefix(&prefix).map(str::to_string).unwrap_or(msg),
        };
        let mut cmd = std::process::Command::new(&self.exe);
        cmd.arg("run-cell").arg("--dir").arg(dir);
        if force {
            cmd.arg("--force");
        }
        let mut child = cmd
            .env("RAYON_NUM_THREADS", self.threads.max(1).to_string())
            .env(
                fpt_train::stop::DEADLINE_ENV,
                fpt_train::stop::deadline()
                    .map(fpt_train::stop::deadline_env_value)
                    .unwrap_or_default(),
            )
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .map_err(|e| fail(format!("could not start `{} run-cell`: {e}", self.exe.display())))?;
        // A stop asked of this process (SIGINT/SIGTERM, not only a terminal's Ctrl-C, which
        // reaches the whole process group) is passed on to the child, which then stops at
        // its next step with a checkpoint.
        let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let forward = {
            let finished = finished.clone();
            let pid = child.id();
            std::thread::spawn(move || {
                while !finished.load(std::sync::atomic::Ordering::SeqCst) {
                    if fpt_train::stop::due() == Some(fpt_train::stop::Why::Requested) {
                        terminate(pid);
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            })
        };
        let json = serde_json::to_vec(spec).expect("a run spec serialises");
        // The child reads its spec to the end before it starts, so this cannot deadlock.
        let written = child.stdin.take().expect("piped stdin").write_all(&json);
        let mut error = None;
        let mut stopped: Option<StoppedLine> = None;
        let mut lines = std::io::BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        while let Some(Ok(line)) = lines.next() {
            if let Some(e) = line.strip_prefix(EVAL) {
                if let Ok(e) = serde_json::from_str::<EvalLine>(e) {
                    on_eval(&e);
                }
            } else if let Some(e) = line.strip_prefix(STOPPED) {
                stopped = serde_json::from_str(e).ok();
            } else if let Some(e) = line.strip_prefix(ERROR) {
                error = Some(e.to_string());
            }
        }
        let status = child.wait();
        finished.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = forward.join();
        let status = status.map_err(|e| fail(format!("waiting for the run's process: {e}")))?;
        if let Some(s) = stopped {
            return Err(fpt_train::TrainError::Stopped {
                path: dir.to_path_buf(),
                step: s.step,
                steps: s.steps,
                why: if s.deadline {
                    fpt_train::stop::Why::Deadline
                } else {
                    fpt_train::stop::Why::Requested
                },
            }
            .into());
        }
        if let Some(e) = error {
            return Err(fail(e));
        }
        if !status.success() {
            return Err(fail(format!(
                "the run's process ended with {status} (its log is above){}",
                written
                    .err()
                    .map(|e| format!("; sending it the spec: {e}"))
                    .unwrap_or_default()
            )));
        }
        let path = dir.join("result.json");
        let text = std::fs::read_to_string(&path).map_err(crate::io(&path))?;
        serde_json::from_str(&text).map_err(|e| AblateError::Spec {
            path,
            msg: format!("the run's result does not parse: {e}"),
        })
    }
}

/// The child's side (`fpt run-cell --dir DIR [--force]`): reads a run spec (JSON) from
/// `input`, trains it into `dir` on the CPU, writes an `fpt-eval` line per evaluation to
/// `out`, and on failure an `fpt-error` line with the reason, which is also returned.
pub fn serve(dir: &Path, force: bool, input: &mut dyn Read, out: &mut dyn Write) -> Result<()> {
    stop_with_parent();
    let result = (|| {
        // The parent's deadline (a campaign's budget), if it has one.
        if let Some(at) = fpt_train::stop::deadline_from_env().map_err(AblateError::Request)? {
            fpt_train::stop::set_deadline(Some(at));
        }
        let mut text = String::new();
        input
            .read_to_string(&mut text)
            .map_err(crate::io(Path::new("<stdin>")))?;
        let spec: RunSpec = serde_json::from_str(&text).map_err(|e| AblateError::Spec {
            path: PathBuf::from("<stdin>"),
            msg: format!("not a run spec: {e}"),
        })?;
        let mut progress = |e: &fpt_train::Event| {
            if let fpt_train::Event::Eval(r) = e {
                let line = EvalLine {
                    step: r.step,
                    test_accuracy: r.test_accuracy,
                    elapsed_s: r.elapsed_s,
                };
                // A closed stdout (the parent went away) does not stop the run.
                let _ = writeln!(out, "{EVAL}{}", serde_json::to_string(&line).expect("serialises"));
                let _ = out.flush();
            }
        };
        crate::run_one(&spec, dir, force, &candle_core::Device::Cpu, &mut progress)
    })();
    match &result {
        Err(AblateError::Train(fpt_train::TrainError::Stopped { step, steps, why, .. })) => {
            let line = StoppedLine {
                step: *step,
                steps: *steps,
                deadline: *why == fpt_train::stop::Why::Deadline,
            };
            let _ = writeln!(out, "{STOPPED}{}", serde_json::to_string(&line).expect("serialises"));
            let _ = out.flush();
        }
        Err(e) => {
            let _ = writeln!(out, "{ERROR}{}", e.to_string().replace('\n', " "));
            let _ = out.flush();
        }
        Ok(_) => {}
    }
    result.map(|_| ())
}

/// Sends SIGTERM to process `pid` (a child of this process that has not been waited for, so
/// the id is still its own). Elsewhere than on Unix, nothing.
fn terminate(pid: u32) {
    #[cfg(unix)]
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours. `pid` is our
        // child's: the caller stops calling this once `wait` has returned (the id could then
        // be reused), so the id names that child, or at worst (the ~50 ms between the child
        // being reaped and the flag being set) a stale id, which kill(2) rejects or which
        // the system has not reused that soon.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

/// A child that trains a run stops with its parent: on Linux the kernel sends it SIGUSR1
/// when the parent dies (killed, or ended by a second Ctrl-C), which stops its run at the
/// next step with a checkpoint, as any stop request does. Not SIGTERM: the signal comes
/// again as each of the dead parent's threads ends (the child is handed from thread to
/// thread), and a second SIGTERM ends the process at once, checkpoint or not. Without this, an orphan would
/// train on unseen until its deadline and its work would never be saved to the campaign.
fn stop_with_parent() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getppid(2) and prctl(2) with PR_SET_PDEATHSIG take and return plain
        // integers; no pointer is passed.
        let before = unsafe { libc::getppid() };
        // SAFETY: as above (PR_SET_PDEATHSIG's second argument is the signal number).
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGUSR1 as libc::c_ulong, 0, 0, 0);
        }
        // The parent died before the call: nobody will send the signal, so stop now.
        // SAFETY: as above.
        if unsafe { libc::getppid() } != before {
            fpt_train::stop::request();
        }
    }
}

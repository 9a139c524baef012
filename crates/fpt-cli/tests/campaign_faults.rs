//! The campaign loses nothing (issue 58): on a fresh copy of a committed campaign run
//! (`results/campaign/<key>/`), a damaged checkpoint pointer (git's conflict markers in
//! `LATEST`, `LATEST` deleted, the step directory it names deleted) is an error naming the
//! file: the stretch exits non-zero, trains nothing and leaves the committed copy byte for
//! byte as it was; `fpt repair` rebuilds the pointer; a committed copy holding a stretch the
//! local run lacks is never replaced; an unknown `--runs` key is refused; a locked run and
//! one whose saved spec differs are left alone, said, exit non-zero; two stretches of one
//! run started together train it once.

mod common;

use common::{fpt, stderr};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A committed campaign run with a checkpoint that needs nothing these tests' empty caches
/// lack (random init, a generated bit task), the first by key: one with no result yet, or
/// (once every such run has ended) an ended one, whose copy [`fresh`] reopens by removing
/// its result. `(dir, ended)`.
fn committed_run() -> (PathBuf, bool) {
    let needs_nothing = |p: &Path| {
        let spec: serde_json::Value = std::fs::read_to_string(p.join("spec.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        spec["backbone"]["init"] == "random" && matches!(spec["task"]["name"].as_str(), Some("bit-xor" | "bit-memory"))
    };
    let mut dirs: Vec<(bool, PathBuf)> = std::fs::read_dir(repo().join("results/campaign"))
        .expect("results/campaign is committed")
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("checkpoints/LATEST").is_file() && needs_nothing(p))
        .map(|p| (p.join("result.json").exists(), p))
        .collect();
    dirs.sort();
    dirs.into_iter()
        .next()
        .map(|(ended, p)| (p, ended))
        .expect("a committed campaign run with a checkpoint")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut m = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                m.insert(p.strip_prefix(dir).unwrap().to_path_buf(), std::fs::read(&p).unwrap());
            }
        }
    }
    m
}

/// A results directory holding a copy of the committed run: `(tempdir, key, copy)`.
fn fresh() -> (tempfile::TempDir, String, PathBuf) {
    let (src, ended) = committed_run();
    let key = src.file_name().unwrap().to_string_lossy().into_owned();
    let t = tempfile::tempdir().unwrap();
    let copy = t.path().join("campaign").join(&key);
    copy_dir(&src, &copy);
    if ended {
        // Reopened: pending again at its last checkpoint, as a run whose stretch was cut.
        std::fs::remove_file(copy.join("result.json")).unwrap();
    }
    (t, key, copy)
}

/// The arguments of `fpt run-table table2 --scale converge --campaign` on results `out`,
/// with `extra`.
fn campaign_args(out: &Path, extra: &[&str]) -> Vec<String> {
    let tables = repo().join("data/tables");
    let mut args: Vec<String> = [
        "run-table",
        "table2",
        "--scale",
        "converge",
        "--tables",
        tables.to_str().unwrap(),
        "--rows",
        "FPT,Random,Bit",
        "--campaign",
        "--out",
        out.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// `fpt run-table table2 --scale converge --campaign` on results `out`, with `extra`.
fn campaign(out: &Path, extra: &[&str]) -> std::process::Output {
    let args = campaign_args(out, extra);
    fpt(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// One campaign stretch of `key` on results `out` (a short budget; nothing here may train).
fn stretch(out: &Path, key: &str) -> std::process::Output {
    campaign(out, &["--runs", key, "--budget", "30s"])
}

fn latest_name(copy: &Path) -> String {
    std::fs::read_to_string(copy.join("checkpoints/LATEST"))
        .unwrap()
        .trim()
        .to_string()
}

/// Each damage to the pointer: a non-zero exit naming `LATEST`, nothing trained, the
/// committed copy unchanged.
#[test]
fn a_damaged_pointer_stops_the_stretch_and_keeps_the_copy() {
    type Damage = fn(&Path);
    let cases: [(&str, Damage); 3] = [
        ("conflict markers", |c| {
            let name = latest_name(c);
            std::fs::write(
                c.join("checkpoints/LATEST"),
                format!("<<<<<<< HEAD\n{name}\n=======\nstep-999999\n>>>>>>> other\n"),
            )
            .unwrap();
        }),
        ("LATEST deleted", |c| {
            std::fs::remove_file(c.join("checkpoints/LATEST")).unwrap()
        }),
        ("its step directory deleted", |c| {
            let name = latest_name(c);
            // Another step directory stays, so that the run still "has checkpoints".
            std::fs::rename(c.join("checkpoints").join(&name), c.join("checkpoints/step-000001")).unwrap();
        }),
    ];
    for (what, damage) in cases {
        let (t, key, copy) = fresh();
        damage(&copy);
        let before = snapshot(&copy);
        let out = stretch(t.path(), &key);
        let err = stderr(&out);
        assert!(!out.status.success(), "{what}: exit 0: {err}");
        assert!(err.contains("LATEST") && err.contains(&key), "{what}: {err}");
        assert!(err.contains("left alone, not trained"), "{what}: {err}");
        assert_eq!(snapshot(&copy), before, "{what}: the committed copy changed");
        // Nothing trained: no local run directory was made for it.
        assert!(
            !t.path().join("runs").join(&key).exists(),
            "{what}: a local run was started"
        );
    }
}

/// `fpt repair` points `LATEST` at the newest checkpoint that verifies; a stretch then
/// reads the run at its step again.
#[test]
fn repair_rebuilds_the_pointer() {
    let (t, key, copy) = fresh();
    let name = latest_name(&copy);
    std::fs::write(copy.join("checkpoints/LATEST"), "<<<<<<< HEAD\n").unwrap();
    // A newer step directory whose files do not verify is passed over.
    let bad = copy.join("checkpoints/step-999999");
    copy_dir(&copy.join("checkpoints").join(&name), &bad);
    std::fs::write(bad.join("trainable.safetensors"), b"torn").unwrap();
    let out = fpt(&["repair", copy.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("step-999999"), "{}", stderr(&out));
    assert_eq!(latest_name(&copy), name);
    let status = fpt(&[
        "run-table",
        "table2",
        "--scale",
        "converge",
        "--tables",
        repo().join("data/tables").to_str().unwrap(),
        "--status",
        "--out",
        t.path().to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&status.stdout);
    let line = text.lines().find(|l| l.contains(&key)).expect("the run's status line");
    assert!(!line.contains("DAMAGED") && !line.contains("not started"), "{line}");
}

/// Two machines stretched the same run from the same start and both committed: the copy
/// holds a stretch the local run lacks, so saving the local run over it is refused (and
/// restoring the copy over the local run likewise), both named, exit non-zero.
#[test]
fn a_copy_with_a_stretch_the_run_lacks_is_never_replaced() {
    let (t, key, copy) = fresh();
    // The local run: the copy as it was, then "trained further" elsewhere: its pointer names
    // a later step (same files), and its history has its own new stretch.
    let local = t.path().join("runs").join(&key);
    copy_dir(&copy, &local);
    let name = latest_name(&copy);
    let step: usize = name["step-".len()..].parse().unwrap();
    let later = format!("step-{:06}", step + 500);
    std::fs::rename(
        local.join("checkpoints").join(&name),
        local.join("checkpoints").join(&later),
    )
    .unwrap();
    std::fs::write(local.join("checkpoints/LATEST"), &later).unwrap();
    let stretch_line = |machine: &str| {
        format!(
            "{{\"ended_utc\":\"2026-11-27T06:00:00Z\",\"from_step\":{step},\"to_step\":{},\"seconds\":1.0,\"device\":\"cpu\",\"machine\":\"{machine}\",\"commit\":\"x\",\"how\":\"stopped\"}}\n",
            step + 500
        )
    };
    let mut h = std::fs::read_to_string(local.join("history.jsonl")).unwrap_or_default();
    h.push_str(&stretch_line("this machine"));
    std::fs::write(local.join("history.jsonl"), h).unwrap();
    // The committed copy got the other machine's stretch.
    let mut h = std::fs::read_to_string(copy.join("history.jsonl")).unwrap_or_default();
    h.push_str(&stretch_line("the other machine"));
    std::fs::write(copy.join("history.jsonl"), h).unwrap();
    let before = snapshot(&copy);
    // Reports only: nothing trains (its fake checkpoint could not be), the runs are saved.
    let out = campaign(t.path(), &["--report-only"]);
    let err = stderr(&out);
    assert!(!out.status.success(), "exit 0: {err}");
    assert!(err.contains(&key) && err.contains("stretch"), "{err}");
    assert_eq!(snapshot(&copy), before, "the committed copy changed");
}

#[test]
fn an_unknown_run_key_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let out = stretch(t.path(), "0123456789abcdef");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no run 0123456789abcdef at scale converge here"),
        "{}",
        stderr(&out)
    );
}

/// A run another process holds (its `.lock` names a live process) is left alone: the
/// stretch says which process holds it and exits non-zero; the run and its committed copy
/// stay as they were.
#[test]
fn a_locked_run_is_left_alone_and_said() {
    let (t, key, copy) = fresh();
    let local = t.path().join("runs").join(&key);
    copy_dir(&copy, &local);
    let mut holder = std::process::Command::new("sleep").arg("60").spawn().unwrap();
    std::fs::write(local.join(".lock"), holder.id().to_string()).unwrap();
    let (before, local_before) = (snapshot(&copy), snapshot(&local));
    let out = stretch(t.path(), &key);
    holder.kill().unwrap();
    holder.wait().unwrap();
    let err = stderr(&out);
    assert!(!out.status.success(), "exit 0: {err}");
    assert!(
        err.contains(&key) && err.contains(&format!("process {}", holder.id())),
        "{err}"
    );
    assert_eq!(snapshot(&copy), before, "the committed copy changed");
    assert_eq!(snapshot(&local), local_before, "the locked run changed");
}

/// A run directory whose saved spec is not its cell's (edited by hand: another learning
/// rate) is refused, the difference named, exit non-zero; nothing of it changes.
#[test]
fn a_run_whose_spec_differs_is_refused() {
    let (t, key, copy) = fresh();
    let local = t.path().join("runs").join(&key);
    copy_dir(&copy, &local);
    let spec_path = local.join("spec.json");
    let mut spec: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&spec_path).unwrap()).unwrap();
    spec["train"]["lr"] = serde_json::json!(0.5);
    std::fs::write(&spec_path, serde_json::to_string(&spec).unwrap()).unwrap();
    let (before, local_before) = (snapshot(&copy), snapshot(&local));
    let out = stretch(t.path(), &key);
    let err = stderr(&out);
    assert!(!out.status.success(), "exit 0: {err}");
    assert!(err.contains(&key) && err.contains("lr"), "{err}");
    assert_eq!(snapshot(&copy), before, "the committed copy changed");
    assert_eq!(snapshot(&local), local_before, "the run changed");
}

/// Two stretches of one run started together on one results directory: one trains it and
/// saves it back, the other finds it held and says so (non-zero); the committed copy is the
/// winner's, further along, and neither leaves a temporary file where `git add` finds it.
#[test]
fn two_stretches_of_one_run_started_together() {
    let (t, key, copy) = fresh();
    let step = |dir: &Path| -> usize { latest_name(dir)["step-".len()..].parse().unwrap() };
    let start = step(&copy);
    let spawn = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_fpt"))
            .args(campaign_args(t.path(), &["--runs", &key, "--budget", "25s"]))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    let said: Vec<String> = outs.iter().map(stderr).collect();
    let won = outs.iter().filter(|o| o.status.success()).count();
    assert_eq!(won, 1, "exactly one stretch trains: {said:#?}");
    let loser = &said[outs.iter().position(|o| !o.status.success()).unwrap()];
    assert!(loser.contains(&key) && loser.contains("process"), "{loser}");
    assert!(
        step(&copy) > start,
        "the committed copy holds the winner's stretch: {said:#?}"
    );
    let stray: Vec<_> = std::fs::read_dir(t.path().join("campaign"))
        .unwrap()
        .chain(std::fs::read_dir(t.path().join("runs")).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') || n.contains(".tmp") || n.ends_with(".part"))
        .collect();
    assert!(stray.is_empty(), "left behind: {stray:?}");
}

/// A committed run begun under an earlier evaluation of the scale (here: 777 held-out
/// examples) moves to its cell's key at the next stretch: `--status` says so first; then its
/// spec and checkpoint carry the cell's spec (the checkpoint verifies), `respec.jsonl` says
/// what changed, the old key is gone, and the run is pending at the step it had.
#[test]
fn a_run_begun_under_an_earlier_evaluation_moves_to_its_new_key() {
    let (t, key, copy) = fresh();
    let step = latest_name(&copy);
    let mut earlier = fpt_train::saved_spec(&copy).unwrap();
    earlier.task.eval_examples = 777;
    fpt_train::respec_run(&copy, &earlier, "this test: an earlier evaluation").unwrap();
    let old = fpt_ablate::spec_key(&earlier);
    let old_dir = t.path().join("campaign").join(&old);
    std::fs::rename(&copy, &old_dir).unwrap();
    let status = || {
        let out = fpt(&[
            "run-table",
            "table2",
            "--scale",
            "converge",
            "--tables",
            repo().join("data/tables").to_str().unwrap(),
            "--status",
            "--out",
            t.path().to_str().unwrap(),
        ]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let before = status();
    assert!(
        before.contains(&format!("{} -> {key}", old_dir.display())) && before.contains("task.eval_examples: 777 -> "),
        "{before}"
    );
    let out = campaign(t.path(), &["--report-only"]);
    let err = stderr(&out);
    assert!(err.contains(&format!("run {old} -> {key}")), "{err}");
    assert!(!old_dir.exists(), "the old key is gone");
    let spec = fpt_train::saved_spec(&copy).unwrap();
    assert_ne!(spec.task.eval_examples, 777);
    assert_eq!(fpt_ablate::spec_key(&spec), key);
    assert_eq!(latest_name(&copy), step, "the same checkpoint");
    let ck = fpt_train::checkpoint::latest(&copy).unwrap().unwrap();
    let loaded = fpt_train::checkpoint::load(&ck, &candle_core::Device::Cpu).unwrap();
    assert_eq!(loaded.state.spec, spec);
    let lines = std::fs::read_to_string(copy.join("respec.jsonl")).unwrap();
    let last: fpt_train::Respec = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
    assert!(last.changes[0].starts_with("task.eval_examples: 777 -> "), "{last:?}");
    let after = status();
    let line = after.lines().find(|l| l.contains(&key)).expect("the run's status line");
    assert!(line.contains("pending") && !after.contains("to move"), "{after}");
}

/// A committed run that ended at its scale's old cap (here: the step of its checkpoint, not
/// converged) moves to the cell's larger cap and trains on: its result is kept aside as
/// `result-cap-N.json` (and carried with the copy), `respec.jsonl` says the cap grew, and it
/// is pending at the step it had; the same where its evaluation changed too (its number is
/// set aside either way).
#[test]
fn a_run_that_ended_at_a_smaller_cap_reopens_under_the_larger_one() {
    let (t, key, copy) = fresh();
    let name = latest_name(&copy);
    let step: usize = name.trim_start_matches("step-").parse().unwrap();
    let mut earlier = fpt_train::saved_spec(&copy).unwrap();
    assert!(earlier.train.steps > step && earlier.train.lr_schedule == fpt_spec::LrSchedule::Constant);
    earlier.train.steps = step;
    fpt_train::respec_run(&copy, &earlier, "this test: an earlier cap").unwrap();
    let mut result: serde_json::Value =
        serde_json::from_str(include_str!("../../fpt-ablate/tests/data/result-template.json")).unwrap();
    result["steps"] = serde_json::json!(step);
    result["converged"] = serde_json::json!(false);
    std::fs::write(copy.join("result.json"), result.to_string()).unwrap();
    assert!(fpt_train::finished_result(&copy).is_some(), "done at its old cap");
    let old = fpt_ablate::spec_key(&earlier);
    let old_dir = t.path().join("campaign").join(&old);
    std::fs::rename(&copy, &old_dir).unwrap();
    let out = campaign(t.path(), &["--report-only"]);
    let err = stderr(&out);
    assert!(err.contains(&format!("run {old} -> {key}")), "{err}");
    assert!(!old_dir.exists(), "the old key is gone");
    assert!(!copy.join("result.json").exists(), "reopened");
    let kept = copy.join(format!("result-cap-{step}.json"));
    assert!(kept.is_file(), "the old result kept aside");
    assert_eq!(latest_name(&copy), name, "the same checkpoint");
    let lines = std::fs::read_to_string(copy.join("respec.jsonl")).unwrap();
    let last: fpt_train::Respec = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
    assert!(
        last.changes
            .iter()
            .any(|c| c.starts_with(&format!("train.steps: {step} -> "))),
        "{last:?}"
    );
    assert!(last.why.contains("cap grew"), "{last:?}");
    // The same where the evaluation changed too: reopened as well.
    let (t2, key2, copy2) = fresh();
    let mut other = fpt_train::saved_spec(&copy2).unwrap();
    other.train.steps = step;
    other.task.eval_examples = 777;
    fpt_train::respec_run(&copy2, &other, "this test: an earlier cap and evaluation").unwrap();
    std::fs::write(copy2.join("result.json"), result.to_string()).unwrap();
    let old2 = t2.path().join("campaign").join(fpt_ablate::spec_key(&other));
    std::fs::rename(&copy2, &old2).unwrap();
    let err = stderr(&campaign(t2.path(), &["--report-only"]));
    assert!(err.contains(&format!("-> {key2}")), "{err}");
    assert!(copy2.join(format!("result-cap-{step}.json")).is_file() && !copy2.join("result.json").exists());
}

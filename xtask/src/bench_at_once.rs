//! `cargo xtask bench step --at-once N` and `cargo xtask bench at-once FILE`: N processes
//! of one step timed side by side (fpt's, then PyTorch's), their timed steps started together
//! behind a barrier directory; each N's steps a second in all, the rounds alternating
//! (issue 56 items 2 and 8: how many campaign runs a GPU should train at once).

use crate::bench::{python, StepArgs};
use crate::root;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;

/// What N processes timed at once measured together: their steps a second in all (each
/// process's median step, summed as rates), the median of their medians, and how much of
/// the longest timed window all of them shared (1: they ran side by side throughout).
pub(crate) fn together(procs: &[serde_json::Value], ms_key: &str) -> Option<serde_json::Value> {
    let f = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_f64());
    let ms: Vec<f64> = procs.iter().map(|p| f(p, ms_key)).collect::<Option<_>>()?;
    if ms.is_empty() || ms.iter().any(|&m| m <= 0.0) {
        return None;
    }
    let windows: Option<Vec<(f64, f64)>> = procs
        .iter()
        .map(|p| {
            // fpt's window is under its step timing (`ours`), PyTorch's at the top.
            let w = p.get("ours").unwrap_or(p);
            f(w, "from_unix").zip(f(w, "to_unix"))
        })
        .collect();
    let overlap = windows.and_then(|w| {
        let start = w.iter().map(|x| x.0).fold(f64::MIN, f64::max);
        let end = w.iter().map(|x| x.1).fold(f64::MAX, f64::min);
        let longest = w.iter().map(|x| x.1 - x.0).fold(0.0, f64::max);
        (longest > 0.0).then(|| ((end - start) / longest).clamp(0.0, 1.0))
    });
    let mut sorted = ms.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    Some(serde_json::json!({
        "processes": ms.len(),
        "steps_per_s": ms.iter().map(|m| 1e3 / m).sum::<f64>(),
        "median_ms": sorted[sorted.len() / 2],
        "per_process_ms": ms,
        "overlap": overlap,
    }))
}

/// Runs `n` copies of the command `make` gives, side by side, their timed steps behind one
/// barrier directory (`--barrier DIR --at-once n`, fpt's and the PyTorch script's flag), and
/// returns each one's JSON.
pub(crate) fn side_by_side(n: usize, what: &str, make: &dyn Fn() -> Command) -> Result<Vec<serde_json::Value>> {
    let dir = root()
        .join("target")
        .join(format!("bench-barrier-{}-{}", std::process::id(), unique()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let children: Vec<_> = (0..n)
        .map(|_| {
            let mut cmd = make();
            cmd.arg("--barrier").arg(&dir).args(["--at-once", &n.to_string()]);
            cmd.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            cmd.spawn().with_context(|| format!("starting {what}"))
        })
        .collect::<Result<_>>()?;
    let outs: Vec<_> = children.into_iter().map(|c| c.wait_with_output()).collect();
    let _ = std::fs::remove_dir_all(&dir);
    outs.into_iter()
        .enumerate()
        .map(|(i, o)| {
            let o = o.with_context(|| format!("waiting for {what}"))?;
            if !o.status.success() {
                bail!(
                    "{what} ({} of {n} at once) failed: {}",
                    i + 1,
                    String::from_utf8_lossy(&o.stderr).trim()
                );
            }
            let text = String::from_utf8_lossy(&o.stdout);
            serde_json::from_str(text.lines().last().unwrap_or(""))
                .with_context(|| format!("{what} ({} of {n} at once) printed no JSON: {text}", i + 1))
        })
        .collect()
}

/// A number no other barrier of this process has used.
fn unique() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// `--at-once`: per shape, kernel path and N, alternating rounds of N fpt processes then N
/// PyTorch processes; rows keyed `shape [path] xN`.
pub(crate) fn at_once(
    a: &StepArgs,
    bin: &Path,
    shapes: &[String],
    paths: &[(String, Option<&str>)],
    torch_ok: bool,
    script: &Path,
) -> Result<serde_json::Map<String, serde_json::Value>> {
    let (steps, warmup) = (a.steps.to_string(), a.warmup.to_string());
    let mut all = serde_json::Map::new();
    for s in shapes {
        for (path, env) in paths {
            for &n in &a.at_once {
                let n = n as usize;
                let (mut ours, mut theirs) = (Vec::new(), Vec::new());
                for r in 1..=a.rounds {
                    eprintln!(
                        "xtask: bench {s} x{n} (round {r}/{}): {n} fpt processes on the {path} kernel path ...",
                        a.rounds
                    );
                    let fpt = side_by_side(n, "fpt bench", &|| {
                        let mut cmd = Command::new(bin);
                        cmd.args([
                            "bench",
                            "--json",
                            "--no-full",
                            "--shape",
                            s,
                            "--steps",
                            &steps,
                            "--warmup",
                            &warmup,
                        ])
                        .args(["--device", &a.device, "--precision", &a.precision]);
                        if let Some(v) = env {
                            cmd.env("FPT_KERNELS", v);
                        }
                        cmd
                    })?;
                    let entries: Vec<_> = fpt.iter().filter_map(|o| o.get(s.as_str()).cloned()).collect();
                    ours.push(together(&entries, "ours_ms").context("fpt bench returned no step times")?);
                    if torch_ok {
                        eprintln!(
                            "xtask: bench {s} x{n} (round {r}/{}): {n} pytorch processes ...",
                            a.rounds
                        );
                        let pt = side_by_side(n, "pytorch_fpt_step.py", &|| {
                            let mut cmd = Command::new(python());
                            cmd.arg(script)
                                .args([
                                    "--shape", s, "--steps", &steps, "--warmup", &warmup, "--device", &a.device,
                                ])
                                .arg("--no-full")
                                .arg("--fpt")
                                .arg(bin);
                            cmd
                        })?;
                        theirs.push(together(&pt, "pytorch_ms").context("pytorch_fpt_step.py returned no step times")?);
                    }
                }
                let kernels = if a.device == "cpu" {
                    path.clone()
                } else {
                    a.device.clone()
                };
                let row = at_once_row(s, &a.backbone, &kernels, &a.precision, n, ours, theirs);
                all.insert(format!("{s} [{path}] x{n}"), row);
            }
        }
    }
    Ok(all)
}

/// One `--at-once` row: N processes' rounds (each [`together`]'s), fpt's and PyTorch's.
pub(crate) fn at_once_row(
    shape: &str,
    backbone: &str,
    kernels: &str,
    precision: &str,
    n: usize,
    ours: Vec<serde_json::Value>,
    theirs: Vec<serde_json::Value>,
) -> serde_json::Value {
    let median = |mut v: Vec<f64>| -> Option<f64> {
        v.sort_by(|a, b| a.total_cmp(b));
        (!v.is_empty()).then(|| v[v.len() / 2])
    };
    let num = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_f64());
    let sps = |v: &[serde_json::Value]| median(v.iter().filter_map(|x| num(x, "steps_per_s")).collect());
    // Per round: PyTorch's steps a second over fpt's (fpt's time per step over PyTorch's,
    // as the one-process ratio; below 1: fpt is faster).
    let ratios: Vec<f64> = ours
        .iter()
        .zip(&theirs)
        .filter_map(|(o, t)| num(t, "steps_per_s").zip(num(o, "steps_per_s")).map(|(t, o)| t / o))
        .collect();
    serde_json::json!({
        "shape": shape,
        "backbone": backbone,
        "kernel_path": kernels,
        "precision": precision,
        "at_once": n,
        "ours_ms": median(ours.iter().filter_map(|x| num(x, "median_ms")).collect()),
        "pytorch_ms": median(theirs.iter().filter_map(|x| num(x, "median_ms")).collect()),
        "steps_per_s": sps(&ours),
        "pytorch_steps_per_s": sps(&theirs),
        "ratio_vs_pytorch": median(ratios.clone()),
        "round_ratios": ratios,
        "overlap_min": ours.iter().chain(&theirs).filter_map(|x| num(x, "overlap")).reduce(f64::min),
        "rounds": ours.len().max(theirs.len()),
        "fpt_rounds": ours,
        "pytorch_rounds": theirs,
    })
}

/// The machine an `<stamp>-at-once.jsonl` was measured on, from the `<stamp>-machine.txt`
/// beside it (bench/gpu/run.sh's: date, nvidia-smi's CSV header and GPU line, versions, the
/// CPU count): "NVIDIA H100 80GB HBM3, 16 cores (device machine)". An error naming the file
/// when it is missing or names no GPU: pass `--machine` then.
pub(crate) fn device_machine(file: &Path) -> Result<String> {
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let Some(stamp) = name.strip_suffix("at-once.jsonl") else {
        bail!(
            "{}: not a `<stamp>-at-once.jsonl`, so no machine file beside it: pass --machine",
            file.display()
        )
    };
    let txt = file.with_file_name(format!("{stamp}machine.txt"));
    let text = std::fs::read_to_string(&txt).with_context(|| {
        format!(
            "reading {} (the machine of {}; or pass --machine)",
            txt.display(),
            file.display()
        )
    })?;
    machine_line(&text).with_context(|| format!("{}: no GPU line (pass --machine)", txt.display()))
}

/// [`device_machine`]'s reading of a machine file's text.
fn machine_line(text: &str) -> Option<String> {
    let mut lines = text.lines().map(str::trim);
    let gpu = lines
        .by_ref()
        .skip_while(|l| !l.starts_with("name,"))
        .nth(1)?
        .split(',')
        .next()?
        .trim()
        .to_string();
    let cores = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()));
    Some(match cores {
        Some(n) => format!("{gpu}, {n} cores (device machine)"),
        None => format!("{gpu} (device machine)"),
    })
}

/// `cargo xtask bench at-once FILE`: the rows of an `at-once.jsonl` a device call wrote
/// (bench/gpu/session.sh: one line per process, `{"side": "fpt"|"pytorch", "at_once": N,
/// "round": R, "out": <its JSON>}`), as `--at-once` makes them here.
pub(crate) fn import_at_once(lines: &str, device: &str) -> Result<serde_json::Map<String, serde_json::Value>> {
    use std::collections::BTreeMap;
    // (N, side, round) -> the processes' JSON.
    let mut groups: BTreeMap<(usize, String, u64), Vec<serde_json::Value>> = BTreeMap::new();
    let mut shape = None;
    for (i, line) in lines.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("line {}: not JSON: {line}", i + 1))?;
        let (Some(side), Some(n), Some(round)) = (v["side"].as_str(), v["at_once"].as_u64(), v["round"].as_u64())
        else {
            bail!("line {}: wants `side`, `at_once` and `round`: {line}", i + 1);
        };
        let out = match side {
            // fpt's JSON is keyed by its shape.
            "fpt" => {
                let (name, entry) = v["out"]
                    .as_object()
                    .and_then(|o| o.iter().next())
                    .with_context(|| format!("line {}: fpt's output names no shape", i + 1))?;
                shape.get_or_insert_with(|| name.clone());
                entry.clone()
            }
            "pytorch" => v["out"].clone(),
            other => bail!("line {}: `side` is fpt or pytorch, not `{other}`", i + 1),
        };
        groups
            .entry((n as usize, side.to_string(), round))
            .or_default()
            .push(out);
    }
    let shape = shape.context("no fpt process in the file")?;
    let mut per_n: BTreeMap<usize, (Vec<serde_json::Value>, Vec<serde_json::Value>)> = BTreeMap::new();
    for ((n, side, round), procs) in groups {
        if procs.len() != n {
            eprintln!(
                "xtask: {side} x{n}, round {round}: {} of {n} processes reported; the round is left out",
                procs.len()
            );
            continue;
        }
        let key = if side == "fpt" { "ours_ms" } else { "pytorch_ms" };
        let t = together(&procs, key).with_context(|| format!("{side} x{n}, round {round}: no step times"))?;
        let e = per_n.entry(n).or_default();
        if side == "fpt" {
            e.0.push(t);
        } else {
            e.1.push(t);
        }
    }
    let backbone = shape.split('-').next().unwrap_or("?").to_string();
    Ok(per_n
        .into_iter()
        .map(|(n, (ours, theirs))| {
            let row = at_once_row(&shape, &backbone, device, "f32", n, ours, theirs);
            (format!("{shape} [{device}] x{n}"), row)
        })
        .collect())
}

/// The rows of a `streams.jsonl` a device call wrote (bench/gpu/session.sh: one line per
/// measurement, `{"streams": N, "step": "replay"|"eager", "round": R, "out": <fpt bench
/// --streams N --json>}`; files from before the replayed steps have no `step`: eager): N
/// runs in one process, each round's steps a second in all beside PyTorch's N processes of
/// the same call (`at_once`'s rows, from its at-once.jsonl), keyed `<shape> [<device>
/// streams] xN` (eager steps) or `<shape> [<device> streams, replayed] xN`.
pub(crate) fn import_streams(
    lines: &str,
    device: &str,
    at_once: &serde_json::Map<String, serde_json::Value>,
) -> Result<serde_json::Map<String, serde_json::Value>> {
    use std::collections::BTreeMap;
    let mut per_n: BTreeMap<(bool, usize), Vec<serde_json::Value>> = BTreeMap::new();
    let mut shape = None;
    for (i, line) in lines.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("line {}: not JSON: {line}", i + 1))?;
        let replayed = match v.get("step").map(|s| s.as_str()) {
            None | Some(Some("eager")) => false,
            Some(Some("replay")) => true,
            Some(other) => bail!(
                "line {}: `step` is {other:?}, not \"replay\" or \"eager\": {line}",
                i + 1
            ),
        };
        let (Some(n), Some((name, t))) = (
            v["streams"].as_u64(),
            v["out"].as_object().and_then(|o| o.iter().next()),
        ) else {
            bail!(
                "line {}: wants `streams` and `out` (fpt bench --streams --json): {line}",
                i + 1
            );
        };
        shape.get_or_insert_with(|| name.clone());
        let runs: Vec<f64> = t["per_run"]
            .as_array()
            .map(|r| r.iter().filter_map(|x| x["median_ms"].as_f64()).collect())
            .unwrap_or_default();
        let (Some(sps), false) = (t["steps_per_s"].as_f64(), runs.len() != n as usize) else {
            bail!(
                "line {}: {} of {n} runs reported, or no steps a second: {line}",
                i + 1,
                runs.len()
            );
        };
        let mut sorted = runs.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        per_n
            .entry((replayed, n as usize))
            .or_default()
            .push(serde_json::json!({
                "processes": n,
                "steps_per_s": sps,
                "median_ms": sorted[sorted.len() / 2],
                "per_process_ms": runs,
                "overlap": t["overlap"],
            }));
    }
    let shape = shape.context("no measurement in the file")?;
    let backbone = shape.split('-').next().unwrap_or("?").to_string();
    Ok(per_n
        .into_iter()
        .map(|((replayed, n), ours)| {
            let theirs = at_once
                .get(&format!("{shape} [{device}] x{n}"))
                .and_then(|r| r["pytorch_rounds"].as_array().cloned())
                .unwrap_or_default();
            let (how, key) = if replayed {
                (", replayed steps", " streams, replayed")
            } else {
                ("", " streams")
            };
            let kernels = format!("{device}, {n} runs in one process{how}");
            let row = at_once_row(&shape, &backbone, &kernels, "f32", n, ours, theirs);
            (format!("{shape} [{device}{key}] x{n}"), row)
        })
        .collect())
}

/// The `--at-once` table.
pub(crate) fn print_at_once(all: &serde_json::Map<String, serde_json::Value>) {
    let fmt = |v: &serde_json::Value, k: &str, p: usize| {
        v.get(k)
            .and_then(|x| x.as_f64())
            .map_or("-".to_string(), |x| format!("{x:.p$}"))
    };
    println!("| shape | kernels | at once | fpt steps/s in all | PyTorch steps/s in all | PyTorch / fpt (rounds) | fpt step ms (median process) | PyTorch step ms | windows shared |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in all.values() {
        let rounds: Vec<String> = r["round_ratios"]
            .as_array()
            .map(|v| v.iter().filter_map(|x| x.as_f64()).map(|x| format!("{x:.2}")).collect())
            .unwrap_or_default();
        println!(
            "| {} | {} | {} | {} | {} | {} ({}) | {} | {} | {} |",
            r["shape"].as_str().unwrap_or("?"),
            r["kernel_path"].as_str().unwrap_or("?"),
            r["at_once"],
            fmt(r, "steps_per_s", 1),
            fmt(r, "pytorch_steps_per_s", 1),
            fmt(r, "ratio_vs_pytorch", 2),
            rounds.join(", "),
            fmt(r, "ours_ms", 1),
            fmt(r, "pytorch_ms", 1),
            r["overlap_min"]
                .as_f64()
                .map_or("-".into(), |x| format!("{:.0}%", 100.0 * x)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two processes at 20 and 40 ms a step make 75 steps a second together; windows that
    /// share 1.5 of the longer's 2 s overlap 75%; a process without a time gives no row.
    #[test]
    fn processes_timed_at_once_add_up_as_rates() {
        let procs = [
            serde_json::json!({"ours_ms": 20.0, "ours": {"from_unix": 100.0, "to_unix": 102.0}}),
            serde_json::json!({"ours_ms": 40.0, "ours": {"from_unix": 100.5, "to_unix": 102.5}}),
        ];
        let t = together(&procs, "ours_ms").unwrap();
        assert!((t["steps_per_s"].as_f64().unwrap() - 75.0).abs() < 1e-9, "{t}");
        assert_eq!(t["processes"], 2);
        assert!((t["overlap"].as_f64().unwrap() - 0.75).abs() < 1e-9, "{t}");
        // PyTorch's window sits at the top of its JSON.
        let pt = [
            serde_json::json!({"pytorch_ms": 10.0, "from_unix": 5.0, "to_unix": 6.0}),
            serde_json::json!({"pytorch_ms": 10.0, "from_unix": 7.0, "to_unix": 8.0}),
        ];
        let t = together(&pt, "pytorch_ms").unwrap();
        assert_eq!(t["overlap"].as_f64(), Some(0.0), "windows that never met share nothing");
        assert!(together(&[serde_json::json!({"x": 1})], "ours_ms").is_none());
    }

    /// A device call's `streams.jsonl` beside its `at-once.jsonl`: each N's rounds of runs in
    /// one process, PyTorch's N processes beside them; a line missing a run is an error.
    #[test]
    fn streams_become_rows_beside_pytorchs_processes() {
        let pt = |n: usize, ms: f64| {
            format!("{{\"side\":\"pytorch\",\"at_once\":{n},\"round\":1,\"out\":{{\"pytorch_ms\":{ms},\"from_unix\":1.0,\"to_unix\":2.0}}}}")
        };
        let fpt = r#"{"side":"fpt","at_once":1,"round":1,"out":{"minilm-mnist":{"ours_ms":8.0,"ours":{"median_ms":8.0,"from_unix":1.0,"to_unix":2.0}}}}"#;
        let at_once = super::import_at_once(
            &[fpt.to_string(), pt(1, 13.0), pt(2, 12.0), pt(2, 12.0)].join("\n"),
            "cuda:0",
        )
        .unwrap();
        let line = |n: usize, sps: f64, runs: &str| {
            format!("{{\"streams\":{n},\"round\":1,\"out\":{{\"minilm-mnist\":{{\"runs\":{n},\"steps_per_s\":{sps},\"overlap\":0.9,\"per_run\":[{runs}]}}}}}}")
        };
        let replayed = line(2, 300.0, r#"{"median_ms":1.0},{"median_ms":1.1}"#).replacen(
            "\"round\"",
            "\"step\":\"replay\",\"round\"",
            1,
        );
        let text = [
            line(1, 120.0, r#"{"median_ms":8.3}"#),
            line(2, 200.0, r#"{"median_ms":10.0},{"median_ms":10.2}"#),
            replayed.clone(),
        ]
        .join("\n");
        let rows = super::import_streams(&text, "cuda:0", &at_once).unwrap();
        assert_eq!(rows.len(), 3, "{rows:?}");
        let r2 = &rows["minilm-mnist [cuda:0 streams, replayed] x2"];
        assert_eq!(r2["steps_per_s"].as_f64(), Some(300.0));
        assert_eq!(
            r2["kernel_path"].as_str(),
            Some("cuda:0, 2 runs in one process, replayed steps")
        );
        let odd = replayed.replace("\"replay\"", "\"graph\"");
        assert!(super::import_streams(&odd, "cuda:0", &at_once).is_err());
        let two = &rows["minilm-mnist [cuda:0 streams] x2"];
        assert_eq!(two["steps_per_s"].as_f64(), Some(200.0));
        assert_eq!(two["kernel_path"].as_str(), Some("cuda:0, 2 runs in one process"));
        // PyTorch's two processes at 12 ms: 166.7 steps a second against fpt's 200.
        let ratio = two["ratio_vs_pytorch"].as_f64().unwrap();
        assert!((ratio - (2e3 / 12.0) / 200.0).abs() < 1e-9, "{ratio}");
        assert!(super::import_streams(&line(2, 200.0, r#"{"median_ms":10.0}"#), "cuda:0", &at_once).is_err());
    }

    #[test]
    fn the_device_machine_is_read_from_its_file() {
        let text = "2026-11-27T21:47Z\nname, memory.total [MiB], driver_version\nNVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04\ntorch 2.11.0+cu130 transformers 5.17.0\n16\n6.18.44\n";
        assert_eq!(
            super::machine_line(text).as_deref(),
            Some("NVIDIA H100 80GB HBM3, 16 cores (device machine)")
        );
        assert_eq!(super::machine_line("2026-11-27\nno gpu here\n"), None);
        let dir = std::env::temp_dir().join(format!("xtask-machine-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("2026-11-27T2147Z-h100-at-once.jsonl");
        let e = super::device_machine(&file).unwrap_err();
        assert!(format!("{e:#}").contains("2026-11-27T2147Z-h100-machine.txt"), "{e:#}");
        std::fs::write(dir.join("2026-11-27T2147Z-h100-machine.txt"), text).unwrap();
        assert!(super::device_machine(&file).unwrap().starts_with("NVIDIA H100"));
        assert!(super::device_machine(&dir.join("other.jsonl")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A device call's `at-once.jsonl`: per N, the rounds of both sides; a round with a
    /// process missing is left out; bad lines are named.
    #[test]
    fn a_device_calls_processes_become_rows() {
        let fpt = |n: usize, r: usize, ms: f64| {
            format!(
                r#"{{"side":"fpt","at_once":{n},"round":{r},"out":{{"minilm-mnist":{{"ours_ms":{ms},"ours":{{"from_unix":0.0,"to_unix":1.0}}}}}}}}"#
            )
        };
        let pt = |n: usize, r: usize, ms: f64| {
            format!(
                r#"{{"side":"pytorch","at_once":{n},"round":{r},"out":{{"pytorch_ms":{ms},"from_unix":0.0,"to_unix":1.0}}}}"#
            )
        };
        let lines = [
            fpt(1, 1, 10.0),
            pt(1, 1, 20.0),
            fpt(2, 1, 20.0),
            fpt(2, 1, 20.0),
            pt(2, 1, 10.0),
            pt(2, 1, 10.0),
            // Round 2 of x2 lost a PyTorch process: its PyTorch side is left out.
            fpt(2, 2, 25.0),
            fpt(2, 2, 25.0),
            pt(2, 2, 10.0),
        ]
        .join("\n");
        let rows = import_at_once(&lines, "cuda:0").unwrap();
        let one = &rows["minilm-mnist [cuda:0] x1"];
        assert_eq!(
            (one["steps_per_s"].as_f64(), one["pytorch_steps_per_s"].as_f64()),
            (Some(100.0), Some(50.0))
        );
        assert_eq!(one["ratio_vs_pytorch"].as_f64(), Some(0.5));
        assert_eq!(one["backbone"], "minilm");
        let two = &rows["minilm-mnist [cuda:0] x2"];
        assert_eq!(two["fpt_rounds"].as_array().unwrap().len(), 2);
        assert_eq!(two["pytorch_rounds"].as_array().unwrap().len(), 1);
        assert_eq!(two["round_ratios"].as_array().unwrap().len(), 1, "{two}");
        assert_eq!(two["pytorch_steps_per_s"].as_f64(), Some(200.0));
        let e = import_at_once("{\"side\":\"gpu\",\"at_once\":1,\"round\":1,\"out\":{}}", "cuda").unwrap_err();
        assert!(e.to_string().contains("line 1") && e.to_string().contains("gpu"), "{e}");
        assert!(import_at_once("not json", "cuda")
            .unwrap_err()
            .to_string()
            .contains("line 1"));
    }
}

//! The `fpt` binary checking itself and the engine: `fpt forward` against transformers on
//! every kernel path, `fpt selfcheck` (and a failed one refusing reports), `run-table` runs
//! in child processes, `run-cell`'s errors.

mod common;
use common::*;
use std::process::Command;

/// `fpt forward` on checkpoints as transformers saved them (GPT-2 with an LM head and
/// `transformer.` names; BERT without a pooler; non-zero biases) reproduces the
/// `last_hidden_state` transformers computed, on every kernel path; bad inputs are named.
#[test]
fn forward_matches_transformers_on_every_kernel_path() {
    let tmp = tempfile::tempdir().unwrap();
    for name in [
        "gpt2-lmhead-tiny",
        "bert-nopool-tiny",
        "gpt2-tiny",
        "bert-tiny",
        "lstm-tiny",
    ] {
        let dir = fixture_dir(name);
        let golden = dir.join("golden.safetensors");
        for path in kernel_paths() {
            let out = tmp.path().join(format!("{name}-{path}.safetensors"));
            let run = Command::new(env!("CARGO_BIN_EXE_fpt"))
                .args(["forward", "--backbone"])
                .arg(&dir)
                .arg("--inputs-embeds")
                .arg(&golden)
                .arg("--out")
                .arg(&out)
                .env("FPT_KERNELS", path)
                .output()
                .unwrap();
            assert!(run.status.success(), "{name} {path}: {}", stderr(&run));
            let ours = safetensors_f32(&out, "last_hidden_state");
            let want = safetensors_f32(&golden, "last_hidden_state");
            assert_eq!(ours.len(), want.len());
            let d = ours.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(d <= 1e-4, "{name} on {path}: differs from transformers by {d}");
        }
    }
    // Bad inputs: a missing tensor, a wrong width.
    let dir = fixture_dir("gpt2-tiny");
    let out = fpt(&[
        "forward",
        "--backbone",
        dir.to_str().unwrap(),
        "--inputs-embeds",
        dir.join("golden.safetensors").to_str().unwrap(),
        "--tensor",
        "nope",
        "--out",
        tmp.path().join("x.safetensors").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no tensor `nope`"), "{}", stderr(&out));
    let out = fpt(&[
        "forward",
        "--backbone",
        fixture_dir("lstm-tiny").to_str().unwrap(),
        "--inputs-embeds",
        dir.join("golden.safetensors").to_str().unwrap(),
        "--out",
        tmp.path().join("x.safetensors").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("32 wide") && stderr(&out).contains("hidden size 8"),
        "{}",
        stderr(&out)
    );
    assert!(!tmp.path().join("x.safetensors").exists());
}

fn safetensors_f32(path: &std::path::Path, name: &str) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    t.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// `fpt selfcheck` passes on every kernel path here, and fails (exit status 1, the broken
/// checks named) when a test-only switch makes the matrix product drop its bias.
#[test]
fn selfcheck_passes_and_can_fail() {
    let ok = fpt(&["selfcheck", "--all-paths", "--json"]);
    let v = json(&ok);
    let runs = v.as_array().unwrap();
    assert_eq!(runs.len(), kernel_paths().len());
    for r in runs {
        assert_eq!(r["passed"], true, "{r}");
        assert!(r["checks"].as_array().unwrap().len() >= 10);
    }
    let broken = Command::new(env!("CARGO_BIN_EXE_fpt"))
        .args(["selfcheck"])
        .env("FPT_TEST_FAULT", "drop-bias")
        .output()
        .unwrap();
    assert_eq!(broken.status.code(), Some(1));
    let text = String::from_utf8_lossy(&broken.stdout);
    assert!(text.contains("gpt2-tiny") && text.contains("FAIL"), "{text}");
    assert!(stderr(&broken).contains("selfcheck failed"), "{}", stderr(&broken));
}

/// A build that fails its self-check writes no report, and the runs it trains record the
/// failure in result.json (which later reports then refuse to show as numbers).
#[test]
fn a_failed_selfcheck_writes_no_report_and_is_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let tables = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables");
    let run = |fault: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_fpt"));
        c.args(["run-table", "table8", "--scale", "smoke", "--report-only", "--tables"])
            .arg(&tables)
            .arg("--out")
            .arg(tmp.path());
        if fault {
            c.env("FPT_TEST_FAULT", "drop-bias");
        }
        c.output().unwrap()
    };
    let bad = run(true);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("self-check"), "{}", stderr(&bad));
    assert!(!tmp.path().join("table8").exists());
    let good = run(false);
    assert!(good.status.success(), "{}", stderr(&good));
    let md = std::fs::read_to_string(tmp.path().join("table8/smoke/report.md")).unwrap();
    assert!(md.contains("`fpt selfcheck` passed"), "{md}");
    let out = tmp.path().join("run");
    let r = Command::new(env!("CARGO_BIN_EXE_fpt"))
        .args([
            "train",
            "-q",
            "--task",
            "bit-xor",
            "--backbone",
            "gpt2",
            "--init",
            "random",
            "--layers",
            "1",
            "--hidden",
            "8",
            "--heads",
            "2",
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--eval-examples",
            "4",
            "--out",
        ])
        .arg(&out)
        .env("FPT_TEST_FAULT", "drop-bias")
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(stderr(&r).contains("failed its self-check"), "{}", stderr(&r));
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("result.json")).unwrap()).unwrap();
    let p = &result["provenance"];
    assert_eq!(p["selfcheck"]["passed"], false, "{p}");
    assert!(
        p["kernel_path"].is_string() && p["cpu"].is_string() && p["commit"].is_string(),
        "{p}"
    );
}

/// A miniature table (a custom sequence task, the tiny GPT-2 fixture, four runs) in `dir`.
fn write_mini_table(dir: &std::path::Path) -> std::path::PathBuf {
    let tables = dir.join("tables");
    std::fs::create_dir_all(&tables).unwrap();
    let data = dir.join("series.jsonl");
    let lines: String = (0..40)
        .map(|i| {
            let label = i % 2;
            let steps: Vec<String> = (0..6)
                .map(|t| format!("[{}]", if label == 0 { t as f64 } else { 6.0 - t as f64 } / 6.0))
                .collect();
            let split = if i < 30 { "train" } else { "test" };
            format!(
                "{{\"features\": [{}], \"label\": {label}, \"split\": \"{split}\"}}\n",
                steps.join(", ")
            )
        })
        .collect();
    std::fs::write(&data, lines).unwrap();
    std::fs::write(
        tables.join("scales.toml"),
        format!(
            "[mini]\nall = {{ steps = 6, batch_size = 4, eval_every = 3 }}\n[mini.backbones.gpt2]\nsource = \"{}\"\nnote = \"the tiny fixture\"\n",
            fixture_dir("gpt2-tiny").display()
        ),
    )
    .unwrap();
    std::fs::write(
        tables.join("table1.toml"),
        format!(
            "id = \"table1\"\ntitle = \"mini\"\ncaption = \"a miniature table\"\npaper = [[\"50%\", \"60%\"], [\"70%\", \"80%\"]]\n\
             [defaults]\ntask = \"custom:{}\"\nbackbone = \"gpt2\"\n\
             [[rows]]\nlabel = \"FPT\"\ninit = \"pretrained\"\n[[rows]]\nlabel = \"Random\"\ninit = \"random\"\n\
             [[cols]]\nlabel = \"fpt\"\ntrain = \"fpt\"\n[[cols]]\nlabel = \"all\"\ntrain = \"all\"\n",
            data.display()
        ),
    )
    .unwrap();
    tables
}

/// `--jobs 2` trains each run in a child process of its own, one thread each, and gets the
/// same numbers as one run at a time in the process; every run's time is printed.
#[test]
fn run_table_jobs_in_child_processes_give_the_same_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    let tables = write_mini_table(tmp.path());
    let run = |jobs: &str, out: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_fpt"))
            .args(["run-table", "table1", "--scale", "mini", "--jobs", jobs, "--tables"])
            .arg(&tables)
            .arg("--out")
            .arg(tmp.path().join(out))
            .env("FPT_HOME", tmp.path().join("home"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        (String::from_utf8_lossy(&o.stdout).into_owned(), stderr(&o))
    };
    let (one, _) = run("1", "one");
    let (two, log) = run("2", "two");
    assert!(one.contains("time per run (1 at once in this process"), "{one}");
    assert!(
        two.contains("time per run (2 at once in child processes, 1 thread(s) each"),
        "{two}"
    );
    assert_eq!(two.lines().filter(|l| l.contains(" s  ")).count(), 4, "{two}");
    assert_eq!(log.matches("step 6/6: test_accuracy").count(), 4, "{log}");
    let mut compared = 0;
    for e in std::fs::read_dir(tmp.path().join("one/runs")).unwrap() {
        let e = e.unwrap();
        let read = |root: &str| -> serde_json::Value {
            let p = tmp
                .path()
                .join(root)
                .join("runs")
                .join(e.file_name())
                .join("result.json");
            serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
        };
        let (a, b) = (read("one"), read("two"));
        assert_eq!(a["test_loss"], b["test_loss"], "{:?}", e.file_name());
        assert_eq!(a["final_train_loss"], b["final_train_loss"], "{:?}", e.file_name());
        compared += 1;
    }
    assert_eq!(compared, 4);
}

/// The child's side of `--jobs`: a spec that does not parse is an `fpt-error` line and a
/// failed exit, and no run directory is left.
#[test]
fn run_cell_refuses_a_bad_spec_clearly() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let mut child = Command::new(env!("CARGO_BIN_EXE_fpt"))
        .args(["run-cell", "--dir"])
        .arg(&dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"{\"task\": 3}").unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(!o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("fpt-error <stdin>: not a run spec"), "{out}");
    assert!(!dir.exists());
}

/// The self-check a result records runs once per binary and machine: the first `fpt train`
/// writes it under `$FPT_HOME/selfcheck`, later ones read it (the same summary in their
/// `result.json`), a process with the test-only fault switch gets its own (failed) one, and
/// `FPT_SELFCHECK_CACHE=off` keeps nothing.
#[test]
fn the_self_check_is_kept_per_binary_and_machine() {
    let home = tempfile::tempdir().unwrap();
    let runs = tempfile::tempdir().unwrap();
    let train = |name: &str, fault: bool, cache: bool| {
        let out = runs.path().join(name);
        let mut c = Command::new(env!("CARGO_BIN_EXE_fpt"));
        c.args(["train", "--task", "bit-xor", "--backbone", "gpt2", "--init", "random"])
            .args([
                "--layers", "1", "--hidden", "16", "--heads", "2", "--steps", "2", "--out",
            ])
            .arg(&out)
            .env("HF_HUB_OFFLINE", "1")
            .env("HF_HUB_CACHE", home.path().join("hub"))
            .env("FPT_HOME", home.path());
        if fault {
            c.env("FPT_TEST_FAULT", "drop-bias");
        }
        if !cache {
            c.env("FPT_SELFCHECK_CACHE", "off");
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let r: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("result.json")).unwrap()).unwrap();
        r["provenance"]["selfcheck"].clone()
    };
    let kept = || std::fs::read_dir(home.path().join("selfcheck")).map_or(0, |d| d.count());
    let first = train("a", false, false);
    assert_eq!(kept(), 0, "FPT_SELFCHECK_CACHE=off keeps nothing");
    assert_eq!(train("b", false, true), first);
    assert_eq!(kept(), 1);
    assert_eq!(train("c", false, true), first);
    assert_eq!(kept(), 1, "read back, not run again");
    let faulty = train("d", true, true);
    assert_eq!(faulty["passed"], false, "{faulty}");
    assert_eq!(kept(), 2, "the fault switch is part of the key");
    assert_eq!(first["passed"], true, "{first}");
}

/// `fpt bench --barrier DIR --at-once 2`: two processes started apart both wait for the
/// other after their warm-up, so their timed windows overlap; one alone gives up after
/// `--barrier-timeout`, naming the directory; a barrier over two shapes is refused.
#[test]
fn bench_processes_timed_at_once_share_their_window() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("barrier");
    let bench = |extra: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_fpt"));
        c.args(["bench", "--json", "--no-full", "--steps", "3", "--warmup", "1"])
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c
    };
    let args = ["--shape", "tiny", "--barrier", dir.to_str().unwrap(), "--at-once", "2"];
    let first = bench(&args).spawn().unwrap();
    // The second starts well after the first could have timed its steps alone.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let second = bench(&args).spawn().unwrap();
    let window = |o: std::process::Output| -> (f64, f64) {
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let t = &v["tiny"]["ours"];
        (t["from_unix"].as_f64().unwrap(), t["to_unix"].as_f64().unwrap())
    };
    let (a, b) = (
        window(first.wait_with_output().unwrap()),
        window(second.wait_with_output().unwrap()),
    );
    assert!(a.0 <= a.1 && b.0 <= b.1, "{a:?} {b:?}");
    // The first waited for the second: its timed steps began after the second started.
    assert!((a.0 - b.0).abs() < 1.0, "the windows began apart: {a:?} {b:?}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "one ready file each");

    let lonely = tmp.path().join("lonely");
    let args = [
        "--shape",
        "tiny",
        "--barrier",
        lonely.to_str().unwrap(),
        "--at-once",
        "2",
        "--barrier-timeout",
        "1",
    ];
    let out = bench(&args).output().unwrap();
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("lonely") && err.contains("1 of 2"), "{err}");

    let args = [
        "--backbone",
        "minilm",
        "--barrier",
        lonely.to_str().unwrap(),
        "--at-once",
        "2",
    ];
    let out = bench(&args).output().unwrap();
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("one shape"), "{err}");
}

/// `FPT_ATTENTION=tiled`, `=mma` and `=mma-tf32` train through the attention tiled over keys
/// (here the host-grid bodies of its SIMT and its tensor-core kernels): two steps of a small causal GPT-2 end where the default fused op's end (the
/// backbone's dropouts off: the fused op draws the last block's attention mask for its
/// read-out rows only, the tiled op for every row, as the GPU's default does). Two steps,
/// because the two sum in different orders (gradients within 1e-6 relative) and Adam
/// turns such differences in near-zero gradients into whole steps of 1e-3 later on. A
/// value it does not know is refused, naming the variable.
#[test]
fn the_tiled_attention_trains_as_the_default_does() {
    let tmp = tempfile::tempdir().unwrap();
    let train = |choice: &str, out: &str| {
        Command::new(env!("CARGO_BIN_EXE_fpt"))
            .args(["train", "--task", "bit-xor", "--backbone", "gpt2", "--init", "random"])
            .args([
                "--layers",
                "2",
                "--hidden",
                "32",
                "--heads",
                "4",
                "--steps",
                "2",
                "--eval-every",
                "1",
                "-q",
            ])
            .arg("--no-backbone-dropout")
            .arg("--out")
            .arg(tmp.path().join(out))
            .env("FPT_ATTENTION", choice)
            .output()
            .unwrap()
    };
    let losses = |out: &str| -> Vec<f64> {
        std::fs::read_to_string(tmp.path().join(out).join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["test_loss"]
                    .as_f64()
                    .unwrap()
            })
            .collect()
    };
    for (choice, out) in [
        ("auto", "default"),
        ("tiled", "tiled"),
        ("mma", "mma"),
        ("mma-tf32", "mma-tf32"),
    ] {
        let o = train(choice, out);
        assert!(o.status.success(), "{choice}: {}", stderr(&o));
    }
    let a = losses("default");
    assert_eq!(a.len(), 2);
    // One TF32 term a product: its operands to 2^-11, so its losses within 1e-3.
    for (other, within) in [("tiled", 1e-6), ("mma", 1e-6), ("mma-tf32", 1e-3)] {
        let b = losses(other);
        assert_eq!(b.len(), 2);
        for (x, y) in a.iter().zip(&b) {
            assert!(
                (x - y).abs() <= within * x.abs().max(1.0),
                "default {a:?} vs {other} {b:?}"
            );
        }
    }
    let o = train("flash", "bad");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("FPT_ATTENTION"), "{}", stderr(&o));
    // The linear layer's switch (the bias in cuBLASLt's product on a GPU) likewise.
    let o = Command::new(env!("CARGO_BIN_EXE_fpt"))
        .args(["train", "--task", "bit-xor", "--backbone", "gpt2", "--init", "random"])
        .args(["--layers", "1", "--hidden", "16", "--heads", "2", "--steps", "1", "-q"])
        .arg("--out")
        .arg(tmp.path().join("bad-linear"))
        .env("FPT_LINEAR", "fused")
        .output()
        .unwrap();
    assert!(
        !o.status.success() && stderr(&o).contains("FPT_LINEAR"),
        "{}",
        stderr(&o)
    );
}

/// `FPT_BRANCH=node` trains through the residual branch a GPU runs (one node of the graph,
/// its backward chained by hand) on the CPU: three steps of a small GPT-2 (pre-norm) and a
/// small BERT (post-norm), dropouts on, end with the losses of `FPT_BRANCH=composed` (the
/// layers' ops, each intermediate a node) to the last bit: the same ops in the same order.
/// A value it does not know is refused, naming the variable.
#[test]
fn the_branch_node_trains_as_the_composed_branch_does() {
    let tmp = tempfile::tempdir().unwrap();
    let train = |backbone: &str, choice: &str| {
        let out = tmp.path().join(format!("{backbone}-{choice}"));
        let o = Command::new(env!("CARGO_BIN_EXE_fpt"))
            .args(["train", "--task", "bit-xor", "--backbone", backbone, "--init", "random"])
            .args(["--layers", "2", "--hidden", "32", "--heads", "4", "--steps", "3"])
            .args(["--eval-every", "1", "-q"])
            .arg("--out")
            .arg(&out)
            .env("FPT_BRANCH", choice)
            .output()
            .unwrap();
        (o, out)
    };
    for backbone in ["gpt2", "minilm"] {
        let losses: Vec<Vec<String>> = ["node", "composed"]
            .iter()
            .map(|choice| {
                let (o, out) = train(backbone, choice);
                assert!(o.status.success(), "{backbone} {choice}: {}", stderr(&o));
                std::fs::read_to_string(out.join("metrics.jsonl"))
                    .unwrap()
                    .lines()
                    .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["test_loss"].to_string())
                    .collect()
            })
            .collect();
        assert_eq!(losses[0].len(), 3, "{backbone}: {losses:?}");
        assert_eq!(losses[0], losses[1], "{backbone}: node vs composed");
    }
    let (o, _) = train("gpt2", "fused");
    assert!(
        !o.status.success() && stderr(&o).contains("FPT_BRANCH"),
        "{}",
        stderr(&o)
    );
}

/// `FPT_LSTM=grid` trains a layer-norm LSTM through the kernels a GPU runs (one block per
/// batch row, `fpt_lstm.h`; here over the host grid): three steps of a two-layer LSTM with
/// every parameter training and its dropout on end with the test losses of the default
/// (the CPU's fused op) to within rounding, and of `FPT_LSTM=composed`. A value it does not
/// know is refused, naming the variable.
#[test]
fn the_lstm_kernels_train_as_the_fused_op_does() {
    let tmp = tempfile::tempdir().unwrap();
    let train = |choice: &str| {
        let out = tmp.path().join(choice);
        let o = Command::new(env!("CARGO_BIN_EXE_fpt"))
            .args(["train", "--task", "bit-xor", "--backbone", "lstm", "--init", "random"])
            .args(["--layers", "2", "--hidden", "24", "--steps", "3", "--train", "all"])
            .args(["--eval-every", "1", "-q"])
            .arg("--out")
            .arg(&out)
            .env("FPT_LSTM", choice)
            .output()
            .unwrap();
        (o, out)
    };
    let losses: Vec<Vec<f64>> = ["auto", "grid", "composed"]
        .iter()
        .map(|choice| {
            let (o, out) = train(choice);
            assert!(o.status.success(), "{choice}: {}", stderr(&o));
            std::fs::read_to_string(out.join("metrics.jsonl"))
                .unwrap()
                .lines()
                .map(|l| {
                    serde_json::from_str::<serde_json::Value>(l).unwrap()["test_loss"]
                        .as_f64()
                        .unwrap()
                })
                .collect()
        })
        .collect();
    assert_eq!(losses[0].len(), 3, "{losses:?}");
    for (name, other) in [("grid", &losses[1]), ("composed", &losses[2])] {
        for (x, y) in losses[0].iter().zip(other) {
            assert!(
                (x - y).abs() <= 1e-5 * x.abs().max(1.0),
                "fused {:?} vs {name} {other:?}",
                losses[0]
            );
        }
    }
    let (o, _) = train("cudnn");
    assert!(!o.status.success() && stderr(&o).contains("FPT_LSTM"), "{}", stderr(&o));
}

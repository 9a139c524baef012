//! A corpus of bad inputs, generated here (no large files): sizes beyond any model, data
//! that does not fit its task, strict spec and record reading, changed checkpoints. Each
//! must give a clean error, exit status 2 (bad input), no panic, the file or field named,
//! and nothing left in `--out`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fpt(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fpt"));
    c.args(args)
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_CACHE", std::env::temp_dir().join("fpt-bad-inputs-empty-hub"))
        .env("FPT_HOME", std::env::temp_dir().join("fpt-bad-inputs-empty-home"));
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run fpt")
}

const TINY: &[&str] = &[
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
    "2",
    "--batch-size",
    "2",
    "--eval-examples",
    "4",
    "-q",
];

struct Case {
    name: &'static str,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    /// Substrings the error must contain (the file, field or flag, and what is wrong).
    needles: Vec<&'static str>,
}

fn custom(dir: &Path, name: &str, lines: &[&str]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, lines.join("\n")).unwrap();
    p
}

fn mnist_dir(dir: &Path, side: usize, gzip_bomb: bool) -> PathBuf {
    let d = dir.join(format!("mnist-{side}-{gzip_bomb}"));
    std::fs::create_dir_all(&d).unwrap();
    for (prefix, n) in [("train", 4usize), ("t10k", 2)] {
        let px: Vec<u8> = (0..n * side * side).map(|i| (i % 251) as u8).collect();
        let mut images = fpt_tasks::idx::encode(&[n, side, side], &px);
        let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
        if gzip_bomb && prefix == "train" {
            // A few kB that inflate to 200 MB behind a header declaring 4 small images.
            images.resize(200 << 20, 0);
            let f = std::fs::File::create(d.join(format!("{prefix}-images-idx3-ubyte.gz"))).unwrap();
            let mut e = flate2::write::GzEncoder::new(f, flate2::Compression::best());
            e.write_all(&images).unwrap();
            e.finish().unwrap();
        } else {
            std::fs::write(d.join(format!("{prefix}-images-idx3-ubyte")), images).unwrap();
        }
        std::fs::write(
            d.join(format!("{prefix}-labels-idx1-ubyte")),
            fpt_tasks::idx::encode(&[n], &labels),
        )
        .unwrap();
    }
    d
}

/// `fpt train` with the tiny settings, the flags of `extra` replacing theirs.
fn train(extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec!["train".into(), "-q".into()];
    let pairs = TINY.iter().filter(|a| **a != "-q").collect::<Vec<_>>();
    for kv in pairs.chunks(2) {
        if !extra.contains(kv[0]) {
            v.extend(kv.iter().map(|s| s.to_string()));
        }
    }
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

#[test]
fn every_bad_input_is_a_clean_named_error_with_status_2_and_nothing_written() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let one_class = custom(
        t,
        "one-class.jsonl",
        &[
            r#"{"tokens": [1, 2], "label": 0, "split": "train"}"#,
            r#"{"tokens": [3], "label": 0, "split": "test"}"#,
        ],
    );
    let big_label = custom(
        t,
        "big-label.jsonl",
        &[
            r#"{"tokens": [1, 2], "label": 1000000000, "split": "train"}"#,
            r#"{"tokens": [3], "label": 0, "split": "test"}"#,
        ],
    );
    let big_id = custom(
        t,
        "big-id.jsonl",
        &[
            r#"{"tokens": [4294967290], "label": 1, "split": "train"}"#,
            r#"{"tokens": [3], "label": 0, "split": "test"}"#,
        ],
    );
    let typo = custom(
        t,
        "typo.jsonl",
        &[
            r#"{"tokens": [1, 2], "label": 1, "split": "train"}"#,
            r#"{"tokens": [3], "label": 0, "split": "tset"}"#,
        ],
    );
    let long_seq = custom(
        t,
        "long-seq.jsonl",
        &[
            r#"{"tokens": [1, 2, 3, 4, 5, 6], "label": 1, "split": "train"}"#,
            r#"{"tokens": [3], "label": 0, "split": "test"}"#,
        ],
    );
    // A record of 2,000,000 tokens: the position table's limit is said, not the memory so
    // long a sequence would need.
    let huge_ids: Vec<String> = (1..=2_000_000u32).map(|i| (i % 7 + 1).to_string()).collect();
    let huge_line = format!(
        r#"{{"tokens": [{}], "label": 1, "split": "train"}}"#,
        huge_ids.join(",")
    );
    let huge_seq = custom(
        t,
        "huge-seq.jsonl",
        &[&huge_line, r#"{"tokens": [3], "label": 0, "split": "test"}"#],
    );
    let ok_custom = custom(
        t,
        "ok.jsonl",
        &[
            r#"{"tokens": [1, 2], "label": 1, "split": "train"}"#,
            r#"{"tokens": [3], "label": 0, "split": "test"}"#,
        ],
    );
    let spec_ok = {
        let dir = t.join("seed-run");
        let mut args = train(&["--task", "bit-xor", "--out"]);
        args.push(dir.display().to_string());
        let out = Command::new(env!("CARGO_BIN_EXE_fpt")).args(&args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        std::fs::read_to_string(dir.join("spec.json")).unwrap()
    };
    let spec_with = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| -> String {
        let mut v: serde_json::Value = serde_json::from_str(&spec_ok).unwrap();
        edit(&mut v);
        let p = t.join(name);
        std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
        p.display().to_string()
    };
    let misspelt = spec_with("misspelt.json", &|v| {
        v["train"]["early_stop_patiense"] = serde_json::json!(3);
    });
    let huge_batch = spec_with("huge-batch.json", &|v| {
        v["train"]["batch_size"] = serde_json::json!(1u64 << 40);
        v["train"]["micro_batch_size"] = serde_json::json!(1u64 << 40);
    });
    let cfg_dir = t.join("huge-config");
    std::fs::create_dir_all(&cfg_dir).unwrap();
    std::fs::write(
        cfg_dir.join("config.json"),
        r#"{"model_type": "bert", "num_hidden_layers": 1000000000, "hidden_size": 8, "num_attention_heads": 2,
            "intermediate_size": 16, "max_position_embeddings": 16, "vocab_size": 10, "type_vocab_size": 2,
            "layer_norm_eps": 1e-12, "hidden_act": "gelu"}"#,
    )
    .unwrap();
    let no_weights = t.join("no-weights");
    std::fs::create_dir_all(&no_weights).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fixtures/bert-tiny/config.json"),
        no_weights.join("config.json"),
    )
    .unwrap();
    let m27 = mnist_dir(t, 27, false);
    let m_bomb = mnist_dir(t, 28, true);
    let m36 = mnist_dir(t, 36, false);
    let p = |p: &Path| p.display().to_string();
    let cases = vec![
        Case {
            name: "depth past the backbone's layers",
            args: train(&["--task", "bit-xor", "--depth", "5"]),
            env: vec![],
            needles: vec!["--depth", "5 of the backbone's 1 layers"],
        },
        Case {
            name: "layers 1e9",
            args: train(&["--task", "bit-xor", "--layers", "1000000000"]),
            env: vec![],
            needles: vec!["layers 1000000000", "limit"],
        },
        Case {
            name: "hidden 2^31",
            args: train(&["--task", "bit-xor", "--hidden", "2147483648"]),
            env: vec![],
            needles: vec!["hidden", "limit"],
        },
        Case {
            name: "batch 2^40",
            args: train(&["--task", "bit-xor", "--batch-size", "1099511627776"]),
            env: vec![],
            needles: vec!["batch_size", "limit"],
        },
        Case {
            name: "steps 0",
            args: train(&["--task", "bit-xor", "--steps", "0"]),
            env: vec![],
            needles: vec!["steps", "at least 1"],
        },
        Case {
            name: "divergence factor 0.5",
            args: train(&["--task", "bit-xor", "--divergence-factor", "0.5"]),
            env: vec![],
            needles: vec!["divergence_factor", "above 1"],
        },
        Case {
            name: "max-len 0",
            args: train(&["--task", &format!("custom:{}", p(&ok_custom)), "--max-len", "0"]),
            env: vec![],
            needles: vec!["max_len", "at least 1"],
        },
        Case {
            name: "one class",
            args: train(&["--task", &format!("custom:{}", p(&one_class))]),
            env: vec![],
            needles: vec!["one-class.jsonl", "at least 2 classes"],
        },
        Case {
            name: "label 1e9",
            args: train(&["--task", &format!("custom:{}", p(&big_label))]),
            env: vec![],
            needles: vec!["big-label.jsonl", "line 1", "label"],
        },
        Case {
            name: "token id near 2^32",
            args: train(&["--task", &format!("custom:{}", p(&big_id))]),
            env: vec![],
            needles: vec!["big-id.jsonl", "line 1", "tokens"],
        },
        Case {
            name: "split typo",
            args: train(&["--task", &format!("custom:{}", p(&typo))]),
            env: vec![],
            needles: vec!["typo.jsonl", "line 2", "tset"],
        },
        Case {
            name: "misspelt spec key",
            args: s(&["train", "--spec", &misspelt]),
            env: vec![],
            needles: vec!["misspelt.json", "early_stop_patiense"],
        },
        Case {
            name: "spec batch 2^40",
            args: s(&["train", "--spec", &huge_batch]),
            env: vec![],
            needles: vec!["huge-batch.json", "batch_size", "limit"],
        },
        Case {
            name: "config layers 1e9 (inspect)",
            args: s(&["inspect", "--backbone", &p(&cfg_dir)]),
            env: vec![],
            needles: vec!["config.json", "num_hidden_layers 1000000000"],
        },
        Case {
            name: "config layers 1e9 (train)",
            args: s(&[
                "train",
                "-q",
                "--task",
                "bit-xor",
                "--backbone",
                &p(&cfg_dir),
                "--init",
                "random",
                "--steps",
                "2",
            ]),
            env: vec![],
            needles: vec!["config.json", "num_hidden_layers"],
        },
        Case {
            name: "no weights",
            args: s(&[
                "train",
                "-q",
                "--task",
                "bit-xor",
                "--backbone",
                &p(&no_weights),
                "--steps",
                "2",
            ]),
            env: vec![],
            needles: vec!["model.safetensors", "no-weights"],
        },
        Case {
            name: "MNIST 27x27",
            args: train(&["--task", "mnist", "--data-dir", &p(&m27)]),
            env: vec![],
            needles: vec!["train-images-idx3-ubyte", "27x27"],
        },
        Case {
            name: "MNIST gzip bomb",
            args: train(&["--task", "mnist", "--data-dir", &p(&m_bomb)]),
            env: vec![],
            needles: vec!["train-images-idx3-ubyte.gz", "trailing"],
        },
        Case {
            name: "MNIST 36x36 padded to 32",
            args: train(&["--task", "mnist", "--data-dir", &p(&m36), "--image-size", "pad32"]),
            env: vec![],
            needles: vec!["train-images-idx3-ubyte", "larger than the 32x32"],
        },
        Case {
            name: "FPT_KERNELS typo",
            args: train(&["--task", "bit-xor"]),
            env: vec![("FPT_KERNELS", "avx-512".into())],
            needles: vec!["FPT_KERNELS", "avx-512"],
        },
        Case {
            name: "more memory than the machine has",
            args: train(&[
                "--task", "bit-xor", "--hidden", "60000", "--heads", "4", "--layers", "64",
            ]),
            env: vec![],
            needles: vec!["this run needs about", "available"],
        },
        Case {
            name: "2,000,000 tokens: the positions, not the memory",
            args: train(&["--task", &format!("custom:{}", p(&huge_seq))]),
            env: vec![],
            needles: vec!["huge-seq.jsonl", "2000000 tokens long", "--max-len"],
        },
        Case {
            name: "longer than the positions",
            args: train(&["--task", &format!("custom:{}", p(&long_seq)), "--positions", "4"]),
            env: vec![],
            needles: vec!["long-seq.jsonl", "--max-len 4"],
        },
        Case {
            name: "steps -5",
            args: train(&["--task", "bit-xor", "--steps", "-5"]),
            env: vec![],
            needles: vec!["--steps"],
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        let out_dir = t.join(format!("out-{i}"));
        let mut args = c.args.clone();
        if args[0] == "train" {
            args.push("--out".into());
            args.push(p(&out_dir));
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = c.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let out = fpt(&refs, &env);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: status {:?}: {err}", c.name, out.status);
        assert!(!err.contains("panicked"), "{}: {err}", c.name);
        for n in &c.needles {
            assert!(err.contains(n), "{}: `{n}` not in: {err}", c.name);
        }
        assert!(!out_dir.exists(), "{}: left {} behind", c.name, out_dir.display());
    }
}

/// A changed checkpoint (one value of state.json, or LATEST pointing outside the run) is
/// refused on resume and by `fpt eval`, naming the file; a second resume of a run that is
/// still going is refused, naming the process.
#[test]
fn changed_checkpoints_and_concurrent_resumes_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let mut args = train(&["--task", "bit-xor", "--steps", "6", "--checkpoint-every", "3", "--out"]);
    args.push(dir.display().to_string());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = fpt(&refs, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let latest = dir.join("checkpoints/LATEST");
    let name = std::fs::read_to_string(&latest).unwrap();
    let state = dir.join("checkpoints").join(name.trim()).join("state.json");
    let text = std::fs::read_to_string(&state).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["adam_t"] = serde_json::json!(v["adam_t"].as_u64().unwrap() + 1);
    std::fs::write(&state, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let out = fpt(&["eval", dir.to_str().unwrap()], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("state.json") && err.contains("manifest.json"), "{err}");
    std::fs::write(&state, &text).unwrap();
    std::fs::write(&latest, "../../etc").unwrap();
    let out = fpt(&["eval", dir.to_str().unwrap()], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("LATEST") && err.contains("not a checkpoint name"), "{err}");
    std::fs::write(&latest, name).unwrap();
    // A lock held by a live process.
    let mut holder = Command::new("sleep").arg("30").spawn().unwrap();
    std::fs::write(dir.join(".lock"), holder.id().to_string()).unwrap();
    let out = fpt(&["train", "-q", "--resume", dir.to_str().unwrap()], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(&format!("process {}", holder.id())),
        "{err}"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    // Its process gone, the lock is stale and taken over.
    let out = fpt(&["train", "-q", "--resume", dir.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!dir.join(".lock").exists());
}

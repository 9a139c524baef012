//! The `fpt` binary end to end: inspect counts, a short training run's files, and clear
//! errors for bad input.

mod common;
use common::{fpt, json, stderr};

#[test]
fn inspect_gives_the_reference_counts() {
    let v = json(&fpt(&[
        "inspect",
        "--backbone",
        "gpt2",
        "--init",
        "random",
        "--task",
        "bit-xor",
        "--json",
    ]));
    assert_eq!(v["trainable"], 827_906);
    assert_eq!(v["backbone_trainable"], 824_832);
    assert_eq!(v["backbone_total"], 124_439_808);
    assert_eq!(v["by_role"]["layer_norm"]["trainable"], 38_400);
    assert_eq!(v["by_role"]["positions"]["trainable"], 786_432);
    let v = json(&fpt(&[
        "inspect",
        "--backbone",
        "gpt2",
        "--task",
        "bit-memory",
        "--json",
    ]));
    assert_eq!(v["trainable"], 940_900);
    let v = json(&fpt(&[
        "inspect",
        "--backbone",
        "gpt2-medium",
        "--train",
        "all",
        "--json",
    ]));
    assert_eq!(v["backbone_total"], 354_823_168);
    let text = fpt(&["inspect", "--backbone", "gpt2"]);
    assert!(text.status.success());
    assert!(String::from_utf8_lossy(&text.stdout).contains("824832"));
}

#[test]
fn train_writes_result_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let out = fpt(&[
        "train",
        "--task",
        "bit-memory",
        "--backbone",
        "gpt2",
        "--init",
        "random",
        "--layers",
        "1",
        "--hidden",
        "32",
        "--heads",
        "2",
        "--n-bits",
        "20",
        "--patch",
        "5",
        "--steps",
        "20",
        "--batch-size",
        "8",
        "--micro-batch-size",
        "4",
        "--eval-every",
        "10",
        "--eval-examples",
        "32",
        "--seed",
        "3",
        "--out",
    ]
    .iter()
    .copied()
    .chain([dir.path().to_str().unwrap()])
    .collect::<Vec<_>>());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("result.json")).unwrap()).unwrap();
    for key in [
        "task",
        "backbone",
        "init",
        "test_accuracy",
        "steps",
        "trainable_params",
        "total_params",
        "wall_seconds",
    ] {
        assert!(!r[key].is_null(), "result.json lacks {key}: {r}");
    }
    assert_eq!(r["task"], "bit-memory");
    assert_eq!(r["init"], "random");
    assert_eq!(r["steps"], 20);
    // Bit Memory's copy baseline, exact on the 32 evaluated strings (75% in expectation).
    assert_eq!(r["baseline"]["kind"], "copy-visible-bits");
    let base = r["baseline_accuracy"].as_f64().unwrap();
    assert!((base - 0.75).abs() < 0.05, "{base}");
    assert_eq!(r["baseline"]["accuracy"].as_f64().unwrap(), base);
    let outcomes: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("outcomes.json")).unwrap()).unwrap();
    assert_eq!(outcomes["correct"].as_array().unwrap().len(), 32);
    assert_eq!(outcomes["labels_per_example"], 20);
    let acc = r["test_accuracy"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&acc));
    let metrics = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2);
    assert!(dir.path().join("spec.json").is_file());
}

fn fails_with(args: &[&str], needles: &[&str]) {
    let out = fpt(args);
    assert!(!out.status.success(), "fpt {args:?} should fail");
    let err = String::from_utf8_lossy(&out.stderr);
    for n in needles {
        assert!(err.contains(n), "stderr of fpt {args:?} lacks `{n}`:\n{err}");
    }
}

#[test]
fn bad_input_gets_clear_errors() {
    let base = tempfile::tempdir().unwrap();
    let d = base.path().join("never-written");
    let d = d.to_str().unwrap();
    fails_with(&["train", "--task", "mnsit", "--out", d], &["mnsit", "bit-xor"]);
    fails_with(
        &["train", "--task", "bit-xor", "--train", "in,bogus", "--out", d],
        &["bogus"],
    );
    fails_with(
        &["train", "--task", "bit-xor", "--init", "sorta", "--out", d],
        &["sorta"],
    );
    fails_with(
        &["train", "--task", "bit-xor", "--steps", "many", "--out", d],
        &["many"],
    );
    fails_with(
        &["train", "--task", "bit-xor", "--layers", "2", "--out", d],
        &["--layers", "--init random"],
    );
    fails_with(
        &[
            "train",
            "--task",
            "bit-xor",
            "--backbone",
            "nobody/not-cached",
            "--out",
            d,
        ],
        &["nobody/not-cached", "fpt fetch", "HF_HUB_OFFLINE"],
    );
    fails_with(
        &["train", "--task", "bit-xor", "--backbone", "./no/such/dir", "--out", d],
        &["no/such/dir"],
    );
    fails_with(
        &[
            "train", "--task", "bit-xor", "--init", "random", "--hidden", "30", "--heads", "4", "--out", d,
        ],
        &["n_embd 30", "n_head 4"],
    );
    fails_with(&["train", "--task", "bit-xor", "--device", "tpu", "--out", d], &["tpu"]);
    // Offline, a model that is not cached cannot be fetched (MiniLM alone has a PyPI copy).
    fails_with(
        &["fetch", "nobody/not-cached"],
        &["nobody/not-cached", "HF_HUB_OFFLINE"],
    );
    assert!(
        !std::path::Path::new(d).exists(),
        "a failed run must not leave a run directory"
    );
}

fn fixture_copy(name: &str) -> tempfile::TempDir {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/fixtures")
        .join(name);
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    tmp
}

/// A bad checkpoint is one line on stderr naming the file or tensor, and a non-zero exit.
fn one_line_error(dir: &std::path::Path, needles: &[&str]) {
    let out_dir = tempfile::tempdir().unwrap();
    let out = fpt(&[
        "train",
        "--task",
        "bit-xor",
        "--backbone",
        dir.to_str().unwrap(),
        "--init",
        "pretrained",
        "--steps",
        "1",
        "--out",
        out_dir.path().join("run").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "expected one line:\n{err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks `{n}`: {err}");
    }
    assert!(!out_dir.path().join("run").exists());
}

#[test]
fn bad_checkpoints_are_one_clear_line() {
    // Truncated weights.
    let d = fixture_copy("gpt2-tiny");
    let w = d.path().join("model.safetensors");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 3]).unwrap();
    one_line_error(d.path(), &["model.safetensors", "not a valid safetensors"]);
    // A config with a missing field.
    let d = fixture_copy("bert-tiny");
    let c = d.path().join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&c).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("hidden_size");
    std::fs::write(&c, v.to_string()).unwrap();
    one_line_error(d.path(), &["config.json", "hidden_size"]);
    // A tensor of the wrong shape.
    let d = fixture_copy("t5-tiny");
    let w = d.path().join("model.safetensors");
    let mut t = candle_core::safetensors::load(&w, &candle_core::Device::Cpu).unwrap();
    t.insert(
        "encoder.final_layer_norm.weight".into(),
        candle_core::Tensor::zeros(31, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&t, &w).unwrap();
    one_line_error(d.path(), &["encoder.final_layer_norm.weight", "[31]", "[32]"]);
}

#[test]
fn inspect_works_for_every_backbone() {
    for (id, arch, total) in [
        ("gpt2-large", "gpt2", 774_030_080u64),
        ("bert-base-uncased", "bert", 109_482_240),
        ("sentence-transformers/all-MiniLM-L6-v2", "bert", 22_713_216),
        ("t5-base", "t5", 109_628_544),
        ("allenai/longformer-base-4096", "longformer", 148_068_864),
    ] {
        let v = json(&fpt(&["inspect", "--backbone", id, "--json"]));
        assert_eq!(v["architecture"], arch, "{id}");
        assert_eq!(v["backbone_total"], total, "{id}");
    }
    let v = json(&fpt(&[
        "inspect",
        "--backbone",
        "google/vit-base-patch16-224-in21k",
        "--task",
        "bit-memory",
        "--json",
    ]));
    assert_eq!(v["architecture"], "vit");
    assert_eq!(v["by_role"]["positions"]["trainable"], 1024 * 768);
    let text = fpt(&["inspect", "--backbone", "t5-base"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("relative-position buckets"));
}

#[test]
fn dataset_tasks_train_inspect_and_explain_missing_data() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("series.jsonl");
    let mut lines = String::new();
    for i in 0..24 {
        // Two classes of short 2-channel series: rising or falling.
        let label = i % 2;
        let steps: Vec<String> = (0..6)
            .map(|t| {
                let v = if label == 0 { t as f64 } else { 6.0 - t as f64 } / 6.0;
                format!("[{v}, {}]", (i % 5) as f64 / 5.0)
            })
            .collect();
        let split = if i < 18 { "train" } else { "test" };
        lines.push_str(&format!(
            "{{\"features\": [{}], \"label\": {label}, \"split\": \"{split}\"}}\n",
            steps.join(", ")
        ));
    }
    std::fs::write(&file, lines).unwrap();
    let task = format!("custom:{}", file.display());
    let out = d.path().join("run");
    let o = fpt(&[
        "train",
        "--task",
        &task,
        "--backbone",
        "gpt2",
        "--init",
        "random",
        "--layers",
        "1",
        "--hidden",
        "16",
        "--heads",
        "2",
        "--steps",
        "4",
        "--batch-size",
        "4",
        "--eval-every",
        "2",
        "-q",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("result.json")).unwrap()).unwrap();
    assert_eq!(r["eval_examples"], 6);
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("spec.json")).unwrap()).unwrap();
    assert_eq!(spec["task"]["name"], "custom");
    assert_eq!(spec["task"]["path"], file.to_str().unwrap());

    let lin = d.path().join("linear");
    let o = fpt(&[
        "train",
        "--task",
        &task,
        "--model",
        "linear",
        "--steps",
        "5",
        "--batch-size",
        "4",
        "-q",
        "--out",
        lin.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lin.join("result.json")).unwrap()).unwrap();
    assert_eq!(
        (r["train_groups"].as_str(), r["trainable_params"].as_u64()),
        (Some("linear"), Some(6 * 2 * 2 + 2))
    );
    // The same run directory as any run: the spec names the model, metrics and outcomes
    // are written, the baseline is judged; a resume trains it again to the same numbers.
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lin.join("spec.json")).unwrap()).unwrap();
    assert_eq!(spec["model"], "linear");
    assert!(lin.join("metrics.jsonl").exists() && lin.join("outcomes.json").exists());
    assert!(r["baseline"]["accuracy"].is_number(), "{r}");
    let o = fpt(&["train", "--resume", lin.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let again: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lin.join("result.json")).unwrap()).unwrap();
    assert_eq!(again["test_accuracy"], r["test_accuracy"]);
    // An unknown model kind is named.
    let o = fpt(&[
        "train",
        "--task",
        &task,
        "--model",
        "mlp",
        "--out",
        d.path().join("m").to_str().unwrap(),
    ]);
    assert!(!o.status.success() && stderr(&o).contains("mlp"), "{}", stderr(&o));

    let v = json(&fpt(&[
        "inspect",
        "--backbone",
        "gpt2",
        "--init",
        "random",
        "--task",
        &task,
        "--json",
    ]));
    assert_eq!(v["task_dims"]["seq_len"], 6);
    assert_eq!(v["data"]["splits"][0]["label_counts"], serde_json::json!([9, 9]));

    // Missing data: a clear error with the way to get it, and nothing written.
    let empty = d.path().join("nothing");
    let o = fpt(&[
        "train",
        "--task",
        "cifar10",
        "--data-dir",
        empty.to_str().unwrap(),
        "--backbone",
        "gpt2",
        "--init",
        "random",
        "--out",
        d.path().join("c10").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("fpt fetch cifar10"), "{}", stderr(&o));
    assert!(!d.path().join("c10").join("spec.json").exists());
    let v = json(&fpt(&[
        "inspect",
        "--backbone",
        "gpt2",
        "--init",
        "random",
        "--task",
        "listops",
        "--json",
    ]));
    assert_eq!(
        v["task_dims"]["input"],
        serde_json::json!({"kind": "tokens", "vocab": 15})
    );
    assert_eq!(v["data"]["present"], false);
    let o = fpt(&["fetch", "bit-xor"]);
    assert!(
        !o.status.success() && stderr(&o).contains("nothing to fetch"),
        "{}",
        stderr(&o)
    );
    let o = fpt(&["train", "--task", "mnsit", "--out", "x"]);
    assert!(
        !o.status.success() && stderr(&o).contains("unknown task `mnsit`"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn pretrain_writes_a_backbone_that_train_loads_and_lstm_flags_work() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pre");
    let o = fpt(&[
        "pretrain",
        "--corpus",
        "zipf",
        "--vocab",
        "64",
        "--seq-len",
        "16",
        "--layers",
        "1",
        "--hidden",
        "16",
        "--heads",
        "2",
        "--steps",
        "6",
        "--batch-size",
        "4",
        "--eval-every",
        "3",
        "--eval-examples",
        "8",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("held-out perplexity") && stdout.contains("unigram"),
        "{stdout}"
    );
    let model = out.join("model");
    let card = std::fs::read_to_string(model.join("README.md")).unwrap();
    assert!(card.contains("tokens seen | 384 (6 steps x 4 windows)"), "{card}");
    // The backbone loads frozen for a downstream task.
    let run = tmp.path().join("down");
    let o = fpt(&[
        "train",
        "--task",
        "bit-xor",
        "--backbone",
        model.to_str().unwrap(),
        "--steps",
        "2",
        "--eval-every",
        "2",
        "--eval-examples",
        "8",
        "--out",
        run.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("result.json")).unwrap()).unwrap();
    assert_eq!(r["weights"], model.join("model.safetensors").display().to_string());
    // Resuming a finished pretraining run refuses a changed spec by name.
    fails_with(
        &[
            "pretrain",
            "--corpus",
            "zipf",
            "--vocab",
            "64",
            "--seq-len",
            "16",
            "--layers",
            "1",
            "--hidden",
            "16",
            "--heads",
            "2",
            "--steps",
            "7",
            "--batch-size",
            "4",
            "--eval-every",
            "3",
            "--eval-examples",
            "8",
            "--resume",
            out.to_str().unwrap(),
        ],
        &["train.steps"],
    );
    // A missing English corpus names the fetch command.
    fails_with(
        &[
            "pretrain",
            "--corpus",
            "austen",
            "--out",
            tmp.path().join("x").to_str().unwrap(),
        ],
        &["fpt fetch austen"],
    );
    // LSTM flags: a 2-layer residual LSTM with positions, frozen.
    let lstm = tmp.path().join("lstm");
    let o = fpt(&[
        "train",
        "--task",
        "bit-xor",
        "--backbone",
        "lstm",
        "--init",
        "random",
        "--layers",
        "2",
        "--hidden",
        "16",
        "--lstm-residual",
        "--lstm-positions",
        "--steps",
        "2",
        "--eval-every",
        "2",
        "--eval-examples",
        "8",
        "--out",
        lstm.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lstm.join("result.json")).unwrap()).unwrap();
    assert!(
        r["weights"].as_str().unwrap().contains("residual, learned positions"),
        "{}",
        r["weights"]
    );
    fails_with(
        &[
            "train",
            "--task",
            "bit-xor",
            "--backbone",
            "lstm",
            "--init",
            "random",
            "--heads",
            "4",
            "--out",
            tmp.path().join("y").to_str().unwrap(),
        ],
        &["no attention heads"],
    );
}

/// One trainable predicate, end to end: for each `--train` value, `fpt inspect --json`
/// counts what `result.json` of a one-step run reports, and the trained tensors saved in its
/// checkpoint hold exactly that many values.
#[test]
fn inspect_and_result_json_count_the_same_trained_parameters() {
    let shape = [
        "--backbone",
        "gpt2",
        "--init",
        "random",
        "--layers",
        "2",
        "--hidden",
        "16",
        "--heads",
        "2",
    ];
    for train in [
        "in,out,ln,pos",
        "all",
        "ln",
        "in,out,ln,pos,last-attn",
        "out,last-attn",
        "attn,ff",
    ] {
        let mut args = vec!["inspect", "--task", "bit-xor", "--json", "--train", train];
        args.extend(shape);
        let inspected = json(&fpt(&args))["trainable"].as_u64().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let mut args = vec![
            "train",
            "-q",
            "--task",
            "bit-xor",
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--eval-examples",
            "4",
            "--train",
            train,
            "--out",
        ];
        args.push(run.to_str().unwrap());
        args.extend(shape);
        let out = fpt(&args);
        assert!(out.status.success(), "{train}: {}", stderr(&out));
        let result: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("result.json")).unwrap()).unwrap();
        assert_eq!(result["trainable_params"].as_u64(), Some(inspected), "--train {train}");
        let latest = std::fs::read_to_string(run.join("checkpoints/LATEST")).unwrap();
        let saved = std::fs::read(
            run.join("checkpoints")
                .join(latest.trim())
                .join("trainable.safetensors"),
        )
        .unwrap();
        let tensors = safetensors::SafeTensors::deserialize(&saved).unwrap();
        let values: usize = tensors
            .tensors()
            .iter()
            .map(|(_, t)| t.shape().iter().product::<usize>())
            .sum();
        assert_eq!(values as u64, inspected, "--train {train}: values in the checkpoint");
    }
}

/// The defaults live in one place: a run from flags that set only the task, the backbone
/// and a short budget writes the spec `RunSpec::new` (the library's constructor) gives.
#[test]
fn cli_defaults_are_the_library_constructors() {
    use fpt_spec::{BackboneSpec, Init, RunSpec, ShapeOverrides, TrainSpec};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let out = fpt(&[
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
        "16",
        "--heads",
        "2",
        // No trainer flag: every default must be the library's (1000 steps of a tiny model).
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let saved: RunSpec = serde_json::from_str(&std::fs::read_to_string(dir.join("spec.json")).unwrap()).unwrap();
    let backbone = BackboneSpec {
        shape: ShapeOverrides {
            layers: Some(1),
            hidden: Some(16),
            heads: Some(2),
            ..Default::default()
        },
        ..BackboneSpec::new("gpt2", Init::Random)
    };
    let expected = RunSpec {
        train: TrainSpec::default(),
        ..RunSpec::new(fpt_spec::TaskSpec::new(fpt_spec::TaskName::BitXor), backbone)
    };
    assert_eq!(saved, expected);
}

#[test]
fn cached_epochs_imply_the_output_only_model() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("oo");
    let args = |out: &str, extra: &[&'static str]| {
        let mut v: Vec<String> = [
            "train",
            "--task",
            "bit-xor",
            "--backbone",
            "gpt2",
            "--init",
            "random",
            "--layers",
            "1",
            "--hidden",
            "16",
            "--heads",
            "2",
            "--train",
            "out",
            "--cached-epochs",
            "2",
            "--steps",
            "4",
            "--batch-size",
            "4",
            "--eval-examples",
            "16",
            "-q",
            "--out",
            out,
        ]
        .map(String::from)
        .to_vec();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let a = args(out.to_str().unwrap(), &[]);
    let o = fpt(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("spec.json")).unwrap()).unwrap();
    assert_eq!(spec["model"], "output-only");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("result.json")).unwrap()).unwrap();
    assert_eq!(r["cached"]["epochs"], 2);
    // Asked for the FPT model, the epochs are refused, naming the field and its flag.
    let bad = d.path().join("bad");
    let a = args(bad.to_str().unwrap(), &["--model", "fpt"]);
    let o = fpt(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let e = stderr(&o);
    assert!(
        !o.status.success() && e.contains("cached_epochs") && e.contains("--cached-epochs"),
        "{e}"
    );
    assert!(!bad.exists(), "nothing is written for a refused spec");
}

//! `fpt predict`: a trained run on new examples.

mod common;
use common::*;
use std::fmt::Write as _;

/// Records of a small learnable custom task: 3 vectors of width 2, class 1 when the last
/// vector's first number is positive (a hash spreads the values).
fn records(n: usize, salt: u64, labels: bool) -> (String, Vec<u32>) {
    let mut text = String::new();
    let mut ys = Vec::new();
    for i in 0..n as u64 {
        let v = |j: u64| {
            let h = (i * 7919 + j * 104_729 + salt).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            (h % 2001) as f64 / 1000.0 - 1.0
        };
        let feats = [[v(0), v(1)], [v(2), v(3)], [v(4), v(5)]];
        let y = u32::from(feats[2][0] > 0.0);
        ys.push(y);
        let f = serde_json::json!(feats);
        if labels {
            let _ = writeln!(text, "{{\"features\": {f}, \"label\": {y}}}");
        } else {
            let _ = writeln!(text, "{{\"features\": {f}}}");
        }
    }
    (text, ys)
}

/// Trains a 1-layer random GPT-2 (hidden 16) on `task` into `run` for `steps` steps; returns
/// the test accuracy `fpt eval` gives its latest checkpoint.
fn train_and_eval(task: &[&str], steps: &str, run: &std::path::Path) -> f64 {
    let mut args = vec!["train"];
    args.extend_from_slice(task);
    args.extend([
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
        steps,
        "--lr",
        "3e-3",
        "-q",
        "--out",
        run.to_str().unwrap(),
    ]);
    let out = fpt(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let eval = fpt(&["eval", run.to_str().unwrap()]);
    assert!(eval.status.success(), "{}", stderr(&eval));
    json(&eval)["test_accuracy"].as_f64().unwrap()
}

/// The run's test examples with their labels removed: `fpt predict`'s classes, scored
/// against the removed labels, give the test accuracy `fpt eval` and result.json report; the
/// CSV form says the same; inputs that do not fit the run are refused, naming why, and no
/// output is left behind.
#[test]
fn predictions_on_the_test_split_reproduce_the_runs_accuracy() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("train.jsonl"), records(96, 1, true).0).unwrap();
    let (test, truth) = records(48, 2, true);
    std::fs::write(data.join("test.jsonl"), test).unwrap();
    let run = tmp.path().join("run");
    let task = format!("custom:{}", data.display());
    let scored = train_and_eval(&["--task", &task], "300", &run);
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("result.json")).unwrap()).unwrap();

    let inputs = tmp.path().join("unlabelled.jsonl");
    std::fs::write(&inputs, records(48, 2, false).0).unwrap();
    let preds = tmp.path().join("preds.jsonl");
    let out = fpt(&[
        "predict",
        run.to_str().unwrap(),
        "--inputs",
        inputs.to_str().unwrap(),
        "--out",
        preds.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&preds)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), truth.len());
    let mut right = 0;
    for (i, (l, y)) in lines.iter().zip(&truth).enumerate() {
        assert_eq!(l["index"], i);
        let probs: Vec<f64> = l["probabilities"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_f64().unwrap())
            .collect();
        assert_eq!(probs.len(), 2, "two classes");
        assert!(
            (probs.iter().sum::<f64>() - 1.0).abs() < 1e-5,
            "line {i}: probabilities sum to 1"
        );
        let class = l["class"].as_u64().unwrap() as usize;
        assert!(
            probs[class] >= probs[1 - class],
            "line {i}: the class is the likelier one"
        );
        assert!(l.get("label").is_none(), "no label was given");
        right += usize::from(class as u32 == *y);
    }
    let accuracy = right as f64 / truth.len() as f64;
    assert!((accuracy - scored).abs() < 1e-12, "predict {accuracy} vs eval {scored}");
    assert!(
        (accuracy - result["test_accuracy"].as_f64().unwrap()).abs() < 1e-12,
        "predict {accuracy} vs result.json {}",
        result["test_accuracy"]
    );
    // The run learned something: its accuracy is above the majority class's.
    let ones = truth.iter().filter(|&&y| y == 1).count();
    let majority = ones.max(truth.len() - ones) as f64 / truth.len() as f64;
    assert!(
        accuracy > majority,
        "accuracy {accuracy} vs majority {majority}: the run learned nothing"
    );

    // CSV, with the labels given: the same classes, and the accuracy printed.
    let csv = tmp.path().join("preds.csv");
    let out = fpt(&[
        "predict",
        run.to_str().unwrap(),
        "--inputs",
        data.join("test.jsonl").to_str().unwrap(),
        "--out",
        csv.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("accuracy {accuracy:.4} on the 48 labelled")),
        "{}",
        stderr(&out)
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut rows = text.lines();
    assert_eq!(rows.next(), Some("index,class,p0,p1,label"));
    for (row, l) in rows.zip(&lines) {
        let cells: Vec<&str> = row.split(',').collect();
        assert_eq!(cells[1], l["class"].to_string());
    }

    // Inputs that do not fit, and what must never be predicted: each refused with its
    // reason (exit 2), nothing written.
    let refused = |name: &str, text: &str, want: &[&str]| {
        let f = tmp.path().join(name);
        std::fs::write(&f, text).unwrap();
        let o = tmp.path().join(format!("{name}.out"));
        let out = fpt(&[
            "predict",
            run.to_str().unwrap(),
            "--inputs",
            f.to_str().unwrap(),
            "--out",
            o.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
        let err = stderr(&out);
        for w in want {
            assert!(err.contains(w), "{name}: `{w}` not in {err}");
        }
        assert!(!o.exists(), "{name}: nothing written");
    };
    refused("wrong.jsonl", "{\"features\": [[1, 2, 3]]}\n", &["width 2", "width 3"]);
    // Finite but huge features: the scores are not numbers.
    refused(
        "huge.jsonl",
        "{\"features\": [[1, 2], [3e38, -3e38], [3e38, 3e38]]}\n",
        &["example 0", "not finite"],
    );
    // A record far longer than the run's 3 time steps.
    let long: Vec<[f64; 2]> = (0..5000).map(|i| [i as f64 * 1e-4, 0.5]).collect();
    refused(
        "long.jsonl",
        &format!("{{\"features\": {}}}\n", serde_json::json!(long)),
        &["example 0 has 5000 time steps", "at most 3"],
    );
    // A label the run cannot have (2 classes).
    refused(
        "label7.jsonl",
        "{\"features\": [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]], \"label\": 7}\n",
        &["example 0 has label 7", "2 classes"],
    );

    // The output path is the input (the same file, a hard link, a symlink): refused before
    // anything is read, and the inputs are unchanged.
    let before = std::fs::read(&inputs).unwrap();
    let hard = tmp.path().join("hard.jsonl");
    std::fs::hard_link(&inputs, &hard).unwrap();
    let soft = tmp.path().join("soft.jsonl");
    std::os::unix::fs::symlink(&inputs, &soft).unwrap();
    for target in [&inputs, &hard, &soft] {
        let out = fpt(&[
            "predict",
            run.to_str().unwrap(),
            "--inputs",
            inputs.to_str().unwrap(),
            "--out",
            target.to_str().unwrap(),
        ]);
        assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(stderr(&out).contains("is the input file"), "{}", stderr(&out));
        assert_eq!(std::fs::read(&inputs).unwrap(), before, "the inputs are unchanged");
    }
}

/// MNIST-format IDX images: a run of the mnist task predicts on its test images (IDX, with
/// the labels file) and scores the accuracy `fpt eval` reports; images of another size are
/// refused.
#[test]
fn idx_images_predict_with_the_runs_accuracy() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("mnist");
    std::fs::create_dir_all(&d).unwrap();
    // Class 1 where the image's top half is bright: learnable in a few steps.
    let write = |prefix: &str, n: usize, salt: usize| -> Vec<u8> {
        let mut px = Vec::with_capacity(n * 28 * 28);
        let mut labels = Vec::with_capacity(n);
        for i in 0..n {
            let y = ((i * 7 + salt) % 2) as u8;
            labels.push(y);
            for r in 0..28 {
                for c in 0..28 {
                    let noise = ((i * 131 + r * 17 + c * 29 + salt) % 64) as u8;
                    px.push(if (r < 14) == (y == 1) { 160 + noise } else { noise });
                }
            }
        }
        std::fs::write(
            d.join(format!("{prefix}-images-idx3-ubyte")),
            fpt_tasks::idx::encode(&[n, 28, 28], &px),
        )
        .unwrap();
        std::fs::write(
            d.join(format!("{prefix}-labels-idx1-ubyte")),
            fpt_tasks::idx::encode(&[n], &labels),
        )
        .unwrap();
        labels
    };
    write("train", 64, 1);
    write("t10k", 40, 2);
    let run = tmp.path().join("run");
    let scored = train_and_eval(&["--task", "mnist", "--data-dir", d.to_str().unwrap()], "60", &run);
    let preds = tmp.path().join("preds.csv");
    let out = fpt(&[
        "predict",
        run.to_str().unwrap(),
        "--inputs",
        d.join("t10k-images-idx3-ubyte").to_str().unwrap(),
        "--labels",
        d.join("t10k-labels-idx1-ubyte").to_str().unwrap(),
        "--out",
        preds.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("accuracy {scored:.4} on the 40 labelled")),
        "eval {scored}: {}",
        stderr(&out)
    );
    let rows = std::fs::read_to_string(&preds).unwrap();
    assert_eq!(
        rows.lines().next(),
        Some("index,class,p0,p1,p2,p3,p4,p5,p6,p7,p8,p9,label")
    );
    assert_eq!(rows.lines().count(), 41);

    // 20x20 images for a run trained on 28x28 ones: refused, naming both.
    let small = tmp.path().join("small-idx3-ubyte");
    std::fs::write(&small, fpt_tasks::idx::encode(&[2, 20, 20], &[0u8; 800])).unwrap();
    let none = tmp.path().join("none.csv");
    let out = fpt(&[
        "predict",
        run.to_str().unwrap(),
        "--inputs",
        small.to_str().unwrap(),
        "--out",
        none.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("28x28") && stderr(&out).contains("20x20"),
        "{}",
        stderr(&out)
    );
    assert!(!none.exists());
}

//! Every dataset format on small files the tests write themselves (IDX plain and gzip,
//! CIFAR-10 binary batches, LRA TSV, TAPE JSON, custom JSONL): values land where the
//! reference pipeline puts them, and every kind of bad input is a clear error naming the
//! file, the record and the field.

use candle_core::Device;
use fpt_nn::Rng;
use fpt_spec::{Brackets, ImageSize, TaskName, TaskSpec};
use fpt_tasks::{build, idx, Inputs, Split, Task, TaskError};
use std::io::Write;
use std::path::Path;

fn spec(name: TaskName, dir: &Path) -> TaskSpec {
    let mut s = TaskSpec::new(name);
    s.path = Some(dir.to_path_buf());
    s
}

fn vectors(i: &Inputs) -> (Vec<usize>, Vec<f32>) {
    match i {
        Inputs::Vectors(t) => (t.dims().to_vec(), t.flatten_all().unwrap().to_vec1().unwrap()),
        Inputs::Tokens(_) => panic!("expected vectors"),
    }
}

fn tokens(i: &Inputs) -> (Vec<usize>, Vec<u32>) {
    match i {
        Inputs::Tokens(t) => (t.dims().to_vec(), t.flatten_all().unwrap().to_vec1().unwrap()),
        Inputs::Vectors(_) => panic!("expected tokens"),
    }
}

fn err_of(r: fpt_tasks::Result<Box<dyn Task>>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

// ---------------------------------------------------------------- MNIST (IDX)

fn mnist_pixels(n: usize) -> Vec<u8> {
    (0..n * 784).map(|i| ((i * 7 + i / 784 * 13) % 256) as u8).collect()
}

fn write_mnist(dir: &Path, n_train: usize, n_test: usize, gz: bool) {
    let write = |name: &str, bytes: Vec<u8>| {
        if gz {
            let f = std::fs::File::create(dir.join(format!("{name}.gz"))).unwrap();
            let mut e = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
            e.write_all(&bytes).unwrap();
            e.finish().unwrap();
        } else {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    };
    for (prefix, n) in [("train", n_train), ("t10k", n_test)] {
        write(
            &format!("{prefix}-images-idx3-ubyte"),
            idx::encode(&[n, 28, 28], &mnist_pixels(n)),
        );
        let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
        write(&format!("{prefix}-labels-idx1-ubyte"), idx::encode(&[n], &labels));
    }
}

#[test]
fn mnist_patches_are_the_reference_layout_plain_and_gzip() {
    for gz in [false, true] {
        let d = tempfile::tempdir().unwrap();
        write_mnist(d.path(), 12, 5, gz);
        let t = build(&spec(TaskName::Mnist, d.path()), &fpt_nn::Rng::new(0)).unwrap();
        let dims = t.dims();
        assert_eq!((dims.seq_len, dims.classes, dims.output_dim()), (49, 10, 10));
        assert_eq!(t.eval_len(Split::Test), 5);
        let b = t.eval_batch(Split::Test, 0, 5, &Device::Cpu).unwrap();
        let (shape, v) = vectors(&b.inputs);
        assert_eq!(shape, vec![5, 49, 16]);
        let px = mnist_pixels(5);
        // Image 3, pixel (row 9, col 6): token (9/4)*7 + 6/4 = 15, within (9%4)*4 + 6%4 = 6.
        let want = px[3 * 784 + 9 * 28 + 6] as f32 / 255.0;
        assert_eq!(v[(3 * 49 + 15) * 16 + 6], want);
        let labels: Vec<u32> = b.labels.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(labels, vec![0, 1, 2, 3, 4]);
    }
}

#[test]
fn mnist_padded_to_32_has_64_tokens_and_a_zero_border() {
    let d = tempfile::tempdir().unwrap();
    write_mnist(d.path(), 3, 2, false);
    let mut s = spec(TaskName::Mnist, d.path());
    s.data.image_size = ImageSize::Pad32;
    let t = build(&s, &fpt_nn::Rng::new(0)).unwrap();
    assert_eq!(t.dims().seq_len, 64);
    let (shape, v) = vectors(&t.eval_batch(Split::Test, 0, 1, &Device::Cpu).unwrap().inputs);
    assert_eq!(shape, vec![1, 64, 16]);
    // Padded pixel (2 + 9, 2 + 6) = (11, 8): token (11/4)*8 + 8/4 = 18, within (11%4)*4 + 0 = 12.
    assert_eq!(v[18 * 16 + 12], mnist_pixels(1)[9 * 28 + 6] as f32 / 255.0);
    // Row 0 is padding.
    assert!(v[..16 * 8].chunks(16).all(|tok| tok[..4].iter().all(|&x| x == 0.0)));
}

#[test]
fn bad_idx_files_are_named_errors() {
    let d = tempfile::tempdir().unwrap();
    write_mnist(d.path(), 4, 2, false);
    let s = spec(TaskName::Mnist, d.path());
    let images = d.path().join("train-images-idx3-ubyte");
    let good = std::fs::read(&images).unwrap();

    std::fs::write(&images, &good[..good.len() - 100]).unwrap();
    let e = err_of(build(&s, &fpt_nn::Rng::new(0)));
    assert!(e.contains("train-images-idx3-ubyte") && e.contains("truncated"), "{e}");

    let mut bad = good.clone();
    bad[0] = 0x12;
    std::fs::write(&images, &bad).unwrap();
    let e = err_of(build(&s, &fpt_nn::Rng::new(0)));
    assert!(
        e.contains("train-images-idx3-ubyte") && e.contains("wrong magic"),
        "{e}"
    );

    std::fs::write(&images, &good[..6]).unwrap();
    let e = err_of(build(&s, &fpt_nn::Rng::new(0)));
    assert!(e.contains("truncated header"), "{e}");

    std::fs::write(&images, &good).unwrap();
    let labels = d.path().join("train-labels-idx1-ubyte");
    std::fs::write(&labels, idx::encode(&[3], &[1, 2, 3])).unwrap();
    let e = err_of(build(&s, &fpt_nn::Rng::new(0)));
    assert!(
        e.contains("train-labels-idx1-ubyte") && e.contains("3 labels for 4 images"),
        "{e}"
    );

    std::fs::write(&labels, idx::encode(&[4], &[1, 2, 11, 3])).unwrap();
    let e = err_of(build(&s, &fpt_nn::Rng::new(0)));
    assert!(e.contains("record 2") && e.contains("11"), "{e}");

    std::fs::write(d.path().join("train-labels-idx1-ubyte"), [0x1f, 0x8b, 1, 2, 3]).unwrap();
    let e = err_of(build(&s, &fpt_nn::Rng::new(0)));
    assert!(e.contains("gzip"), "{e}");

    std::fs::remove_file(&labels).unwrap();
    match build(&s, &fpt_nn::Rng::new(0)) {
        Err(TaskError::Missing { what, hint, .. }) => {
            assert!(
                what.contains("train-labels") && hint.contains("fpt fetch mnist"),
                "{what} {hint}"
            )
        }
        _ => panic!("a missing file is TaskError::Missing"),
    }
}

/// Images that 4x4 patches do not tile, images larger than the 32x32 they are padded to
/// (once silently turned into blank images), and splits of different sizes are errors
/// naming the file.
#[test]
fn image_sizes_that_do_not_fit_the_task_are_named_errors() {
    let write = |dir: &Path, prefix: &str, n: usize, side: usize| {
        let px: Vec<u8> = (0..n * side * side).map(|i| (i % 251) as u8).collect();
        std::fs::write(
            dir.join(format!("{prefix}-images-idx3-ubyte")),
            idx::encode(&[n, side, side], &px),
        )
        .unwrap();
        let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
        std::fs::write(
            dir.join(format!("{prefix}-labels-idx1-ubyte")),
            idx::encode(&[n], &labels),
        )
        .unwrap();
    };
    for (train, test, pad32, want) in [
        (27, 27, false, "27x27, which 4x4 patches do not tile"),
        (2, 2, false, "2x2, which 4x4 patches do not tile"),
        (36, 36, true, "larger than the 32x32"),
        (28, 32, false, "test images are 32x32, the training images"),
    ] {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "train", 3, train);
        write(d.path(), "t10k", 2, test);
        let mut s = spec(TaskName::Mnist, d.path());
        if pad32 {
            s.data.image_size = ImageSize::Pad32;
        }
        let e = err_of(build(&s, &fpt_nn::Rng::new(0)));
        assert!(
            e.contains(want) && e.contains("-images-idx3-ubyte"),
            "{train}/{test}: {e}"
        );
    }
}

/// A fetched dataset is re-checked against the sha256 recorded when it was fetched: a file
/// changed since is an error naming it, with the command that fetches it again.
#[test]
fn fetched_data_that_changed_is_refused() {
    let d = tempfile::tempdir().unwrap();
    write_mnist(d.path(), 4, 2, false);
    let images = d.path().join("train-images-idx3-ubyte");
    let sha = fpt_tasks::fetch::sha256(&std::fs::read(&images).unwrap());
    std::fs::write(
        d.path().join(fpt_tasks::fetch::MANIFEST),
        serde_json::json!({"source": "test", "sha256": {"train-images-idx3-ubyte": sha}}).to_string(),
    )
    .unwrap();
    let s = spec(TaskName::Mnist, d.path());
    build(&s, &fpt_nn::Rng::new(0)).unwrap();
    let mut bytes = std::fs::read(&images).unwrap();
    bytes[500] ^= 1;
    std::fs::write(&images, &bytes).unwrap();
    let e = err_of(build(&s, &fpt_nn::Rng::new(0)));
    assert!(
        e.contains("train-images-idx3-ubyte") && e.contains("differs") && e.contains("fpt fetch"),
        "{e}"
    );
}

// ---------------------------------------------------------------- CIFAR-10

fn cifar_record(label: u8, seed: usize) -> Vec<u8> {
    let mut r = vec![label];
    r.extend((0..3072).map(|i| ((i * 31 + seed * 17) % 251) as u8));
    r
}

fn write_cifar(dir: &Path, per_file: usize) {
    for (f, file) in fpt_tasks::images::CIFAR_TRAIN_FILES
        .iter()
        .chain(&[fpt_tasks::images::CIFAR_TEST_FILE])
        .enumerate()
    {
        let bytes: Vec<u8> = (0..per_file)
            .flat_map(|i| cifar_record(((f + i) % 10) as u8, f * 100 + i))
            .collect();
        std::fs::write(dir.join(file), bytes).unwrap();
    }
}

#[test]
fn cifar_patches_are_channel_fastest_and_normalized() {
    let d = tempfile::tempdir().unwrap();
    write_cifar(d.path(), 3);
    let t = build(&spec(TaskName::Cifar10, d.path()), &fpt_nn::Rng::new(0)).unwrap();
    assert_eq!((t.dims().seq_len, t.eval_len(Split::Test)), (64, 3));
    let (shape, v) = vectors(&t.eval_batch(Split::Test, 0, 3, &Device::Cpu).unwrap().inputs);
    assert_eq!(shape, vec![3, 64, 48]);
    let rec = cifar_record(0, 5 * 100 + 1); // the test file is file index 5, example 1
    let (y, x) = (13, 22);
    for c in 0..3 {
        let raw = rec[1 + c * 1024 + y * 32 + x] as f32 / 255.0;
        let want = (raw - fpt_tasks::images::CIFAR_MEAN[c]) / fpt_tasks::images::CIFAR_STD[c];
        let tok = (y / 4) * 8 + x / 4;
        let within = ((y % 4) * 4 + x % 4) * 3 + c;
        assert!((v[(64 + tok) * 48 + within] - want).abs() < 1e-6);
    }
    // LRA: gray (PIL luma), one pixel per token, [-1, 1].
    let t = build(&spec(TaskName::Cifar10Lra, d.path()), &fpt_nn::Rng::new(0)).unwrap();
    let (shape, v) = vectors(&t.eval_batch(Split::Test, 1, 1, &Device::Cpu).unwrap().inputs);
    assert_eq!(shape, vec![1, 1024, 1]);
    let p = |c: usize| rec[1 + c * 1024 + y * 32 + x] as u32;
    let luma = ((p(0) * 19595 + p(1) * 38470 + p(2) * 7471 + 0x8000) >> 16) as f32 / 255.0;
    assert!((v[y * 32 + x] - (luma - 0.5) / 0.5).abs() < 1e-6);
}

#[test]
fn cifar_augmentation_is_seeded_switchable_and_training_only() {
    let d = tempfile::tempdir().unwrap();
    write_cifar(d.path(), 2);
    let s = spec(TaskName::Cifar10, d.path());
    let batch = |s: &TaskSpec, rng_seed: u64| {
        let mut t = build(s, &fpt_nn::Rng::new(0)).unwrap();
        vectors(&t.train_batch(4, &mut Rng::new(rng_seed), &Device::Cpu).unwrap().inputs).1
    };
    let (a, b, c) = (batch(&s, 1), batch(&s, 1), batch(&s, 2));
    assert_eq!(a, b, "the same stream gives the same augmentation");
    assert_ne!(a, c, "another stream gives another augmentation");
    let mut off = s.clone();
    off.data.augment = Some(false);
    let plain = batch(&off, 1);
    assert_ne!(a, plain);
    // Without augmentation a training batch is exactly the evaluation encoding.
    let mut t = build(&off, &fpt_nn::Rng::new(0)).unwrap();
    let train = t.train_batch(10, &mut Rng::new(3), &Device::Cpu).unwrap();
    let labels: Vec<u32> = train.labels.flatten_all().unwrap().to_vec1().unwrap();
    let mut sorted = labels.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        vec![0, 1, 1, 2, 2, 3, 3, 4, 4, 5],
        "one epoch is every example once"
    );
}

#[test]
fn bad_cifar_files_are_named_errors() {
    let d = tempfile::tempdir().unwrap();
    write_cifar(d.path(), 2);
    let s = spec(TaskName::Cifar10, d.path());
    let f = d.path().join("data_batch_3.bin");
    std::fs::write(&f, vec![1u8; 3073 + 5]).unwrap();
    let e = err_of(build(&s, &fpt_nn::Rng::new(0)));
    assert!(e.contains("data_batch_3.bin") && e.contains("3073-byte records"), "{e}");
    let mut bytes = cifar_record(1, 0);
    bytes.extend(cifar_record(12, 1));
    std::fs::write(&f, bytes).unwrap();
    let e = err_of(build(&s, &fpt_nn::Rng::new(0)));
    assert!(
        e.contains("data_batch_3.bin") && e.contains("record 1") && e.contains("label 12"),
        "{e}"
    );
    write_cifar(d.path(), 2);
    std::fs::remove_file(d.path().join("test_batch.bin")).unwrap();
    let e = err_of(build(&s, &fpt_nn::Rng::new(0)));
    assert!(
        e.contains("test_batch.bin not found") && e.contains("fpt fetch cifar10"),
        "{e}"
    );
}

// ---------------------------------------------------------------- ListOps

/// An independent evaluator of LRA's source strings: a stack of (operator, values).
fn eval_source(s: &str) -> (u32, usize) {
    let mut stack: Vec<(String, Vec<u32>)> = Vec::new();
    let mut result = None;
    let mut length = 0;
    for tok in s.split_whitespace() {
        match tok {
            "(" | ")" => {}
            "]" => {
                length += 1;
                let (op, mut v) = stack.pop().unwrap();
                let r = match op.as_str() {
                    "[MIN" => *v.iter().min().unwrap(),
                    "[MAX" => *v.iter().max().unwrap(),
                    "[SM" => v.iter().sum::<u32>() % 10,
                    "[MED" => {
                        v.sort();
                        let n = v.len();
                        if n % 2 == 1 {
                            v[n / 2]
                        } else {
                            ((v[n / 2 - 1] + v[n / 2]) as f64 / 2.0) as u32
                        }
                    }
                    o => panic!("op {o}"),
                };
                match stack.last_mut() {
                    Some(top) => top.1.push(r),
                    None => result = Some(r),
                }
            }
            t if t.starts_with('[') => {
                length += 1;
                stack.push((t.to_string(), Vec::new()))
            }
            d => {
                length += 1;
                let v: u32 = d.parse().unwrap();
                match stack.last_mut() {
                    Some(top) => top.1.push(v),
                    None => result = Some(v),
                }
            }
        }
    }
    (result.unwrap(), length)
}

#[test]
fn listops_generator_follows_lra_and_round_trips_through_tsv() {
    let c = fpt_tasks::listops::GenConfig {
        train: 60,
        val: 10,
        test: 10,
        min_length: 20,
        max_length: 120,
        seed: 7,
        ..Default::default()
    };
    let g = fpt_tasks::listops::generate(&c, &mut |_, _| {});
    assert_eq!((g.train.len(), g.val.len(), g.test.len()), (60, 10, 10));
    let mut seen = std::collections::HashSet::new();
    for (src, target) in g.train.iter().chain(&g.val).chain(&g.test) {
        let (v, len) = eval_source(src);
        assert_eq!(v, *target, "{src}");
        assert!(len > 20 && len < 120, "length {len}");
        assert!(seen.insert(src.clone()), "duplicate tree");
        assert!(src.starts_with("( "), "{src}");
    }
    let d = tempfile::tempdir().unwrap();
    fpt_tasks::fetch::generate_listops(d.path(), &c, &mut |_| {}).unwrap();
    let raw = std::fs::read_to_string(d.path().join("basic_val.tsv")).unwrap();
    assert!(raw.starts_with("Source\tTarget\r\n"));
    let mut s = spec(TaskName::ListOps, d.path());
    let t = build(&s, &fpt_nn::Rng::new(0)).unwrap();
    assert_eq!(
        (t.eval_len(Split::Test), t.dims().seq_len, t.dims().classes),
        (10, 512, 10)
    );
    let b = t.eval_batch(Split::Test, 0, 10, &Device::Cpu).unwrap();
    let (shape, ids) = tokens(&b.inputs);
    assert_eq!(shape, vec![10, 512]);
    let first = fpt_tasks::listops::tokenize(&g.val[0].0, Brackets::Drop).unwrap();
    assert_eq!(&ids[..first.len()], &first[..]);
    assert!(
        ids[first.len()..512].iter().all(|&i| i == 0),
        "padding at the end with 0"
    );
    assert!(ids.iter().all(|&i| i < 15));
    s.eval_split = Some("test".into());
    s.data.brackets = Brackets::Keep;
    let t = build(&s, &fpt_nn::Rng::new(0)).unwrap();
    let (_, ids) = tokens(&t.eval_batch(Split::Test, 0, 1, &Device::Cpu).unwrap().inputs);
    let keep = fpt_tasks::listops::tokenize(&g.test[0].0, Brackets::Keep).unwrap();
    assert_eq!(&ids[..keep.len()], &keep[..]);
    assert_eq!(
        keep.iter().filter(|&&i| i == 15).count(),
        eval_source(&g.test[0].0).1 - first_len_without_brackets(&g.test[0].0)
    );
    s.eval_split = Some("valid".into());
    let e = err_of(build(&s, &fpt_nn::Rng::new(0)));
    assert!(
        e.contains("no evaluation split `valid`") && e.contains("val, test"),
        "{e}"
    );
}

fn first_len_without_brackets(src: &str) -> usize {
    fpt_tasks::listops::tokenize(src, Brackets::Drop).unwrap().len()
}

#[test]
fn listops_tokens_match_the_reference_vocabulary() {
    let ids = fpt_tasks::listops::tokenize("( ( ( [MAX 2 ) 9 ) ] )", Brackets::Drop).unwrap();
    assert_eq!(ids, vec![12, 3, 10]);
    let ids = fpt_tasks::listops::tokenize("( ( ( [MAX 2 ) 9 ) ] )", Brackets::Keep).unwrap();
    assert_eq!(ids, vec![12, 3, 10, 15]);
    assert_eq!(eval_source("( ( ( [MED 2 ) 9 ) ] )").0, 5);
}

#[test]
fn bad_listops_rows_are_named_errors() {
    let d = tempfile::tempdir().unwrap();
    let good = "Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n";
    std::fs::write(d.path().join("basic_val.tsv"), good).unwrap();
    let s = spec(TaskName::ListOps, d.path());
    let cases = [
        (
            "Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t12\n",
            "line 2, field Target: `12`",
        ),
        ("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\tx\n", "line 2, field Target"),
        (
            "Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n( [FOO 1 ] )\t1\n",
            "line 3, field Source: unknown token `[FOO`",
        ),
        ("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] ) 9\n", "line 2: no tab"),
        ("src\ttgt\n", "line 1: header"),
    ];
    for (text, want) in cases {
        std::fs::write(d.path().join("basic_train.tsv"), text).unwrap();
        let e = err_of(build(&s, &fpt_nn::Rng::new(0)));
        assert!(e.contains("basic_train.tsv") && e.contains(want), "{e} (wanted {want})");
    }
    std::fs::remove_file(d.path().join("basic_train.tsv")).unwrap();
    let e = err_of(build(&s, &fpt_nn::Rng::new(0)));
    assert!(
        e.contains("basic_train.tsv not found") && e.contains("fpt fetch listops"),
        "{e}"
    );
}

// ---------------------------------------------------------------- TAPE remote homology

fn write_tape(dir: &Path, split: &str, records: serde_json::Value) {
    let sub = dir.join("remote_homology");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join(format!("remote_homology_{split}.json")), records.to_string()).unwrap();
}

fn tape_ok(dir: &Path) {
    for split in fpt_tasks::homology::SPLITS {
        write_tape(
            dir,
            split,
            serde_json::json!([
                {"id": "d1a", "primary": "ACDZ", "protein_length": 4, "fold_label": 3, "class_label": 0},
                {"id": "d1b", "primary": "MKV", "protein_length": 3, "fold_label": 1194},
                {"id": "d1c", "primary": "A".repeat(1023), "fold_label": 5},
            ]),
        );
    }
}

#[test]
fn tape_json_encodes_iupac_with_cls_and_sep_and_drops_long_sequences() {
    let d = tempfile::tempdir().unwrap();
    tape_ok(d.path());
    let t = build(&spec(TaskName::Homology, d.path()), &fpt_nn::Rng::new(0)).unwrap();
    assert_eq!(
        (t.dims().classes, t.eval_len(Split::Test)),
        (1195, 2),
        "1025 ids > 1024: left out"
    );
    let b = t.eval_batch(Split::Test, 0, 2, &Device::Cpu).unwrap();
    let (shape, ids) = tokens(&b.inputs);
    assert_eq!(shape, vec![2, 6], "padded to the longest in the batch");
    // TAPE's IUPAC ids (REFERENCE-DATA.md): A 5, C 7, D 8, Z 29, M 16, K 14, V 25 (no J).
    assert_eq!(ids, vec![2, 5, 7, 8, 29, 3, 2, 16, 14, 25, 3, 0]);
    let labels: Vec<u32> = b.labels.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(labels, vec![3, 1194]);
    let mut s = spec(TaskName::Homology, d.path());
    s.eval_split = Some("test_fold_holdout".into());
    assert!(build(&s, &fpt_nn::Rng::new(0)).is_ok());
}

#[test]
fn bad_tape_records_are_named_errors() {
    let cases = [
        (
            serde_json::json!([{"id": "x1", "fold_label": 3}]),
            "record 0 (id x1): field `primary` is missing",
        ),
        (
            serde_json::json!([{"primary": "AC"}]),
            "record 0: field `fold_label` is missing",
        ),
        (
            serde_json::json!([{"primary": "AC", "fold_label": 3}, {"primary": "Ab", "fold_label": 3}]),
            "record 1, field primary: unknown residue `b` at position 1",
        ),
        (
            serde_json::json!([{"primary": "AC", "fold_label": 1195}]),
            "field fold_label: 1195",
        ),
        (
            serde_json::json!([{"primary": "AJC", "fold_label": 2}]),
            "unknown residue `J` at position 1",
        ),
        (serde_json::json!({"primary": "AC"}), "expected a JSON list"),
    ];
    for (records, want) in cases {
        let d = tempfile::tempdir().unwrap();
        tape_ok(d.path());
        write_tape(d.path(), "train", records);
        let e = err_of(build(&spec(TaskName::Homology, d.path()), &fpt_nn::Rng::new(0)));
        assert!(
            e.contains("remote_homology_train.json") && e.contains(want),
            "{e} (wanted {want})"
        );
    }
    let d = tempfile::tempdir().unwrap();
    tape_ok(d.path());
    std::fs::remove_file(d.path().join("remote_homology/remote_homology_valid.json")).unwrap();
    let e = err_of(build(&spec(TaskName::Homology, d.path()), &fpt_nn::Rng::new(0)));
    assert!(e.contains("remote_homology_valid.json not found"), "{e}");
}

// ---------------------------------------------------------------- custom JSONL

#[test]
fn custom_tokens_and_features_from_a_directory_or_one_file() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("train.jsonl"),
        "{\"tokens\": [3, 1, 4], \"label\": 0}\n{\"tokens\": [5], \"label\": 2}\n\n",
    )
    .unwrap();
    std::fs::write(d.path().join("test.jsonl"), "{\"tokens\": [9, 2], \"label\": 1}\n").unwrap();
    let t = build(
        &TaskSpec::parse(&format!("custom:{}", d.path().display())).unwrap(),
        &fpt_nn::Rng::new(0),
    )
    .unwrap();
    let dims = t.dims();
    assert_eq!((dims.seq_len, dims.classes), (3, 3));
    assert_eq!(dims.input, fpt_tasks::InputKind::Tokens { vocab: 11 });
    let (_, ids) = tokens(&t.eval_batch(Split::Test, 0, 1, &Device::Cpu).unwrap().inputs);
    assert_eq!(ids, vec![10, 9, 2], "left-padded with the extra id");

    let f = d.path().join("one.jsonl");
    std::fs::write(
        &f,
        "{\"features\": [[0.5, 1], [2, 3]], \"label\": 1, \"split\": \"train\"}\n{\"features\": [[7, 8]], \"label\": 0, \"split\": \"val\"}\n",
    )
    .unwrap();
    let t = build(
        &TaskSpec::parse(&format!("custom:{}", f.display())).unwrap(),
        &fpt_nn::Rng::new(0),
    )
    .unwrap();
    assert_eq!(t.dims().input, fpt_tasks::InputKind::Vectors { width: 2 });
    let (shape, v) = vectors(&t.eval_batch(Split::Test, 0, 1, &Device::Cpu).unwrap().inputs);
    assert_eq!((shape, v), (vec![1, 2, 2], vec![0.0, 0.0, 7.0, 8.0]));
}

#[test]
fn bad_custom_records_are_named_errors() {
    let cases = [
        ("{\"tokens\": [1], \"split\": \"train\"}", "line 1: field `label` is missing"),
        ("{\"tokens\": [1], \"lable\": 0, \"split\": \"train\"}", "line 1: unknown field `lable`"),
        ("{\"tokens\": [1], \"label\": 0, \"label\": 1, \"split\": \"train\"}", "line 1: duplicate field `label`"),
        ("{\"tokens\": [1], \"label\": 0, \"split\": \"tset\"}", "line 1: field `split`: `tset` is not a split name"),
        ("{\"tokens\": [1], \"label\": 1000000000, \"split\": \"train\"}", "line 1: field `label`: 1000000000 is above fpt's limit"),
        ("{\"tokens\": [4294967290], \"label\": 0, \"split\": \"train\"}", "line 1: field `tokens`, item 0: id 4294967290 is above fpt's limit"),
        ("{\"features\": [[1e39]], \"label\": 0, \"split\": \"train\"}", "not a finite 32-bit float"),
        ("{\"tokens\": [1], \"label\": 0, \"split\": \"train\"}\n{\"tokens\": [2], \"label\": 0, \"split\": \"test\"}", "at least 2 classes"),
        ("{\"tokens\": [1, -2], \"label\": 0, \"split\": \"train\"}", "line 1: field `tokens`, item 1"),
        ("{\"label\": 0, \"split\": \"train\"}", "line 1: needs a `tokens` or a `features` field"),
        ("{\"features\": [[1, 2], [3]], \"label\": 0, \"split\": \"train\"}", "item 1: 1 numbers, expected 2"),
        ("{\"features\": [[]], \"label\": 0, \"split\": \"train\"}", "line 1: field `features`, item 0: an empty vector"),
        ("{\"tokens\": [1], \"label\": 0}", "line 1: field `split` is missing"),
        ("{\"tokens\": [1], \"label\": 0, \"split\": \"train\"}\nnot json", "line 2: not a JSON object"),
        ("{\"tokens\": [1], \"label\": 0, \"split\": \"train\"}\n{\"features\": [[1]], \"label\": 0, \"split\": \"test\"}", "mixes token ids with the dataset's feature vectors of width 1"),
        ("{\"tokens\": [1], \"label\": 0, \"split\": \"test\"}", "no `train` split"),
        ("{\"tokens\": [1], \"label\": 0, \"split\": \"train\"}", "no `test` or `valid` split"),
    ];
    for (text, want) in cases {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("data.jsonl");
        std::fs::write(&f, text).unwrap();
        let e = err_of(build(
            &TaskSpec::parse(&format!("custom:{}", f.display())).unwrap(),
            &fpt_nn::Rng::new(0),
        ));
        assert!(e.contains(want), "{e} (wanted {want})");
        assert!(e.contains("data.jsonl"), "{e}");
    }
}

/// Examples to predict on: labels optional (kept as written), `split` ignored, one kind
/// and width per file, and the same named errors as the task's records.
#[test]
fn examples_to_predict_take_records_without_labels() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("new.jsonl");
    std::fs::write(
        &f,
        "{\"features\": [[1, 2], [3, 4]]}\n\n{\"features\": [[5, 6]], \"label\": 3, \"split\": \"test\"}\n",
    )
    .unwrap();
    let (data, labels) = fpt_tasks::custom::read_for_prediction(&f).unwrap();
    assert_eq!(labels, vec![None, Some(3)]);
    assert_eq!(data.lengths, vec![2, 1]);
    match &data.examples {
        fpt_tasks::Examples::Features { width, seqs } => {
            assert_eq!(*width, 2);
            assert_eq!(seqs, &vec![vec![1.0, 2.0, 3.0, 4.0], vec![5.0, 6.0]]);
        }
        _ => panic!("features expected"),
    }
    for (text, want) in [
        (
            "{\"features\": [[1, 2]]}\n{\"tokens\": [1]}",
            "line 2: token ids where the file's first record has feature vectors of width 2",
        ),
        (
            "{\"features\": [[1, 2]]}\n{\"features\": [[1]]}",
            "line 2: feature vectors of width 1",
        ),
        ("\n", "has no records"),
        ("{\"tokens\": [1], \"lable\": 0}", "line 1: unknown field `lable`"),
    ] {
        std::fs::write(&f, text).unwrap();
        let e = fpt_tasks::custom::read_for_prediction(&f)
            .expect_err("an error")
            .to_string();
        assert!(e.contains(want) && e.contains("new.jsonl"), "{e} (wanted {want})");
    }
}

// ---------------------------------------------------------------- order and cursor

#[test]
fn training_order_is_seeded_epochwise_and_resumes_from_a_cursor() {
    let d = tempfile::tempdir().unwrap();
    let lines: String = (0..7)
        .map(|i| format!("{{\"tokens\": [{i}], \"label\": {i}, \"split\": \"train\"}}\n"))
        .chain(std::iter::once(
            "{\"tokens\": [1], \"label\": 0, \"split\": \"test\"}\n".to_string(),
        ))
        .collect();
    let f = d.path().join("d.jsonl");
    std::fs::write(&f, lines).unwrap();
    let s = TaskSpec::parse(&format!("custom:{}", f.display())).unwrap();
    let labels = |t: &mut Box<dyn Task>, n: usize| -> Vec<u32> {
        t.train_batch(n, &mut Rng::new(0), &Device::Cpu)
            .unwrap()
            .labels
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let mut a = build(&s, &fpt_nn::Rng::new(5)).unwrap();
    let first: Vec<u32> = labels(&mut a, 7);
    let mut sorted = first.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..7).collect::<Vec<_>>(), "an epoch is a permutation");
    let _ = labels(&mut a, 3);
    let cursor = a.cursor().unwrap();
    assert_eq!((cursor.epoch, cursor.position), (1, 3));
    let rest_a = labels(&mut a, 9);
    let mut b = build(&s, &fpt_nn::Rng::new(5)).unwrap();
    b.set_cursor(cursor).unwrap();
    assert_eq!(labels(&mut b, 9), rest_a, "a restored cursor continues the same order");
    let mut c = build(&s, &fpt_nn::Rng::new(6)).unwrap();
    assert_ne!(labels(&mut c, 7), first, "another seed, another order");
    let bad = fpt_tasks::Cursor { epoch: 0, position: 99 };
    assert!(b.set_cursor(bad).unwrap_err().to_string().contains("99"));
}

#[test]
fn train_and_eval_samples_are_fixed_by_the_seed() {
    let d = tempfile::tempdir().unwrap();
    write_mnist(d.path(), 40, 30, false);
    let mut s = spec(TaskName::Mnist, d.path());
    s.train_examples = Some(10);
    s.eval_examples = 8;
    let t = build(&s, &fpt_nn::Rng::new(1)).unwrap();
    assert_eq!((t.eval_len(Split::Test), t.eval_len(Split::Train)), (8, 8));
    assert_eq!(t.splits()[0].1.len(), 10);
    let labels = |t: &dyn Task| -> Vec<u32> {
        t.eval_batch(Split::Test, 0, 8, &Device::Cpu)
            .unwrap()
            .labels
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    assert_eq!(
        labels(t.as_ref()),
        labels(build(&s, &fpt_nn::Rng::new(1)).unwrap().as_ref())
    );
}

#[test]
fn the_listops_cache_notices_a_changed_file() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("basic_train.tsv");
    std::fs::write(&p, "Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n").unwrap();
    let a = fpt_tasks::listops::read_tsv_cached(&p, Brackets::Drop, 512).unwrap();
    assert_eq!(a.labels, vec![9]);
    std::fs::write(&p, "Source\tTarget\n( ( ( [MIN 2 ) 9 ) ] )\t2\n( ( [SM 7 ) ] )\t7\n").unwrap();
    let b = fpt_tasks::listops::read_tsv_cached(&p, Brackets::Drop, 512).unwrap();
    assert_eq!(b.labels, vec![2, 7]);
    let c = fpt_tasks::listops::read_tsv_cached(&p, Brackets::Drop, 2).unwrap();
    assert!(
        matches!(&c.examples, fpt_tasks::Examples::Tokens(t) if t[0].len() == 2),
        "max_len is part of the key"
    );
}

/// An empty ListOps split (its header alone, or nothing) is an error naming the file, not
/// "task `dataset`: the training split is empty".
#[test]
fn an_empty_listops_split_names_its_file() {
    let d = tempfile::tempdir().unwrap();
    for text in ["Source\tTarget\n", ""] {
        let p = d.path().join("basic_train.tsv");
        std::fs::write(&p, text).unwrap();
        let e = fpt_tasks::listops::read_tsv(&p, Brackets::Drop, 512)
            .unwrap_err()
            .to_string();
        assert!(e.contains("basic_train.tsv") && e.contains("holds no example"), "{e}");
    }
}

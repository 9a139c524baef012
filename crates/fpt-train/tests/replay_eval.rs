//! The replayed evaluation (what a CUDA graph of the evaluation batches runs: each batch
//! copied into a fixed input buffer, the logits written into a fixed output buffer and kept
//! on the device, everything read back once at the end) against the trainer's own
//! evaluation, on the CPU where it runs eagerly through the same buffers: the same loss,
//! per-example outcomes and class counts to the last bit, evaluation after evaluation while
//! the parameters change in place under the replay's buffers. The capture itself needs a
//! GPU (`fpt gpu-check`'s "replayed evaluation" checks).

use candle_core::Device;
use fpt_spec::{BackboneSpec, Init, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainSpec};
use fpt_tasks::Split;
use fpt_train::outcomes::Tally;
use fpt_train::{EvalReplay, Trainer};

fn spec(source: &str, task: TaskSpec) -> RunSpec {
    RunSpec {
        train: TrainSpec {
            steps: 100,
            batch_size: 4,
            micro_batch_size: 4,
            seed: 3,
            lr: 3e-3,
            ..TrainSpec::default()
        },
        ..RunSpec::new(
            task,
            BackboneSpec {
                shape: ShapeOverrides {
                    layers: Some(2),
                    hidden: Some(32),
                    heads: Some(2),
                    ..Default::default()
                },
                ..BackboneSpec::new(source, Init::Random)
            },
        )
    }
}

fn bits(t: &Tally) -> (u64, u64, Vec<u32>, Vec<u64>) {
    let (loss, acc) = t.loss_and_accuracy();
    (loss.to_bits(), acc.to_bits(), t.correct.clone(), t.predicted.clone())
}

/// Four evaluations, three training steps apart (the parameters change in place under the
/// replay's buffers, as a replayed step changes them), each replayed evaluation equal to
/// the trainer's; `expect` examples evaluated, in batches that end in a short one.
fn agrees(s: &RunSpec, splits: &[Split], expect: usize) {
    let mut tr = Trainer::new(s, &Device::Cpu).unwrap();
    assert!(
        !expect.is_multiple_of(tr.eval_batch_size()),
        "the split should end in a short batch: {expect} examples in batches of {}",
        tr.eval_batch_size()
    );
    // Read back once a split, and after every batch.
    let (mut replay, mut each) = (EvalReplay::new(), EvalReplay::reading_back_every(1));
    let mut seen = Vec::new();
    for round in 0..4 {
        for &split in splits {
            let want = tr.tally(split).unwrap();
            let got = replay.tally(&tr, split).unwrap();
            assert_eq!(want.correct.len(), expect, "{split:?}");
            assert_eq!(bits(&got), bits(&want), "round {round}, {split:?}");
            assert_eq!(
                bits(&each.tally(&tr, split).unwrap()),
                bits(&want),
                "round {round}, {split:?}, read back each batch"
            );
            seen.push(want.loss_and_accuracy().0.to_bits());
        }
        for _ in 0..3 {
            tr.step().unwrap();
        }
    }
    assert_eq!(replay.captured(), 0, "no capture without a GPU");
    seen.dedup();
    assert!(
        seen.len() >= 4,
        "the evaluations should differ as the model trains: {seen:?}"
    );
}

/// A small GPT-2 on Bit XOR (vectors, five labels per string): 150 strings, batches of
/// 64, 64 and 22.
#[test]
fn replayed_evaluation_equals_the_trainers_on_vectors() {
    let task = TaskSpec {
        eval_examples: 150,
        ..TaskSpec::new(TaskName::BitXor)
    };
    agrees(&spec("gpt2", task), &[Split::Test], 150);
}

/// A small MiniLM (BERT) on token sequences (a custom task, padded to its longest record):
/// 160 test examples in batches of 64, 64 and 32 (two shapes, each with buffers of its
/// own), and the 70 of the training split.
#[test]
fn replayed_evaluation_equals_the_trainers_on_tokens() {
    let data = tempfile::tempdir().unwrap();
    let mut lines = String::new();
    for i in 0..230usize {
        let split = if i < 70 { "train" } else { "test" };
        let len = 3 + i % 5;
        let toks: Vec<String> = (0..len).map(|k| ((i * 7 + k * 3) % 11).to_string()).collect();
        lines.push_str(&format!(
            "{{\"tokens\": [{}], \"label\": {}, \"split\": \"{split}\"}}\n",
            toks.join(", "),
            (i / 2) % 3
        ));
    }
    let file = data.path().join("d.jsonl");
    std::fs::write(&file, lines).unwrap();
    let task = TaskSpec::parse(&format!("custom:{}", file.display())).unwrap();
    agrees(&spec("minilm", task.clone()), &[Split::Test], 160);
    let s = spec("minilm", task);
    let tr = Trainer::new(&s, &Device::Cpu).unwrap();
    let (want, got) = (
        tr.tally(Split::Train).unwrap(),
        EvalReplay::new().tally(&tr, Split::Train).unwrap(),
    );
    assert_eq!(bits(&got), bits(&want), "the training split");
}

/// Tallying kept batches at the end is tallying them one by one; no batch, no labels.
#[test]
fn a_tally_of_kept_batches_is_the_tally_of_each() {
    use candle_core::Tensor;
    let dev = Device::Cpu;
    let batches: Vec<(Tensor, Tensor)> = [(3usize, 0.5f32), (2, -1.0), (1, 2.0)]
        .iter()
        .map(|&(n, s)| {
            let logits: Vec<f32> = (0..n * 4).map(|i| ((i as f32) * 0.37 + s).sin()).collect();
            let labels: Vec<u32> = (0..n as u32).map(|i| (i * 3 + 1) % 4).collect();
            (
                Tensor::from_vec(logits, (n, 4), &dev).unwrap(),
                Tensor::from_vec(labels, n, &dev).unwrap(),
            )
        })
        .collect();
    let mut one_by_one = Tally::default();
    for (l, t) in &batches {
        one_by_one.add(l, t, 1).unwrap();
    }
    let mut kept = Tally::default();
    kept.add_batches(&batches, 1).unwrap();
    assert_eq!(bits(&kept), bits(&one_by_one));
    // In two parts, and with nothing added: the same.
    let mut parts = Tally::default();
    parts.add_batches(&batches[..1], 1).unwrap();
    parts.add_batches(&[], 1).unwrap();
    parts.add_batches(&batches[1..], 1).unwrap();
    assert_eq!(bits(&parts), bits(&one_by_one));
}

//! A steady-state training step copies nothing between the host and the device but its
//! batches (inputs and labels, uploaded) and one download (the micro-batches' losses and
//! the gradient norm, read once to skip a non-finite update): every copy fpt makes goes
//! through `fpt_nn::transfer`, which counts them on every device, so this runs here on the
//! CPU and says what a GPU step would copy. Constants (masks, rotary tables, relative
//! position buckets) are made at the first step and kept. One test per backbone family
//! that has its own constants, in one binary with one test function so that no other test
//! copies meanwhile.

use candle_core::Device;
use fpt_nn::transfer;
use fpt_spec::{BackboneSpec, Init, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainSpec};
use fpt_train::Trainer;

fn spec(source: &str, shape: ShapeOverrides, micro: usize) -> RunSpec {
    let mut task = TaskSpec::new(TaskName::BitXor);
    task.eval_examples = 64;
    RunSpec {
        train: TrainSpec {
            steps: 10,
            batch_size: 8,
            micro_batch_size: micro,
            clip_norm: Some(1.0),
            eval_every: 100,
            seed: 0,
            ..TrainSpec::default()
        },
        ..RunSpec::new(
            task,
            BackboneSpec {
                shape,
                ..BackboneSpec::new(source, Init::Random)
            },
        )
    }
}

fn small(layers: usize, hidden: usize, heads: usize) -> ShapeOverrides {
    ShapeOverrides {
        layers: Some(layers),
        hidden: Some(hidden),
        heads: Some(heads),
        ..Default::default()
    }
}

#[test]
fn a_steady_step_copies_only_its_batches_and_one_read_back() {
    let cases = [
        ("gpt2", small(2, 32, 2), 8),
        // Gradient accumulation: two micro-batches, still one read-back.
        ("gpt2", small(2, 32, 2), 4),
        ("minilm", small(2, 32, 2), 8),
        ("t5-base", small(2, 32, 2), 8),
        (
            "smollm2",
            ShapeOverrides {
                layers: Some(1),
                ..Default::default()
            },
            8,
        ),
    ];
    for (source, shape, micro) in cases {
        let s = spec(source, shape, micro);
        assert!(
            s.input_dropout > 0.0 && s.backbone_dropout,
            "the steps must draw dropout masks"
        );
        let mut tr = Trainer::new(&s, &Device::Cpu).unwrap();
        // The first step makes the constants.
        tr.step().unwrap();
        let before = transfer::counts();
        let steps = 3;
        for _ in 0..steps {
            assert!(tr.step().unwrap().finite);
        }
        let d = transfer::counts().since(before);
        let micro_batches = (s.train.batch_size / micro) as u64;
        // Per micro-batch: the inputs and the labels.
        assert_eq!(
            d.uploads,
            steps * micro_batches * 2,
            "{source} (micro-batch {micro}): {d:?}"
        );
        // Inputs and labels only: no upload as large as a dropout mask would be.
        let per_batch = d.upload_bytes / (steps * micro_batches);
        assert!(per_batch < 4096, "{source}: {per_batch} bytes a batch");
        assert_eq!(d.downloads, steps, "{source} (micro-batch {micro}): {d:?}");
        // The losses (one per micro-batch) and the norm, as f64.
        assert_eq!(d.download_bytes, steps * (micro_batches + 1) * 8, "{source}: {d:?}");
    }
}

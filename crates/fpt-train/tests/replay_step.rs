//! The replayed step (what a CUDA graph of a training step runs: the batch in fixed
//! buffers, the dropout seeds in slots, Adam's update decided on the device) against the
//! trainer's own step, on the CPU where it runs eagerly through the same buffers, slots
//! and gate: the same losses, norms and learning rates, and the same parameters, moments
//! and streams to the last bit. The capture itself needs a GPU (`fpt bench --graph`).

use candle_core::Device;
use fpt_spec::{BackboneSpec, Init, LrSchedule, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainSpec};
use fpt_train::{StepOutcome, Trainer};

fn spec(source: &str, task: TaskName, steps: usize, micro: usize) -> RunSpec {
    RunSpec {
        train: TrainSpec {
            steps,
            batch_size: 4,
            micro_batch_size: micro,
            seed: 11,
            lr_schedule: LrSchedule::Linear { warmup_steps: 3 },
            ..TrainSpec::default()
        },
        ..RunSpec::new(
            TaskSpec::new(task),
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

fn trained(t: &Trainer) -> Vec<(String, Vec<u32>)> {
    t.model()
        .trainable()
        .iter()
        .map(|(n, v)| {
            let bits = v.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            (n.clone(), bits.iter().map(|x| x.to_bits()).collect())
        })
        .collect()
}

fn bits(o: &StepOutcome) -> (u64, u64, u64, bool) {
    (o.loss.to_bits(), o.grad_norm.to_bits(), o.lr.to_bits(), o.finite)
}

/// Seven steps of a small GPT-2 and MiniLM (BERT) with every dropout on (input, embeddings,
/// attention, residual) and a warm-up schedule, drained every third step: the replayed
/// steps' outcomes and parameters equal the trainer's steps', and a step of each after
/// them (the data and dropout streams where they should be) still agrees.
#[test]
fn replayed_steps_equal_the_trainers_steps_bit_for_bit() {
    for (source, task) in [("gpt2", TaskName::BitXor), ("minilm", TaskName::BitMemory)] {
        let s = spec(source, task, 20, 4);
        let (mut a, mut b) = (
            Trainer::new(&s, &Device::Cpu).unwrap(),
            Trainer::new(&s, &Device::Cpu).unwrap(),
        );
        let want: Vec<_> = (0..7).map(|_| bits(&a.step().unwrap())).collect();
        let mut r = b.replay_step(4).unwrap();
        let mut got = Vec::new();
        for i in 0..7 {
            r.step(&mut b).unwrap();
            if i % 3 == 2 || i == 6 {
                got.extend(r.drain(&mut b).unwrap().iter().map(bits));
            }
        }
        assert!(!r.captured(), "{source}: no capture without a GPU");
        assert_eq!(got, want, "{source}: outcomes");
        assert_eq!(trained(&b), trained(&a), "{source}: parameters");
        assert_eq!(b.steps_done(), a.steps_done(), "{source}");
        assert_eq!(
            bits(&b.step().unwrap()),
            bits(&a.step().unwrap()),
            "{source}: the step after"
        );
        assert_eq!(trained(&b), trained(&a), "{source}: parameters after");
    }
}

/// A drain later than the ring holds, a step past the table of the run's steps, and a
/// batch in micro-batches are errors that say so.
#[test]
fn replays_refuse_what_they_cannot_account_for() {
    let s = spec("gpt2", TaskName::BitXor, 3, 4);
    let mut b = Trainer::new(&s, &Device::Cpu).unwrap();
    let mut r = b.replay_step(2).unwrap();
    for _ in 0..3 {
        r.step(&mut b).unwrap();
    }
    let err = r.drain(&mut b).unwrap_err().to_string();
    assert!(err.contains("overran the gate's ring of 2"), "{err}");

    let mut b = Trainer::new(&s, &Device::Cpu).unwrap();
    let mut r = b.replay_step(8).unwrap();
    for _ in 0..4 {
        r.step(&mut b).unwrap();
    }
    let err = r.drain(&mut b).unwrap_err().to_string();
    assert!(err.contains("past the gate's table"), "{err}");

    let b = Trainer::new(&spec("gpt2", TaskName::BitXor, 3, 2), &Device::Cpu).unwrap();
    let err = b.replay_step(8).err().expect("refused").to_string();
    assert!(err.contains("accumulates"), "{err}");
}

/// The LSTM draws its dropout masks on the host and uploads them: its steps cannot be
/// replayed, and the replay says why at its first bound step instead of freezing a mask.
#[test]
fn host_drawn_masks_are_refused() {
    let mut s = spec("lstm", TaskName::BitXor, 10, 4);
    s.backbone.shape.heads = None;
    let mut b = Trainer::new(&s, &Device::Cpu).unwrap();
    let mut r = b.replay_step(4).unwrap();
    r.step(&mut b).unwrap(); // the first step counts the seeds, unbound
    let err = r.step(&mut b).expect_err("refused").to_string();
    assert!(err.contains("copies between host and device"), "{err}");
}

/// What `FPT_STEP` asks for, and when a run replays by default: on a GPU only, and only a
/// run that can (each reason it cannot is named: a batch in micro-batches, a backbone that
/// draws on the host).
#[test]
fn the_default_replays_on_a_gpu_where_the_run_can() {
    use fpt_train::replay_step::{parse_step_kind, replays, StepKind};
    assert_eq!(parse_step_kind(None).unwrap(), StepKind::Auto);
    assert_eq!(parse_step_kind(Some(" auto")).unwrap(), StepKind::Auto);
    assert_eq!(parse_step_kind(Some("")).unwrap(), StepKind::Auto);
    assert_eq!(parse_step_kind(Some("eager")).unwrap(), StepKind::Eager);
    assert_eq!(parse_step_kind(Some("replay")).unwrap(), StepKind::Replay);
    let err = parse_step_kind(Some("graph")).unwrap_err().to_string();
    assert!(err.contains("FPT_STEP=graph") && err.contains("`auto`"), "{err}");
    // (kind, on a GPU, blocked) -> replays
    for (kind, gpu, blocked, want) in [
        (StepKind::Auto, true, false, true),
        (StepKind::Auto, true, true, false),
        (StepKind::Auto, false, false, false),
        (StepKind::Eager, true, false, false),
        (StepKind::Replay, false, false, true),
    ] {
        assert_eq!(
            replays(kind, gpu, blocked.then_some("why")),
            want,
            "{kind:?} {gpu} {blocked}"
        );
    }

    let blocker = |t: &Trainer| t.replay_blocker();
    assert_eq!(
        blocker(&Trainer::new(&spec("gpt2", TaskName::BitXor, 3, 4), &Device::Cpu).unwrap()),
        None
    );
    let why = blocker(&Trainer::new(&spec("gpt2", TaskName::BitXor, 3, 2), &Device::Cpu).unwrap()).unwrap();
    assert!(why.contains("accumulates"), "{why}");
    let mut s = spec("lstm", TaskName::BitXor, 3, 4);
    s.backbone.shape.heads = None;
    let why = blocker(&Trainer::new(&s, &Device::Cpu).unwrap()).unwrap();
    assert!(why.contains("LSTM") && why.contains("host"), "{why}");
}

/// Token sequences padded to the longest of each batch (TAPE's collate) give batches of
/// many shapes: nothing stops their replay, each shape gets its own buffers, and the
/// replayed steps equal the trainer's to the last bit, parameters included.
#[test]
fn batches_of_many_shapes_replay_each_in_its_own_buffers() {
    use fpt_tasks::data::{Dataset, DatasetTask, Encoding, Examples};
    let data = |n: usize| Dataset {
        examples: Examples::Tokens((0..n).map(|i| vec![1 + (i % 5) as u32; 3 + i % 4]).collect()),
        labels: (0..n).map(|i| (i % 2) as u32).collect(),
        lengths: (0..n).map(|i| (3 + i % 4) as u32).collect(),
    };
    let task = || {
        let encoding = Encoding::Tokens {
            len: 8,
            pad: 0,
            per_batch: true,
            left: false,
        };
        Box::new(
            DatasetTask::new(
                TaskName::Homology,
                data(12),
                data(6),
                encoding,
                2,
                8,
                &fpt_nn::Rng::new(1),
            )
            .unwrap(),
        )
    };
    let s = spec("gpt2", TaskName::Homology, 12, 2);
    let s = RunSpec {
        train: TrainSpec {
            batch_size: 2,
            ..s.train
        },
        ..s
    };
    let (mut a, mut b) = (
        Trainer::with_task(&s, task(), &Device::Cpu).unwrap(),
        Trainer::with_task(&s, task(), &Device::Cpu).unwrap(),
    );
    assert_eq!(b.replay_blocker(), None);
    let want: Vec<_> = (0..10).map(|_| bits(&a.step().unwrap())).collect();
    let mut r = b.replay_step(4).unwrap();
    let mut got = Vec::new();
    for i in 0..10 {
        r.step(&mut b).unwrap();
        if i % 3 == 2 || i == 9 {
            got.extend(r.drain(&mut b).unwrap().iter().map(bits));
        }
    }
    assert!(r.shapes() > 1, "the batches took {} shape(s)", r.shapes());
    assert_eq!(r.captured_shapes(), 0, "no capture without a GPU");
    assert_eq!(got, want, "outcomes");
    assert_eq!(trained(&b), trained(&a), "parameters");
    assert_eq!(bits(&b.step().unwrap()), bits(&a.step().unwrap()), "the step after");
}

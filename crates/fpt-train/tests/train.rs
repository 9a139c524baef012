//! The training loop on tiny random GPT-2s: frozen tensors stay bitwise unchanged and never
//! get gradients, runs are deterministic, accumulation equals a full batch, bit XOR is
//! learned, divergence is caught.

use candle_core::Device;
use fpt_spec::{BackboneSpec, Init, ResidualInit, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainGroups, TrainSpec};
use fpt_train::{train, RunResult, Trainer};
use std::collections::HashSet;

fn tiny(task: TaskName, steps: usize) -> RunSpec {
    let mut t = TaskSpec::new(task);
    t.eval_examples = 256;
    if task == TaskName::BitMemory {
        t.n_bits = Some(20);
        t.patch = Some(5);
    }
    RunSpec {
        task: t,
        backbone: BackboneSpec {
            source: "gpt2".into(),
            init: Init::Random,
            shape: ShapeOverrides {
                layers: Some(2),
                hidden: Some(32),
                heads: Some(2),
                positions: Some(32),
                ..Default::default()
            },
            residual_init: ResidualInit::Scaled,
            depth: None,
            final_norm: true,
            bit_pretrain: None,
            precision: Default::default(),
        },
        train_groups: TrainGroups::fpt(),
        train: TrainSpec {
            steps,
            batch_size: 32,
            micro_batch_size: 32,
            lr: 1e-3,
            clip_norm: Some(1.0),
            eval_every: 100,
            seed: 0,
            ..TrainSpec::default()
        },
        input_dropout: 0.1,
        orth_gain: 1.41,
        input_init: fpt_spec::InputInit::Orthogonal,
        backbone_dropout: true,
        model: fpt_spec::ModelKind::Fpt,
    }
}

fn snapshot(tr: &Trainer) -> Vec<(String, bool, Vec<u32>)> {
    tr.model()
        .params()
        .into_iter()
        .map(|(n, _, p)| {
            let bits = p
                .tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            (n, p.is_trainable(), bits)
        })
        .collect()
}

#[test]
fn frozen_tensors_are_bitwise_unchanged_and_never_get_gradients() {
    let spec = tiny(TaskName::BitXor, 1);
    let mut tr = Trainer::new(&spec, &Device::Cpu).unwrap();
    let before = snapshot(&tr);
    let trainable_ids: HashSet<_> = tr.model().trainable().iter().map(|(_, v)| v.as_tensor().id()).collect();
    let (_, grads) = tr.micro_batch_grads().unwrap();
    let stored: HashSet<_> = grads.get_ids().copied().collect();
    assert!(!stored.is_empty());
    let extra: Vec<_> = stored
        .difference(&trainable_ids)
        .map(|id| grads.get_id(*id).unwrap().dims().to_vec())
        .collect();
    assert!(
        extra.is_empty(),
        "the gradient store holds tensors that are not trainable: {extra:?}"
    );
    for _ in 0..5 {
        assert!(tr.step().unwrap().finite);
    }
    let after = snapshot(&tr);
    let (mut frozen, mut moved) = (0, 0);
    for ((name, trainable, a), (_, _, b)) in before.iter().zip(&after) {
        if *trainable {
            moved += usize::from(a != b);
        } else {
            assert_eq!(a, b, "frozen tensor {name} changed");
            frozen += 1;
        }
    }
    assert!(frozen >= 2 * 4, "attention and MLP tensors of 2 blocks are frozen");
    assert!(moved > 0, "no trainable tensor moved");
}

fn strip_time(r: &RunResult) -> RunResult {
    RunResult {
        wall_seconds: 0.0,
        ..r.clone()
    }
}

#[test]
fn same_spec_and_seed_give_the_same_numbers() {
    let spec = tiny(TaskName::BitMemory, 30);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ra = train(&spec, a.path(), &Device::Cpu, &mut |_| {}).unwrap();
    let rb = train(&spec, b.path(), &Device::Cpu, &mut |_| {}).unwrap();
    assert_eq!(strip_time(&ra), strip_time(&rb));
    let mut other = spec.clone();
    other.train.seed = 1;
    let c = tempfile::tempdir().unwrap();
    let rc = train(&other, c.path(), &Device::Cpu, &mut |_| {}).unwrap();
    assert_ne!(ra.test_loss, rc.test_loss);
    // The run directory holds the effective spec, the metrics and the result.
    let saved: RunSpec = serde_json::from_str(&std::fs::read_to_string(a.path().join("spec.json")).unwrap()).unwrap();
    assert_eq!(saved, spec);
    let back: RunResult =
        serde_json::from_str(&std::fs::read_to_string(a.path().join("result.json")).unwrap()).unwrap();
    assert_eq!(strip_time(&back), strip_time(&ra));
    let lines = std::fs::read_to_string(a.path().join("metrics.jsonl")).unwrap();
    assert_eq!(
        lines.lines().count(),
        1,
        "one evaluation at the last step (30 < eval_every)"
    );
    // Each evaluation times itself, within the run's time.
    let rec: fpt_train::EvalRecord = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    let e = rec.eval_s.expect("eval_s recorded");
    assert!(e > 0.0 && e < rec.elapsed_s, "{e} s of {} s", rec.elapsed_s);
}

#[test]
fn gradient_accumulation_equals_the_full_batch() {
    let mut full = tiny(TaskName::BitXor, 1);
    full.input_dropout = 0.0;
    full.backbone_dropout = false;
    full.train.batch_size = 16;
    full.train.micro_batch_size = 16;
    let mut acc = full.clone();
    acc.train.micro_batch_size = 4;
    let mut a = Trainer::new(&full, &Device::Cpu).unwrap();
    let mut b = Trainer::new(&acc, &Device::Cpu).unwrap();
    let (oa, ob) = (a.step().unwrap(), b.step().unwrap());
    assert!((oa.loss - ob.loss).abs() < 1e-5, "{} vs {}", oa.loss, ob.loss);
    assert!((oa.grad_norm - ob.grad_norm).abs() < 1e-4 * oa.grad_norm.max(1.0));
    for ((n, va), (_, vb)) in a.model().trainable().iter().zip(b.model().trainable()) {
        let d = (va.as_tensor() - vb.as_tensor())
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(d < 1e-5, "{n} differs by {d}");
    }
}

#[test]
fn tiny_gpt2_learns_bit_xor() {
    // Fully trained, a 2 x 32 x 2 GPT-2 solves Bit XOR in a few hundred steps (the frozen
    // 4 x 128 x 4 run of the README needs ~2750 steps: too slow for a test).
    let mut spec = tiny(TaskName::BitXor, 500);
    spec.train_groups = TrainGroups::all();
    spec.train.eval_every = 250;
    let dir = tempfile::tempdir().unwrap();
    let r = train(&spec, dir.path(), &Device::Cpu, &mut |_| {}).unwrap();
    assert!(
        r.test_accuracy > 0.95,
        "bit XOR accuracy {} after 500 steps",
        r.test_accuracy
    );
    assert_eq!(r.steps, 500);
    assert_eq!(r.eval_examples, 256);
}

#[test]
fn divergence_is_caught_and_reported() {
    let mut spec = tiny(TaskName::BitXor, 50);
    spec.train.lr = 1e30;
    spec.train.clip_norm = None;
    let dir = tempfile::tempdir().unwrap();
    let mut seen = None;
    let r = train(&spec, dir.path(), &Device::Cpu, &mut |e| {
        if let fpt_train::Event::Diverged(s) = e {
            seen = Some(*s);
        }
    })
    .unwrap();
    assert!(r.diverged_at_step.is_some(), "{r:?}");
    assert_eq!(r.diverged_at_step, seen);
    assert_eq!(r.steps + 1, r.diverged_at_step.unwrap());
    assert!(dir.path().join("result.json").is_file());
}

/// A loss that explodes without ever being non-finite (a learning rate ramped up to 3)
/// is caught as divergence; the result keeps the best evaluation before it, and the last
/// checkpoint holds that evaluation's tensors, so `evaluate_run` gives the same accuracy.
#[test]
fn a_loss_blowing_up_is_divergence_and_the_best_evaluation_is_kept() {
    let mut spec = tiny(TaskName::BitXor, 400);
    spec.train.lr = 3.0;
    spec.train.lr_schedule = "linear:300".parse().unwrap();
    spec.train.clip_norm = None;
    spec.train.eval_every = 5;
    let dir = tempfile::tempdir().unwrap();
    let r = train(&spec, dir.path(), &Device::Cpu, &mut |_| {}).unwrap();
    assert!(r.diverged, "{r:?}");
    let at = r.diverged_at_step.unwrap();
    assert!(at < 400 && r.best_step < at, "{r:?}");
    assert!(r.diverged_reason.as_deref().unwrap().contains("first step"), "{r:?}");
    assert_eq!(r.test_accuracy, r.best_accuracy, "{r:?}");
    let (_, acc, _, step) = fpt_train::evaluate_run(dir.path(), &Device::Cpu).unwrap();
    assert_eq!(
        acc, r.best_accuracy,
        "the checkpoint holds the best evaluation's tensors (step {step})"
    );
}

#[test]
fn nothing_to_train_is_an_error() {
    let mut spec = tiny(TaskName::BitXor, 1);
    spec.train_groups = TrainGroups::none();
    let e = Trainer::new(&spec, &Device::Cpu).err().unwrap().to_string();
    assert!(e.contains("nothing to train"), "{e}");
}

#[test]
fn bench_times_the_tiny_shape_and_counts_c10_flops() {
    use fpt_train::bench;
    let c10 = bench::shape("c10").unwrap();
    // The estimate is ~360 GFLOP for forward plus activation-only backward of the
    // whole model (355.5 exactly); fpt executes less: its last block runs projection and MLP
    // for the read-out token only (11 full layers + 3C^2 per token + 9C^2 once, x2 for
    // backward: 326.5 GFLOP of linears) and attention's seven T x T products (7.8 GFLOP).
    let gflop = c10.step_flops(false) / 1e9;
    assert!((gflop - 334.25).abs() < 0.01, "{gflop}");
    assert!(c10.step_flops(true) > c10.step_flops(false));
    let r = bench::run(
        &bench::shape("tiny").unwrap(),
        1,
        2,
        true,
        &Device::Cpu,
        fpt_spec::Precision::F32,
    )
    .unwrap();
    assert!(r.ours_ms > 0.0 && r.full_ms.unwrap() > 0.0 && r.peak_gflops > 0.0);
    assert!((r.peak_fraction - r.gflops / r.peak_gflops).abs() < 1e-12);
    assert!(bench::shape("nope").is_none());
    // The MiniLM and LSTM shapes: found with or without the backbone's prefix, and their
    // FLOPs from the per-token counts (BERT as GPT-2: 12 C^2 per token and layer, the last
    // layer 3 C^2 per token and 9 C^2 per read-out token; LSTM: 8 H^2), forward plus input
    // gradients.
    let m = bench::find(bench::Arch::Minilm, "mnist").unwrap();
    assert_eq!(m, bench::shape("minilm-mnist").unwrap());
    assert_eq!((m.layers, m.hidden, m.batch, m.tokens), (6, 384, 16, 49));
    let c2 = 384.0 * 384.0;
    let linear = 16.0 * (5.0 * 49.0 * 12.0 * c2 + 49.0 * 3.0 * c2 + 9.0 * c2);
    let attn = 16.0 * (5.0 * 49.0 * 49.0 * 384.0 + 49.0 * 384.0);
    let bert = 2.0 * 2.0 * linear + 2.0 * 7.0 * attn;
    assert!((m.step_flops(false) - bert).abs() < 1.0, "{}", m.step_flops(false));
    let l = bench::find(bench::Arch::Lstm, "listops").unwrap();
    assert_eq!((l.layers, l.hidden, l.readout), (3, 256, 1));
    assert!((l.step_flops(true) / l.step_flops(false) - 1.5).abs() < 1e-12);
    assert!(bench::find(bench::Arch::Lstm, "c10").is_none());
    assert_eq!(bench::shapes_for(bench::Arch::Minilm).len(), 3);
    // SmolLM2: q, o (C^2), k, v (C x 3 heads x 64), the SwiGLU (3 C x 1536), every token.
    let s = bench::find(bench::Arch::Smollm2, "mnist").unwrap();
    let (c, t) = (576.0, 49.0);
    let per_token = 2.0 * c * c + 2.0 * c * 192.0 + 3.0 * c * 1536.0;
    let want = 2.0 * 2.0 * 16.0 * 30.0 * t * per_token + 2.0 * 7.0 * 16.0 * 30.0 * t * t * c;
    assert!((s.step_flops(false) - want).abs() < 1.0, "{}", s.step_flops(false));
    let r = bench::run(
        &bench::shape("lstm-bitxor").unwrap(),
        0,
        1,
        false,
        &Device::Cpu,
        fpt_spec::Precision::F32,
    )
    .unwrap();
    assert!(r.ours_ms > 0.0 && !r.kernel_path.is_empty());
}

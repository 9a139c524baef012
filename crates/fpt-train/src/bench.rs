//! Timing of one training step at named shapes (issue "engine speed"): the FPT step
//! (input, output, LayerNorm and positions train) and the full fine-tune step, on a
//! randomly initialised GPT-2 of the shape, with synthetic data of the task's shapes.
//!
//! Shapes: `tiny` (for CI), `c10` (GPT-2 base, batch 16 x 64 tokens of width 48, 10
//! classes), `lra` (GPT-2 base, batch 2 x 1024 tokens of width 1), `listops` (GPT-2 base,
//! batch 4 x 512 tokens through an Embedding of 15 ids).

use crate::{Result, Trainer};
use candle_core::{Device, Tensor};
use fpt_spec::{BackboneSpec, Init, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainGroups, TrainSpec};
use fpt_tasks::{InputKind, Synthetic, TaskDims};
use serde::Serialize;
use std::time::Instant;

/// A benchmark shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Shape {
    /// Its name.
    pub name: &'static str,
    /// GPT-2 blocks.
    pub layers: usize,
    /// Width.
    pub hidden: usize,
    /// Heads.
    pub heads: usize,
    /// Examples per step.
    pub batch: usize,
    /// Tokens per example.
    pub tokens: usize,
    /// Token kind.
    pub input: InputKind,
    /// Classes.
    pub classes: usize,
}

/// Every named shape.
pub const SHAPES: [Shape; 4] = [
    Shape {
        name: "tiny",
        layers: 2,
        hidden: 64,
        heads: 4,
        batch: 4,
        tokens: 16,
        input: InputKind::Vectors { width: 8 },
        classes: 10,
    },
    Shape {
        name: "c10",
        layers: 12,
        hidden: 768,
        heads: 12,
        batch: 16,
        tokens: 64,
        input: InputKind::Vectors { width: 48 },
        classes: 10,
    },
    Shape {
        name: "lra",
        layers: 12,
        hidden: 768,
        heads: 12,
        batch: 2,
        tokens: 1024,
        input: InputKind::Vectors { width: 1 },
        classes: 10,
    },
    Shape {
        name: "listops",
        layers: 12,
        hidden: 768,
        heads: 12,
        batch: 4,
        tokens: 512,
        input: InputKind::Tokens { vocab: 15 },
        classes: 10,
    },
];

/// The shape of that name.
pub fn shape(name: &str) -> Option<Shape> {
    SHAPES.iter().copied().find(|s| s.name == name)
}

impl Shape {
    /// Matmul FLOPs fpt executes for one step (2 per multiply-add), read out at the last
    /// token: the blocks' linear layers (12 C^2 multiply-adds per token and layer, except
    /// that the last block runs only Q/K/V (3 C^2) for every token and its projection and
    /// MLP (9 C^2) for the read-out token), their input gradients in backward (as much
    /// again), the weight gradients too when `full`; attention's two T x T products per
    /// layer forward and five backward (four plus the recomputed scores; the last layer
    /// has one query).
    pub fn step_flops(&self, full: bool) -> f64 {
        let (b, t, c, l) = (
            self.batch as f64,
            self.tokens as f64,
            self.hidden as f64,
            self.layers as f64,
        );
        let per_token = 12.0 * c * c;
        let linear_macs = b * ((l - 1.0) * t * per_token + t * 3.0 * c * c + 9.0 * c * c);
        let linear = 2.0 * linear_macs * if full { 3.0 } else { 2.0 };
        let attn_macs = b * ((l - 1.0) * t * t * c + t * c);
        let attention = 2.0 * attn_macs * 7.0;
        linear + attention
    }

    fn spec(&self, groups: TrainGroups) -> RunSpec {
        RunSpec {
            task: TaskSpec::new(TaskName::BitXor),
            backbone: BackboneSpec {
                source: "gpt2".into(),
                init: Init::Random,
                shape: ShapeOverrides {
                    layers: Some(self.layers),
                    hidden: Some(self.hidden),
                    heads: Some(self.heads),
                    positions: Some(self.tokens.max(1024)),
                    ..Default::default()
                },
                residual_init: Default::default(),
                depth: None,
                final_norm: true,
                bit_pretrain: None,
            },
            train_groups: groups,
            train: TrainSpec {
                batch_size: self.batch,
                micro_batch_size: self.batch,
                ..TrainSpec::default()
            },
            input_dropout: 0.1,
            orth_gain: 1.41,
            backbone_dropout: true,
        }
    }

    fn dims(&self) -> TaskDims {
        TaskDims {
            input: self.input,
            seq_len: self.tokens,
            readout_tokens: 1,
            labels_per_example: 1,
            classes: self.classes,
        }
    }
}

/// Median, minimum and maximum of a list of milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Timing {
    /// Median.
    pub median_ms: f64,
    /// Fastest.
    pub min_ms: f64,
    /// Slowest.
    pub max_ms: f64,
}

fn timing(mut ms: Vec<f64>) -> Timing {
    ms.sort_by(|a, b| a.total_cmp(b));
    Timing {
        median_ms: ms[ms.len() / 2],
        min_ms: ms[0],
        max_ms: ms[ms.len() - 1],
    }
}

/// Times `steps` optimizer steps after `warmup` of the FPT (`groups`) model of `shape`.
pub fn time_steps(shape: &Shape, groups: TrainGroups, warmup: usize, steps: usize, device: &Device) -> Result<Timing> {
    let mut tr = Trainer::with_task(&shape.spec(groups), Box::new(Synthetic::new(shape.dims())), device)?;
    for _ in 0..warmup {
        tr.step()?;
    }
    let mut ms = Vec::with_capacity(steps);
    for _ in 0..steps.max(1) {
        let t0 = Instant::now();
        tr.step()?;
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(timing(ms))
}

/// The matmul throughput fpt's linear layers reach here: `x W^T` for `x: [1024, 768]` and
/// `W: [3072, 768]` (GPT-2 base's MLP on 1024 tokens) through [`fpt_nn::ops::linear`], the
/// product every step runs, best of 9 after a warm-up, in GFLOP/s. (On CPU that is fpt's
/// AVX-512 kernel where the CPU has one; elsewhere the backend's matmul.)
pub fn matmul_peak(device: &Device) -> Result<f64> {
    let a = Tensor::randn(0f32, 1.0, (1024, 768), device)?;
    let w = Tensor::randn(0f32, 1.0, (3072, 768), device)?;
    fpt_nn::ops::linear(&a, &w, None)?;
    let mut best = f64::INFINITY;
    for _ in 0..9 {
        let t0 = Instant::now();
        let c = fpt_nn::ops::linear(&a, &w, None)?;
        device.synchronize()?;
        drop(c);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    Ok(2.0 * 1024.0 * 768.0 * 3072.0 / best / 1e9)
}

/// Peak resident memory of this process so far, in MB (Linux `VmHWM`).
pub fn peak_rss_mb() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// One shape's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    /// The shape.
    pub shape: Shape,
    /// FPT step (median, ms).
    pub ours_ms: f64,
    /// Its spread.
    pub ours: Timing,
    /// Full fine-tune step (median, ms), when measured.
    pub full_ms: Option<f64>,
    /// Matmul GFLOP/s of the FPT step (`step_flops / ours_ms`).
    pub gflops: f64,
    /// The matmul peak measured in the same run (GFLOP/s).
    pub peak_gflops: f64,
    /// `gflops / peak_gflops`.
    pub peak_fraction: f64,
    /// Peak resident memory of the process (MB).
    pub peak_rss_mb: Option<f64>,
}

/// Benchmarks one shape: the FPT step, then (if `full`) the full fine-tune step.
pub fn run(shape: &Shape, warmup: usize, steps: usize, full: bool, device: &Device) -> Result<BenchResult> {
    let before = matmul_peak(device)?;
    let ours = time_steps(shape, TrainGroups::fpt(), warmup, steps, device)?;
    // The machine's speed drifts: the peak is the better of a measurement just before and
    // one just after the FPT steps, so a slow moment does not flatter the fraction.
    let peak = before.max(matmul_peak(device)?);
    let rss = peak_rss_mb();
    let full_ms = if full {
        Some(time_steps(shape, TrainGroups::all(), warmup, steps, device)?.median_ms)
    } else {
        None
    };
    let gflops = shape.step_flops(false) / (ours.median_ms / 1e3) / 1e9;
    Ok(BenchResult {
        shape: *shape,
        ours_ms: ours.median_ms,
        ours,
        full_ms,
        gflops,
        peak_gflops: peak,
        peak_fraction: gflops / peak,
        peak_rss_mb: rss,
    })
}

//! Timing of one training step at named shapes (issue "engine speed"): the FPT step
//! (input, output, LayerNorm and positions train) and the full fine-tune step, on a
//! randomly initialised backbone of the shape, with synthetic data of the task's shapes.
//! The step's cost does not depend on the weights' values, so no weights are needed.
//!
//! Shapes, per backbone ([`Arch`]):
//! - GPT-2: `tiny` (for CI), `c10` (GPT-2 base, batch 16 x 64 tokens of width 48, 10
//!   classes), `lra` (batch 2 x 1024 tokens of width 1), `listops` (batch 4 x 512 tokens
//!   through an Embedding of 15 ids).
//! - MiniLM (all-MiniLM-L6-v2's config: BERT, 6 layers x 384, 12 heads, the stand-in for
//!   GPT-2 at the `cpu` scale): `minilm-mnist` (16 x 49 tokens of 16 pixels),
//!   `minilm-listops` (4 x 512 ids), `minilm-bitxor` (32 x 10 bits, 5 read out).
//! - The layer-norm LSTM at the `cpu` scale's size (3 layers x 256): `lstm-bitxor`,
//!   `lstm-listops`.
//! - SmolLM2-135M's config (Llama family, 30 layers x 576, 9 query / 3 key-value heads):
//!   `smollm2-mnist` (16 x 49 tokens of 16 pixels).

use crate::{Result, Trainer};
use candle_core::{Device, Tensor};
use fpt_spec::{BackboneSpec, Init, Precision, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainGroups, TrainSpec};
use fpt_tasks::{InputKind, Synthetic, TaskDims};
use serde::Serialize;
use std::time::Instant;

/// The backbone a benchmark shape runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// GPT-2 (pre-norm, causal) at the shape's size.
    Gpt2,
    /// BERT at all-MiniLM-L6-v2's config (post-norm, bidirectional).
    Minilm,
    /// The reference code's layer-norm LSTM.
    Lstm,
    /// SmolLM2-135M's Llama-family config.
    Smollm2,
}

impl Arch {
    /// Every backbone with shapes.
    pub const ALL: [Arch; 4] = [Arch::Gpt2, Arch::Minilm, Arch::Lstm, Arch::Smollm2];

    /// `gpt2`, `minilm`, `lstm` or `smollm2`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == s)
    }

    /// Its name, as [`Arch::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Gpt2 => "gpt2",
            Arch::Minilm => "minilm",
            Arch::Lstm => "lstm",
            Arch::Smollm2 => "smollm2",
        }
    }
}

/// A benchmark shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Shape {
    /// Its name.
    pub name: &'static str,
    /// The backbone.
    pub arch: Arch,
    /// Blocks (LSTM layers).
    pub layers: usize,
    /// Width.
    pub hidden: usize,
    /// Heads (0 for the LSTM).
    pub heads: usize,
    /// Examples per step.
    pub batch: usize,
    /// Tokens per example.
    pub tokens: usize,
    /// Token kind.
    pub input: InputKind,
    /// Classes.
    pub classes: usize,
    /// Tokens read out at the end (1, or Bit XOR's 5).
    pub readout: usize,
    /// Labels per example.
    pub labels: usize,
}

const GPT2_BASE: Shape = Shape {
    name: "",
    arch: Arch::Gpt2,
    layers: 12,
    hidden: 768,
    heads: 12,
    batch: 16,
    tokens: 64,
    input: InputKind::Vectors { width: 48 },
    classes: 10,
    readout: 1,
    labels: 1,
};
const MINILM: Shape = Shape {
    arch: Arch::Minilm,
    layers: 6,
    hidden: 384,
    heads: 12,
    ..GPT2_BASE
};
const LSTM: Shape = Shape {
    arch: Arch::Lstm,
    layers: 3,
    hidden: 256,
    heads: 0,
    ..GPT2_BASE
};
const LISTOPS: Shape = Shape {
    batch: 4,
    tokens: 512,
    input: InputKind::Tokens { vocab: 15 },
    ..GPT2_BASE
};
const BIT_XOR: Shape = Shape {
    batch: 32,
    tokens: 10,
    input: InputKind::Vectors { width: 1 },
    classes: 2,
    readout: 5,
    labels: 5,
    ..GPT2_BASE
};

/// Every named shape.
pub const SHAPES: [Shape; 10] = [
    Shape {
        name: "tiny",
        layers: 2,
        hidden: 64,
        heads: 4,
        batch: 4,
        tokens: 16,
        input: InputKind::Vectors { width: 8 },
        ..GPT2_BASE
    },
    Shape {
        name: "c10",
        ..GPT2_BASE
    },
    Shape {
        name: "lra",
        batch: 2,
        tokens: 1024,
        input: InputKind::Vectors { width: 1 },
        ..GPT2_BASE
    },
    Shape {
        name: "listops",
        ..LISTOPS
    },
    Shape {
        name: "minilm-mnist",
        tokens: 49,
        input: InputKind::Vectors { width: 16 },
        ..MINILM
    },
    Shape {
        name: "minilm-listops",
        arch: Arch::Minilm,
        layers: MINILM.layers,
        hidden: MINILM.hidden,
        heads: MINILM.heads,
        ..LISTOPS
    },
    Shape {
        name: "minilm-bitxor",
        arch: Arch::Minilm,
        layers: MINILM.layers,
        hidden: MINILM.hidden,
        heads: MINILM.heads,
        ..BIT_XOR
    },
    Shape {
        name: "lstm-bitxor",
        arch: Arch::Lstm,
        layers: LSTM.layers,
        hidden: LSTM.hidden,
        heads: 0,
        ..BIT_XOR
    },
    Shape {
        name: "lstm-listops",
        arch: Arch::Lstm,
        layers: LSTM.layers,
        hidden: LSTM.hidden,
        heads: 0,
        ..LISTOPS
    },
    Shape {
        name: "smollm2-mnist",
        arch: Arch::Smollm2,
        layers: 30,
        hidden: 576,
        heads: 9,
        tokens: 49,
        input: InputKind::Vectors { width: 16 },
        ..GPT2_BASE
    },
];

/// The shape of that name.
pub fn shape(name: &str) -> Option<Shape> {
    SHAPES.iter().copied().find(|s| s.name == name)
}

/// The shapes of a backbone, in [`SHAPES`]' order.
pub fn shapes_for(arch: Arch) -> Vec<Shape> {
    SHAPES.iter().copied().filter(|s| s.arch == arch).collect()
}

/// A shape by its name alone (`c10`, `minilm-mnist`) or by the name without the backbone's
/// prefix (`mnist` with [`Arch::Minilm`]).
pub fn find(arch: Arch, name: &str) -> Option<Shape> {
    shape(&format!("{}-{name}", arch.name()))
        .filter(|s| s.arch == arch)
        .or_else(|| shape(name).filter(|s| s.arch == arch))
}

impl Shape {
    /// Matmul FLOPs fpt executes for one step (2 per multiply-add), with `full` the weight
    /// gradients too.
    ///
    /// GPT-2 and BERT, read out at the last `readout` tokens: the blocks' linear layers (12
    /// C^2 multiply-adds per token and layer, except that the last block runs only Q/K/V (3
    /// C^2) for every token and its projection and MLP (9 C^2) for the read-out tokens),
    /// their input gradients in backward (as much again), the weight gradients too when
    /// `full`; attention's two T x T products per layer forward and five backward (four
    /// plus the recomputed scores; the last layer has `readout` queries). LSTM: the input
    /// and recurrent maps (4 H^2 each per token and layer), twice (forward and input
    /// gradients), thrice when `full`.
    pub fn step_flops(&self, full: bool) -> f64 {
        let (b, t, c, l) = (
            self.batch as f64,
            self.tokens as f64,
            self.hidden as f64,
            self.layers as f64,
        );
        let passes = if full { 3.0 } else { 2.0 };
        let r = self.readout as f64;
        match self.arch {
            Arch::Gpt2 | Arch::Minilm => {
                let per_token = 12.0 * c * c;
                let linear_macs = b * ((l - 1.0) * t * per_token + t * 3.0 * c * c + r * 9.0 * c * c);
                let attn_macs = b * ((l - 1.0) * t * t * c + r * t * c);
                2.0 * linear_macs * passes + 2.0 * attn_macs * 7.0
            }
            Arch::Lstm => 2.0 * b * l * t * 8.0 * c * c * passes,
            Arch::Smollm2 => {
                // Every block runs for every token (no read-out shortcut yet): q and o (C^2
                // each), k and v (C x kv heads x head width each), the SwiGLU's three maps.
                let cfg = fpt_backbones::llama::LlamaConfig::builtin("smollm2").expect("built in");
                let kv = (cfg.kv_heads() * cfg.head_dim()) as f64;
                let f = cfg.intermediate_size as f64;
                let per_token = 2.0 * c * c + 2.0 * c * kv + 3.0 * c * f;
                let linear_macs = b * l * t * per_token;
                let attn_macs = b * l * t * t * c;
                2.0 * linear_macs * passes + 2.0 * attn_macs * 7.0
            }
        }
    }

    /// The run the shape's step trains: a random-init backbone of the shape with `groups`
    /// training and its frozen weights in `precision`, every trainer setting the default
    /// (batch the shape's; Adam 1e-3, clip 1, input and backbone dropout on).
    pub fn spec(&self, groups: TrainGroups, precision: Precision) -> RunSpec {
        let (source, shape) = match self.arch {
            Arch::Gpt2 => (
                "gpt2",
                ShapeOverrides {
                    layers: Some(self.layers),
                    hidden: Some(self.hidden),
                    heads: Some(self.heads),
                    positions: Some(self.tokens.max(1024)),
                    ..Default::default()
                },
            ),
            // The built-in config (512 positions), randomly initialised.
            Arch::Minilm => ("sentence-transformers/all-MiniLM-L6-v2", ShapeOverrides::default()),
            // The built-in config, randomly initialised.
            Arch::Smollm2 => ("smollm2", ShapeOverrides::default()),
            Arch::Lstm => (
                "lstm",
                ShapeOverrides {
                    layers: Some(self.layers),
                    hidden: Some(self.hidden),
                    ..Default::default()
                },
            ),
        };
        let backbone = BackboneSpec {
            shape,
            precision,
            ..BackboneSpec::new(source, Init::Random)
        };
        RunSpec {
            train_groups: groups,
            train: TrainSpec {
                batch_size: self.batch,
                micro_batch_size: self.batch,
                ..TrainSpec::default()
            },
            ..RunSpec::new(TaskSpec::new(TaskName::BitXor), backbone)
        }
    }

    pub(crate) fn dims(&self) -> TaskDims {
        TaskDims {
            input: self.input,
            seq_len: self.tokens,
            readout_tokens: self.readout,
            labels_per_example: self.labels,
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
    /// When the first timed step began (wall clock, seconds since the Unix epoch): with
    /// [`Timing::to_unix`], the window several processes timed at once are compared on.
    pub from_unix: f64,
    /// When the last timed step ended.
    pub to_unix: f64,
}

pub(crate) fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub(crate) fn timing(mut ms: Vec<f64>, from_unix: f64, to_unix: f64) -> Timing {
    ms.sort_by(|a, b| a.total_cmp(b));
    Timing {
        median_ms: ms[ms.len() / 2],
        min_ms: ms[0],
        max_ms: ms[ms.len() - 1],
        from_unix,
        to_unix,
    }
}

/// What runs between the warm-up and the timed steps: nothing, or a wait for the other
/// processes timed at once ([`Gate::Barrier`]), so their timed windows overlap.
#[derive(Debug, Clone, Default)]
pub enum Gate {
    /// Time right after the warm-up.
    #[default]
    Open,
    /// Write `ready-<pid>` into `dir`, then wait until `count` such files are there (every
    /// process of the measurement warmed up), at most `timeout`.
    Barrier {
        /// The directory the processes share.
        dir: std::path::PathBuf,
        /// How many processes are timed at once.
        count: usize,
        /// The longest wait before the measurement is given up, naming the directory.
        timeout: std::time::Duration,
    },
}

impl Gate {
    /// Waits as the gate says.
    pub fn pass(&self) -> Result<()> {
        let Gate::Barrier { dir, count, timeout } = self else {
            return Ok(());
        };
        let io = |source| crate::TrainError::Io {
            path: dir.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        std::fs::write(dir.join(format!("ready-{}", std::process::id())), b"").map_err(io)?;
        let start = Instant::now();
        loop {
            let ready = std::fs::read_dir(dir)
                .map_err(io)?
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("ready-"))
                .count();
            if ready >= *count {
                return Ok(());
            }
            if start.elapsed() > *timeout {
                return Err(crate::run_dir_err(
                    dir,
                    format!(
                        "{ready} of {count} processes timed at once were ready after {:.0} s (a process failed to start, or `--at-once` is larger than the processes started)",
                        timeout.as_secs_f64()
                    ),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

/// Times `steps` optimizer steps after `warmup` of the FPT (`groups`) model of `shape`, its
/// frozen weights in `precision`.
pub fn time_steps(
    shape: &Shape,
    groups: TrainGroups,
    precision: Precision,
    warmup: usize,
    steps: usize,
    device: &Device,
) -> Result<Timing> {
    Ok(time_steps_resident(shape, groups, precision, warmup, steps, device)?.timing)
}

/// What [`time_steps_resident`] measured.
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    /// The steps' times.
    pub timing: Timing,
    /// How much the process's resident memory grew from before the model was built to
    /// after the timed steps (MB, Linux `VmRSS`), with the trainer still alive: the model's
    /// weights (frozen ones as stored and packed), the optimizer's state, and what the
    /// allocator keeps of a step's activations.
    pub model_rss_mb: Option<f64>,
    /// [`frozen_mb`] of the model after the timed steps.
    pub frozen_mb: f64,
    /// The host-device copies of one timed step ([`fpt_nn::transfer`]; averaged).
    pub copies: StepCopies,
    /// Whether the steps were replayed ([`crate::ReplayStep`], `FPT_STEP=replay`).
    pub replayed: bool,
}

/// What one step copied between the host and the device (on the CPU: what it would copy
/// on a GPU, see [`fpt_nn::transfer`]).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct StepCopies {
    /// Copies to the device a step.
    pub uploads: f64,
    /// Their bytes a step.
    pub upload_bytes: f64,
    /// Copies back to the host a step.
    pub downloads: f64,
    /// Their bytes a step.
    pub download_bytes: f64,
}

impl StepCopies {
    fn per_step(c: fpt_nn::transfer::Counts, steps: usize) -> Self {
        let n = steps.max(1) as f64;
        StepCopies {
            uploads: c.uploads as f64 / n,
            upload_bytes: c.upload_bytes as f64 / n,
            downloads: c.downloads as f64 / n,
            download_bytes: c.download_bytes as f64 / n,
        }
    }
}

/// [`time_steps`], with the memory the model took ([`Timed`]).
pub fn time_steps_resident(
    shape: &Shape,
    groups: TrainGroups,
    precision: Precision,
    warmup: usize,
    steps: usize,
    device: &Device,
) -> Result<Timed> {
    time_steps_gated(shape, groups, precision, warmup, steps, device, &Gate::Open, None)
}

/// [`time_steps_resident`], passing `gate` between the warm-up and the timed steps. The
/// steps are replayed as `replay` says, or (`None`) as a run of the shape would take them
/// ([`Trainer::takes_replayed_steps`]: under `FPT_STEP`, by default on a GPU, never where
/// the backbone draws on the host, as an LSTM does).
#[allow(clippy::too_many_arguments)]
fn time_steps_gated(
    shape: &Shape,
    groups: TrainGroups,
    precision: Precision,
    warmup: usize,
    steps: usize,
    device: &Device,
    gate: &Gate,
    replay: Option<bool>,
) -> Result<Timed> {
    use crate::replay_step::{REPLAY_AHEAD, WARM_STEPS};
    let before = rss_mb("VmRSS:");
    let mut spec = shape.spec(groups, precision);
    // A replay's coefficient table covers every step the bench runs.
    spec.train.steps = spec.train.steps.max(warmup + steps + WARM_STEPS + 4);
    let mut tr = Trainer::with_task(&spec, Box::new(Synthetic::new(shape.dims())), device)?;
    let replay = match replay {
        Some(r) => r,
        None => tr.takes_replayed_steps()?,
    };
    for _ in 0..warmup {
        tr.step()?;
    }
    // The replayed step (a CUDA graph on a GPU, captured here, before the timed steps), as
    // a run that replays trains.
    let mut replay = if replay {
        Some(tr.replay_step_warmed(REPLAY_AHEAD)?)
    } else {
        None
    };
    gate.pass()?;
    let mut ms = Vec::with_capacity(steps);
    let copied_before = fpt_nn::transfer::counts();
    let from_unix = unix_now();
    for _ in 0..steps.max(1) {
        let t0 = Instant::now();
        match replay.as_mut() {
            // Its loss read back every step, as the eager step's (and PyTorch's) is.
            Some(r) => drop(r.step(&mut tr).and_then(|()| r.drain(&mut tr))?),
            None => drop(tr.step()?),
        }
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let to_unix = unix_now();
    let copies = StepCopies::per_step(fpt_nn::transfer::counts().since(copied_before), steps.max(1));
    let model_rss_mb = rss_mb("VmRSS:").zip(before).map(|(a, b)| a - b);
    let frozen_mb = frozen_mb(tr.model());
    drop(tr);
    Ok(Timed {
        replayed: replay.is_some(),
        timing: timing(ms, from_unix, to_unix),
        model_rss_mb,
        frozen_mb,
        copies,
    })
}

/// The bytes (MB) the frozen parameters of `model` take as stored (their dtype's size
/// each), plus every frozen weight kept packed for fpt's product in this process.
pub fn frozen_mb(model: &fpt_model::Fpt) -> f64 {
    let stored: usize = model
        .params()
        .iter()
        .filter(|(_, _, p)| !p.is_trainable())
        .map(|(_, _, p)| p.elem_count() * p.tensor().dtype().size_in_bytes())
        .sum();
    (stored + fpt_nn::ops::packed_bytes()) as f64 / (1024.0 * 1024.0)
}

/// The matmul throughput fpt's linear layers reach here: `x W^T` for `x: [1024, 768]` and
/// `W: [3072, 768]` (GPT-2 base's MLP on 1024 tokens) through [`fpt_nn::ops::linear`], the
/// product every step runs, best of 9 after a warm-up, in GFLOP/s. (On CPU that is fpt's
/// AVX-512 kernel where the CPU has one; elsewhere the backend's matmul.)
///
/// With `precision: bf16` the weight is a frozen bf16 layer's ([`fpt_nn::Linear`], packed
/// once as the FPT step's are): the bf16 product's peak on this path.
pub fn matmul_peak(device: &Device, precision: Precision) -> Result<f64> {
    let a = Tensor::randn(0f32, 1.0, (1024, 768), device)?;
    let w = Tensor::randn(0f32, 1.0, (3072, 768), device)?;
    let bf16 = match precision {
        Precision::F32 => None,
        Precision::Bf16 => Some(fpt_nn::Linear::new(
            fpt_nn::Param::new(fpt_nn::ops::bf16::to_bf16(&w)?, false)?,
            None,
        )),
    };
    let product = || match &bf16 {
        None => fpt_nn::ops::linear(&a, &w, None),
        Some(l) => l.forward(&a),
    };
    product()?;
    let mut best = f64::INFINITY;
    for _ in 0..9 {
        let t0 = Instant::now();
        let c = product()?;
        device.synchronize()?;
        drop(c);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    Ok(2.0 * 1024.0 * 768.0 * 3072.0 / best / 1e9)
}

/// Peak resident memory of this process so far, in MB (Linux `VmHWM`).
pub fn peak_rss_mb() -> Option<f64> {
    rss_mb("VmHWM:")
}

/// A memory line of `/proc/self/status` (`VmHWM:`, `VmRSS:`), in MB.
fn rss_mb(key: &str) -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
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
    /// How much resident memory the FPT model added, from before it was built to after its
    /// timed steps (MB; [`time_steps_resident`]).
    pub model_rss_mb: Option<f64>,
    /// What the frozen weights take as stored and packed (MB; [`frozen_mb`]).
    pub frozen_mb: Option<f64>,
    /// The kernel path that ran (`avx512bf16`, `avx512`, `avx2`, `portable`; the device's
    /// name off the CPU).
    pub kernel_path: String,
    /// The frozen weights' number format.
    pub precision: Precision,
    /// Host-device copies a step of the FPT model.
    pub copies: StepCopies,
    /// Whether the FPT steps were replayed (`FPT_STEP=replay`: on a GPU a CUDA graph a
    /// step, its loss read back every step as the eager step's is); `kernel_path` says so too.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
    /// With bf16 weights off the CPU: each product shape's measured choice
    /// (`fpt_nn::ops::bf16_choice`), empty otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bf16_products: Vec<Bf16Choice>,
}

/// One product shape's bf16 choice and the medians that made it (microseconds, forward and
/// input gradient; 0 when `FPT_BF16_PRODUCT` pinned it).
#[derive(Debug, Clone, Serialize)]
pub struct Bf16Choice {
    /// Rows of the input, the weight's inputs and outputs.
    pub rows: usize,
    /// The weight's inputs.
    pub inputs: usize,
    /// The weight's outputs.
    pub outputs: usize,
    /// `autocast` or `widened`.
    pub product: String,
    /// Autocast's median.
    pub autocast_us: f64,
    /// The widened product's median.
    pub widened_us: f64,
}

/// The bf16 choices kept on `device` so far.
fn bf16_choices(device: &Device) -> Vec<Bf16Choice> {
    fpt_nn::ops::bf16_choice::chosen()
        .into_iter()
        .filter(|(s, _)| s.device == device.location())
        .map(|(s, c)| Bf16Choice {
            rows: s.rows,
            inputs: s.inputs,
            outputs: s.outputs,
            product: format!("{:?}", c.product).to_lowercase(),
            autocast_us: c.autocast_s * 1e6,
            widened_us: c.widened_s * 1e6,
        })
        .collect()
}

/// Benchmarks one shape: the FPT step with its frozen weights in `precision`, then (if
/// `full`, and in f32 only: a full fine-tune has no frozen weights) the full fine-tune step.
/// The matmul peak is the product of `precision` (f32, or the frozen bf16 layer's).
pub fn run(
    shape: &Shape,
    warmup: usize,
    steps: usize,
    full: bool,
    device: &Device,
    precision: Precision,
) -> Result<BenchResult> {
    run_gated(shape, warmup, steps, full, device, precision, &Gate::Open)
}

/// [`run`], the FPT step's timed steps behind `gate` (several processes timed at once:
/// `fpt bench --barrier DIR --at-once N`).
pub fn run_gated(
    shape: &Shape,
    warmup: usize,
    steps: usize,
    full: bool,
    device: &Device,
    precision: Precision,
    gate: &Gate,
) -> Result<BenchResult> {
    let before = matmul_peak(device, precision)?;
    let Timed {
        timing: ours,
        model_rss_mb,
        frozen_mb,
        copies,
        replayed,
    } = time_steps_gated(shape, TrainGroups::fpt(), precision, warmup, steps, device, gate, None)?;
    // The machine's speed drifts: the peak is the better of a measurement just before and
    // one just after the FPT steps, so a slow moment does not flatter the fraction.
    let peak = before.max(matmul_peak(device, precision)?);
    let rss = peak_rss_mb();
    let full_ms = if full && precision.is_f32() {
        Some(time_steps(shape, TrainGroups::all(), Precision::F32, warmup, steps, device)?.median_ms)
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
        model_rss_mb,
        frozen_mb: Some(frozen_mb),
        kernel_path: format!(
            "{}{}",
            if device.is_cpu() {
                fpt_nn::kernels::KernelPath::active().name().to_string()
            } else {
                format!("{device:?}")
            },
            if replayed { ", replayed steps" } else { "" }
        ),
        replayed,
        precision,
        copies,
        bf16_products: bf16_choices(device),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bench's steps replayed (what `FPT_STEP=replay` times) on the CPU, where the
    /// replay runs eagerly through its buffers: more steps than the gate's ring (the loss is
    /// read back every step, or the gate overruns), the result marked replayed.
    #[test]
    fn the_bench_times_replayed_steps() {
        let s = shape("tiny").expect("the tiny shape");
        let steps = crate::replay_step::REPLAY_AHEAD + 3;
        for replay in [false, true] {
            let t = time_steps_gated(
                &s,
                TrainGroups::fpt(),
                Precision::F32,
                1,
                steps,
                &Device::Cpu,
                &Gate::Open,
                Some(replay),
            )
            .unwrap();
            assert_eq!(t.replayed, replay);
            // (The copies are counted process-wide: other tests' copies land in them too.)
            assert!(t.timing.median_ms > 0.0 && t.copies.downloads >= 1.0, "{:?}", t.timing);
        }
    }
}

//! A run's peak memory, estimated from its spec before anything is allocated, and checked
//! against what the machine has: a run that cannot fit is refused with the estimate instead
//! of growing until the allocator aborts (a value within `fpt_spec::limits` can still ask
//! for far more than a machine has, e.g. `--hidden 60000`).
//!
//! The estimate is deliberately generous (it must not refuse runs that fit): f32 weights of
//! every used tensor, up to two packed copies of the frozen linear weights (the AVX2 and AVX-512
//! paths), gradient and Adam moments of the trained ones, and per micro-batch the
//! activations kept for backward (about 24 floats per token per layer and hidden unit, plus
//! the attention scores of the composed paths). `FPT_SKIP_MEMORY_CHECK=1` turns the check
//! off (e.g. with swap).

use fpt_backbones::ParamSpec;
use fpt_spec::{RunSpec, TrainGroups};
use fpt_tasks::TaskDims;

/// The estimate, by part, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// Weights (every used tensor, f32) and packed copies of the frozen ones.
    pub weights: u64,
    /// Gradients and Adam moments of the trained tensors.
    pub optimizer: u64,
    /// Activations of one micro-batch kept for backward.
    pub activations: u64,
}

impl Estimate {
    /// The total.
    pub fn total(&self) -> u64 {
        self.weights
            .saturating_add(self.optimizer)
            .saturating_add(self.activations)
    }
}

/// The estimate for a run of `spec` on a backbone of `specs` (hidden width `hidden`, `layers`
/// blocks, `heads`) and a task of shapes `dims`.
pub fn estimate(
    spec: &RunSpec,
    specs: &[ParamSpec],
    (hidden, layers, heads): (usize, usize, usize),
    dims: &TaskDims,
) -> Estimate {
    let f = 4u64;
    let groups: &TrainGroups = &spec.train_groups;
    let last = fpt_backbones::last_block(specs.iter().map(|s| s.name.as_str()));
    let (mut used, mut trained) = (0u64, 0u64);
    for s in specs.iter().filter(|s| s.used) {
        let n = s.numel() as u64;
        used = used.saturating_add(n);
        if s.trains(groups, last) {
            trained = trained.saturating_add(n);
        }
    }
    let head = (dims.output_dim() as u64 + 1) * hidden as u64
        + match dims.input {
            fpt_tasks::InputKind::Vectors { width } => (width as u64 + 1) * hidden as u64,
            fpt_tasks::InputKind::Tokens { vocab } => vocab as u64 * hidden as u64,
        };
    let frozen = used.saturating_sub(trained);
    let (b, t) = (spec.train.micro_batch_size as u64, dims.seq_len as u64);
    let per_layer = b.saturating_mul(t).saturating_mul(24 * hidden as u64).saturating_add(
        b.saturating_mul(heads as u64)
            .saturating_mul(t)
            .saturating_mul(t)
            .saturating_mul(2),
    );
    Estimate {
        weights: used.saturating_add(head).saturating_add(2 * frozen).saturating_mul(f),
        optimizer: trained.saturating_add(head).saturating_mul(3 * f),
        activations: per_layer.saturating_mul(layers.max(1) as u64).saturating_mul(f),
    }
}

/// Bytes this machine can still give a process: `MemAvailable` plus free swap from
/// `/proc/meminfo` (`None` where that cannot be read).
pub fn available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb = |key: &str| -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((kb("MemAvailable:")? + kb("SwapFree:").unwrap_or(0)) * 1024)
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

/// Refuses a run whose estimate exceeds what the machine has, naming the parts.
pub fn check(e: &Estimate) -> std::result::Result<(), String> {
    if std::env::var_os("FPT_SKIP_MEMORY_CHECK").is_some_and(|v| v == "1") {
        return Ok(());
    }
    let Some(have) = available() else { return Ok(()) };
    if e.total() > have {
        return Err(format!(
            "this run needs about {} (weights {}, gradients and optimizer {}, activations of one micro-batch {}), \
             and the machine has {} available: lower --micro-batch-size or --batch-size, the model's size, or the \
             sequence length (FPT_SKIP_MEMORY_CHECK=1 runs it anyway)",
            gib(e.total()),
            gib(e.weights),
            gib(e.optimizer),
            gib(e.activations),
            gib(have)
        ));
    }
    Ok(())
}

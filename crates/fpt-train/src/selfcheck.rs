//! `fpt selfcheck`: the build checks itself, on the kernel path it uses, against outputs
//! other frameworks computed.
//!
//! The golden fixtures (`data/fixtures/*`: tiny checkpoints in each architecture's exact
//! Hugging Face format, and the hidden states and gradients PyTorch / `transformers` / timm
//! computed for them, `tools/make_fixtures.py`) are compiled into the binary, so an
//! installed `fpt` needs no source tree. Each is checked with
//! [`fpt_backbones::golden::check_dir`] (hidden states, input and parameter gradients within
//! [`TOLERANCE`]); two 20-step training trajectories recorded in PyTorch are replayed
//! through fpt's trainer ([`crate::parity`]); the real all-MiniLM-L6-v2 is checked against
//! committed reference hidden states when it is in the Hugging Face cache. Every run records the result
//! ([`Provenance`] in `result.json`), and table reports refuse to render when it fails.

use candle_core::Device;
use fpt_nn::KernelPath;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Largest difference a golden check allows on the CPU (absolute, on values of order 1).
pub const TOLERANCE: f32 = 1e-4;
/// Largest difference (absolute, and relative for losses) on a GPU, whose libraries sum in
/// their own order.
pub const GPU_TOLERANCE: f64 = 1e-3;

fn tolerance(device: &Device) -> f64 {
    if device.is_cpu() {
        TOLERANCE as f64
    } else {
        GPU_TOLERANCE
    }
}

/// The MiniLM model id the reference hidden states belong to.
pub const MINILM: &str = "sentence-transformers/all-MiniLM-L6-v2";

macro_rules! fixture {
    ($name:literal) => {
        fixture!($name, "config.json", "model.safetensors", "golden.safetensors")
    };
    ($name:literal, $($file:literal),+) => {
        (
            $name,
            &[$((
                $file,
                include_bytes!(concat!("../../../data/fixtures/", $name, "/", $file)).as_slice(),
            )),+],
        )
    };
}

/// The embedded fixtures: (name, [(file name, bytes)]).
type Fixture = (&'static str, &'static [(&'static str, &'static [u8])]);

const FIXTURES: &[Fixture] = &[
    fixture!("gpt2-tiny"),
    fixture!("gpt2-lmhead-tiny"),
    fixture!("bert-tiny"),
    fixture!("bert-nopool-tiny"),
    fixture!("t5-tiny"),
    fixture!("vit-tiny"),
    fixture!("vit-timm-tiny"),
    fixture!("longformer-tiny"),
    fixture!("lstm-tiny"),
    fixture!("llama-tiny"),
    fixture!("qwen2-tiny"),
    fixture!("llama-gguf-tiny", "model.gguf", "golden.safetensors"),
];

macro_rules! trajectory {
    ($name:literal) => {
        (
            $name,
            [
                (
                    "config.json",
                    include_bytes!(concat!("../../../data/fixtures/", $name, "/config.json")).as_slice(),
                ),
                (
                    "model.safetensors",
                    include_bytes!(concat!("../../../data/fixtures/", $name, "/model.safetensors")).as_slice(),
                ),
                (
                    "trajectory.safetensors",
                    include_bytes!(concat!("../../../data/fixtures/", $name, "/trajectory.safetensors")).as_slice(),
                ),
                (
                    "MADE_BY.json",
                    include_bytes!(concat!("../../../data/fixtures/", $name, "/MADE_BY.json")).as_slice(),
                ),
                (
                    "trajectory-autocast-bf16.safetensors",
                    include_bytes!(concat!(
                        "../../../data/fixtures/",
                        $name,
                        "/trajectory-autocast-bf16.safetensors"
                    ))
                    .as_slice(),
                ),
            ],
        )
    };
}

/// The embedded training trajectories recorded in PyTorch (`tools/make_trajectory.py`).
type Trajectory = (&'static str, [(&'static str, &'static [u8]); 5]);

const TRAJECTORIES: &[Trajectory] = &[trajectory!("trajectory-gpt2"), trajectory!("trajectory-bert")];

/// Largest relative difference of a replayed step's loss.
pub const LOSS_TOLERANCE: f64 = 1e-5;

const MINILM_REFERENCE: &str = include_str!("../../../data/fixtures/minilm-reference.json");

const SMOLLM2_REFERENCE: &[u8] = include_bytes!("../../../data/fixtures/smollm2-reference.safetensors");

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Within tolerance.
    Pass,
    /// Off, or it could not run.
    Fail,
    /// Not available here (MiniLM or SmolLM2 not installed).
    Skipped,
}

impl Status {
    /// As the CLI prints it: `pass`, `FAIL`, `skipped`.
    pub fn label(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::Skipped => "skipped",
        }
    }
}

/// One check of the self-check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// What was checked (`gpt2-tiny`, `minilm`, ...).
    pub name: String,
    /// Its outcome.
    pub status: Status,
    /// The largest difference to the reference, where one was measured.
    pub max_diff: Option<f64>,
    /// What was compared, or why it failed or was skipped.
    pub detail: String,
    /// The frozen weights' number format of the check (`bf16` checks measure relative
    /// differences against f32 references, within [`BF16_TOLERANCE`]).
    #[serde(default, skip_serializing_if = "fpt_spec::Precision::is_f32")]
    pub precision: fpt_spec::Precision,
}

/// The self-check of this build on one kernel path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelfCheck {
    /// Every check passed (skipped ones aside).
    pub passed: bool,
    /// The kernel path it ran on.
    pub kernel_path: String,
    /// Each check.
    pub checks: Vec<Check>,
    /// Test-only faults switched on (`FPT_TEST_FAULT`); empty normally.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<String>,
    /// How products with bf16 weights ran in the `bf16` checks (the AVX512_BF16 kernel,
    /// widened operands, or the device's casts).
    #[serde(default)]
    pub bf16_kernel: String,
}

impl SelfCheck {
    /// The largest difference over the checks that measured one.
    pub fn max_diff(&self) -> Option<f64> {
        self.checks
            .iter()
            .filter(|c| c.precision.is_f32())
            .filter_map(|c| c.max_diff)
            .reduce(f64::max)
    }

    /// The largest relative difference of the `bf16` checks.
    pub fn bf16_max_diff(&self) -> Option<f64> {
        self.checks
            .iter()
            .filter(|c| !c.precision.is_f32())
            .filter_map(|c| c.max_diff)
            .reduce(f64::max)
    }

    /// One line: `passed (10 checks, max diff 1.1e-5; skipped: minilm)`.
    pub fn summary(&self) -> String {
        let skipped: Vec<&str> = self
            .checks
            .iter()
            .filter(|c| c.status == Status::Skipped)
            .map(|c| c.name.as_str())
            .collect();
        let failed: Vec<&str> = self
            .checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .map(|c| c.name.as_str())
            .collect();
        let mut s = format!(
            "{} on the {} kernel path ({} checks, max diff {})",
            if self.passed { "passed" } else { "FAILED" },
            self.kernel_path,
            self.checks.len(),
            self.max_diff().map_or("-".into(), |d| format!("{d:.1e}"))
        );
        if let Some(d) = self.bf16_max_diff() {
            let n = self.checks.iter().filter(|c| !c.precision.is_f32()).count();
            s += &format!("; bf16 on {}: {n} checks, max relative diff {d:.1e}", self.bf16_kernel);
        }
        if !failed.is_empty() {
            s += &format!("; failed: {}", failed.join(", "));
        }
        if !skipped.is_empty() {
            s += &format!("; skipped: {}", skipped.join(", "));
        }
        s
    }
}

fn diff_check(name: &str, diff: f64, tol: f64, detail: String) -> Check {
    Check {
        name: name.into(),
        status: if diff <= tol { Status::Pass } else { Status::Fail },
        max_diff: Some(diff),
        detail,
        precision: fpt_spec::Precision::F32,
    }
}

fn failed(name: &str, e: impl std::fmt::Display) -> Check {
    Check {
        name: name.into(),
        status: Status::Fail,
        max_diff: None,
        detail: e.to_string(),
        precision: fpt_spec::Precision::F32,
    }
}

/// Largest relative difference (`max |ours - reference| / max |reference|` per tensor) a
/// `bf16` golden check allows against the f32 reference: bf16 keeps 8 bits of mantissa
/// (relative rounding up to 2^-9 = 2.0e-3 per operand), and a tiny model's two blocks and
/// backward compound it to 1.7e-3..9.7e-3 on the fixtures checked here (measured on every
/// kernel path, all within 3e-5 of each other).
pub const BF16_TOLERANCE: f64 = 2e-2;

/// The fixtures checked in bf16: one per architecture family the tables run (GPT-2,
/// BERT, ViT, Llama).
const BF16_FIXTURES: &[&str] = &["gpt2-tiny", "bert-tiny", "vit-tiny", "llama-tiny"];

/// How products with bf16 weights run on `device` (on the CPU, on the active kernel path).
pub fn bf16_kernel(device: &Device) -> String {
    if device.is_cpu() {
        KernelPath::active().bf16_kernel().to_string()
    } else {
        "bf16 operands widened to f32 (candle casts)".to_string()
    }
}

fn bf16_check(&(name, files): &Fixture, device: &Device) -> Check {
    let label = format!("{name}-bf16");
    let dir = match unpack(name, files) {
        Ok(d) => d,
        Err(e) => return failed(&label, format!("cannot unpack the fixture: {e}")),
    };
    let mut c = match fpt_backbones::golden::check_dir_in(dir.path(), device, fpt_spec::Precision::Bf16) {
        Ok(d) => diff_check(
            &label,
            d.relative as f64,
            BF16_TOLERANCE,
            format!(
                "bf16 weights vs transformers' f32: relative {:.1e} (absolute: hidden {:.1e}, input gradient {:.1e}, {} parameter gradients {:.1e})",
                d.relative, d.hidden, d.input_grad, d.params_checked, d.param_grads
            ),
        ),
        Err(e) => failed(&label, e),
    };
    c.precision = fpt_spec::Precision::Bf16;
    c
}

/// Writes an embedded fixture into a fresh temporary directory.
fn unpack(name: &str, files: &[(&str, &[u8])]) -> std::io::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("fpt-selfcheck-{name}-"))
        .tempdir()?;
    for (file, bytes) in files {
        std::fs::write(dir.path().join(file), bytes)?;
    }
    Ok(dir)
}

fn golden_check(&(name, files): &Fixture, device: &Device) -> Check {
    let dir = match unpack(name, files) {
        Ok(d) => d,
        Err(e) => return failed(name, format!("cannot unpack the fixture: {e}")),
    };
    match fpt_backbones::golden::check_dir(dir.path(), device) {
        Ok(d) => diff_check(
            name,
            d.max() as f64,
            tolerance(device),
            format!(
                "hidden {:.1e}, input gradient {:.1e}, {} parameter gradients {:.1e}",
                d.hidden, d.input_grad, d.params_checked, d.param_grads
            ),
        ),
        Err(e) => failed(name, e),
    }
}

/// Bounds of a bf16 replay against PyTorch's autocast-bf16 run: relative loss and gradient
/// norm, absolute trained tensor (the two round different operations; measured 5.8e-3,
/// 5.0e-3 and 2.1e-3 at most, while autocast's own losses are 7.0e-3 from f32's).
pub const BF16_TRAJECTORY_TOLERANCE: (f64, f64, f64) = (1e-2, 1e-2, 5e-3);

fn trajectory_bf16_check((name, files): &Trajectory, device: &Device) -> Check {
    let label = format!("{name}-bf16");
    let dir = match unpack(name, files) {
        Ok(d) => d,
        Err(e) => return failed(&label, format!("cannot unpack the fixture: {e}")),
    };
    let bf16 = fpt_spec::Precision::Bf16;
    let mut c = match crate::trajectory::replay_file(dir.path(), "trajectory-autocast-bf16.safetensors", device, bf16) {
        Ok(d) => {
            let (l, g, t) = BF16_TRAJECTORY_TOLERANCE;
            let ok = d.loss_rel <= l && d.grad_norm_rel <= g && d.tensor_abs <= t;
            Check {
                name: label,
                status: if ok { Status::Pass } else { Status::Fail },
                max_diff: Some(d.loss_rel),
                precision: bf16,
                detail: format!(
                    "{} bf16 training steps vs PyTorch's autocast-bf16: losses {:.1e}, gradient norms {:.1e} (relative), {} trained tensors {:.1e}",
                    d.steps, d.loss_rel, d.grad_norm_rel, d.tensors, d.tensor_abs
                ),
            }
        }
        Err(e) => failed(&label, e),
    };
    c.precision = bf16;
    c
}

fn trajectory_check((name, files): &Trajectory, device: &Device) -> Check {
    let dir = match unpack(name, files) {
        Ok(d) => d,
        Err(e) => return failed(name, format!("cannot unpack the fixture: {e}")),
    };
    match crate::trajectory::replay(dir.path(), device) {
        Ok(d) => {
            let tol = tolerance(device);
            let loss_tol = if device.is_cpu() { LOSS_TOLERANCE } else { GPU_TOLERANCE };
            let ok = d.loss_rel <= loss_tol && d.grad_norm_rel <= tol && d.tensor_abs <= tol;
            Check {
                name: (*name).into(),
                status: if ok { Status::Pass } else { Status::Fail },
                max_diff: Some(d.tensor_abs),
                precision: fpt_spec::Precision::F32,
                detail: format!(
                    "{} training steps vs PyTorch: losses {:.1e}, gradient norms {:.1e} (relative), {} trained tensors {:.1e}",
                    d.steps, d.loss_rel, d.grad_norm_rel, d.tensors, d.tensor_abs
                ),
            }
        }
        Err(e) => failed(name, e),
    }
}

fn minilm_check(device: &Device) -> Check {
    let files = match fpt_backbones::hub::resolves_offline(MINILM, true) {
        Ok(f) => f,
        Err(_) => {
            return Check {
                name: "minilm".into(),
                status: Status::Skipped,
                max_diff: None,
                detail: format!("{MINILM} is not in the Hugging Face cache (`fpt fetch minilm`)"),
                precision: fpt_spec::Precision::F32,
            }
        }
    };
    let reference: serde_json::Value = serde_json::from_str(MINILM_REFERENCE).expect("embedded reference is JSON");
    match fpt_backbones::golden::minilm_diff(&files, &reference, device) {
        Ok((first8, sum_rel)) => {
            let mut c = diff_check(
                "minilm",
                first8 as f64,
                tolerance(device),
                format!("real weights vs transformers: hidden states {first8:.1e}, sum {sum_rel:.1e} relative"),
            );
            if sum_rel > 1e-3 {
                c.status = Status::Fail;
            }
            c
        }
        // A copy without the word table (a GPU machine's): the check cannot run there.
        Err(e) if e.to_string().contains(fpt_backbones::golden::NO_WORD_TABLE) => Check {
            name: "minilm".into(),
            status: Status::Skipped,
            max_diff: None,
            detail: e.to_string(),
            precision: fpt_spec::Precision::F32,
        },
        Err(e) => failed("minilm", e),
    }
}

fn smollm2_check(device: &Device) -> Check {
    let Ok(gguf) = fpt_backbones::hub::smollm2_gguf() else {
        return Check {
            name: "smollm2".into(),
            status: Status::Skipped,
            max_diff: None,
            detail: "SmolLM2 is not installed (`fpt fetch smollm2`)".into(),
            precision: fpt_spec::Precision::F32,
        };
    };
    let reference = match candle_core::safetensors::load_buffer(SMOLLM2_REFERENCE, &Device::Cpu) {
        Ok(r) => r,
        Err(e) => return failed("smollm2", format!("the embedded reference: {e}")),
    };
    match fpt_backbones::golden::smollm2_diff(&gguf, &reference, device) {
        Ok((last, deep)) => diff_check(
            "smollm2",
            last.max(deep) as f64,
            tolerance(device),
            format!(
                "real Q4_1 GGUF vs transformers' GGUF loader, relative to the largest value: {last:.1e} (30 blocks + norm), {deep:.1e} (29 blocks, values to ~1e4)"
            ),
        ),
        Err(e) => failed("smollm2", e),
    }
}

/// Runs every check on `device` on the calling thread's kernel path.
pub fn run(device: &Device) -> SelfCheck {
    let mut checks: Vec<Check> = FIXTURES.iter().map(|f| golden_check(f, device)).collect();
    checks.extend(TRAJECTORIES.iter().map(|t| trajectory_check(t, device)));
    checks.push(minilm_check(device));
    checks.push(smollm2_check(device));
    checks.extend(
        FIXTURES
            .iter()
            .filter(|f| BF16_FIXTURES.contains(&f.0))
            .map(|f| bf16_check(f, device)),
    );
    checks.extend(TRAJECTORIES.iter().map(|t| trajectory_bf16_check(t, device)));
    SelfCheck {
        passed: checks.iter().all(|c| c.status != Status::Fail),
        kernel_path: KernelPath::active().name().into(),
        checks,
        faults: fpt_nn::kernels::active_faults().into_iter().map(String::from).collect(),
        bf16_kernel: bf16_kernel(device),
    }
}

/// Where [`cached`] keeps its results across processes, once [`keep_on_disk`] names it.
static DISK: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Keeps [`cached`]'s results in `dir` (the `fpt` binary: `$FPT_HOME/selfcheck`), one file
/// per binary, CPU and kernel path, and what the checks read: a self-check then runs once
/// per build and machine, not in every process (every table cell is a process, and the
/// MiniLM and SmolLM2 checks load their weights: seconds and hundreds of MB each).
pub fn keep_on_disk(dir: PathBuf) {
    *DISK.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir);
}

/// The file a self-check of `path` is kept in under `dir`: named by the SHA-256 of this
/// binary's bytes, the CPU, the kernel path, the test-only fault switch, and the size and
/// time of the MiniLM and SmolLM2 files the checks load (a check skipped for want of them
/// runs again once they are fetched). `None` where the binary cannot be read.
fn disk_file(dir: &Path, path: KernelPath) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let binary = fpt_spec::files::sha256_file(&exe).ok()?;
    let stamp = |p: &Path| -> String {
        std::fs::metadata(p)
            .map(|m| format!("{}:{}:{:?}", p.display(), m.len(), m.modified().ok()))
            .unwrap_or_else(|_| format!("{}:absent", p.display()))
    };
    let mut assets = Vec::new();
    match fpt_backbones::hub::resolves_offline(MINILM, true) {
        Ok(f) => {
            assets.push(stamp(&f.config));
            if let Some(w) = &f.weights {
                assets.push(stamp(w));
            }
        }
        Err(_) => assets.push("minilm:absent".into()),
    }
    match fpt_backbones::hub::smollm2_gguf() {
        Ok(g) => assets.push(stamp(&g)),
        Err(_) => assets.push("smollm2:absent".into()),
    }
    let key = format!(
        "{binary}|{}|{}|{}|{}",
        fpt_nn::kernels::cpu_model(),
        path.name(),
        std::env::var("FPT_TEST_FAULT").unwrap_or_default(),
        assets.join("|")
    );
    let name = &fpt_spec::files::sha256_hex(key.as_bytes())[..16];
    Some(dir.join(format!("{name}.json")))
}

/// [`run`] on the CPU, once per kernel path per process, and (where [`keep_on_disk`] was
/// called) once per binary and machine: a result written by an earlier process of the same
/// binary on the same CPU, kernel path and weights is read back.
pub fn cached() -> SelfCheck {
    static DONE: Mutex<Option<HashMap<KernelPath, SelfCheck>>> = Mutex::new(None);
    let path = KernelPath::active();
    if let Some(c) = DONE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&path))
    {
        return c.clone();
    }
    let dir = DISK.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let file = dir.as_deref().and_then(|d| disk_file(d, path));
    let kept = file
        .as_ref()
        .and_then(|f| std::fs::read(f).ok())
        .and_then(|b| serde_json::from_slice::<SelfCheck>(&b).ok());
    let c = match kept {
        Some(c) => c,
        None => {
            let c = run(&Device::Cpu);
            if let (Some(f), Ok(text)) = (&file, serde_json::to_vec_pretty(&c)) {
                // Best effort: a cache that cannot be written only costs the next process
                // another self-check.
                let written = f
                    .parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|_| fpt_spec::files::write_atomic(f, &text));
                if let Err(e) = written {
                    tracing::debug!("self-check not kept in {}: {e}", f.display());
                }
            }
            c
        }
    };
    DONE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(path, c.clone());
    c
}

/// What built and ran a result: recorded in every `result.json` and report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// fpt's version.
    pub fpt_version: String,
    /// The git commit the build came from (`+dirty` with uncommitted changes; `unknown`
    /// outside a git checkout).
    pub commit: String,
    /// `release` or `debug`.
    pub profile: String,
    /// The kernel path the run used.
    pub kernel_path: String,
    /// The best kernel path this CPU runs.
    pub cpu_best_path: String,
    /// The CPU's model name.
    pub cpu: String,
    /// The self-check on the run's kernel path.
    pub selfcheck: SelfCheckSummary,
}

/// The self-check as a result records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelfCheckSummary {
    /// Every check passed.
    pub passed: bool,
    /// The largest difference to a reference.
    pub max_diff: Option<f64>,
    /// Checks run (skipped ones included).
    pub checks: usize,
    /// Checks skipped (e.g. `minilm` when not cached).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// Checks failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<String>,
}

impl From<&SelfCheck> for SelfCheckSummary {
    fn from(c: &SelfCheck) -> Self {
        let names = |s: Status| -> Vec<String> {
            c.checks
                .iter()
                .filter(|k| k.status == s)
                .map(|k| k.name.clone())
                .collect()
        };
        Self {
            passed: c.passed,
            max_diff: c.max_diff(),
            checks: c.checks.len(),
            skipped: names(Status::Skipped),
            failed: names(Status::Fail),
        }
    }
}

/// The build's commit and profile.
pub fn build_info() -> (&'static str, &'static str) {
    (env!("FPT_GIT_COMMIT"), env!("FPT_BUILD_PROFILE"))
}

/// This process's provenance, with the (cached) self-check of its kernel path.
pub fn provenance() -> Provenance {
    let (commit, profile) = build_info();
    let check = cached();
    Provenance {
        fpt_version: env!("CARGO_PKG_VERSION").into(),
        commit: commit.into(),
        profile: profile.into(),
        kernel_path: KernelPath::active().name().into(),
        cpu_best_path: KernelPath::detected().name().into(),
        cpu: fpt_nn::kernels::cpu_model(),
        selfcheck: SelfCheckSummary::from(&check),
    }
}

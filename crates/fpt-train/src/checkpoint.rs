//! Checkpoints: only the trainable tensors (safetensors), the optimizer's moments (their
//! own safetensors file), `state.json` (step, random-stream states, the loop's running
//! numbers, the run spec, and the sha256 of both tensor files), and `manifest.json`, the
//! sha256 of each of the three, so that a changed bit anywhere (`state.json` included) is
//! refused with the file named.
//!
//! Layout inside a run directory:
//! ```text
//! checkpoints/step-000100/{trainable.safetensors, optimizer.safetensors, state.json, manifest.json}
//! checkpoints/LATEST            "step-000100" (a checkpoint name, never a path)
//! ```
//! A checkpoint is written into a fresh temporary directory, each file synced, the directory
//! renamed into place, and only then does `LATEST` (itself written to a temporary file and
//! renamed) point at it; older checkpoints are removed after that. A crash or a full disk
//! at any moment leaves `LATEST` pointing at a complete checkpoint.

use crate::{write_atomic, Result, RunState, TrainError, Trainer};
use candle_core::{Device, Tensor};
use fpt_nn::Rng;
use fpt_spec::files::sha256_hex;
use fpt_spec::RunSpec;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Version of the checkpoint format (2: with `manifest.json`; 1, without, is still read).
pub const FORMAT: u32 = 2;
/// Trainable tensors, by parameter name (`input.weight`, `wpe.weight`, `h.0.ln_1.weight`, ...).
pub const TRAINABLE_FILE: &str = "trainable.safetensors";
/// Adam moments: `m.<name>` and `v.<name>`.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// Everything else.
pub const STATE_FILE: &str = "state.json";
/// sha256 of the three files above.
pub const MANIFEST_FILE: &str = "manifest.json";

/// `state.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CheckpointState {
    /// [`FORMAT`].
    pub format: u32,
    /// Optimizer steps done.
    pub step: usize,
    /// The run spec the checkpoint belongs to.
    pub spec: RunSpec,
    /// Adam's step counter.
    pub adam_t: usize,
    /// The training-data stream.
    pub data_rng: Rng,
    /// The dropout stream.
    pub dropout_rng: Rng,
    /// Where a dataset task's training order stands (`None` for generated tasks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_cursor: Option<fpt_tasks::Cursor>,
    /// The training loop's running numbers.
    pub run: RunState,
    /// sha256 (hex) of each tensor file.
    pub sha256: BTreeMap<String, String>,
}

fn err(path: &Path, msg: impl Into<String>) -> TrainError {
    TrainError::Checkpoint {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |e| err(path, e.to_string())
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::File::create(path).map_err(io(path))?;
    f.write_all(bytes).map_err(io(path))?;
    f.sync_all().map_err(io(path))
}

fn to_bytes(tensors: &HashMap<String, Tensor>, path: &Path) -> Result<Vec<u8>> {
    let cpu: Vec<(String, Tensor)> = tensors
        .iter()
        .map(|(k, v)| Ok((k.clone(), v.to_device(&Device::Cpu)?)))
        .collect::<candle_core::Result<_>>()?;
    safetensors::serialize(cpu.iter().map(|(k, v)| (k.as_str(), v)), None).map_err(|e| err(path, e.to_string()))
}

/// The directory holding checkpoints of a run.
pub fn root(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// Whether `name` is a checkpoint's directory name, `step-` and digits (so `LATEST` can
/// never lead outside the run directory).
fn is_checkpoint_name(name: &str) -> bool {
    name.strip_prefix("step-")
        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

/// The checkpoint directories of a run (`step-` and digits), newest first, with their step.
pub fn step_dirs(run_dir: &Path) -> Vec<(usize, PathBuf)> {
    let mut v: Vec<(usize, PathBuf)> = std::fs::read_dir(root(run_dir))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (is_checkpoint_name(&name) && e.path().is_dir())
                .then(|| name["step-".len()..].parse::<usize>().ok().map(|s| (s, e.path())))
                .flatten()
        })
        .collect();
    v.sort_by_key(|d| std::cmp::Reverse(d.0));
    v
}

/// What to do about a damaged pointer: the step directories there, and the command that
/// rebuilds it.
fn repair_hint(run_dir: &Path) -> String {
    let dirs = step_dirs(run_dir);
    let names: Vec<String> = dirs
        .iter()
        .map(|(_, d)| d.file_name().unwrap_or_default().to_string_lossy().into_owned())
        .collect();
    if names.is_empty() {
        "and no checkpoint directory is there".into()
    } else {
        format!(
            "checkpoint directories present: {}; `fpt repair {}` points it at the newest one whose files verify",
            names.join(", "),
            run_dir.display()
        )
    }
}

/// The newest complete checkpoint of a run, if any: the one `LATEST` names. `None` only
/// where the run has no `LATEST` and no checkpoint directory (it never wrote one). A
/// `LATEST` that cannot be read, holds anything but a checkpoint name (git's conflict
/// markers, say), or names a directory that is not there is an error naming the file, as is
/// a missing `LATEST` beside checkpoint directories: never "no checkpoint", which would
/// start the run again from step 0. [`repair`] rebuilds the pointer.
pub fn latest(run_dir: &Path) -> Result<Option<PathBuf>> {
    let pointer = root(run_dir).join("LATEST");
    match std::fs::read_to_string(&pointer) {
        Ok(name) => {
            if !is_checkpoint_name(name.trim()) {
                let shown: String = name.trim().chars().take(80).collect();
                return Err(err(
                    &pointer,
                    format!(
                        "holds `{}`, not a checkpoint name (`step-` and digits): the file was changed (a merge conflict?); {}",
                        shown.escape_debug(),
                        repair_hint(run_dir)
                    ),
                ));
            }
            let dir = root(run_dir).join(name.trim());
            if !dir.is_dir() {
                return Err(err(
                    &pointer,
                    format!(
                        "points at `{}`, which does not exist; {}",
                        name.trim(),
                        repair_hint(run_dir)
                    ),
                ));
            }
            Ok(Some(dir))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if step_dirs(run_dir).is_empty() {
                Ok(None)
            } else {
                Err(err(
                    &pointer,
                    format!("is missing, but the run has checkpoints; {}", repair_hint(run_dir)),
                ))
            }
        }
        Err(e) => Err(err(&pointer, format!("{e}; {}", repair_hint(run_dir)))),
    }
}

/// Removes what a process killed while writing left in a run's checkpoint directory: a
/// temporary pointer (`.LATEST.<pid>.part`) or a checkpoint directory never renamed into
/// place (`.step-*.tmp-*`). Called by a resume, which holds the run's lock, so no live
/// writer owns them. Returns how many it removed.
pub fn sweep(run_dir: &Path) -> usize {
    let mut removed = 0;
    for e in std::fs::read_dir(root(run_dir)).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        let gone = if name.starts_with(".LATEST.") && name.ends_with(".part") {
            std::fs::remove_file(&path).is_ok()
        } else if name.starts_with(".step-") && name.contains(".tmp-") && path.is_dir() {
            std::fs::remove_dir_all(&path).is_ok()
        } else {
            false
        };
        removed += usize::from(gone);
    }
    removed
}

/// Rebuilds a run's `LATEST` from its checkpoint directories: the newest one whose files
/// all verify against its manifest (sha256) becomes the pointer (written atomically).
/// Returns it, with the directories passed over and why. An error where none verifies.
pub fn repair(run_dir: &Path) -> Result<(PathBuf, Vec<String>)> {
    let mut passed = Vec::new();
    for (_, dir) in step_dirs(run_dir) {
        match load(&dir, &Device::Cpu) {
            Ok(_) => {
                let name = dir
                    .file_name()
                    .expect("a checkpoint has a name")
                    .to_string_lossy()
                    .into_owned();
                write_atomic(&root(run_dir).join("LATEST"), name.as_bytes())?;
                return Ok((dir, passed));
            }
            Err(e) => passed.push(format!("{}: {e}", dir.display())),
        }
    }
    Err(err(
        &root(run_dir),
        if passed.is_empty() {
            "holds no checkpoint directory to point LATEST at".to_string()
        } else {
            format!("no checkpoint verifies: {}", passed.join("; "))
        },
    ))
}

/// Writes a checkpoint of `tr` and `run` into `run_dir` (see the module docs); returns
/// its directory.
pub fn save(run_dir: &Path, tr: &Trainer, run: &RunState) -> Result<PathBuf> {
    let root = root(run_dir);
    std::fs::create_dir_all(&root).map_err(io(&root))?;
    let name = format!("step-{:06}", tr.steps_done());
    let final_dir = root.join(&name);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let tmp = root.join(format!(".{name}.tmp-{}-{nanos}", std::process::id()));
    let result = (|| -> Result<()> {
        std::fs::create_dir(&tmp).map_err(io(&tmp))?;
        let mut sha = BTreeMap::new();
        let trainable: HashMap<String, Tensor> = tr
            .model()
            .trainable()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone()))
            .collect();
        let (m, v) = tr.optimizer().moments();
        let mut moments = HashMap::new();
        for ((n, _), (mi, vi)) in tr.model().trainable().iter().zip(m.iter().zip(v)) {
            moments.insert(format!("m.{n}"), mi.clone());
            moments.insert(format!("v.{n}"), vi.clone());
        }
        for (file, tensors) in [(TRAINABLE_FILE, &trainable), (OPTIMIZER_FILE, &moments)] {
            let path = tmp.join(file);
            let bytes = to_bytes(tensors, &path)?;
            sha.insert(file.to_string(), sha256_hex(&bytes));
            write_synced(&path, &bytes)?;
        }
        let state = CheckpointState {
            format: FORMAT,
            step: tr.steps_done(),
            spec: tr.spec().clone(),
            adam_t: tr.optimizer().t,
            data_rng: tr.data_rng.clone(),
            dropout_rng: tr.ctx.rng.clone(),
            data_cursor: tr.task().cursor(),
            run: run.clone(),
            sha256: sha,
        };
        let path = tmp.join(STATE_FILE);
        // Compact: the loop's state carries the recent evaluations' per-example outcomes
        // (10,000 MNIST images each), which pretty-printing spread over a line a value: 3 MB
        // a campaign checkpoint where compact JSON takes 0.7 MB, and the campaign's copies
        // are committed (and must travel to a lent GPU under its 64 MiB).
        let state_bytes = serde_json::to_string(&state).expect("state serialises");
        write_synced(&path, state_bytes.as_bytes())?;
        let mut manifest = state.sha256.clone();
        manifest.insert(STATE_FILE.to_string(), sha256_hex(state_bytes.as_bytes()));
        write_synced(
            &tmp.join(MANIFEST_FILE),
            serde_json::to_string_pretty(&manifest)
                .expect("manifest serialises")
                .as_bytes(),
        )?;
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir).map_err(io(&final_dir))?;
        }
        std::fs::rename(&tmp, &final_dir).map_err(io(&final_dir))?;
        write_atomic(&root.join("LATEST"), name.as_bytes())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // Only now that LATEST points at the new checkpoint are the older ones removed.
    if let Ok(entries) = std::fs::read_dir(&root) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            if n != name && (n.starts_with("step-") || n.starts_with(".step-")) && e.path().is_dir() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(final_dir)
}

/// A checkpoint read back and verified.
pub struct Loaded {
    /// `state.json`.
    pub state: CheckpointState,
    /// Trainable tensors by name.
    pub trainable: HashMap<String, Tensor>,
    /// Adam moments (`m.<name>`, `v.<name>`).
    pub moments: HashMap<String, Tensor>,
}

/// Checks `bytes` (the file at `path`) against the sha256 recorded for it in `record`.
fn verify(path: &Path, bytes: &[u8], want: Option<&String>, record: &str) -> Result<()> {
    let Some(want) = want else {
        return Err(err(
            path,
            format!("has no sha256 in {record}: the checkpoint was changed"),
        ));
    };
    let got = sha256_hex(bytes);
    if &got != want {
        return Err(err(
            path,
            format!("sha256 {got} does not match {want} recorded in {record}: the file is corrupted"),
        ));
    }
    Ok(())
}

fn read_tensors(path: &Path, want_sha: Option<&String>, device: &Device) -> Result<HashMap<String, Tensor>> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    verify(path, &bytes, want_sha, STATE_FILE)?;
    let cpu = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
        .map_err(|e| err(path, format!("not a valid safetensors file: {e}")))?;
    cpu.into_iter().map(|(k, v)| Ok((k, v.to_device(device)?))).collect()
}

/// Reads and verifies the checkpoint in `dir` (checksums, format).
pub fn load(dir: &Path, device: &Device) -> Result<Loaded> {
    let sp = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&sp).map_err(io(&sp))?;
    let mp = dir.join(MANIFEST_FILE);
    let manifest: Option<BTreeMap<String, String>> = match std::fs::read_to_string(&mp) {
        Ok(m) => Some(serde_json::from_str(&m).map_err(|e| err(&mp, format!("not a valid manifest: {e}")))?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(err(&mp, e.to_string())),
    };
    if let Some(m) = &manifest {
        verify(&sp, text.as_bytes(), m.get(STATE_FILE), MANIFEST_FILE)?;
    }
    let state: CheckpointState =
        serde_json::from_str(&text).map_err(|e| err(&sp, format!("not a valid checkpoint state: {e}")))?;
    match (state.format, &manifest) {
        (FORMAT, None) => return Err(err(&mp, "is missing: the checkpoint is incomplete or was changed")),
        // Format 1 (before manifests): the tensor files' sha256 in state.json still hold.
        (1, None) => tracing::warn!(
            "{}: a checkpoint of an older fpt (no manifest): state.json is not checksummed",
            dir.display()
        ),
        (FORMAT | 1, Some(_)) => {}
        (f, _) => {
            return Err(err(
                &sp,
                format!("checkpoint format {f} (this fpt reads {FORMAT} and 1)"),
            ))
        }
    }
    if let Some(m) = &manifest {
        // The manifest and state.json must agree on the tensor files.
        for file in [TRAINABLE_FILE, OPTIMIZER_FILE] {
            if m.get(file) != state.sha256.get(file) {
                return Err(err(
                    &mp,
                    format!("and {STATE_FILE} disagree on {file}: the checkpoint was changed"),
                ));
            }
        }
    }
    let trainable = read_tensors(&dir.join(TRAINABLE_FILE), state.sha256.get(TRAINABLE_FILE), device)?;
    let moments = read_tensors(&dir.join(OPTIMIZER_FILE), state.sha256.get(OPTIMIZER_FILE), device)?;
    Ok(Loaded {
        state,
        trainable,
        moments,
    })
}

/// Puts `spec` in place of the run spec of the checkpoint in `dir`, in its `state.json` and
/// the manifest's sha256 of it, after verifying the checkpoint whole ([`load`]); the
/// tensors are untouched. For a run whose spec changed in what leaves its training alone
/// (the caller decides which fields may: see `fpt_ablate::campaign::migrate`).
pub fn respec(dir: &Path, spec: &RunSpec) -> Result<()> {
    let mut state = load(dir, &Device::Cpu)?.state;
    if state.format != FORMAT {
        return Err(err(
            &dir.join(STATE_FILE),
            format!(
                "checkpoint format {}: only format {FORMAT} can take a new spec",
                state.format
            ),
        ));
    }
    state.spec = spec.clone();
    let state_bytes = serde_json::to_string_pretty(&state).expect("state serialises");
    let mut manifest = state.sha256.clone();
    manifest.insert(STATE_FILE.to_string(), sha256_hex(state_bytes.as_bytes()));
    write_atomic(&dir.join(STATE_FILE), state_bytes.as_bytes())?;
    write_atomic(
        &dir.join(MANIFEST_FILE),
        serde_json::to_string_pretty(&manifest)
            .expect("manifest serialises")
            .as_bytes(),
    )
}

/// Copies `tensors` into the model's trainable parameters. Every trainable parameter must
/// be present with its exact shape, and no other tensor may be: a checkpoint of another
/// backbone, task or set of trained groups is refused with the first mismatch named.
pub fn load_trainable(model: &fpt_model::Fpt, tensors: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    let vars = model.trainable();
    for (name, var) in &vars {
        let t = tensors.get(name).ok_or_else(|| {
            err(
                path,
                format!("has no tensor `{name}`: it was written for another backbone, task or set of trained groups"),
            )
        })?;
        if t.dims() != var.dims() {
            return Err(err(
                path,
                format!(
                    "tensor `{name}` has shape {:?}, this model's is {:?}: it was written for another backbone or task",
                    t.dims(),
                    var.dims()
                ),
            ));
        }
    }
    if let Some(extra) = tensors.keys().find(|k| !vars.iter().any(|(n, _)| n == *k)) {
        return Err(err(path, format!("holds tensor `{extra}`, which this model does not train: it was written for another backbone, task or set of trained groups")));
    }
    for (name, var) in &vars {
        var.set(&tensors[name].to_dtype(var.dtype())?)?;
    }
    Ok(())
}

#[cfg(test)]
mod sweep_tests {
    use super::*;

    /// A killed writer's leftovers go; complete checkpoints and the pointer stay; a
    /// missing pointer beside a checkpoint is an error, not "no checkpoint".
    #[test]
    fn a_resume_sweeps_leftovers_and_a_lost_pointer_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let r = root(d.path());
        std::fs::create_dir_all(r.join("step-000010")).unwrap();
        std::fs::create_dir_all(r.join(".step-000020.tmp-77-123")).unwrap();
        std::fs::write(r.join(".LATEST.77.part"), "").unwrap();
        assert!(latest(d.path())
            .unwrap_err()
            .to_string()
            .contains("is missing, but the run has checkpoints"));
        std::fs::write(r.join("LATEST"), "step-000010").unwrap();
        assert_eq!(sweep(d.path()), 2);
        let mut left: Vec<String> = std::fs::read_dir(&r)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["LATEST", "step-000010"]);
        assert_eq!(latest(d.path()).unwrap(), Some(r.join("step-000010")));
        assert_eq!(step_dirs(d.path()).len(), 1);
        // No checkpoint directory and no pointer: a run that never wrote one.
        let e = tempfile::tempdir().unwrap();
        assert_eq!(latest(e.path()).unwrap(), None);
    }
}

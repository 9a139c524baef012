//! Reading checkpoints: safetensors (sharded too), each used tensor's presence, shape and
//! finiteness checked, named as the architecture's checkpoints name them.

#[allow(unused_imports)]
use super::*;

/// How an architecture's checkpoints name its tensors, for [`read_checked`].
pub(crate) struct Naming {
    /// Prefixes a wrapping model puts before the backbone's names (`transformer.`,
    /// `bert.`); the first one the file uses is stripped.
    pub prefixes: &'static [&'static str],
    /// A second name to try for a tensor (old checkpoints' spellings).
    pub alias: fn(&str) -> String,
    /// Whether a tensor is stored `[in, out]` (GPT-2's Conv1D) and is transposed on reading.
    pub transposed: fn(&str) -> bool,
    /// Names that may stand in a checkpoint and that fpt never reads (heads, buffers):
    /// ignored with a debug log; other unknown names get a warning.
    pub quiet: &'static [&'static str],
}

impl Naming {
    /// A checkpoint under fpt's own names, nothing transposed, no alias.
    pub const PLAIN: Naming = Naming {
        prefixes: &[],
        alias: str::to_string,
        transposed: |_| false,
        quiet: &[],
    };
}

/// Reads the tensors `specs` name from a safetensors file, checking each one's presence
/// and shape, the names read as `naming` says. Tensors not `used` are shape-checked when
/// present but not loaded, and may be absent; a missing used tensor is an error naming it.
pub(crate) fn read_checked(
    weights: &Path,
    specs: &[ParamSpec],
    naming: &Naming,
    device: &Device,
) -> Result<std::collections::HashMap<String, Tensor>> {
    let Naming {
        prefixes,
        alias,
        transposed,
        quiet,
    } = naming;
    let st_err = |msg: String| BackboneError::Safetensors {
        path: weights.to_path_buf(),
        msg,
    };
    let shards = shard_files(weights)?;
    // SAFETY: the files are mapped read-only; fpt never writes checkpoints in place
    // (writes go to a temporary file that is renamed), so they do not change under us.
    let st = match &shards {
        Some(files) => unsafe { candle_core::safetensors::MmapedSafetensors::multi(files) },
        None => unsafe { candle_core::safetensors::MmapedSafetensors::new(weights) },
    }
    .map_err(|e| st_err(e.to_string()))?;
    let names: std::collections::HashSet<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
    let prefix = prefixes
        .iter()
        .copied()
        .find(|p| names.iter().any(|n| n.starts_with(p)))
        .unwrap_or("");
    let mut used_names = std::collections::HashSet::new();
    let mut out = std::collections::HashMap::new();
    for spec in specs {
        let found = [
            format!("{prefix}{}", spec.name),
            format!("{prefix}{}", alias(&spec.name)),
        ]
        .into_iter()
        .find(|n| names.contains(n));
        let full = match found {
            Some(n) => n,
            // FPT never reads it (a pooler, a token table): a checkpoint may leave it out,
            // as `BertModel(add_pooling_layer=False)` does.
            None if !spec.used => {
                tracing::debug!(file = %weights.display(), "`{prefix}{}` is absent; fpt does not use it", spec.name);
                continue;
            }
            None => {
                return Err(BackboneError::MissingTensor {
                    path: weights.to_path_buf(),
                    tensor: format!("{prefix}{}", spec.name),
                })
            }
        };
        used_names.insert(full.clone());
        let view = st.get(&full).map_err(|e| st_err(e.to_string()))?;
        let t = transposed(&spec.name);
        let mut expected = spec.shape.clone();
        if t {
            expected.reverse();
        }
        if view.shape() != expected.as_slice() {
            return Err(BackboneError::Shape {
                path: weights.to_path_buf(),
                tensor: full,
                expected,
                found: view.shape().to_vec(),
            });
        }
        if !matches!(
            view.dtype(),
            safetensors::Dtype::F32 | safetensors::Dtype::F16 | safetensors::Dtype::BF16 | safetensors::Dtype::F64
        ) {
            return Err(st_err(format!(
                "tensor `{full}` is {:?}; a weight must be floating point (f32, f16, bf16 or f64)",
                view.dtype()
            )));
        }
        if !spec.used {
            continue;
        }
        let x = st
            .load(&full, device)
            .map_err(|e| st_err(format!("tensor `{full}`: {e}")))?
            .to_dtype(DType::F32)?;
        if let Some(i) = first_non_finite(&x)? {
            return Err(st_err(format!(
                "tensor `{full}` holds a non-finite value (NaN or infinity) at flat index {i}"
            )));
        }
        let x = if t { x.t()?.contiguous()? } else { x };
        out.insert(spec.name.clone(), x);
    }
    let (known, unknown): (Vec<&String>, Vec<&String>) = names
        .iter()
        .filter(|n| !used_names.contains(*n))
        .partition(|n| quiet.iter().any(|q| n.contains(q)));
    if let Some(first) = known.first() {
        tracing::debug!(file = %weights.display(), "ignoring {} tensors FPT does not use (heads, buffers), e.g. `{first}`", known.len());
    }
    if let Some(first) = unknown.first() {
        tracing::warn!(file = %weights.display(), "ignoring {} tensors this architecture does not use, e.g. `{first}`", unknown.len());
    }
    Ok(out)
}

/// The flat index of the first NaN or infinity in an f32 tensor, if any (read in place on
/// the CPU).
pub(crate) fn first_non_finite(t: &Tensor) -> candle_core::Result<Option<usize>> {
    let t = t.to_device(&Device::Cpu)?.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(cs) = &*storage else {
        candle_core::bail!("first_non_finite: expected a CPU tensor")
    };
    let data = cs.as_slice::<f32>()?;
    let (a, b) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("first_non_finite: not contiguous".into()))?;
    Ok(data[a..b].iter().position(|v| !v.is_finite()))
}

/// For a sharded checkpoint (`model.safetensors.index.json`), its shard files (each checked
/// to exist); `None` for a single file.
pub fn shard_files(weights: &Path) -> Result<Option<Vec<PathBuf>>> {
    if !weights.to_string_lossy().ends_with(".index.json") {
        return Ok(None);
    }
    let bad = |msg: String| BackboneError::Config {
        path: weights.to_path_buf(),
        msg,
    };
    let text = std::fs::read_to_string(weights).map_err(|source| BackboneError::Io {
        path: weights.to_path_buf(),
        source,
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("missing field `weight_map`".into()))?;
    let dir = weights.parent().unwrap_or(Path::new("."));
    let mut files: Vec<PathBuf> = Vec::new();
    for (tensor, file) in map {
        let f = file
            .as_str()
            .ok_or_else(|| bad(format!("weight_map entry `{tensor}` is not a file name")))?;
        let p = dir.join(f);
        if !files.contains(&p) {
            if !p.is_file() {
                return Err(BackboneError::Io {
                    path: p,
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("shard listed in {} is missing", weights.display()),
                    ),
                });
            }
            files.push(p);
        }
    }
    Ok(Some(files))
}

//! Where a backbone's files come from: a local directory, or the standard Hugging Face
//! cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`), filled by
//! `fpt fetch` or by any Python tool. With `HF_HUB_OFFLINE=1` the Hub is never contacted.

use crate::{BackboneError, Result};
use std::path::{Path, PathBuf};

/// The files of one model.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    /// `config.json`.
    pub config: PathBuf,
    /// `model.safetensors`, when weights were asked for.
    pub weights: Option<PathBuf>,
}

/// The Hugging Face hub cache directory this process uses.
pub fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        return PathBuf::from(p).join("hub");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("huggingface").join("hub")
}

/// Whether `HF_HUB_OFFLINE` is set to a true value.
pub fn offline() -> bool {
    matches!(
        std::env::var("HF_HUB_OFFLINE")
            .map(|v| v.to_ascii_lowercase())
            .as_deref(),
        Ok("1" | "true" | "yes" | "on")
    )
}

fn check_dir(dir: &Path, want_weights: bool) -> Result<ModelFiles> {
    let config = dir.join("config.json");
    if !config.is_file() {
        return Err(BackboneError::Io {
            path: config,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no config.json in the model directory"),
        });
    }
    let weights = if want_weights {
        let w = dir.join("model.safetensors");
        if !w.is_file() {
            let why = if dir.join("pytorch_model.bin").is_file() {
                "only pytorch_model.bin is present; fpt reads safetensors only (it never unpickles files): convert it with `safetensors` in Python"
            } else {
                "no model.safetensors in the model directory"
            };
            return Err(BackboneError::Io {
                path: w,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, why),
            });
        }
        Some(w)
    } else {
        None
    };
    Ok(ModelFiles { config, weights })
}

/// Resolves `source` (a directory, or a Hub model id with an optional `@revision`) to its
/// files. A directory is used as is; a model id is looked up in the cache and, unless
/// offline, downloaded into it.
pub fn resolve(source: &str, want_weights: bool) -> Result<ModelFiles> {
    let as_path = Path::new(source);
    if as_path.is_dir() {
        return check_dir(as_path, want_weights);
    }
    if source.starts_with('.') || source.starts_with('/') || source.ends_with('/') {
        return Err(BackboneError::Io {
            path: as_path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "model directory not found"),
        });
    }
    let (id, revision) = match source.split_once('@') {
        Some((id, rev)) => (id, rev.to_string()),
        None => (source, "main".to_string()),
    };
    let repo = hf_hub::Repo::with_revision(id.to_string(), hf_hub::RepoType::Model, revision.clone());
    let cache = hf_hub::Cache::new(cache_dir());
    let cached = cache.repo(repo.clone());
    let mut names = vec!["config.json"];
    if want_weights {
        names.push("model.safetensors");
    }
    let mut found: Vec<Option<PathBuf>> = names.iter().map(|n| cached.get(n)).collect();
    if found.iter().any(Option::is_none) {
        let hint = format!(
            "`fpt fetch {source}` on a machine that reaches the Hub, or copy its cache folder to {}",
            cache_dir().display()
        );
        if offline() {
            return Err(BackboneError::NotCached {
                model: source.to_string(),
                cache: cache_dir().display().to_string(),
                why: "HF_HUB_OFFLINE is set".into(),
                hint,
            });
        }
        let api = hf_hub::api::sync::ApiBuilder::from_cache(cache)
            .with_progress(true)
            .build()
            .map_err(|e| BackboneError::NotCached {
                model: source.to_string(),
                cache: cache_dir().display().to_string(),
                why: format!("the Hub client could not start ({e})"),
                hint: hint.clone(),
            })?;
        let api_repo = api.repo(repo);
        for (slot, name) in found.iter_mut().zip(&names) {
            if slot.is_none() {
                *slot = Some(api_repo.get(name).map_err(|e| BackboneError::NotCached {
                    model: source.to_string(),
                    cache: cache_dir().display().to_string(),
                    why: format!("downloading {name} failed ({e})"),
                    hint: hint.clone(),
                })?);
            }
        }
    }
    let mut it = found.into_iter().map(|p| p.expect("filled above"));
    let config = it.next().expect("config");
    Ok(ModelFiles {
        config,
        weights: it.next(),
    })
}

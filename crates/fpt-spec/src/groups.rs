//! Parameter roles and the groups a run trains (`--train`).

use crate::{Result, SpecError};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The role of a parameter tensor in the FPT recipe (paper §2.2). Every backbone tensor
/// has exactly one role; the input and output layers have their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The new input layer (Linear or Embedding).
    Input,
    /// The new output layer.
    Output,
    /// LayerNorm scales and biases.
    LayerNorm,
    /// Learned positional embeddings.
    Positions,
    /// Self-attention weights and biases.
    Attention,
    /// Feed-forward (MLP) weights and biases.
    FeedForward,
    /// Recurrent-cell weights (the LSTM baselines' input-to-hidden and hidden-to-hidden
    /// maps): frozen in the FPT setting, trained with `all` or `rec`.
    Recurrent,
    /// Anything else (e.g. GPT-2's token embedding `wte`, unused with input embeddings);
    /// always frozen.
    Other,
}

impl Role {
    /// All roles, in report order.
    pub const ALL: [Role; 8] = [
        Role::Input,
        Role::Output,
        Role::LayerNorm,
        Role::Positions,
        Role::Attention,
        Role::FeedForward,
        Role::Recurrent,
        Role::Other,
    ];

    /// The short name used in `--train` lists and reports.
    pub fn short(self) -> &'static str {
        match self {
            Role::Input => "in",
            Role::Output => "out",
            Role::LayerNorm => "ln",
            Role::Positions => "pos",
            Role::Attention => "attn",
            Role::FeedForward => "ff",
            Role::Recurrent => "rec",
            Role::Other => "other",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Role::Input => "input",
            Role::Output => "output",
            Role::LayerNorm => "layer_norm",
            Role::Positions => "positions",
            Role::Attention => "attention",
            Role::FeedForward => "feed_forward",
            Role::Recurrent => "recurrent",
            Role::Other => "other",
        };
        f.write_str(s)
    }
}

/// Which parameter groups are trained; everything else is frozen (plain tensors, never
/// `Var`s). The default is the paper's FPT setting: input, output, LayerNorm, positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainGroups {
    /// Train the input layer.
    pub input: bool,
    /// Train the output layer.
    pub output: bool,
    /// Train the LayerNorm parameters.
    pub layer_norm: bool,
    /// Train the positional embeddings.
    pub positions: bool,
    /// Train the self-attention weights.
    pub attention: bool,
    /// Train the feed-forward weights.
    pub feed_forward: bool,
    /// Train recurrent-cell weights (LSTM baselines).
    #[serde(default, skip_serializing_if = "is_false")]
    pub recurrent: bool,
    /// Train the attention weights of the last block only (paper Table 14's "+ last attn
    /// layer"); "last" is the backbone's last block after any depth cut.
    #[serde(default, skip_serializing_if = "is_false")]
    pub last_attention: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Default for TrainGroups {
    fn default() -> Self {
        Self::fpt()
    }
}

impl TrainGroups {
    /// The paper's frozen pretrained transformer: in, out, ln, pos.
    pub fn fpt() -> Self {
        Self {
            input: true,
            output: true,
            layer_norm: true,
            positions: true,
            attention: false,
            feed_forward: false,
            recurrent: false,
            last_attention: false,
        }
    }

    /// Every group trains (full training / fine-tuning).
    pub fn all() -> Self {
        Self {
            input: true,
            output: true,
            layer_norm: true,
            positions: true,
            attention: true,
            feed_forward: true,
            recurrent: true,
            last_attention: false,
        }
    }

    /// Nothing trains.
    pub fn none() -> Self {
        Self {
            input: false,
            output: false,
            layer_norm: false,
            positions: false,
            attention: false,
            feed_forward: false,
            recurrent: false,
            last_attention: false,
        }
    }

    /// Whether tensors of `role` train. [`Role::Other`] never does.
    pub fn trains(&self, role: Role) -> bool {
        match role {
            Role::Input => self.input,
            Role::Output => self.output,
            Role::LayerNorm => self.layer_norm,
            Role::Positions => self.positions,
            Role::Attention => self.attention,
            Role::FeedForward => self.feed_forward,
            Role::Recurrent => self.recurrent,
            Role::Other => false,
        }
    }

    /// Whether a tensor trains: the tensor of `role` in block `block` (`None` outside the
    /// blocks) of a backbone whose last block is `last_block`. Its role's group trains, or
    /// it belongs to the last block's attention under `last_attention`. The one trainable
    /// predicate: the backbones build their `Var`s with it and every count (inspect,
    /// `result.json`, reports) derives from it.
    pub fn trains_tensor(&self, role: Role, block: Option<usize>, last_block: Option<usize>) -> bool {
        self.trains(role) || (self.last_attention && role == Role::Attention && block.is_some() && block == last_block)
    }

    fn set(&mut self, role: Role, on: bool) {
        match role {
            Role::Input => self.input = on,
            Role::Output => self.output = on,
            Role::LayerNorm => self.layer_norm = on,
            Role::Positions => self.positions = on,
            Role::Attention => self.attention = on,
            Role::FeedForward => self.feed_forward = on,
            Role::Recurrent => self.recurrent = on,
            Role::Other => {}
        }
    }
}

impl FromStr for TrainGroups {
    type Err = SpecError;

    /// Parses `in,out,ln,pos,attn,ff,rec,last-attn` (any subset, any order), `all`, `fpt`
    /// or `none`.
    /// Long names (`input`, `layer_norm`, `feed_forward`, ...) are accepted too.
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        match s {
            "all" => return Ok(Self::all()),
            "fpt" | "default" => return Ok(Self::fpt()),
            "none" | "" => return Ok(Self::none()),
            _ => {}
        }
        let mut g = Self::none();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let role = match part {
                "in" | "input" => Role::Input,
                "out" | "output" => Role::Output,
                "ln" | "layer_norm" | "layernorm" => Role::LayerNorm,
                "pos" | "positions" => Role::Positions,
                "attn" | "attention" => Role::Attention,
                "ff" | "mlp" | "feed_forward" => Role::FeedForward,
                "rec" | "recurrent" => Role::Recurrent,
                "last-attn" | "last_attention" => {
                    g.last_attention = true;
                    continue;
                }
                other => return Err(SpecError::UnknownGroup(other.to_string())),
            };
            g.set(role, true);
        }
        Ok(g)
    }
}

impl fmt::Display for TrainGroups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Role::ALL
            .iter()
            .filter(|r| self.trains(**r))
            .map(|r| r.short())
            .collect();
        let mut names = names;
        if self.last_attention && !self.attention {
            names.push("last-attn");
        }
        if names.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&names.join(","))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn train_groups_parse_and_print() {
        let g: TrainGroups = "in,out,ln,pos".parse().unwrap();
        assert_eq!(g, TrainGroups::fpt());
        assert_eq!(g.to_string(), "in,out,ln,pos");
        let g: TrainGroups = "attn, ff".parse().unwrap();
        assert!(g.attention && g.feed_forward && !g.input);
        assert_eq!("all".parse::<TrainGroups>().unwrap(), TrainGroups::all());
        let e = "in,bogus".parse::<TrainGroups>().unwrap_err().to_string();
        assert!(e.contains("`bogus`"), "{e}");
    }
}

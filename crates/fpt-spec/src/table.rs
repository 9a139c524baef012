//! Tables and figures of the paper as data (`data/tables/<id>.toml`), and the scales they
//! run at (`data/tables/scales.toml`). The ablation harness (`fpt-ablate`) expands a table
//! into one cell per (row, column): the table's `defaults`, then the row's settings, then
//! the column's; no table has code of its own.

use crate::ShapeOverrides;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a table's cells hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Metric {
    /// Accuracy on the evaluation split, in percent.
    #[default]
    TestAccuracy,
    /// Accuracy on the training split, in percent.
    TrainAccuracy,
    /// Steps to convergence (see `TrainSpec::convergence_tolerance`).
    StepsToConvergence,
    /// Backbone parameters (counted from the config; nothing trains).
    ParamsTotal,
    /// Trained parameters, input and output layers included (counted).
    ParamsTrained,
    /// Trained parameters counted as the paper's Table 8 did: position rows only for the
    /// tokens the task uses, the input layer at the cell's `input_width` when set.
    ParamsTrainedUsed,
    /// Blocks of the backbone (from its config).
    ConfigLayers,
    /// Hidden width (from its config).
    ConfigHidden,
    /// Attention heads (from its config).
    ConfigHeads,
    /// Per-epoch speedup of output-only training on cached features over FPT training
    /// (Table 10), as a factor.
    Speedup,
    /// A number only the paper gives (a hyperparameter, a citation): shown, not run.
    PaperOnly,
}

optional_settings! {
    /// The settings of a cell; unset fields inherit (table defaults, row, column).
    #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
    pub struct CellSettings {
        /// Task name as on the command line.
        task: String,
        /// Backbone as named in the paper (`gpt2`, `gpt2-medium`, `gpt2-large`,
        /// `bert-base-uncased`, `t5-base`, `allenai/longformer-base-4096`, `vit`); scales may
        /// substitute it.
        backbone: String,
        /// `pretrained`, `random`, `stats-only` or `bit-pretrained`.
        init: String,
        /// Trained groups (`--train` syntax).
        train: String,
        /// Depth cut: the first N blocks.
        depth: usize,
        /// `transformer` (default), `lstm`, `output-only` (cached features), or `literature`
        /// (a number the paper cites from other work).
        model: String,
        /// LSTM layers.
        lstm_layers: usize,
        /// LSTM with residual connections.
        lstm_residual: bool,
        /// LSTM with learned positional embeddings.
        lstm_positions: bool,
        /// Blocks without their feed-forward half (random init; the critics' LLM2Attn row).
        attention_only: bool,
        /// Train the last attention layer too (Table 14).
        last_attention: bool,
        /// How a linear input layer is initialised (`orthogonal` unless set; §3.12).
        input_init: crate::InputInit,
        /// What the cell reports.
        metric: Metric,
        /// Learning rate (paper: 1e-3; homology 1e-4; LSTMs 3e-4).
        lr: f64,
        /// For counted cells: the input layer's width the paper counted with (Table 8: 16).
        input_width: usize,
        /// What loads instead of the cell's backbone, over the scale's own substitution
        /// (set by an [`Alternate`] row, not written in tables).
        substitute: Substitute,
        /// The frozen weights' number format (`f32` unless set).
        precision: crate::Precision,
        /// The paper's steps to convergence for this row, by task (its Table 6): a run is
        /// not called converged before them. Written into the run's spec
        /// (`TrainSpec::converge_floor`) only at scales with `apply_converge_floor`; every
        /// report applies it when it judges a cell's runs.
        converge_floor: BTreeMap<String, usize>,
    }
}

impl Metric {
    /// Whether the metric is an accuracy in percent (test or train).
    pub fn is_percent(self) -> bool {
        matches!(self, Metric::TestAccuracy | Metric::TrainAccuracy)
    }

    /// Whether the metric is read off the backbone's config (nothing trains).
    pub fn is_counted(self) -> bool {
        matches!(
            self,
            Metric::ParamsTotal
                | Metric::ParamsTrained
                | Metric::ParamsTrainedUsed
                | Metric::ConfigLayers
                | Metric::ConfigHidden
                | Metric::ConfigHeads
        )
    }
}

/// A row or a column: a label and the settings it contributes. Read strictly: a key that
/// is not a [`CellSettings`] field is an error naming it (serde's `flatten` alone would
/// drop it silently).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Labelled")]
pub struct Axis {
    /// As printed in the paper.
    pub label: String,
    /// Its settings.
    #[serde(flatten)]
    pub set: CellSettings,
}

/// Settings for one cell, on top of its row and column (e.g. Table 1's CIFAR-10 FPT
/// number comes from GPT-2 large). Read strictly, as [`Axis`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Labelled")]
pub struct CellOverride {
    /// Row label.
    pub row: String,
    /// Column label.
    pub col: String,
    /// Its settings.
    #[serde(flatten)]
    pub set: CellSettings,
}

/// A row, column or cell as written: its labels and every other key, which must be
/// [`CellSettings`] fields.
#[derive(Deserialize)]
struct Labelled {
    label: Option<String>,
    row: Option<String>,
    col: Option<String>,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

impl Labelled {
    fn settings(self, what: &str) -> Result<CellSettings, String> {
        serde_json::from_value(serde_json::Value::Object(self.rest)).map_err(|e| format!("{what}: {e}"))
    }
}

impl TryFrom<Labelled> for Axis {
    type Error = String;
    fn try_from(l: Labelled) -> Result<Self, String> {
        let label = l.label.clone().ok_or("a row or column needs a `label`")?;
        if l.row.is_some() || l.col.is_some() {
            return Err(format!(
                "row or column `{label}`: `row` and `col` belong to `[[cells]]`"
            ));
        }
        let set = l.settings(&format!("row or column `{label}`"))?;
        Ok(Axis { label, set })
    }
}

impl TryFrom<Labelled> for CellOverride {
    type Error = String;
    fn try_from(l: Labelled) -> Result<Self, String> {
        let (Some(row), Some(col)) = (l.row.clone(), l.col.clone()) else {
            return Err("a `[[cells]]` entry needs `row` and `col`".into());
        };
        if l.label.is_some() {
            return Err(format!("cell ({row}, {col}): `label` belongs to rows and columns"));
        }
        let set = l.settings(&format!("cell ({row}, {col})"))?;
        Ok(CellOverride { row, col, set })
    }
}

/// What kind of artefact a spec describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A table of numbers.
    #[default]
    Table,
    /// Grouped bars of a table's cells (Figure 1).
    Bars,
    /// First-layer attention maps of a trained run (Figures 3-5).
    AttentionMap,
    /// Standard deviation of parameters by layer (Figure 6).
    ParamStd,
}

/// One table or figure of the paper.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSpec {
    /// `table1` ... `table22`, `fig1`, `fig3` ... `fig6`.
    pub id: String,
    /// Short title.
    pub title: String,
    /// The paper's caption.
    pub caption: String,
    /// Section of the paper.
    #[serde(default)]
    pub section: String,
    /// Table or figure kind.
    #[serde(default)]
    pub kind: Kind,
    /// For figures drawn from a table's cells: that table's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_table: Option<String>,
    /// Settings every cell starts from.
    #[serde(default)]
    pub defaults: CellSettings,
    /// Rows.
    #[serde(default)]
    pub rows: Vec<Axis>,
    /// Columns.
    #[serde(default)]
    pub cols: Vec<Axis>,
    /// The paper's numbers as printed, `paper[row][col]` (`-` where the paper has none).
    #[serde(default)]
    pub paper: Vec<Vec<String>>,
    /// Per-cell settings.
    #[serde(default)]
    pub cells: Vec<CellOverride>,
    /// Notes shown under the report.
    #[serde(default)]
    pub notes: Vec<String>,
    /// Per-scale overrides of `scales.toml` for this table.
    #[serde(default)]
    pub scales: BTreeMap<String, ScaleSettings>,
    /// The paper's claims this table tests, as checks over its cells. A claim that names an
    /// [`Alternate`] row is checked only at the scales that carry it.
    #[serde(default)]
    pub claims: Vec<Claim>,
    /// Rows that exist only at the scales where the paper's backbone they name is
    /// substituted: a second stand-in beside the scale's own, run like one of the paper's
    /// rows and shown beside its numbers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternates: Vec<Alternate>,
    /// A figure's statements (its caption's or the paper's text about it), each judged from
    /// what the figure measures.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub statements: Vec<Statement>,
}

/// A statement the paper makes about one of its figures, judged from the figure's measure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    /// The statement, as the paper makes it.
    pub text: String,
    /// What decides it.
    pub measure: Measure,
    /// `xor-pair-weaker`: the figure (at the same scale) whose pattern this one's is weaker
    /// than.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub than_figure: Option<String>,
}

/// How a figure's statement is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Measure {
    /// Bit XOR: each read-out token's best first-layer head puts its attention on the two
    /// bits the token XORs, above the 95th percentile of the same statistic on every other
    /// pair of keys it sees, for most read-out tokens, and at least twice a uniform spread.
    XorPair,
    /// Bit XOR: the XOR'ed pair's first-layer attention (mean over heads) is weaker than in
    /// `than_figure`, paired over the read-out tokens.
    XorPairWeaker,
    /// Bit Memory: the masked query's tokens attend more to the string they are a copy of
    /// (found from the visible bits) than to any other string, for most query tokens.
    MatchingString,
    /// The pretrained parameters' standard deviation by layer is unlike the default init
    /// (0.02 for weights, 0 for biases).
    LayerSpread,
}

/// A row of a table that exists only where a scale substitutes the paper's backbone
/// `stands_in_for` (e.g. a causal language model beside the sentence encoder that stands in
/// for GPT-2 where GPT-2's weights cannot be had). Its cells are the cells of row `like`
/// with `source` loaded instead; the paper's numbers shown beside them are `like`'s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Alternate {
    /// The row's label.
    pub label: String,
    /// The paper's row it is run like (its settings and the paper's numbers).
    pub like: String,
    /// The paper's backbone it stands in for (a key of the scale's `backbones`): the row
    /// exists at a scale only where that backbone is substituted by something that runs.
    pub stands_in_for: String,
    /// What loads instead (a name, Hub id, file or directory).
    pub source: String,
    /// Why, printed beside every cell of the row.
    pub note: String,
    /// The frozen weights' number format for the row's runs (`f32` unless set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<crate::Precision>,
    /// The scales the row runs at (empty: every scale that substitutes `stands_in_for`):
    /// a row too slow for a scale's budget runs at a longer one of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scales: Vec<String>,
}

/// Cells of a table: every cell of `row`, of `col`, or the one at both.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Select {
    /// A row label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row: Option<String>,
    /// A column label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub col: Option<String>,
}

/// How a claim compares its cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClaimKind {
    /// `a` exceeds `b` by more than `by` points, on the mean of paired differences.
    #[default]
    Greater,
    /// `a` exceeds every selection in `among` (paired the same way).
    Best,
    /// `a` and `b` differ by at most `within` points either way, on the mean of paired
    /// differences ("comparable", "close").
    Comparable,
    /// The gap `a - b` exceeds the gap `c - d` by more than `by` points, on the mean over
    /// the paired cells ("the architecture explains most of the gain": `(Trans. - LSTM) -
    /// (FPT - Trans.)`; "Linformer overfits most": `(train - test) - (train - test)`).
    Gap,
    /// `a / b` exceeds the factor `by`, on the log scale over the paired cells (steps to
    /// convergence: "6x slower"); with `within` (a factor above 1), `a / b` lies within
    /// `by / within` to `by * within` ("about `by` times").
    Ratio,
}

/// A claim of the paper, checked over a table's cells: `a` and `b` (or each of `among`)
/// select the same number of cells, paired in order (a row against a row pairs by
/// column).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// The claim, as the paper makes it.
    pub text: String,
    /// How the cells compare.
    #[serde(default)]
    pub kind: ClaimKind,
    /// The cells that should be ahead.
    pub a: Select,
    /// What they are compared with (`greater`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b: Option<Select>,
    /// What they are compared with (`best`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub among: Vec<Select>,
    /// `gap`: the cells of the gap `c - d` that `a - b` is compared with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub c: Option<Select>,
    /// `gap`: see `c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub d: Option<Select>,
    /// The margin, in the cells' unit (points of accuracy, steps).
    #[serde(default)]
    pub by: f64,
    /// `greater` or `comparable` without `b`: the number every cell of `a` is compared with
    /// (e.g. a speedup of 100x; the 92% of a linear classifier on MNIST).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub than: Option<f64>,
    /// `comparable`: the largest difference either way, in the cells' unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<f64>,
    /// The claim is about a failure (e.g. "+ Attention can diverge"): cells at their
    /// trivial baseline are evidence for it, not left out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub about_failure: bool,
    /// A claim the paper does not make: about rows it does not have (the critics' rows,
    /// whose paper numbers read `n/p`); it has no verdict on the paper's numbers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub beyond_paper: bool,
    /// A claim the paper makes in its text about cells its tables print no numbers for (a
    /// Bit row in Table 6, a linear classifier's 92% on MNIST): the paper's verdict is its
    /// words, not a check of its numbers; the section that says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_text: Option<String>,
}

/// A backbone standing in for another at a scale.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Substitute {
    /// What loads instead (a name, Hub id or directory).
    pub source: String,
    /// Shape overrides (random init only).
    #[serde(default)]
    pub shape: ShapeOverrides,
    /// Why, printed beside every cell it affects.
    pub note: String,
}

optional_settings! {
    /// Per-task overrides at a scale.
    #[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
    pub struct TaskOverrides {
        /// Optimizer steps.
        steps: usize,
        /// Batch size.
        batch_size: usize,
        /// Micro-batch size.
        micro_batch_size: usize,
        /// Evaluate every N steps.
        eval_every: usize,
        /// Held-out examples (0 = all).
        eval_examples: usize,
        /// Training examples (sample).
        train_examples: usize,
        /// Bits per string (bit tasks).
        n_bits: usize,
        /// Bits per token (bit tasks).
        patch: usize,
        /// Maximum sequence length.
        max_len: usize,
        /// ListOps' brackets: `drop` (the reference code's tokens, the default) or `keep`
        /// (LRA's pipeline).
        brackets: crate::Brackets,
        /// Learning rate.
        lr: f64,
        /// Epochs of output-only training on cached features (Table 10).
        cached_epochs: usize,
        /// Training examples whose features output-only training caches (datasets; `None`:
        /// `train_examples`, else the whole split).
        cached_examples: usize,
        /// Accuracy on the training split (`never`, `final`, `every`); cells that report
        /// training accuracy always measure it. `None`: `final`.
        train_eval: crate::TrainEval,
        /// Runs per cell, each with its own seed (the cell's seed, then the next ones): the
        /// cell reports their mean and spread, and claims use it. `None`: one.
        seeds: usize,
        /// Write a checkpoint every this many steps (a run interrupted later resumes from it;
        /// one is always written at the end).
        checkpoint_every: usize,
        /// Stop after this many evaluations without improvement (`steps` is then a cap).
        early_stop_patience: usize,
        /// Improvement counted only beyond the evaluation's noise, and never stopping a run
        /// still at its trivial baseline (`TrainSpec::early_stop_within_noise`).
        early_stop_within_noise: bool,
        /// Stop only on a plateau by the paired test (`TrainSpec::stop_on_plateau`).
        stop_on_plateau: bool,
    }
}

/// A scale: what every cell runs with, per task, and which backbones stand in.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleSettings {
    /// The scale this one extends: its settings (and each table's overrides for it) first,
    /// these over them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// One line on what the scale is for.
    #[serde(default)]
    pub description: String,
    /// Settings for every task.
    #[serde(default)]
    pub all: TaskOverrides,
    /// Per-task settings (keys: task names).
    #[serde(default)]
    pub tasks: BTreeMap<String, TaskOverrides>,
    /// Backbone substitutions (keys: the paper's backbone names; `lstm` for the LSTM
    /// baselines).
    #[serde(default)]
    pub backbones: BTreeMap<String, Substitute>,
    /// How `bit-pretrained` backbones are trained at this scale (defaults when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bit_pretrain: Option<crate::BitPretrainSpec>,
    /// Where this scale's settings still differ from the paper's, printed beside every
    /// cell they concern (the `paper` scale: what fpt cannot or does not copy). Keys: `all`,
    /// a task name, `init:<init>` or `model:<model>`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub differs: BTreeMap<String, Vec<String>>,
    /// The spread of a task's accuracy across seeds at this scale, as measured (keys: task
    /// names): a single-seed comparison within it is inconclusive.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub seed_spread: BTreeMap<String, SeedSpread>,
    /// Write each row's `converge_floor` (the paper's Table 6 count) into its runs' specs, so
    /// they run at least that far before they may stop on a plateau.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub apply_converge_floor: bool,
    /// Seed spreads only from this scale's own `seed_spread` (measured on its own cells),
    /// never the base scale's: a spread measured at another budget is not this scale's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own_seed_spread_only: bool,
    /// A campaign's order of tasks (`fpt run-table` trains by row kind, then seed, then
    /// this order); empty: by run key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub campaign_order: Vec<String>,
    /// Tasks whose seeds past the first wait, in a campaign, behind the Bit row's runs: their
    /// first seed trains in `campaign_order`, their others once the other tasks' three seeds
    /// and the Bit row are trained (long runs that no claim the campaign must decide needs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub campaign_later: Vec<String>,
}

/// A task's accuracy spread across seeds at a scale, as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedSpread {
    /// Standard deviation across seeds, in points of accuracy.
    pub sd: f64,
    /// Where it was measured (report, cells, seeds).
    pub source: String,
    /// The backbone (its source, as a run spec names it) the seeds ran on: the spread
    /// widens only that backbone's cells, never another's.
    pub backbone: String,
}

impl ScaleSettings {
    /// `self` overridden by `over` (task settings merged key by key).
    pub fn merged(&self, over: &ScaleSettings) -> ScaleSettings {
        let mut tasks = self.tasks.clone();
        for (k, v) in &over.tasks {
            let base = tasks.get(k).cloned().unwrap_or_default();
            tasks.insert(k.clone(), base.merged(v));
        }
        let mut backbones = self.backbones.clone();
        backbones.extend(over.backbones.clone());
        ScaleSettings {
            base: None,
            description: if over.description.is_empty() {
                self.description.clone()
            } else {
                over.description.clone()
            },
            all: self.all.merged(&over.all),
            tasks,
            backbones,
            bit_pretrain: over.bit_pretrain.or(self.bit_pretrain),
            differs: {
                let mut d = self.differs.clone();
                d.extend(over.differs.clone());
                d
            },
            seed_spread: if over.own_seed_spread_only {
                over.seed_spread.clone()
            } else {
                let mut d = self.seed_spread.clone();
                d.extend(over.seed_spread.clone());
                d
            },
            own_seed_spread_only: self.own_seed_spread_only || over.own_seed_spread_only,
            apply_converge_floor: self.apply_converge_floor || over.apply_converge_floor,
            campaign_order: if over.campaign_order.is_empty() {
                self.campaign_order.clone()
            } else {
                over.campaign_order.clone()
            },
            campaign_later: if over.campaign_later.is_empty() {
                self.campaign_later.clone()
            } else {
                over.campaign_later.clone()
            },
        }
    }

    /// The settings for `task`: `all`, then the task's own.
    pub fn for_task(&self, task: &str) -> TaskOverrides {
        match self.tasks.get(task) {
            Some(t) => self.all.merged(t),
            None => self.all.clone(),
        }
    }
}

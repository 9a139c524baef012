//! The ablation harness: a table of the paper (`data/tables/<id>.toml`, see
//! [`fpt_spec::table`]) is expanded at a scale into one [`Cell`] per (row, column); each
//! runnable cell becomes a [`RunSpec`] whose hash names its run directory; missing runs are
//! trained; a report puts our number beside the paper's for every cell, with every backbone
//! substitution the scale made and every cell it could not run, and why.
//!
//! ```no_run
//! let dir = std::path::Path::new("data/tables");
//! let table = fpt_ablate::load_table(dir, "table2").unwrap();
//! let scales = fpt_ablate::load_scales(dir).unwrap();
//! let cells = fpt_ablate::expand(&table, &scales, "smoke").unwrap();
//! let out = std::path::Path::new("results");
//! fpt_ablate::run(&cells, out, &fpt_ablate::RunOptions::default(), &mut |line| eprintln!("{line}")).unwrap();
//! let report = fpt_ablate::Report::new(&table, "smoke", &cells, out);
//! report.write(out).unwrap();
//! ```

pub mod bootstrap;
pub mod chart;
pub mod claims;
pub mod figure;
pub mod paper;
pub mod record;
pub mod report;
pub mod reproduce;
pub mod site;
pub mod worker;

pub use report::Report;

use fpt_spec::table::{CellSettings, Metric, ScaleSettings, TableSpec};
use fpt_spec::{BackboneSpec, Init, ResidualInit, RunSpec, TaskSpec, TrainGroups, TrainSpec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Errors of the harness.
#[derive(Debug, thiserror::Error)]
pub enum AblateError {
    /// A table or scale file is malformed.
    #[error("{}: {msg}", path.display())]
    Spec {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A run failed.
    #[error(transparent)]
    Train(#[from] fpt_train::TrainError),
    /// A run panicked.
    #[error("{}: {msg}", dir.display())]
    Panicked {
        /// The run directory.
        dir: PathBuf,
        /// The panic's message.
        msg: String,
    },
    /// A run trained in a child process failed (see [`worker`]).
    #[error("{}: {msg}", dir.display())]
    Worker {
        /// The run directory.
        dir: PathBuf,
        /// Why.
        msg: String,
    },
    /// A request names something that does not exist (a table id, a scale) or asks for
    /// something impossible (no jobs).
    #[error("{0}")]
    Request(String),
    /// This build failed its self-check: no report is written from it.
    #[error("not writing {table}: this build failed its self-check ({summary}); run `fpt selfcheck` to see which")]
    SelfCheck {
        /// The table.
        table: String,
        /// The self-check's one-line summary.
        summary: String,
    },
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, AblateError>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> AblateError + '_ {
    move |source| AblateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The ids of every table and figure spec in `dir`, in paper order.
pub fn list(dir: &Path) -> Result<Vec<String>> {
    let mut ids: Vec<String> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let id = name.strip_suffix(".toml")?;
            (id.starts_with("table") || id.starts_with("fig")).then(|| id.to_string())
        })
        .collect();
    let key = |id: &str| {
        let (kind, n) = if let Some(n) = id.strip_prefix("table") {
            (0, n)
        } else {
            (1, id.trim_start_matches("fig"))
        };
        (kind, n.parse::<u32>().unwrap_or(u32::MAX), id.to_string())
    };
    ids.sort_by_key(|id| key(id));
    Ok(ids)
}

/// Reads `dir/<id>.toml`, checking that the paper's numbers fill the grid.
pub fn load_table(dir: &Path, id: &str) -> Result<TableSpec> {
    let path = dir.join(format!("{id}.toml"));
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    let t: TableSpec = toml::from_str(&text).map_err(|e| AblateError::Spec {
        path: path.clone(),
        msg: e.to_string(),
    })?;
    let bad = |msg: String| AblateError::Spec {
        path: path.clone(),
        msg,
    };
    if t.id != id {
        return Err(bad(format!("id `{}` does not match the file name", t.id)));
    }
    if t.kind == fpt_spec::table::Kind::Table && (t.rows.is_empty() || t.cols.is_empty()) {
        return Err(bad("a table needs rows and cols".into()));
    }
    for o in &t.cells {
        if !t.rows.iter().any(|r| r.label == o.row) || !t.cols.iter().any(|c| c.label == o.col) {
            return Err(bad(format!(
                "cell override ({}, {}) names no row/column of the table",
                o.row, o.col
            )));
        }
    }
    for c in &t.claims {
        claims::validate(&t, c).map_err(&bad)?;
    }
    if !t.rows.is_empty() {
        if t.paper.len() != t.rows.len() {
            return Err(bad(format!(
                "paper has {} rows, the table {}",
                t.paper.len(),
                t.rows.len()
            )));
        }
        for (i, r) in t.paper.iter().enumerate() {
            if r.len() != t.cols.len() {
                return Err(bad(format!(
                    "paper row {} (`{}`) has {} numbers for {} columns",
                    i + 1,
                    t.rows[i].label,
                    r.len(),
                    t.cols.len()
                )));
            }
        }
    }
    Ok(t)
}

/// Reads `dir/scales.toml`.
pub fn load_scales(dir: &Path) -> Result<BTreeMap<String, ScaleSettings>> {
    let path = dir.join("scales.toml");
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    toml::from_str(&text).map_err(|e| AblateError::Spec {
        path: path.clone(),
        msg: e.to_string(),
    })
}

/// What the harness does with a cell.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Train this spec; the run directory is named by `key`.
    Run {
        /// The run.
        spec: Box<RunSpec>,
        /// Hash of the spec (16 hex digits).
        key: String,
    },
    /// Read the number off the backbone's config (nothing trains).
    Count(Box<Counted>),
    /// Not runnable here, and why.
    Unavailable(String),
    /// A number the paper cites or states; nothing to run.
    PaperOnly(String),
    /// The paper did not run this cell (its table shows `-`): nothing to run.
    NotInPaper,
}

/// A cell whose number is counted from a config.
#[derive(Debug, Clone, PartialEq)]
pub struct Counted {
    /// The backbone (the paper's own, never substituted).
    pub backbone: BackboneSpec,
    /// The task whose input/output layers are counted.
    pub task: TaskSpec,
    /// Trained groups.
    pub groups: TrainGroups,
    /// The input width to count with, where the paper counted another than the task's.
    pub input_width: Option<usize>,
}

/// One cell of a table at a scale.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// Row index.
    pub row: usize,
    /// Column index.
    pub col: usize,
    /// The merged settings.
    pub settings: CellSettings,
    /// What it reports.
    pub metric: Metric,
    /// The paper's number as printed.
    pub paper: String,
    /// What happens to it.
    pub plan: Plan,
    /// Substitutions and other changes the scale made, printed beside the cell.
    pub notes: Vec<String>,
    /// Every setting of this cell that differs from the paper's: this scale against the
    /// `paper` scale field by field, and the `paper` scale's own recorded differences
    /// (`differs` in `scales.toml`).
    pub differs: Vec<String>,
    /// Further runs of the same plan with the next seeds (`seeds` at the scale): the cell
    /// reports the mean over its run and these, with their spread. Each as (key, spec).
    pub replicas: Vec<(String, Box<RunSpec>)>,
    /// The task's measured accuracy spread across seeds at the scale (points), where known.
    pub seed_sd: Option<f64>,
}

/// The runs that repeat `plan` with the `seeds - 1` seeds after its own.
fn replicas_of(plan: &Plan, seeds: usize) -> Vec<(String, Box<RunSpec>)> {
    let Plan::Run { spec, .. } = plan else {
        return Vec::new();
    };
    (1..seeds as u64)
        .map(|i| {
            let mut s = spec.clone();
            s.train.seed = spec.train.seed.wrapping_add(i);
            (s.key(), s)
        })
        .collect()
}

/// Runs per cell at scale `sc` for the cell's task (`seeds`, at least one).
fn seeds_for(s: &CellSettings, sc: &ScaleSettings) -> usize {
    s.task.as_deref().and_then(|t| sc.for_task(t).seeds).unwrap_or(1).max(1)
}

/// The run directory's name of `spec`: [`RunSpec::key`].
pub fn spec_key(spec: &RunSpec) -> String {
    spec.key()
}

/// The scale settings for `table` at `scale`: `scales.toml`, then the table's overrides.
pub fn scale_of(table: &TableSpec, scales: &BTreeMap<String, ScaleSettings>, scale: &str) -> Result<ScaleSettings> {
    let base = scales.get(scale).ok_or_else(|| AblateError::Spec {
        path: PathBuf::from("scales.toml"),
        msg: format!(
            "no scale `{scale}` (known: {})",
            scales.keys().cloned().collect::<Vec<_>>().join(", ")
        ),
    })?;
    Ok(match table.scales.get(scale) {
        Some(over) => base.merged(over),
        None => base.clone(),
    })
}

/// Expands `table` at `scale` into its cells.
pub fn expand(table: &TableSpec, scales: &BTreeMap<String, ScaleSettings>, scale: &str) -> Result<Vec<Cell>> {
    expand_with(table, scales, scale, true)
}

/// [`expand`] without looking for this machine's data and weights: every cell as its scale
/// defines it, runnable here or not (what `--dry-run` lists, e.g. the `paper` scale's
/// settings on a machine without the weights).
pub fn expand_unchecked(table: &TableSpec, scales: &BTreeMap<String, ScaleSettings>, scale: &str) -> Result<Vec<Cell>> {
    expand_with(table, scales, scale, false)
}

/// One line of a cell's settings as it would run: task, backbone (source, shape, init,
/// depth), trained groups, budget, learning rate, evaluation, Bit pretraining.
pub fn describe(plan: &Plan) -> String {
    match plan {
        Plan::Run { spec, .. } => {
            let b = &spec.backbone;
            let shape = fpt_backbones::param_specs(b)
                .map(|(c, _)| match c.heads() {
                    0 => format!(" ({} layers x {} wide)", c.layers(), c.hidden_size()),
                    h => format!(" ({} layers x {} wide, {h} heads)", c.layers(), c.hidden_size()),
                })
                .unwrap_or_default();
            let mut parts = vec![
                format!("task {}", spec.task.label()),
                format!("backbone {}{shape}, {}", b.source, b.init),
            ];
            if b.init == Init::Random && b.source.starts_with("gpt2") {
                parts.push(format!(
                    "residual init {}",
                    serde_json::to_value(b.residual_init)
                        .ok()
                        .and_then(|v| v.as_str().map(String::from))
                        .unwrap_or_default()
                ));
            }
            if let Some(d) = b.depth {
                parts.push(format!("depth {d}"));
            }
            if let Some(bp) = b.bit_pretrain {
                parts.push(format!(
                    "Bit pretraining {} steps x {} at lr {:e}",
                    bp.steps, bp.batch_size, bp.lr
                ));
            }
            let t = &spec.train;
            parts.push(format!("train {}", spec.train_groups));
            parts.push(match t.early_stop_patience {
                Some(p) => format!(
                    "at most {} steps x batch {}, stopping after {p} evaluations without improvement{}",
                    t.steps,
                    t.batch_size,
                    if t.early_stop_within_noise {
                        " beyond their noise (never while at its trivial baseline)"
                    } else {
                        ""
                    }
                ),
                None => format!("{} steps x batch {}", t.steps, t.batch_size),
            });
            parts.push(format!("lr {:e}", t.lr));
            if let Some(e) = t.cached_epochs {
                parts.push(format!("{e} epochs on cached features"));
            }
            parts.push(match spec.task.eval_examples {
                0 => "evaluated on the whole split".into(),
                n => format!("evaluated on {n} examples"),
            });
            parts.join("; ")
        }
        Plan::Count(c) => format!(
            "counted from {}'s config (task {}, train {})",
            c.backbone.source,
            c.task.label(),
            c.groups
        ),
        Plan::Unavailable(why) => format!("cannot run: {why}"),
        Plan::PaperOnly(why) => why.clone(),
        Plan::NotInPaper => "not run in the paper (-)".into(),
    }
}

fn expand_with(
    table: &TableSpec,
    scales: &BTreeMap<String, ScaleSettings>,
    scale: &str,
    check: bool,
) -> Result<Vec<Cell>> {
    let sc = scale_of(table, scales, scale)?;
    let paper_sc = scales
        .contains_key("paper")
        .then(|| scale_of(table, scales, "paper"))
        .transpose()?;
    let mut cells = Vec::new();
    if table.kind == fpt_spec::table::Kind::AttentionMap {
        // An attention-map figure draws from one run: its defaults.
        let s = table.defaults.clone();
        let metric = Metric::TestAccuracy;
        let mut notes = Vec::new();
        let plan = plan_at(&s, metric, &sc, &mut notes, check);
        let differs = paper_differences(&s, metric, &plan, paper_sc.as_ref(), 1);
        cells.push(Cell {
            row: 0,
            col: 0,
            settings: s,
            metric,
            paper: String::new(),
            plan,
            notes,
            differs,
            replicas: Vec::new(),
            seed_sd: None,
        });
        return Ok(cells);
    }
    for (r, row) in table.rows.iter().enumerate() {
        for (c, col) in table.cols.iter().enumerate() {
            let mut s = table.defaults.merged(&row.set).merged(&col.set);
            for o in table.cells.iter().filter(|o| o.row == row.label && o.col == col.label) {
                s = s.merged(&o.set);
            }
            let metric = s.metric.unwrap_or_default();
            let paper = table.paper[r][c].clone();
            let mut notes = Vec::new();
            let plan = if paper.trim() == "-" {
                Plan::NotInPaper
            } else {
                plan_at(&s, metric, &sc, &mut notes, check)
            };
            if let Plan::Run { spec, .. } = &plan {
                notes.extend(data_origin(&spec.task));
            }
            let seeds = seeds_for(&s, &sc);
            let differs = paper_differences(&s, metric, &plan, paper_sc.as_ref(), seeds);
            let replicas = replicas_of(&plan, seeds);
            let seed_sd = s.task.as_deref().and_then(|t| sc.seed_spread.get(t)).map(|x| x.sd);
            if !replicas.is_empty() {
                notes.push(format!(
                    "{} seeds per cell: the mean and spread over them (the paper prints one number per cell)",
                    replicas.len() + 1
                ));
            }
            cells.push(Cell {
                row: r,
                col: c,
                settings: s,
                metric,
                paper,
                plan,
                notes,
                differs,
                replicas,
                seed_sd,
            });
        }
    }
    Ok(cells)
}

/// The plan of a cell at scale `sc`; `check` = whether this machine's data and weights are
/// looked for (not for the `paper`-scale reference a cell is compared with).
fn plan_at(s: &CellSettings, metric: Metric, sc: &ScaleSettings, notes: &mut Vec<String>, check: bool) -> Plan {
    let model = s.model.as_deref().unwrap_or("transformer");
    if metric == Metric::PaperOnly || model == "literature" {
        return Plan::PaperOnly("the paper's number (cited or stated), not an experiment".into());
    }
    let (lstm, cached) = match model {
        "transformer" => (false, false),
        "lstm" => (true, false),
        "output-only" => (false, true),
        other => return Plan::Unavailable(format!("unknown model `{other}`")),
    };
    let init = match s.init.as_deref().unwrap_or(if lstm { "random" } else { "pretrained" }) {
        "pretrained" => Init::Pretrained,
        "random" => Init::Random,
        "stats-only" => Init::StatsOnly,
        "bit-pretrained" => Init::BitPretrained,
        other => return Plan::Unavailable(format!("unknown init `{other}`")),
    };
    if lstm && init != Init::Random {
        return Plan::Unavailable(format!("an LSTM has no `{init}` weights (random init only)"));
    }
    let mut groups: TrainGroups = match s.train.as_deref().unwrap_or("fpt").parse() {
        Ok(g) => g,
        Err(e) => return Plan::Unavailable(e.to_string()),
    };
    if s.last_attention == Some(true) {
        groups.last_attention = true;
    }
    if cached {
        groups = TrainGroups {
            output: true,
            ..TrainGroups::none()
        };
    }
    let name = if lstm {
        "lstm".to_string()
    } else {
        s.backbone.clone().unwrap_or_else(|| "gpt2".into())
    };
    let Some(task_name) = s.task.as_deref() else {
        return Plan::Unavailable("the cell names no task".into());
    };
    let mut task = match TaskSpec::parse(task_name) {
        Ok(t) => t,
        Err(e) => return Plan::Unavailable(e.to_string()),
    };
    let o = sc.for_task(task_name);
    if task.name.is_generated() {
        task.n_bits = o.n_bits;
        task.patch = o.patch;
    }
    if let Some(n) = o.eval_examples {
        task.eval_examples = n;
    }
    task.train_examples = if cached {
        o.cached_examples.or(o.train_examples)
    } else {
        o.train_examples
    }
    .filter(|_| !task.name.is_generated());
    task.data.max_len = o.max_len;
    if metric.is_counted() {
        // Counted from the paper's own backbone config: no weights, no substitution.
        return Plan::Count(Box::new(Counted {
            backbone: BackboneSpec {
                source: name,
                init: Init::Random,
                shape: Default::default(),
                residual_init: ResidualInit::Unscaled,
                depth: s.depth,
                final_norm: true,
                bit_pretrain: None,
            },
            task,
            groups,
            input_width: s.input_width,
        }));
    }
    let (source, mut shape) = match sc.backbones.get(&name) {
        Some(sub) if sub.source == "none" => return Plan::Unavailable(sub.note.clone()),
        Some(sub) => {
            notes.push(format!("{name} -> {}: {}", sub.source, sub.note));
            (
                sub.source.clone(),
                if init.needs_weights() {
                    Default::default()
                } else {
                    sub.shape
                },
            )
        }
        None => {
            let to = fpt_backbones::hub::canonical(&name);
            if to != name {
                if let Some((_, _, why)) = fpt_backbones::hub::ALIASES.iter().find(|(n, _, _)| *n == name) {
                    notes.push(format!("{name} loads as {to}: {why}"));
                }
            }
            (to.to_string(), Default::default())
        }
    };
    if lstm {
        shape.layers = s.lstm_layers.or(shape.layers);
        shape.lstm_residual = s.lstm_residual.filter(|&r| r);
        shape.lstm_positions = s.lstm_positions.filter(|&p| p);
    }
    if !init.needs_weights() && !lstm && source.starts_with("gpt2") {
        notes.push(
            "random GPT-2 init as in transformers 4.1.1, which the paper ran: every weight N(0, 0.02), \
             c_proj not scaled by 1/sqrt(2 * n_layer)"
                .into(),
        );
    }
    let backbone = BackboneSpec {
        source,
        init,
        shape,
        residual_init: ResidualInit::Unscaled,
        depth: s.depth,
        final_norm: true,
        bit_pretrain: (init == Init::BitPretrained).then(|| sc.bit_pretrain.unwrap_or_default()),
    };
    // What this machine lacks: data, weights, depth.
    if check {
        if let Some(why) = unavailable_here(&task, &backbone, s.depth) {
            return Plan::Unavailable(why);
        }
    }
    let steps = o.steps.unwrap_or(1000);
    let batch_size = o.batch_size.unwrap_or(32);
    let train = TrainSpec {
        steps,
        batch_size,
        micro_batch_size: o.micro_batch_size.unwrap_or(batch_size),
        // The paper: 1e-3 for transformers, 3e-4 for LSTMs (App. B).
        lr: s.lr.or(if lstm { Some(3e-4) } else { o.lr }).unwrap_or(1e-3),
        cached_epochs: cached.then(|| o.cached_epochs.unwrap_or(10)),
        train_eval: match metric {
            Metric::TrainAccuracy => fpt_spec::TrainEval::Final,
            _ => o.train_eval.unwrap_or(fpt_spec::TrainEval::Final),
        },
        eval_every: o.eval_every.unwrap_or(steps.div_ceil(4)).max(1),
        early_stop_patience: o.early_stop_patience,
        checkpoint_every: o.checkpoint_every,
        early_stop_within_noise: o.early_stop_within_noise.unwrap_or(false),
        ..TrainSpec::default()
    };
    let spec = RunSpec {
        train_groups: groups,
        train,
        ..RunSpec::new(task, backbone)
    };
    if let Err(e) = spec.validate() {
        return Plan::Unavailable(format!("invalid run spec: {e}"));
    }
    let key = spec_key(&spec);
    Plan::Run {
        spec: Box::new(spec),
        key,
    }
}

/// A note where a cell's dataset is not the published one: data fpt generated here (ListOps
/// by LRA's procedure when LRA's released files cannot be had).
fn data_origin(task: &TaskSpec) -> Option<String> {
    if task.name.is_generated() || task.name == fpt_spec::TaskName::Custom {
        return None;
    }
    let dir = task
        .path
        .clone()
        .unwrap_or_else(|| fpt_tasks::paths::data_dir(task.name));
    let source = fpt_tasks::fetch::source_of(&dir)?;
    source.starts_with("generated").then(|| {
        format!(
            "{} data regenerated on this machine ({source}), not the published files: the same procedure, other examples",
            task.name
        )
    })
}

/// What in `here` (a cell's plan at some scale) differs from the same cell at the `paper`
/// scale, field by field, plus the paper scale's own recorded differences from the paper.
fn paper_differences(
    s: &CellSettings,
    metric: Metric,
    here: &Plan,
    paper_sc: Option<&ScaleSettings>,
    seeds: usize,
) -> Vec<String> {
    let Some(psc) = paper_sc else {
        return Vec::new();
    };
    let Plan::Run { spec: h, .. } = here else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Plan::Run { spec: p, .. } = plan_at(s, metric, psc, &mut Vec::new(), false) {
        // `paper:` only for what the paper states (its backbone, App. C's learning rates);
        // the rest is fpt's own choice at the paper scale and is labelled as such.
        let mut d = |what: &str, ours: String, paper: String| {
            if ours != paper {
                let whose = if matches!(what, "backbone" | "lr") {
                    "paper"
                } else {
                    "fpt's paper scale"
                };
                out.push(format!("{what} {ours} ({whose}: {paper})"));
            }
        };
        // The shape from the config (shape overrides applied) where it can be read here.
        let shape = |b: &BackboneSpec| match fpt_backbones::param_specs(b) {
            Ok((c, _)) => format!(
                " ({} x {})",
                b.depth.unwrap_or(c.layers()).min(c.layers()),
                c.hidden_size()
            ),
            Err(_) => String::new(),
        };
        d(
            "backbone",
            format!("{}{}", h.backbone.source, shape(&h.backbone)),
            format!("{}{}", p.backbone.source, shape(&p.backbone)),
        );
        d("steps", h.train.steps.to_string(), p.train.steps.to_string());
        d("batch", h.train.batch_size.to_string(), p.train.batch_size.to_string());
        d("lr", format!("{:e}", h.train.lr), format!("{:e}", p.train.lr));
        let eval = |t: &TaskSpec| match t.eval_examples {
            0 => "the whole split".to_string(),
            n => format!("{n} examples"),
        };
        d("evaluation on", eval(&h.task), eval(&p.task));
        let train = |t: &TaskSpec| t.train_examples.map_or("all".into(), |n| n.to_string());
        d("training examples", train(&h.task), train(&p.task));
        let opt = |v: Option<usize>| v.map_or("default".into(), |n| n.to_string());
        d("bits per string", opt(h.task.n_bits), opt(p.task.n_bits));
        d("bits per token", opt(h.task.patch), opt(p.task.patch));
        d("max tokens", opt(h.task.data.max_len), opt(p.task.data.max_len));
        if let (Some(a), Some(b)) = (h.backbone.bit_pretrain, p.backbone.bit_pretrain) {
            d(
                "Bit pretraining",
                format!("{} steps x {}", a.steps, a.batch_size),
                format!("{} steps x {}", b.steps, b.batch_size),
            );
        }
        let cached = |t: &TrainSpec| t.cached_epochs.map_or("-".into(), |n| n.to_string());
        d("cached epochs", cached(&h.train), cached(&p.train));
    }
    let first = h.train.seed;
    out.push(match seeds {
        0 | 1 => format!("one seed ({first}): the paper does not say how many seeds its numbers average"),
        n => format!(
            "{n} seeds ({}), their mean reported: the paper does not say how many seeds its numbers average",
            (0..n as u64)
                .map(|i| first.wrapping_add(i).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    });
    let task = s.task.as_deref().unwrap_or("");
    let init = s.init.as_deref().unwrap_or("");
    let model = s.model.as_deref().unwrap_or("transformer");
    for key in [
        "all".to_string(),
        task.to_string(),
        format!("init:{init}"),
        format!("model:{model}"),
    ] {
        if let Some(v) = psc.differs.get(&key) {
            out.extend(v.iter().cloned());
        }
    }
    out
}

/// What `fpt fetch` would have to bring for `cells` to run (whether it is here or not): the
/// datasets their runs read and the pretrained models they load, as `fpt fetch` names them
/// (`minilm` for all-MiniLM-L6-v2), sorted. Cells expanded with [`expand_unchecked`] name
/// what is missing here too.
pub fn assets(cells: &[Cell]) -> Vec<String> {
    let mut out = std::collections::BTreeSet::new();
    for c in cells {
        let Plan::Run { spec, .. } = &c.plan else { continue };
        let t = spec.task.name;
        if !t.is_generated() && !matches!(t, fpt_spec::TaskName::Custom | fpt_spec::TaskName::Text) {
            out.insert(match t {
                fpt_spec::TaskName::Cifar10Lra => "cifar10".to_string(),
                t => t.to_string(),
            });
        }
        // Weights, or (a random or Bit init) a config fpt does not have built in; a local
        // directory is the user's, not fetched.
        let b = &spec.backbone;
        let needs = b.init.needs_weights() || fpt_backbones::Config::builtin(&b.source).is_none();
        if needs && !Path::new(&b.source).is_dir() {
            out.insert(if b.source == fpt_backbones::hub::MINILM_ID {
                "minilm".to_string()
            } else {
                b.source.clone()
            });
        }
    }
    out.into_iter().collect()
}

/// Why a cell cannot run on this machine (its data, weights or depth), if it cannot.
fn unavailable_here(task: &TaskSpec, backbone: &BackboneSpec, depth: Option<usize>) -> Option<String> {
    if let Err(e) = fpt_tasks::check_present(task) {
        return Some(format!("data not present: {e}"));
    }
    if let Err(e) = fpt_backbones::hub::resolves_offline(&backbone.source, backbone.init.needs_weights())
        .map(|_| ())
        .or_else(|e| {
            // Random init (and Bit pretraining from it) of a built-in config (gpt2, lstm,
            // ...) needs no files.
            if !backbone.init.needs_weights() && fpt_backbones::param_specs(backbone).is_ok() {
                Ok(())
            } else {
                Err(e)
            }
        })
    {
        return Some(format!("backbone not available here: {e}"));
    }
    if let Some(d) = depth {
        match fpt_backbones::param_specs(backbone) {
            Ok((config, _)) if config.layers() < d => {
                return Some(format!(
                    "depth {d} exceeds the {} blocks of {}",
                    config.layers(),
                    backbone.source
                ))
            }
            _ => {}
        }
    }
    None
}

/// How [`run`] runs.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Rerun cells that have a result.
    pub force: bool,
    /// Run only shard `i` of `n` (`(i, n)`): every `n`-th runnable run, by key order.
    pub shard: Option<(usize, usize)>,
    /// Runs trained at once: in threads of this process, or with `workers` in child
    /// processes.
    pub jobs: usize,
    /// Render only; train nothing.
    pub report_only: bool,
    /// Where runs train (`None`: the CPU).
    pub device: Option<candle_core::Device>,
    /// Train each run in a child process (CPU only; see [`worker`]).
    pub workers: Option<worker::Workers>,
}

/// Where the run of `key` lives under `out`.
pub fn run_dir(out: &Path, key: &str) -> PathBuf {
    out.join("runs").join(key)
}

/// The distinct runs of `cells`, by key, in key order.
pub fn runs_of(cells: &[Cell]) -> Vec<(String, RunSpec)> {
    let mut m: BTreeMap<String, RunSpec> = BTreeMap::new();
    for c in cells {
        if let Plan::Run { spec, key } = &c.plan {
            m.insert(key.clone(), (**spec).clone());
        }
        for (key, spec) in &c.replicas {
            m.insert(key.clone(), (**spec).clone());
        }
    }
    m.into_iter().collect()
}

/// Trains every run of `cells` that has no `result.json` under `out/runs/` (or all with
/// `force`), honouring the shard. A run directory left by an interrupted run is resumed
/// from its checkpoint, or started again when it has none. `log` receives progress lines.
/// Returns the runs trained and each run's time; a failed run is logged and counted in the
/// report, not fatal.
pub fn run(cells: &[Cell], out: &Path, opts: &RunOptions, log: &mut (dyn FnMut(&str) + Send)) -> Result<Trained> {
    if opts.report_only {
        return Ok(Trained::default());
    }
    let mut todo: Vec<(String, RunSpec)> = runs_of(cells);
    if let Some((i, n)) = opts.shard {
        todo = todo
            .into_iter()
            .enumerate()
            .filter(|(k, _)| k % n == i)
            .map(|(_, r)| r)
            .collect();
    }
    todo.retain(|(key, _)| opts.force || !run_dir(out, key).join("result.json").is_file());
    order_for_builds(&mut todo);
    let total = todo.len();
    let on_cpu = opts.device.as_ref().is_none_or(|d| d.is_cpu());
    let workers = opts.workers.as_ref().filter(|_| on_cpu);
    let times = std::sync::Mutex::new(Vec::new());
    let queue = std::sync::Mutex::new(todo.into_iter().enumerate());
    let log = std::sync::Mutex::new(log);
    let say = |s: String| (log.lock().expect("log lock"))(&s);
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..opts.jobs.max(1) {
            scope.spawn(|| loop {
                let Some((i, (key, spec))) = queue.lock().expect("queue lock").next() else {
                    break;
                };
                let dir = run_dir(out, &key);
                say(format!(
                    "[{}/{total}] run {key}: {} on {} ({}, train {}), {} steps",
                    i + 1,
                    spec.task.label(),
                    spec.backbone.source,
                    spec.backbone.init,
                    spec.train_groups,
                    spec.train.steps
                ));
                let t0 = std::time::Instant::now();
                let eval_line = |step: usize, acc: f64, secs: f64| {
                    say(format!(
                        "[{}/{total}]     step {step}/{}: test_accuracy {acc:.4}, {secs:.0} s",
                        i + 1,
                        spec.train.steps,
                    ))
                };
                let mut progress = |e: &fpt_train::Event| {
                    if let fpt_train::Event::Eval(r) = e {
                        eval_line(r.step, r.test_accuracy, r.elapsed_s)
                    }
                };
                let device = opts.device.clone().unwrap_or(candle_core::Device::Cpu);
                // A panic inside one run is that run's failure, not the table's.
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match workers {
                    Some(w) => w.train(&spec, &dir, opts.force, &mut |e| {
                        eval_line(e.step, e.test_accuracy, e.elapsed_s)
                    }),
                    None => run_one(&spec, &dir, opts.force, &device, &mut progress),
                }))
                .unwrap_or_else(|p| {
                    let why = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "a panic".into());
                    Err(AblateError::Panicked {
                        dir: dir.clone(),
                        msg: format!("the run panicked: {why}"),
                    })
                });
                let secs = t0.elapsed().as_secs_f64();
                let what = format!("{} {} ({})", key, spec.task.label(), spec.backbone.init);
                times.lock().expect("times lock").push((what, secs, outcome.is_ok()));
                match outcome {
                    Ok(r) => {
                        done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        say(format!(
                            "[{}/{total}] run {key}: test_accuracy {:.4} in {:.0} s",
                            i + 1,
                            r.test_accuracy,
                            t0.elapsed().as_secs_f64()
                        ))
                    }
                    Err(e) => say(format!("[{}/{total}] run {key} FAILED: {e}", i + 1)),
                }
            });
        }
    });
    Ok(Trained {
        count: done.into_inner(),
        times: times.into_inner().expect("times lock"),
        how: match workers {
            Some(w) => format!(
                "{} at once in child processes, {} thread(s) each",
                opts.jobs.max(1),
                w.threads
            ),
            None => format!("{} at once in this process", opts.jobs.max(1)),
        },
    })
}

/// What [`run`] trained.
#[derive(Debug, Clone, Default)]
pub struct Trained {
    /// Runs that finished.
    pub count: usize,
    /// Every run started, in the order it finished: what it was (key, task, init), its
    /// wall-clock seconds, and whether it finished.
    pub times: Vec<(String, f64, bool)>,
    /// How the runs were spread (jobs, processes, threads).
    pub how: String,
}

impl Trained {
    /// The time of each run, one line each under a heading; empty when nothing ran.
    pub fn time_lines(&self) -> Vec<String> {
        if self.times.is_empty() {
            return Vec::new();
        }
        let total: f64 = self.times.iter().map(|t| t.1).sum();
        let mut lines = vec![format!("time per run ({}; {:.0} s of runs in all):", self.how, total)];
        for (what, secs, ok) in &self.times {
            lines.push(format!("    {secs:6.0} s  {what}{}", if *ok { "" } else { "  FAILED" }));
        }
        lines
    }
}

/// Orders the runs so that a backbone fpt trains itself (the Bit init) is built early and
/// the runs that wait for it come last: first one run per backbone still to build, then
/// the runs that need no build, then the rest; by key within each group. With several jobs,
/// the others train meanwhile instead of waiting on the build's lock.
fn order_for_builds(todo: &mut [(String, RunSpec)]) {
    let mut first = std::collections::BTreeSet::new();
    let rank: Vec<u8> = todo
        .iter()
        .map(|(_, spec)| match fpt_train::pretrain::self_built_dir(&spec.backbone) {
            Some(dir) if !dir.join("config.json").is_file() => {
                if first.insert(dir) {
                    0
                } else {
                    2
                }
            }
            _ => 1,
        })
        .collect();
    let mut ranked: Vec<(u8, (String, RunSpec))> = rank.into_iter().zip(todo.iter().cloned()).collect();
    ranked.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1 .0.cmp(&b.1 .0)));
    for (slot, (_, r)) in todo.iter_mut().zip(ranked) {
        *slot = r;
    }
}

fn run_one(
    spec: &RunSpec,
    dir: &Path,
    force: bool,
    device: &candle_core::Device,
    on_event: &mut dyn FnMut(&fpt_train::Event),
) -> Result<fpt_train::RunResult> {
    if dir.exists() && (force || fpt_train::checkpoint::latest(dir).ok().flatten().is_none()) {
        std::fs::remove_dir_all(dir).map_err(io(dir))?;
    }
    if dir.exists() {
        return Ok(fpt_train::resume(dir, Some(spec), device, on_event)?);
    }
    Ok(fpt_train::train(spec, dir, device, on_event)?)
}

/// The shell command that reproduces one run by hand.
pub fn command_for(out: &Path, key: &str) -> String {
    let d = run_dir(out, key);
    format!("fpt train --spec {}/spec.json --out <new dir>", d.display())
}

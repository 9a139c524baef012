//! A table at a scale, cell by cell: each cell's merged settings become a [`Plan`] (a run
//! spec keyed by its hash, a count, the paper's number only, or unavailable-and-why), with
//! the scale's substitutions and every setting that differs from the paper; and what the
//! cells need fetched ([`assets`](crate::here::assets)).

#[allow(unused_imports)]
use super::*;

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
pub(crate) fn replicas_of(plan: &Plan, seeds: usize) -> Vec<(String, Box<RunSpec>)> {
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
pub(crate) fn seeds_for(s: &CellSettings, sc: &ScaleSettings) -> usize {
    s.task.as_deref().and_then(|t| sc.for_task(t).seeds).unwrap_or(1).max(1)
}

/// The run directory's name of `spec`: [`RunSpec::key`].
pub fn spec_key(spec: &RunSpec) -> String {
    spec.key()
}

/// The scale settings for `table` at `scale`: `scales.toml`, then the table's overrides.
pub fn scale_of(table: &TableSpec, scales: &BTreeMap<String, ScaleSettings>, scale: &str) -> Result<ScaleSettings> {
    scale_with_bases(table, scales, scale, 0)
}

/// [`scale_of`], following `base` (at most 4 deep: a cycle is an error).
fn scale_with_bases(
    table: &TableSpec,
    scales: &BTreeMap<String, ScaleSettings>,
    scale: &str,
    depth: usize,
) -> Result<ScaleSettings> {
    let err = |msg: String| AblateError::Spec {
        path: PathBuf::from("scales.toml"),
        msg,
    };
    let own = scales.get(scale).ok_or_else(|| {
        err(format!(
            "no scale `{scale}` (known: {})",
            scales.keys().cloned().collect::<Vec<_>>().join(", ")
        ))
    })?;
    let resolved = match &own.base {
        Some(_) if depth >= 4 => {
            return Err(err(format!(
                "scale `{scale}`: its `base` chain is a cycle or deeper than 4"
            )))
        }
        // The base as this table runs it (with the table's overrides for it), then this
        // scale's settings over it.
        Some(b) => scale_with_bases(table, scales, b, depth + 1)?.merged(own),
        None => own.clone(),
    };
    Ok(match table.scales.get(scale) {
        Some(over) => resolved.merged(over),
        None => resolved,
    })
}

/// `table` as it stands at `scale`: its [`Alternate`](fpt_spec::table::Alternate) rows
/// added where the scale substitutes the backbone they stand in for (each row copies its
/// `like` row's settings, with the alternate's source and precision, and the paper's numbers
/// of `like`), and claims that name a row absent at the scale dropped. Every function that
/// takes a table and a scale works on this table; applying it again changes nothing.
pub fn at_scale(table: &TableSpec, scales: &BTreeMap<String, ScaleSettings>, scale: &str) -> Result<TableSpec> {
    if table.alternates.is_empty() {
        return Ok(table.clone());
    }
    let sc = scale_of(table, scales, scale)?;
    with_alternates(table, |alt| {
        (alt.scales.is_empty() || alt.scales.iter().any(|s| s == scale))
            && sc
                .backbones
                .get(&alt.stands_in_for)
                .is_some_and(|sub| sub.source != "none")
    })
    .map_err(|msg| AblateError::Spec {
        path: PathBuf::from(format!("{}.toml", table.id)),
        msg,
    })
}

/// `table` with the alternate rows `keep` accepts added and the others' claims dropped.
pub(crate) fn with_alternates(
    table: &TableSpec,
    keep: impl Fn(&fpt_spec::table::Alternate) -> bool,
) -> std::result::Result<TableSpec, String> {
    let mut t = table.clone();
    t.alternates.clear();
    let mut absent = Vec::new();
    for alt in &table.alternates {
        if table.rows.iter().any(|r| r.label == alt.label) {
            return Err(format!(
                "alternate row `{}`: a row of the table has its label",
                alt.label
            ));
        }
        if !keep(alt) {
            absent.push(alt.label.as_str());
            continue;
        }
        let Some(like) = table.rows.iter().position(|r| r.label == alt.like) else {
            return Err(format!(
                "alternate row `{}`: `like` names no row (`{}`)",
                alt.label, alt.like
            ));
        };
        // bf16 frozen weights are a table's choice for speed: only where the CPU multiplies
        // bf16 natively (AVX512_BF16); elsewhere its bf16 products are widened to f32 and no
        // faster, so the row keeps f32 and says so. (`--precision bf16` asks for bf16 anyway.)
        let native = fpt_nn::KernelPath::detected() == fpt_nn::KernelPath::Avx512Bf16;
        let (precision, note) = match alt.precision {
            Some(p) if !p.is_f32() && !native => (
                Some(fpt_spec::Precision::F32),
                format!(
                    "{}; this CPU has no AVX512_BF16 (its bf16 products would be widened to f32, no faster), so these runs keep f32",
                    alt.note
                ),
            ),
            p => (p, alt.note.clone()),
        };
        let set = table.rows[like].set.merged(&CellSettings {
            substitute: Some(fpt_spec::table::Substitute {
                source: alt.source.clone(),
                shape: Default::default(),
                note,
            }),
            precision,
            ..Default::default()
        });
        t.rows.push(fpt_spec::table::Axis {
            label: alt.label.clone(),
            set,
        });
        if let Some(p) = table.paper.get(like) {
            t.paper.push(p.clone());
        }
        t.cells.extend(
            table
                .cells
                .iter()
                .filter(|o| o.row == alt.like)
                .map(|o| fpt_spec::table::CellOverride {
                    row: alt.label.clone(),
                    ..o.clone()
                }),
        );
    }
    // A claim about a row this scale does not carry is not checked here.
    t.claims.retain(|c| {
        let mut sels = vec![&c.a];
        sels.extend(c.b.as_ref());
        sels.extend(c.among.iter());
        sels.extend(c.c.iter().chain(c.d.iter()));
        !sels
            .iter()
            .any(|s| s.row.as_deref().is_some_and(|r| absent.contains(&r)))
    });
    Ok(t)
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
            if b.shape.attention_only == Some(true) {
                parts.push("attention-only blocks (no feed-forward half)".into());
            }
            match b.depth {
                Some(0) => parts.push("depth 0 (no block: the embedding stage alone)".into()),
                Some(d) => parts.push(format!("depth {d}")),
                None => {}
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
                Some(p) if t.stop_on_plateau => format!(
                    "at most {} steps x batch {}, stopping only when converged (no gain above the noise across the last half of its steps, at least {p} evaluations, paired over the held-out examples; never while at its trivial baseline{})",
                    t.steps,
                    t.batch_size,
                    t.converge_floor
                        .map_or(String::new(), |f| format!("; not before step {f}, the paper's Table 6 count"))
                ),
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

pub(crate) fn expand_with(
    table: &TableSpec,
    scales: &BTreeMap<String, ScaleSettings>,
    scale: &str,
    check: bool,
) -> Result<Vec<Cell>> {
    let table = &at_scale(table, scales, scale)?;
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
            // The task's seed spread, where it was measured on this cell's backbone.
            let seed_sd = match &plan {
                Plan::Run { spec, .. } => s
                    .task
                    .as_deref()
                    .and_then(|t| sc.seed_spread.get(t))
                    .filter(|x| x.backbone == spec.backbone.source)
                    .map(|x| x.sd),
                _ => None,
            };
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
pub(crate) fn plan_at(
    s: &CellSettings,
    metric: Metric,
    sc: &ScaleSettings,
    notes: &mut Vec<String>,
    check: bool,
) -> Plan {
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
    if init == Init::BitPretrained && sc.bit_pretrain.is_none() {
        return Plan::Unavailable(
            "this scale has no budget to pretrain the Bit backbone until it solves Bit Memory (its `bit_pretrain`); the `cpu-full` scale does".into(),
        );
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
    if let Some(b) = o.brackets {
        task.data.brackets = b;
    }
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
                precision: Default::default(),
            },
            task,
            groups,
            input_width: s.input_width,
        }));
    }
    // A row's own substitute (an alternate row) over the scale's.
    let (source, mut shape) = match s.substitute.as_ref().or(sc.backbones.get(&name)) {
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
    if !lstm && s.attention_only == Some(true) {
        shape.attention_only = Some(true);
    }
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
        precision: s.precision.unwrap_or_default(),
    };
    // Llama-family backbones have rotary positions and no position table: fpt adds its own.
    if !lstm && fpt_backbones::param_specs(&backbone).is_ok_and(|(c, _)| c.architecture() == "llama") {
        notes.push(format!(
            "{}: rotary positions have no table to train, so fpt adds its own learned position table ({} rows, N(0, 0.02)), trained as the positions group (as the reference code does for ViT)",
            backbone.source,
            fpt_backbones::llama::FPT_POSITIONS
        ));
    }
    // What this machine lacks: data, weights, depth.
    if check {
        if let Some(why) = crate::here::unavailable_here(&task, &backbone, s.depth) {
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
        stop_on_plateau: o.stop_on_plateau.unwrap_or(false),
        converge_floor: if sc.apply_converge_floor {
            s.converge_floor.as_ref().and_then(|m| m.get(task_name)).copied()
        } else {
            None
        },
        ..TrainSpec::default()
    };
    let spec = RunSpec {
        train_groups: groups,
        train,
        input_init: s.input_init.unwrap_or_default(),
        model: if cached {
            fpt_spec::ModelKind::OutputOnly
        } else {
            fpt_spec::ModelKind::Fpt
        },
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
pub(crate) fn data_origin(task: &TaskSpec) -> Option<String> {
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
pub(crate) fn paper_differences(
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
    // The same cell as the paper ran it: its backbone, in f32.
    let paper_cell = CellSettings {
        substitute: None,
        precision: None,
        ..s.clone()
    };
    if let Plan::Run { spec: p, .. } = plan_at(&paper_cell, metric, psc, &mut Vec::new(), false) {
        // `paper:` only for what the paper states (its backbone, App. C's learning rates);
        // the rest is fpt's own choice at the paper scale and is labelled as such.
        let mut d = |what: &str, ours: String, paper: String| {
            if ours != paper {
                let whose = if matches!(what, "backbone" | "lr" | "frozen weights in") {
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
        d(
            "frozen weights in",
            h.backbone.precision.name().to_string(),
            p.backbone.precision.name().to_string(),
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
        if h.task.name == fpt_spec::TaskName::ListOps {
            let b = |t: &TaskSpec| format!("{:?}", t.data.brackets).to_lowercase();
            d("brackets", b(&h.task), b(&p.task));
        }
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

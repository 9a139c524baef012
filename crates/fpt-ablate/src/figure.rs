//! Figures, as SVG written by hand and rasterised to PNG with `resvg` (system fonts for the
//! labels): Figure 1's grouped bars from Table 1's cells (ours filled, the paper's
//! outlined), Figures 3-5's first-layer attention maps of a trained run (recorded through
//! `Ctx::attention` on a held-out example), Figure 6's standard deviation of the attention
//! and feed-forward parameters by layer, and a learning-curve plot per table from its runs'
//! `metrics.jsonl`.

use crate::chart::{bars_svg, heatmap_svg, lines_svg, write_all};
use crate::figure_claims::{judge, matching_masses, section, Measured};
use crate::{expand, Report, Result};
use fpt_spec::table::{Kind, ScaleSettings, TableSpec};
use fpt_spec::{BackboneSpec, Init, ResidualInit, Role, TrainGroups};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The first attention layer of the trained run in `run_dir` (its last checkpoint) on the
/// first held-out example: per head `[queries][keys]`.
pub fn first_layer_attention(spec: &fpt_spec::RunSpec, run_dir: &Path) -> std::result::Result<Attention, String> {
    let cpu = candle_core::Device::Cpu;
    let s = |e: &dyn std::fmt::Display| e.to_string();
    let tr = fpt_train::Trainer::new(spec, &cpu).map_err(|e| s(&e))?;
    let last = fpt_train::checkpoint::latest(run_dir)
        .map_err(|e| s(&e))?
        .ok_or("the run has no checkpoint")?;
    let loaded = fpt_train::checkpoint::load(&last, &cpu).map_err(|e| s(&e))?;
    fpt_train::checkpoint::load_trainable(tr.model(), &loaded.trainable, &last).map_err(|e| s(&e))?;
    let batch = tr
        .task()
        .eval_batch(fpt_tasks::Split::Test, 0, 1, &cpu)
        .map_err(|e| s(&e))?;
    let mut ctx = fpt_nn::Ctx::eval();
    ctx.attention = Some(Vec::new());
    tr.model().forward(&batch.inputs, &mut ctx).map_err(|e| s(&e))?;
    let first = ctx
        .attention
        .and_then(|v| v.into_iter().next())
        .ok_or("the backbone has no attention layer")?;
    let probs = first.squeeze(0).map_err(|e| s(&e))?; // [heads, T, T]
    Ok(Attention {
        heads: probs.to_vec3::<f32>().map_err(|e| s(&e))?,
        // Token inputs (vectors); token ids and images have no bits to compare.
        inputs: match &batch.inputs {
            fpt_tasks::Inputs::Vectors(t) => t.flatten_all().and_then(|t| t.to_vec1()).unwrap_or_default(),
            fpt_tasks::Inputs::Tokens(_) => Vec::new(),
        },
        readout: tr.task().dims().readout_tokens,
    })
}

/// A trained run's first attention layer on its first held-out example.
pub struct Attention {
    /// Per head `[queries][keys]`.
    pub heads: Vec<Vec<Vec<f32>>>,
    /// The example's inputs, flattened (empty where they are not values).
    pub inputs: Vec<f32>,
    /// The task's read-out tokens.
    pub readout: usize,
}

/// Standard deviation of every attention and feed-forward tensor, by layer and by
/// weight/bias: `(series name, per-layer values)`.
pub fn param_std(backbone: &BackboneSpec) -> std::result::Result<Vec<(String, Vec<f64>)>, String> {
    let mut rng = fpt_nn::Rng::new(0);
    let b = fpt_backbones::load(backbone, &TrainGroups::none(), &candle_core::Device::Cpu, &mut rng)
        .map_err(|e| e.to_string())?;
    let mut acc: BTreeMap<String, BTreeMap<usize, (f64, f64, f64)>> = BTreeMap::new();
    for (name, role, p) in b.params() {
        let group = match role {
            Role::Attention => "attention",
            Role::FeedForward => "feed-forward",
            _ => continue,
        };
        let kind = if name.ends_with("bias") { "biases" } else { "weights" };
        let Some(layer) = name.split('.').find_map(|part| part.parse::<usize>().ok()) else {
            continue;
        };
        let v: Vec<f32> = p
            .tensor()
            .flatten_all()
            .and_then(|t| t.to_vec1())
            .map_err(|e| e.to_string())?;
        let e = acc
            .entry(format!("{group} {kind}"))
            .or_default()
            .entry(layer)
            .or_default();
        for x in v {
            let x = x as f64;
            e.0 += 1.0;
            e.1 += x;
            e.2 += x * x;
        }
    }
    Ok(acc
        .into_iter()
        .map(|(k, layers)| {
            let vals = layers
                .values()
                .map(|(n, s, s2)| (s2 / n - (s / n).powi(2)).max(0.0).sqrt())
                .collect();
            (k, vals)
        })
        .collect())
}

/// Renders figure `fig` at `scale` into `out/<id>/<scale>/` (`figure.svg`, `report.md`,
/// `report.json`), reading the runs of a table it draws from where `sources` allows;
/// returns the directory.
pub fn render(
    fig: &TableSpec,
    tables: &Path,
    scales: &BTreeMap<String, ScaleSettings>,
    scale: &str,
    out: &Path,
    sources: crate::report::Sources,
) -> Result<PathBuf> {
    let dir = out.join(&fig.id).join(scale);
    let mut md = format!("# {}: {} (scale `{scale}`)\n\n> {}\n\n", fig.id, fig.title, fig.caption);
    match fig.kind {
        Kind::Bars => {
            let from = fig.from_table.clone().unwrap_or_default();
            let t = crate::at_scale(&crate::load_table(tables, &from)?, scales, scale)?;
            let cells = expand(&t, scales, scale)?;
            let r = Report::from_runs(&t, scale, &cells, out, sources);
            let nc = r.cols.len();
            let ours: Vec<Vec<Option<f64>>> = (0..r.rows.len())
                .map(|i| r.cells[i * nc..(i + 1) * nc].iter().map(|c| c.ours).collect())
                .collect();
            let paper: Vec<Vec<Option<f64>>> = (0..r.rows.len())
                .map(|i| r.cells[i * nc..(i + 1) * nc].iter().map(|c| c.paper).collect())
                .collect();
            let svg = bars_svg(
                &format!("{} ({}, scale {scale})", fig.title, from),
                &r.cols,
                &r.rows,
                &ours,
                &paper,
            );
            md.push_str(&format!(
                "![{}](figure.svg)\n\nData: the cells of `{from}` at this scale (its report lists every number, substitution and missing cell). Filled bars: ours; outlined: the paper's.\n",
                fig.id
            ));
            write_all(
                &dir,
                &[
                    ("figure.svg", svg),
                    ("report.md", md),
                    ("report.json", serde_json::to_string_pretty(&r).expect("json")),
                ],
            )?;
        }
        Kind::ParamStd => {
            let name = fig.defaults.backbone.clone().unwrap_or_else(|| "gpt2".into());
            let sc = crate::scale_of(fig, scales, scale)?;
            let (source, note) = match sc.backbones.get(&name) {
                Some(s) if s.source != "none" => {
                    (s.source.clone(), Some(format!("{name} -> {}: {}", s.source, s.note)))
                }
                _ => (name.clone(), None),
            };
            let spec = BackboneSpec {
                source,
                init: Init::Pretrained,
                shape: Default::default(),
                residual_init: ResidualInit::Unscaled,
                depth: None,
                final_norm: true,
                bit_pretrain: None,
                precision: Default::default(),
            };
            match param_std(&spec) {
                Ok(series) => {
                    let mut all = series.clone();
                    let layers = series.first().map(|s| s.1.len()).unwrap_or(0);
                    all.push(("default init, weights (0.02)".into(), vec![0.02; layers]));
                    let svg = lines_svg(
                        &format!("std of parameters by layer: {} vs default init", spec.source),
                        &all,
                    );
                    md.push_str("![fig6](figure.svg)\n\n| series | std by layer |\n|---|---|\n");
                    for (k, v) in &series {
                        let vals: Vec<String> = v.iter().map(|x| format!("{x:.4}")).collect();
                        md.push_str(&format!("| {k} | {} |\n", vals.join(" ")));
                    }
                    md.push_str("\nDefault GPT-2 init: weights 0.02, biases 0.\n");
                    if let Some(n) = note {
                        md.push_str(&format!("\nSubstitution: {n}\n"));
                    }
                    let m = Measured {
                        series: series.clone(),
                        ..Measured::default()
                    };
                    let claims = judge(fig, &m, &|_| None);
                    md.push_str(&section(&claims));
                    let json = serde_json::json!({ "backbone": spec.source, "series": series, "claims": claims });
                    write_all(
                        &dir,
                        &[
                            ("figure.svg", svg),
                            ("report.md", md),
                            ("report.json", serde_json::to_string_pretty(&json).expect("json")),
                        ],
                    )?;
                }
                Err(e) => {
                    md.push_str(&format!(
                        "Not drawn: the pretrained weights of `{}` are not available here ({e}).\n",
                        spec.source
                    ));
                    let why = format!("the pretrained weights of `{}` are not available here", spec.source);
                    not_drawn(fig, &dir, md, why)?;
                }
            }
        }
        Kind::AttentionMap => {
            let cells = expand(fig, scales, scale)?;
            let cell = &cells[0];
            for n in &cell.notes {
                md.push_str(&format!("Substitution: {n}\n\n"));
            }
            match &cell.plan {
                crate::Plan::Run { spec, key } => {
                    let run = crate::run_dir(out, key);
                    let written = dir.join("report.md");
                    if sources == crate::report::Sources::RunDirsOrRecords && !run.is_dir() && written.is_file() {
                        // Rendering only, and the run (its checkpoint) is not here: the figure
                        // drawn when it was keeps; whether its run learned is said from the
                        // run's record where the report does not say it yet.
                        let text = std::fs::read_to_string(&written).map_err(crate::io(&written))?;
                        let record = crate::record::RunRecord::load(out, key).ok().flatten();
                        let res = record.and_then(|r| {
                            let mut res = r.result?;
                            if res.baseline.is_none() {
                                // Judged now from its accuracy, as reports judge such runs.
                                let task = fpt_tasks::build(&spec.task, &fpt_train::root_rng(spec)).ok();
                                if let Some(base) = task.and_then(|t| t.baseline(fpt_tasks::Split::Test).ok()) {
                                    let losses: Vec<f64> = r.evals.iter().map(|e| e.train_loss).collect();
                                    res.baseline = Some(fpt_train::outcomes::judge_summary(
                                        &base,
                                        res.test_accuracy,
                                        res.eval_examples,
                                        &losses,
                                    ));
                                }
                            }
                            Some(res)
                        });
                        let left = res.as_ref().and_then(|r| r.baseline.as_ref().map(|b| b.left));
                        let converged = converged(out, key, spec);
                        let mut text = text;
                        if let (Some(res), false) = (res, text.contains("trivial baseline")) {
                            if let Some(at) = text.find("\n\n![") {
                                text.insert_str(at + 2, &learned_words(&res));
                                fpt_train::write_atomic(&written, text.as_bytes())?;
                            }
                        }
                        keep_statements(fig, &dir, &text, (left, converged))?;
                        return Ok(dir);
                    }
                    md.push_str(&format!(
                        "Run: `{}` ({}).\n\n",
                        run.display(),
                        crate::command_for(out, key)
                    ));
                    // Whether the run learned: a pattern in a model that learned nothing
                    // is no evidence for the caption.
                    let learned = std::fs::read_to_string(run.join("result.json"))
                        .ok()
                        .and_then(|t| serde_json::from_str::<fpt_train::RunResult>(&t).ok());
                    if let Some(line) = learned.as_ref().map(learned_words) {
                        md.push_str(&line);
                    }
                    let left = learned.as_ref().and_then(|r| r.baseline.as_ref().map(|b| b.left));
                    let ended = (left, converged(out, key, spec));
                    match first_layer_attention(spec, &run) {
                        Ok(a) => attention_report(fig, spec, &a, ended, (out, scale), &dir, md)?,
                        Err(e) => {
                            md.push_str(&format!("Not drawn: {e} (run `fpt run-table {}` first).\n", fig.id));
                            not_drawn(fig, &dir, md, format!("not drawn: {e}"))?;
                        }
                    }
                }
                crate::Plan::Unavailable(why) | crate::Plan::PaperOnly(why) => {
                    md.push_str(&format!("Not drawn: {why}\n"));
                    write_all(&dir, &[("report.md", md)])?;
                }
                crate::Plan::Count(_) | crate::Plan::NotInPaper => {
                    md.push_str("Not drawn: the figure's defaults name no run\n");
                    write_all(&dir, &[("report.md", md)])?;
                }
            }
        }
        Kind::Table => {
            md.push_str("Not a figure.\n");
            write_all(&dir, &[("report.md", md)])?;
        }
    }
    Ok(dir)
}

/// Draws the mean first-layer attention over heads, and for Bit XOR measures how much of
/// each read-out token's attention falls on the two bits it XORs (the paper's Figure 3
/// observation), against a uniform spread over the keys it can see.
fn attention_report(
    fig: &TableSpec,
    spec: &fpt_spec::RunSpec,
    a: &Attention,
    (left, converged): (Option<bool>, Option<bool>),
    (out, scale): (&Path, &str),
    dir: &Path,
    mut md: String,
) -> Result<()> {
    let heads = &a.heads;
    let mut measured = Measured {
        learned: left,
        converged,
        ..Measured::default()
    };
    let t = heads[0].len();
    let nh = heads.len() as f32;
    let mean: Vec<Vec<f32>> = (0..t)
        .map(|i| {
            (0..t)
                .map(|j| heads.iter().map(|h| h[i][j]).sum::<f32>() / nh)
                .collect()
        })
        .collect();
    let mut marks = Vec::new();
    let mut summary = serde_json::json!({ "heads": heads.len(), "tokens": t, "backbone": spec.backbone.source });
    if spec.task.name == fpt_spec::TaskName::BitXor {
        let n = t / 2;
        let mut rows = Vec::new();
        md.push_str("Bit XOR: read-out token at position n+j XORs bits j and n+j. Attention mass on those two keys (first layer):\n\n| read-out position | mean over heads | best head | uniform over visible keys | null: best head on other key pairs, mean / 95th percentile |\n|---|---|---|---|---|\n");
        for j in 0..n {
            let q = n + j;
            marks.push((q, j));
            marks.push((q, q));
            let on = |h: &Vec<Vec<f32>>| h[q][j] + h[q][q];
            let best = heads.iter().map(on).fold(0f32, f32::max);
            // Causal attention: the first query sees only itself.
            let visible = if heads[0][0].iter().skip(1).all(|&v| v == 0.0) {
                q + 1
            } else {
                t
            };
            let uniform = 2.0 / visible as f32;
            // The null control: the same statistic (the best head's mass on two keys) on every
            // other pair of keys the token sees. Taking the top of the heads favours any pair;
            // the XOR'ed pair stands out only above this distribution.
            let mut null: Vec<f32> = Vec::new();
            for a in 0..visible {
                for b in a + 1..visible {
                    if (a, b) != (j.min(q), j.max(q)) {
                        null.push(heads.iter().map(|h| h[q][a] + h[q][b]).fold(0f32, f32::max));
                    }
                }
            }
            null.sort_by(|x, y| x.total_cmp(y));
            let null_mean = null.iter().sum::<f32>() / null.len().max(1) as f32;
            let null_p95 = null
                .get(((null.len() as f32 * 0.95) as usize).min(null.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0.0);
            md.push_str(&format!(
                "| {q} | {:.3} | {best:.3} | {uniform:.3} | {null_mean:.3} / {null_p95:.3} |\n",
                mean[q][j] + mean[q][q]
            ));
            rows.push(serde_json::json!({ "query": q, "mean": mean[q][j] + mean[q][q], "best_head": best, "uniform": uniform, "null_mean": null_mean, "null_p95": null_p95, "above_null_p95": best > null_p95 }));
            measured.xor.push([
                best as f64,
                null_mean as f64,
                null_p95 as f64,
                uniform as f64,
                (mean[q][j] + mean[q][q]) as f64,
            ]);
        }
        let masses: Vec<f64> = rows.iter().filter_map(|r| r["best_head"].as_f64()).collect();
        let uniforms: Vec<f64> = rows.iter().filter_map(|r| r["uniform"].as_f64()).collect();
        let (m, u) = (
            masses.iter().sum::<f64>() / masses.len().max(1) as f64,
            uniforms.iter().sum::<f64>() / uniforms.len().max(1) as f64,
        );
        let above = rows
            .iter()
            .filter(|r| r["above_null_p95"].as_bool() == Some(true))
            .count();
        let null_means: Vec<f64> = rows.iter().filter_map(|r| r["null_mean"].as_f64()).collect();
        let nm = null_means.iter().sum::<f64>() / null_means.len().max(1) as f64;
        md.push_str(&format!(
            "\nMeasured: over the read-out tokens, the best head puts {m:.3} of its attention on the two bits the token XORs, {:.1}x a uniform spread ({u:.3}); the same statistic on the other pairs of keys each token sees (the null control) averages {nm:.3}, and the XOR'ed pair is above the null's 95th percentile for {above} of {} read-out tokens. The caption's pattern counts as seen when the XOR'ed pair is above that percentile for most tokens (and at least 2x uniform).\n",
            m / u.max(1e-9),
            rows.len()
        ));
        summary["null_mean"] = nm.into();
        summary["above_null_p95"] = above.into();
        summary["xor_mass"] = rows.into();
        summary["best_head_mass_over_uniform"] = (m / u.max(1e-9)).into();
        md.push('\n');
    }
    if spec.task.name == fpt_spec::TaskName::BitMemory {
        measured.matching = matching_masses(heads, &a.inputs, a.readout);
    }
    summary["learned"] = serde_json::json!(left);
    summary["converged"] = serde_json::json!(converged);
    // Another figure's per-token XOR masses at this scale, where its run learned and ended.
    let other = |id: &str| -> Option<Vec<f64>> {
        let p = out.join(id).join(scale).join("report.json");
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()?;
        if v["learned"] != serde_json::json!(true) || v["converged"] != serde_json::json!(true) {
            return None;
        }
        v["xor_mass"].as_array()?.iter().map(|r| r["mean"].as_f64()).collect()
    };
    let claims = judge(fig, &measured, &other);
    summary["claims"] = serde_json::to_value(&claims).expect("json");
    let svg = heatmap_svg(
        &format!("{}: first-layer attention, mean over heads", fig.id),
        &mean,
        &marks,
    );
    md.push_str(&format!(
        "![{}](figure.svg)\n\nRows: query positions; columns: key positions; darker = more attention (mean over the first layer's {} heads, first held-out example){}.\n",
        fig.id,
        heads.len(),
        if marks.is_empty() { "" } else { "; red boxes: the two bits each read-out token XORs" }
    ));
    md.push_str(&section(&claims));
    summary["mean"] = serde_json::to_value(&mean).expect("json");
    write_all(
        dir,
        &[
            ("figure.svg", svg),
            ("report.md", md),
            ("report.json", serde_json::to_string_pretty(&summary).expect("json")),
        ],
    )
}

/// A figure that measured nothing: its report says why, its statements `not run`.
fn not_drawn(fig: &TableSpec, dir: &Path, mut md: String, why: String) -> Result<()> {
    let m = Measured {
        missing: Some(why),
        ..Measured::default()
    };
    let claims = judge(fig, &m, &|_| None);
    md.push_str(&section(&claims));
    let json = serde_json::json!({ "claims": claims });
    write_all(
        dir,
        &[
            ("report.md", md),
            ("report.json", serde_json::to_string_pretty(&json).expect("json")),
        ],
    )
}

/// Whether the figure's run converged, by the rule its table's reports apply.
fn converged(out: &Path, key: &str, spec: &fpt_spec::RunSpec) -> Option<bool> {
    let rec = crate::record::RunRecord::load(out, key).ok().flatten()?;
    let res = rec.result.as_ref()?;
    crate::convergence::converged_by_rule(res, &rec.evals, spec.train.converge_floor).0
}

/// A kept figure report (its run's checkpoint not here) without its statements gets them,
/// judged from what can be known without the run: nothing where it learned (its measure
/// needs the checkpoint), `undecided` where it did not.
fn keep_statements(
    fig: &TableSpec,
    dir: &Path,
    md: &str,
    (left, converged): (Option<bool>, Option<bool>),
) -> Result<()> {
    if fig.statements.is_empty() || md.contains("## The paper's statements") {
        return Ok(());
    }
    let m = Measured {
        learned: left,
        converged,
        missing: (left == Some(true) && converged == Some(true))
            .then(|| "the run's checkpoint is not on this machine: its attention was not measured".to_string()),
        ..Measured::default()
    };
    let claims = judge(fig, &m, &|_| None);
    let path = dir.join("report.json");
    let mut json: serde_json::Value = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| serde_json::json!({}));
    json["claims"] = serde_json::to_value(&claims).expect("json");
    json["learned"] = serde_json::json!(left);
    json["converged"] = serde_json::json!(converged);
    write_all(
        dir,
        &[
            ("report.md", format!("{md}{}", section(&claims))),
            ("report.json", serde_json::to_string_pretty(&json).expect("json")),
        ],
    )
}

/// Whether a figure's run learned, in words: a pattern in a model that learned nothing is no
/// evidence for the caption.
fn learned_words(r: &fpt_train::RunResult) -> String {
    match &r.baseline {
        Some(b) if b.left => format!(
            "The run left its task's trivial baseline: test accuracy {:.1}% against {} ({:+.1} points, 95% interval {:+.1} to {:+.1}).\n\n",
            100.0 * r.test_accuracy,
            b.describe,
            100.0 * b.margin,
            100.0 * b.margin_interval.0,
            100.0 * b.margin_interval.1
        ),
        Some(b) => format!(
            "**The run did not leave its task's trivial baseline** (test accuracy {:.1}%: {}), so its attention is no evidence for or against the caption.\n\n",
            100.0 * r.test_accuracy,
            b.reasons.join("; ")
        ),
        None => format!(
            "The run's test accuracy is {:.1}% (whether it left its trivial baseline was not recorded).\n\n",
            100.0 * r.test_accuracy
        ),
    }
}

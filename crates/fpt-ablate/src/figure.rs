//! Figures, as SVG written by hand and rasterised to PNG with `resvg` (system fonts for the
//! labels): Figure 1's grouped bars from Table 1's cells (ours filled, the paper's
//! outlined), Figures 3-5's first-layer attention maps of a trained run (recorded through
//! `Ctx::attention` on a held-out example), Figure 6's standard deviation of the attention
//! and feed-forward parameters by layer, and a learning-curve plot per table from its runs'
//! `metrics.jsonl`.

use crate::{expand, io, Report, Result};
use fpt_spec::table::{Kind, ScaleSettings, TableSpec};
use fpt_spec::{BackboneSpec, Init, ResidualInit, Role, TrainGroups};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub(crate) const COLORS: [&str; 6] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"];

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Grouped bars: `groups` along x, one bar per series in each; `ours[s][g]` filled,
/// `paper[s][g]` outlined beside it. Values in percent.
fn bars_svg(
    title: &str,
    groups: &[String],
    series: &[String],
    ours: &[Vec<Option<f64>>],
    paper: &[Vec<Option<f64>>],
) -> String {
    let (w, h, left, bottom, top) = (900.0, 420.0, 50.0, 70.0, 40.0);
    let plot_h = h - bottom - top;
    let gw = (w - left - 20.0) / groups.len().max(1) as f64;
    let bw = gw * 0.8 / (2 * series.len()).max(1) as f64;
    let y = |v: f64| top + plot_h * (1.0 - v.clamp(0.0, 100.0) / 100.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        w / 2.0,
        esc(title)
    );
    for t in [0, 25, 50, 75, 100] {
        let yy = y(t as f64);
        let _ = writeln!(
            s,
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{yy}\" y2=\"{yy}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{t}%</text>",
            w - 20.0,
            left - 5.0,
            yy + 4.0
        );
    }
    for (g, name) in groups.iter().enumerate() {
        let x0 = left + g as f64 * gw + gw * 0.1;
        for (k, _) in series.iter().enumerate() {
            let c = COLORS[k % COLORS.len()];
            let x = x0 + (2 * k) as f64 * bw;
            if let Some(v) = ours[k][g] {
                let _ = writeln!(
                    s,
                    "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"{:.1}\" fill=\"{c}\"/>",
                    y(v),
                    y(0.0) - y(v)
                );
            }
            if let Some(v) = paper[k][g] {
                let _ = writeln!(
                    s,
                    "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"{:.1}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"1.5\"/>",
                    x + bw,
                    y(v),
                    y(0.0) - y(v)
                );
            }
        }
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x0 + gw * 0.4,
            h - bottom + 18.0,
            esc(name)
        );
    }
    for (k, name) in series.iter().enumerate() {
        let x = left + 10.0 + k as f64 * 200.0;
        let c = COLORS[k % COLORS.len()];
        let _ = writeln!(
            s,
            "<rect x=\"{x}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{c}\"/><rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"none\" stroke=\"{c}\"/><text x=\"{}\" y=\"{}\">{} (ours / paper)</text>",
            h - 30.0,
            x + 14.0,
            h - 30.0,
            x + 32.0,
            h - 20.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Lines over layer index (Figure 6).
fn lines_svg(title: &str, series: &[(String, Vec<f64>)]) -> String {
    let pts: Vec<(String, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(n, v)| (n.clone(), v.iter().enumerate().map(|(i, y)| (i as f64, *y)).collect()))
        .collect();
    xy_svg(title, "layer", &pts)
}

/// Lines through `(x, y)` points, one per series, with a legend below.
pub(crate) fn xy_svg(title: &str, xlabel: &str, series: &[(String, Vec<(f64, f64)>)]) -> String {
    let rows = series.len().div_ceil(3) as f64;
    let (w, left, bottom, top) = (700.0, 60.0, 56.0 + 14.0 * rows, 40.0);
    let h = 360.0 + bottom;
    let all = || series.iter().flat_map(|s| s.1.iter().copied());
    let ymax = all().map(|p| p.1).fold(0.0f64, f64::max).max(1e-6) * 1.1;
    let (xmin, xmax) = all().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (xmin, xmax) = match (xmin.is_finite(), xmax > xmin) {
        (true, true) => (xmin, xmax),
        // One x value (one evaluation per run): centre it.
        (true, false) => (xmin - 1.0, xmin + 1.0),
        _ => (0.0, 1.0),
    };
    let x = |v: f64| left + (w - left - 20.0) * (v - xmin) / (xmax - xmin);
    let y = |v: f64| top + (h - bottom - top) * (1.0 - v / ymax);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        w / 2.0,
        esc(title)
    );
    for k in 0..=4 {
        let v = ymax * k as f64 / 4.0;
        let _ = writeln!(
            s,
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.3}</text>",
            w - 20.0,
            y(v),
            y(v),
            left - 5.0,
            y(v) + 4.0
        );
    }
    let integers = all().all(|p| p.0.fract() == 0.0) && xmax - xmin <= 24.0;
    let ticks: Vec<f64> = if integers {
        (xmin as i64..=xmax as i64).map(|v| v as f64).collect()
    } else {
        (0..=4).map(|k| xmin + (xmax - xmin) * k as f64 / 4.0).collect()
    };
    for t in ticks {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{t:.0}</text>",
            x(t),
            h - bottom + 16.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
        w / 2.0,
        h - bottom + 32.0,
        esc(xlabel)
    );
    for (k, (name, vals)) in series.iter().enumerate() {
        let c = COLORS[k % COLORS.len()];
        let pts: Vec<String> = vals.iter().map(|(a, b)| format!("{:.1},{:.1}", x(*a), y(*b))).collect();
        if pts.len() > 1 {
            let _ = writeln!(
                s,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"/>",
                pts.join(" ")
            );
        }
        for (a, b) in vals {
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{c}\"/>",
                x(*a),
                y(*b)
            );
        }
        let lx = left + 10.0 + (k % 3) as f64 * 210.0;
        let ly = h - bottom + 40.0 + (k / 3) as f64 * 14.0;
        let _ = writeln!(
            s,
            "<rect x=\"{lx}\" y=\"{}\" width=\"12\" height=\"3\" fill=\"{c}\"/><text x=\"{}\" y=\"{}\">{}</text>",
            ly + 4.0,
            lx + 16.0,
            ly + 9.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// The learning curves (held-out accuracy by step) of a table's finished runs (under the
/// results directory `out`), one line per cell that ran, as SVG; `None` when no cell has a
/// `metrics.jsonl`.
pub fn learning_curves(report: &Report, out: &Path) -> Option<String> {
    let mut series = Vec::new();
    for c in &report.cells {
        let Some(run) = &c.run else { continue };
        let Ok(text) = std::fs::read_to_string(out.join(run).join("metrics.jsonl")) else {
            continue;
        };
        let pts: Vec<(f64, f64)> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<fpt_train::EvalRecord>(l).ok())
            .map(|r| (r.step as f64, 100.0 * r.test_accuracy))
            .collect();
        if !pts.is_empty() {
            series.push((format!("{} / {}", c.row, c.col), pts));
        }
    }
    (!series.is_empty()).then(|| {
        xy_svg(
            &format!("{}: held-out accuracy (%) by step, scale {}", report.id, report.scale),
            "step",
            &series,
        )
    })
}

/// Writes each file atomically; every `*.svg` also as a `*.png` beside it. Refuses,
/// writing nothing, when this build failed its self-check.
pub(crate) fn write_all(dir: &Path, files: &[(&str, String)]) -> Result<()> {
    let check = fpt_train::selfcheck::cached();
    if !check.passed {
        return Err(crate::AblateError::SelfCheck {
            table: dir.display().to_string(),
            summary: check.summary(),
        });
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let write = |name: &str, bytes: &[u8]| -> Result<()> {
        let p = dir.join(name);
        fpt_spec::files::write_atomic(&p, bytes).map_err(io(&p))
    };
    for (name, text) in files {
        write(name, text.as_bytes())?;
        if let Some(stem) = name.strip_suffix(".svg") {
            let png_name = format!("{stem}.png");
            match png(text) {
                Ok(bytes) => write(&png_name, &bytes)?,
                Err(e) => {
                    // An earlier build's PNG would no longer match its SVG.
                    let old = dir.join(&png_name);
                    if old.is_file() {
                        std::fs::remove_file(&old).map_err(io(&old))?;
                    }
                    if cfg!(feature = "png") {
                        tracing::warn!("{}: no PNG: {e}", dir.join(name).display())
                    } else {
                        tracing::info!("{}: no PNG: {e}", dir.join(name).display())
                    }
                }
            }
        }
    }
    Ok(())
}

/// An SVG rasterised at its own size: an error in a build without the `png` feature.
#[cfg(not(feature = "png"))]
pub fn png(_svg: &str) -> std::result::Result<Vec<u8>, String> {
    Err(
        "this build has no PNG output (built without the `png` feature, which `cargo build --release -p fpt-cli` has)"
            .into(),
    )
}

/// An SVG rasterised at its own size (text with the system's fonts).
#[cfg(feature = "png")]
pub fn png(svg: &str) -> std::result::Result<Vec<u8>, String> {
    use std::sync::{Arc, OnceLock};
    static FONTS: OnceLock<Arc<resvg::usvg::fontdb::Database>> = OnceLock::new();
    let fonts = FONTS.get_or_init(|| {
        let mut db = resvg::usvg::fontdb::Database::new();
        db.load_system_fonts();
        // The SVGs ask for `sans-serif`; map it to a sans face this system has.
        let families: Vec<String> = db
            .faces()
            .flat_map(|f| f.families.iter().map(|(name, _)| name.clone()))
            .collect();
        let pick = [
            "DejaVu Sans",
            "Liberation Sans",
            "Noto Sans",
            "FreeSans",
            "Arial",
            "Helvetica",
        ]
        .iter()
        .map(|s| s.to_string())
        .find(|f| families.contains(f))
        .or_else(|| families.first().cloned());
        if let Some(f) = pick {
            db.set_sans_serif_family(f);
        }
        Arc::new(db)
    });
    let opt = resvg::usvg::Options {
        fontdb: fonts.clone(),
        ..Default::default()
    };
    let tree = resvg::usvg::Tree::from_str(svg, &opt).map_err(|e| e.to_string())?;
    let size = tree.size().to_int_size();
    let mut pix = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).ok_or("empty image")?;
    resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pix.as_mut());
    pix.encode_png().map_err(|e| e.to_string())
}

/// A heatmap of `m` (rows: queries, columns: keys), white to dark blue by value / max.
fn heatmap_svg(title: &str, m: &[Vec<f32>], marks: &[(usize, usize)]) -> String {
    let t = m.len().max(1);
    let cell = (480.0 / t as f64).clamp(2.0, 40.0);
    let (left, top) = (60.0, 40.0);
    let (w, h) = (left + cell * t as f64 + 20.0, top + cell * t as f64 + 50.0);
    let max = m.iter().flatten().fold(0f32, |a, &b| a.max(b)).max(1e-9);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w:.0}\" height=\"{h:.0}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{:.0}\" y=\"18\" text-anchor=\"middle\" font-size=\"13\">{}</text>\n",
        w / 2.0,
        esc(title)
    );
    for (i, row) in m.iter().enumerate() {
        for (j, &v) in row.iter().enumerate() {
            let a = (v / max).clamp(0.0, 1.0);
            let (r, g, b) = (
                (255.0 * (1.0 - a) + 8.0 * a) as u8,
                (255.0 * (1.0 - a) + 48.0 * a) as u8,
                (255.0 * (1.0 - a) + 107.0 * a) as u8,
            );
            let _ = writeln!(
                s,
                "<rect x=\"{:.2}\" y=\"{:.2}\" width=\"{cell:.2}\" height=\"{cell:.2}\" fill=\"rgb({r},{g},{b})\"/>",
                left + j as f64 * cell,
                top + i as f64 * cell
            );
        }
    }
    for &(i, j) in marks {
        let _ = writeln!(
            s,
            "<rect x=\"{:.2}\" y=\"{:.2}\" width=\"{cell:.2}\" height=\"{cell:.2}\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"1\"/>",
            left + j as f64 * cell,
            top + i as f64 * cell
        );
    }
    let step = (t / 10).max(1);
    for k in (0..t).step_by(step) {
        let c = k as f64 * cell + cell / 2.0;
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{k}</text><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{k}</text>",
            left + c,
            top + cell * t as f64 + 14.0,
            left - 4.0,
            top + c + 4.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"middle\">key position</text><text x=\"14\" y=\"{:.0}\" transform=\"rotate(-90 14 {:.0})\" text-anchor=\"middle\">query position</text>\n</svg>",
        left + cell * t as f64 / 2.0,
        h - 12.0,
        top + cell * t as f64 / 2.0,
        top + cell * t as f64 / 2.0
    );
    s
}

/// The first attention layer of the trained run in `run_dir` (its last checkpoint) on the
/// first held-out example: per head `[queries][keys]`.
pub fn first_layer_attention(
    spec: &fpt_spec::RunSpec,
    run_dir: &Path,
) -> std::result::Result<Vec<Vec<Vec<f32>>>, String> {
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
    probs.to_vec3::<f32>().map_err(|e| s(&e))
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
            let t = crate::load_table(tables, &from)?;
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
                    let json = serde_json::json!({ "backbone": spec.source, "series": series });
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
                    write_all(&dir, &[("report.md", md)])?;
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
                        // drawn when it was keeps.
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
                        .and_then(|t| serde_json::from_str::<fpt_train::RunResult>(&t).ok())
                        .map(|r| (r.test_accuracy, r.baseline));
                    match learned {
                        Some((acc, Some(b))) if b.left => md.push_str(&format!(
                            "The run left its task's trivial baseline: test accuracy {:.1}% against {} ({:+.1} points, 95% interval {:+.1} to {:+.1}).\n\n",
                            100.0 * acc,
                            b.describe,
                            100.0 * b.margin,
                            100.0 * b.margin_interval.0,
                            100.0 * b.margin_interval.1
                        )),
                        Some((acc, Some(b))) => md.push_str(&format!(
                            "**The run did not leave its task's trivial baseline** (test accuracy {:.1}%: {}), so its attention is no evidence for or against the caption.\n\n",
                            100.0 * acc,
                            b.reasons.join("; ")
                        )),
                        Some((acc, None)) => md.push_str(&format!(
                            "The run's test accuracy is {:.1}% (whether it left its trivial baseline was not recorded).\n\n",
                            100.0 * acc
                        )),
                        None => {}
                    }
                    match first_layer_attention(spec, &run) {
                        Ok(heads) => attention_report(fig, spec, &heads, &dir, md)?,
                        Err(e) => {
                            md.push_str(&format!("Not drawn: {e} (run `fpt run-table {}` first).\n", fig.id));
                            write_all(&dir, &[("report.md", md)])?;
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
    heads: &[Vec<Vec<f32>>],
    dir: &Path,
    mut md: String,
) -> Result<()> {
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
        md.push_str("Bit XOR: read-out token at position n+j XORs bits j and n+j. Attention mass on those two keys (first layer):\n\n| read-out position | mean over heads | best head | uniform over visible keys |\n|---|---|---|---|\n");
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
            md.push_str(&format!(
                "| {q} | {:.3} | {best:.3} | {uniform:.3} |\n",
                mean[q][j] + mean[q][q]
            ));
            rows.push(serde_json::json!({ "query": q, "mean": mean[q][j] + mean[q][q], "best_head": best, "uniform": uniform }));
        }
        let masses: Vec<f64> = rows.iter().filter_map(|r| r["best_head"].as_f64()).collect();
        let uniforms: Vec<f64> = rows.iter().filter_map(|r| r["uniform"].as_f64()).collect();
        let (m, u) = (
            masses.iter().sum::<f64>() / masses.len().max(1) as f64,
            uniforms.iter().sum::<f64>() / uniforms.len().max(1) as f64,
        );
        md.push_str(&format!(
            "\nMeasured: over the read-out tokens, the best head puts {m:.3} of its attention on the two bits the token XORs, {:.1}x a uniform spread ({u:.3}); the caption's pattern counts as seen when that is at least 2x.\n",
            m / u.max(1e-9)
        ));
        summary["xor_mass"] = rows.into();
        summary["best_head_mass_over_uniform"] = (m / u.max(1e-9)).into();
        md.push('\n');
    }
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

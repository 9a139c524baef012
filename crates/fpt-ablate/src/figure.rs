//! Figures, as SVG written by hand (no plotting dependency): Figure 1's grouped bars from
//! Table 1's cells (ours filled, the paper's outlined), and Figure 6's standard deviation of
//! the attention and feed-forward parameters by layer. Figures 3-5 (attention maps) need the
//! attention probabilities of a trained run, which fpt does not export yet; their report
//! says so.

use crate::{expand, io, Report, Result};
use fpt_spec::table::{Kind, ScaleSettings, TableSpec};
use fpt_spec::{BackboneSpec, Init, ResidualInit, Role, TrainGroups};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const COLORS: [&str; 6] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"];

fn esc(s: &str) -> String {
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

/// Lines over layers: one polyline per series.
fn lines_svg(title: &str, series: &[(String, Vec<f64>)]) -> String {
    let (w, h, left, bottom, top) = (700.0, 420.0, 60.0, 70.0, 40.0);
    let n = series.iter().map(|s| s.1.len()).max().unwrap_or(1).max(2);
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().copied())
        .fold(0.0f64, f64::max)
        .max(1e-6)
        * 1.1;
    let x = |i: usize| left + (w - left - 20.0) * i as f64 / (n - 1) as f64;
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
    for i in 0..n {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{i}</text>",
            x(i),
            h - bottom + 16.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">layer</text>",
        w / 2.0,
        h - bottom + 34.0
    );
    for (k, (name, vals)) in series.iter().enumerate() {
        let c = COLORS[k % COLORS.len()];
        let pts: Vec<String> = vals
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"/>",
            pts.join(" ")
        );
        let lx = left + 10.0 + (k % 3) as f64 * 210.0;
        let ly = h - 22.0 + (k / 3) as f64 * 14.0 - 14.0;
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

fn write_all(dir: &Path, files: &[(&str, String)]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    for (name, text) in files {
        let p = dir.join(name);
        let tmp = dir.join(format!("{name}.part"));
        std::fs::write(&tmp, text).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &p).map_err(io(&p))?;
    }
    Ok(())
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
/// `report.json`); returns the directory.
pub fn render(
    fig: &TableSpec,
    tables: &Path,
    scales: &BTreeMap<String, ScaleSettings>,
    scale: &str,
    out: &Path,
) -> Result<PathBuf> {
    let dir = out.join(&fig.id).join(scale);
    let mut md = format!("# {}: {} (scale `{scale}`)\n\n> {}\n\n", fig.id, fig.title, fig.caption);
    match fig.kind {
        Kind::Bars => {
            let from = fig.from_table.clone().unwrap_or_default();
            let t = crate::load_table(tables, &from)?;
            let cells = expand(&t, scales, scale)?;
            let r = Report::new(&t, scale, &cells, out);
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
                residual_init: ResidualInit::Scaled,
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
        Kind::AttentionMap | Kind::Table => {
            md.push_str("Not drawn: fpt does not yet export the first-layer attention probabilities of a trained run (the figure needs them); the run it would draw from is the spec's defaults.\n");
            write_all(&dir, &[("report.md", md)])?;
        }
    }
    Ok(dir)
}

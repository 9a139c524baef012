//! Hand-written SVG charts (lines through points, grouped bars, heat maps), their PNG
//! copies (rasterised with `resvg` and the system's fonts, the `png` feature), and the
//! atomic writing of a figure's files. Used by the reports, the figures and the site; uses
//! none of them.

use crate::{io, Result};
use std::fmt::Write as _;
use std::path::Path;

pub(crate) const COLORS: [&str; 6] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"];

/// Dash patterns for curves beyond the colours (none first).
const DASHES: [&str; 4] = ["", "7,4", "2,3", "9,3,2,3"];

/// A round axis for values up to `max`: (top, step between the 4 gridlines, decimals the
/// labels need), the step 1, 2, 2.5 or 5 times a power of ten.
pub(crate) fn nice_axis(max: f64) -> (f64, f64, usize) {
    let raw = max.max(1e-6) / 4.0;
    let mag = 10f64.powf(raw.log10().floor());
    let m = [1.0, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .into_iter()
        .find(|m| m * mag >= raw * (1.0 - 1e-12))
        .unwrap_or(10.0);
    let step = m * mag;
    // The decimals of the step: those of its power of ten, one more for 2.5.
    let digits = (-mag.log10().round()).max(0.0) as usize + usize::from(m == 2.5 && mag <= 1.0);
    (4.0 * step, step, digits)
}

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Grouped bars: `groups` along x, one bar per series in each; `ours[s][g]` filled,
/// `paper[s][g]` outlined beside it. Values in percent.
pub(crate) fn bars_svg(
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
pub(crate) fn lines_svg(title: &str, series: &[(String, Vec<f64>)]) -> String {
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
    let (ymax, ystep, ydigits) = nice_axis(all().map(|p| p.1).fold(0.0f64, f64::max));
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
        let v = ystep * k as f64;
        let _ = writeln!(
            s,
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.ydigits$}</text>",
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
        // Round steps: multiples of a 1, 2, 2.5, ... x 10^k step within the range.
        let (_, step, _) = nice_axis(xmax - xmin);
        let first = (xmin / step).ceil() as i64;
        let last = (xmax / step).floor() as i64;
        (first..=last).map(|k| k as f64 * step).collect()
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
        // Every curve its own look: the colours, then again with another dash pattern.
        let c = COLORS[k % COLORS.len()];
        let dash = match DASHES[(k / COLORS.len()) % DASHES.len()] {
            "" => String::new(),
            d => format!(" stroke-dasharray=\"{d}\""),
        };
        let pts: Vec<String> = vals.iter().map(|(a, b)| format!("{:.1},{:.1}", x(*a), y(*b))).collect();
        if pts.len() > 1 {
            let _ = writeln!(
                s,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"{dash}/>",
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
            "<line x1=\"{lx}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"{c}\" stroke-width=\"3\"{dash}/><text x=\"{}\" y=\"{}\">{}</text>",
            lx + 14.0,
            ly + 5.5,
            ly + 5.5,
            lx + 18.0,
            ly + 9.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
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
pub(crate) fn heatmap_svg(title: &str, m: &[Vec<f32>], marks: &[(usize, usize)]) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_are_round() {
        assert_eq!(nice_axis(100.0), (100.0, 25.0, 0));
        assert_eq!(nice_axis(110.0), (120.0, 30.0, 0));
        let (top, step, digits) = nice_axis(0.7);
        assert!((top - 0.8).abs() < 1e-12 && (step - 0.2).abs() < 1e-12 && digits == 1);
        let (top, _, digits) = nice_axis(0.09);
        assert!((top - 0.1).abs() < 1e-12 && digits == 3, "{top} {digits}");
    }

    #[test]
    fn curves_beyond_the_colours_get_their_own_dash() {
        let series: Vec<(String, Vec<(f64, f64)>)> = (0..8)
            .map(|i| (format!("s{i}"), vec![(0.0, 1.0), (1.0, 2.0)]))
            .collect();
        let svg = xy_svg("t", "x", &series);
        let looks: std::collections::BTreeSet<String> = svg
            .lines()
            .filter(|l| l.starts_with("<polyline"))
            .map(|l| l.split("points=").next().unwrap_or("").to_string() + l.rsplit("stroke=").next().unwrap_or(""))
            .collect();
        assert_eq!(looks.len(), 8, "{svg}");
        assert!(!svg.contains(".000<"), "{svg}");
    }
}

//! The paper's numbers as its tables print them (`38.4%`, `1×10^4`, `117M`, `89.0% [†]`).

/// Parses a number as the paper prints it: `38.4%`, `38%`, `1×10^4`, `117M`, `106K`,
/// `89.0% [†]`, `500 – 2000×` (a range: its lower end); `None` for `-` or text.
pub fn parse_paper(s: &str) -> Option<f64> {
    let s = s.replace("[†]", "");
    let s = s.trim();
    if let Some((lo, _)) = s.strip_suffix('×').and_then(|r| r.split_once('–')) {
        return lo.trim().parse().ok();
    }
    if let Some(p) = s.strip_suffix('%') {
        return p.trim().parse().ok();
    }
    if let Some((m, e)) = s.split_once("×10^") {
        return Some(m.trim().parse::<f64>().ok()? * 10f64.powi(e.trim().parse().ok()?));
    }
    for (suf, mul) in [("M", 1e6), ("K", 1e3)] {
        if let Some(p) = s.strip_suffix(suf) {
            return p.trim().parse::<f64>().ok().map(|v| v * mul);
        }
    }
    s.parse().ok()
}

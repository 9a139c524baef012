//! The paper's statements about its figures (`[[statements]]` in a figure's TOML), each
//! judged from what the figure measures: verdicts in the figure's report beside the
//! tables' claims (`report.json`'s `claims`, the same shape), so `fpt run-table all
//! --claims` lists them too.
//!
//! A statement about what a trained model attends to is evidence only where the run left
//! its task's trivial baseline and converged by the rule (`undecided` otherwise); its rule
//! is stated in its verdict.

use crate::claims::{ClaimReport, Verdict};
use fpt_spec::table::{Measure, Statement, TableSpec};

/// What one figure measured, as its statements read it.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// Whether the figure's run left its task's trivial baseline (`None`: not known, or
    /// the figure has no run).
    pub learned: Option<bool>,
    /// Whether the run converged by the rule (`result.json`'s `converged`): the attention of
    /// a run still rising may not be where it ends.
    pub converged: Option<bool>,
    /// Bit XOR, per read-out token: (best head's mass on the XOR'ed pair, the null's mean,
    /// the null's 95th percentile, uniform, mean-over-heads mass on the pair).
    pub xor: Vec<[f64; 5]>,
    /// Bit Memory, per query token: (mass on the matching string, the largest mass on any
    /// other string, the mean mass on the other strings), mean over heads.
    pub matching: Vec<[f64; 3]>,
    /// Figure 6: (series, std per layer).
    pub series: Vec<(String, Vec<f64>)>,
    /// Why nothing was measured (no run, no checkpoint here, no weights).
    pub missing: Option<String>,
}

fn verdict(v: &str, detail: String) -> Verdict {
    Verdict {
        verdict: v.into(),
        detail,
    }
}

/// Most of `n`: more than half.
fn most(k: usize, n: usize) -> bool {
    2 * k > n
}

fn xor_pair(m: &Measured) -> Verdict {
    let n = m.xor.len();
    let above = m.xor.iter().filter(|r| r[0] > r[2]).count();
    let at_null = m.xor.iter().filter(|r| r[0] <= r[1]).count();
    let mass = m.xor.iter().map(|r| r[0]).sum::<f64>() / n as f64;
    let uniform = m.xor.iter().map(|r| r[3]).sum::<f64>() / n as f64;
    let ratio = mass / uniform.max(1e-9);
    let detail = format!(
        "the best head's mass on the XOR'ed pair is above the null's 95th percentile for {above} of {n} read-out tokens, at or below the null's mean for {at_null}; {mass:.3} on average, {ratio:.1}x uniform (needed: above the percentile for most tokens and at least 2x uniform; fails when at or below the null's mean for most tokens, or under 1x uniform)"
    );
    let v = if most(above, n) && ratio >= 2.0 {
        "holds"
    } else if most(at_null, n) || ratio < 1.0 {
        "fails"
    } else {
        "inconclusive"
    };
    verdict(v, detail)
}

/// The paired difference over read-out tokens of the mean-over-heads mass on the XOR'ed
/// pair, this figure's minus `other`'s, with a normal 95% interval over the tokens.
fn weaker(m: &Measured, other: &[f64], than: &str) -> Verdict {
    let mine: Vec<f64> = m.xor.iter().map(|r| r[4]).collect();
    if mine.len() != other.len() || mine.len() < 2 {
        return verdict(
            "not run",
            format!(
                "{than} measured {} read-out tokens and this figure {}: no pairing",
                other.len(),
                mine.len()
            ),
        );
    }
    let d: Vec<f64> = mine.iter().zip(other).map(|(a, b)| a - b).collect();
    let k = d.len() as f64;
    let mean = d.iter().sum::<f64>() / k;
    let sd = (d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (k - 1.0)).sqrt();
    let half = 1.96 * sd / k.sqrt();
    let (lo, hi) = (mean - half, mean + half);
    let v = if hi < 0.0 {
        "holds"
    } else if lo > 0.0 {
        "fails"
    } else {
        "inconclusive"
    };
    verdict(
        v,
        format!(
            "the XOR'ed pair's mass (mean over heads) minus {than}'s: {mean:+.3}, 95% interval {lo:+.3} to {hi:+.3} over {} read-out tokens (one held-out example; needed < 0)",
            d.len()
        ),
    )
}

fn matching(m: &Measured) -> Verdict {
    let n = m.matching.len();
    let best = m.matching.iter().filter(|r| r[0] > r[1]).count();
    let at_others = m.matching.iter().filter(|r| r[0] <= r[2]).count();
    let on = m.matching.iter().map(|r| r[0]).sum::<f64>() / n as f64;
    let off = m.matching.iter().map(|r| r[2]).sum::<f64>() / n as f64;
    let v = if most(best, n) {
        "holds"
    } else if most(at_others, n) {
        "fails"
    } else {
        "inconclusive"
    };
    verdict(
        v,
        format!(
            "the query tokens' attention (mean over heads) on the string they copy is above every other string's for {best} of {n} tokens, at or below the others' mean for {at_others}; {on:.3} on it against {off:.3} on another on average (needed: above every other for most tokens; fails when at or below the others' mean for most)"
        ),
    )
}

fn layer_spread(m: &Measured) -> Verdict {
    let mut unlike = Vec::new();
    let mut like = Vec::new();
    for (name, v) in &m.series {
        let default = if name.contains("bias") { 0.0 } else { 0.02 };
        // A layer is unlike the default init when its std differs from it by more than a
        // tenth (of 0.02 for biases, whose default std is 0).
        let off = v
            .iter()
            .filter(|&&x| (x - default).abs() > 0.1 * default.max(0.02))
            .count();
        let line = format!("{name}: {off} of {} layers", v.len());
        match most(off, v.len()) {
            true => unlike.push(line),
            false => like.push(line),
        }
    }
    let v = if like.is_empty() && !unlike.is_empty() {
        "holds"
    } else {
        "fails"
    };
    verdict(
        v,
        format!(
            "layers whose std differs from the default init (0.02 for weights, 0 for biases) by more than 0.002: {}{} (needed: most layers of every series)",
            unlike.join(", "),
            if like.is_empty() {
                String::new()
            } else {
                format!("; like the default in most layers: {}", like.join(", "))
            }
        ),
    )
}

/// The paper's side of a figure's statement: its figure, not numbers.
fn on_paper(fig: &TableSpec) -> Verdict {
    verdict(
        "figure",
        format!("the paper shows it in its figure ({}, {})", fig.id, fig.section),
    )
}

/// Each statement of `fig` judged from `m`; `other` reads another figure's per-token
/// masses (mean over heads) at the same scale, for `xor-pair-weaker`.
pub fn judge(fig: &TableSpec, m: &Measured, other: &dyn Fn(&str) -> Option<Vec<f64>>) -> Vec<ClaimReport> {
    fig.statements
        .iter()
        .map(|s: &Statement| {
            let ours = judge_one(s, m, other);
            ClaimReport {
                text: s.text.clone(),
                ours,
                paper: on_paper(fig),
            }
        })
        .collect()
}

fn judge_one(s: &Statement, m: &Measured, other: &dyn Fn(&str) -> Option<Vec<f64>>) -> Verdict {
    if let Some(why) = &m.missing {
        return verdict("not run", why.clone());
    }
    let attention = s.measure != Measure::LayerSpread;
    if attention && m.learned != Some(true) {
        return verdict(
            "undecided",
            match m.learned {
                Some(false) => "the run did not leave its task's trivial baseline: its attention is no evidence".into(),
                _ => "whether the run left its task's trivial baseline is not known".into(),
            },
        );
    }
    if attention && m.converged != Some(true) {
        return verdict(
            "undecided",
            "the run is not converged by the rule (still rising across the last half of its steps, or its convergence not recorded): its attention where it ends may differ".into(),
        );
    }
    match s.measure {
        Measure::XorPair if !m.xor.is_empty() => xor_pair(m),
        Measure::XorPairWeaker if !m.xor.is_empty() => {
            let than = s.than_figure.as_deref().unwrap_or("");
            match other(than) {
                Some(o) => weaker(m, &o, than),
                None => verdict(
                    "not run",
                    format!("{than} has no measure at this scale (or its run did not learn)"),
                ),
            }
        }
        Measure::MatchingString if !m.matching.is_empty() => matching(m),
        Measure::LayerSpread if !m.series.is_empty() => layer_spread(m),
        _ => verdict("not run", "the figure measured nothing this statement reads".into()),
    }
}

/// The statements' section of a figure's `report.md` (empty without statements).
pub fn section(claims: &[ClaimReport]) -> String {
    if claims.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n## The paper's statements\n\nEach judged from what this figure measures (its rule in the verdict); a pattern in a run that did not leave its task's trivial baseline, or is not converged by the rule, is no evidence (`undecided`).\n\n| statement | ours | decided by | paper |\n|---|---|---|---|\n",
    );
    for c in claims {
        s.push_str(&format!(
            "| {} | **{}** | {} | {} ({}) |\n",
            c.text, c.ours.verdict, c.ours.detail, c.paper.verdict, c.paper.detail
        ));
    }
    s
}

/// The Bit Memory measure on one example: `heads` `[head][query][key]`, `x` the example's
/// inputs `[token][patch]` flattened, `readout` tokens per string (the query is the last
/// `readout` tokens, string `s` tokens `s * readout ..`). Per query token: the mass (mean
/// over heads) on the string whose bits agree with the query's visible ones, the largest
/// on another, and the others' mean. Empty when no string agrees with the visible bits.
pub fn matching_masses(heads: &[Vec<Vec<f32>>], x: &[f32], readout: usize) -> Vec<[f64; 3]> {
    let t = heads.first().map_or(0, |h| h.len());
    if readout == 0 || t < 2 * readout || !t.is_multiple_of(readout) || !x.len().is_multiple_of(t) {
        return Vec::new();
    }
    let patch = x.len() / t;
    let strings = t / readout - 1;
    let query = &x[strings * readout * patch..];
    // The string the query copies: every visible (non-zero) bit agrees.
    let agrees = |s: usize| {
        let bits = &x[s * readout * patch..(s + 1) * readout * patch];
        query.iter().zip(bits).all(|(q, b)| *q == 0.0 || q == b)
    };
    let Some(copy) = (0..strings).find(|&s| agrees(s)) else {
        return Vec::new();
    };
    let nh = heads.len() as f64;
    (0..readout)
        .map(|j| {
            let q = strings * readout + j;
            let mass = |s: usize| {
                heads
                    .iter()
                    .map(|h| {
                        h[q][s * readout..(s + 1) * readout]
                            .iter()
                            .map(|&v| v as f64)
                            .sum::<f64>()
                    })
                    .sum::<f64>()
                    / nh
            };
            let others: Vec<f64> = (0..strings).filter(|&s| s != copy).map(mass).collect();
            let top = others.iter().copied().fold(f64::MIN, f64::max);
            let mean = others.iter().sum::<f64>() / others.len().max(1) as f64;
            [mass(copy), top, mean]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(measure: Measure) -> TableSpec {
        let mut t: TableSpec = toml::from_str(
            r#"id = "figx"
title = "t"
caption = "c"
section = "§0"
kind = "attention-map"
"#,
        )
        .unwrap();
        t.statements.push(Statement {
            text: "s".into(),
            measure,
            than_figure: Some("figy".into()),
        });
        t
    }

    fn xor(rows: &[[f64; 5]]) -> Measured {
        Measured {
            learned: Some(true),
            converged: Some(true),
            xor: rows.to_vec(),
            ..Measured::default()
        }
    }

    #[test]
    fn the_xor_pair_rule_reads_the_null_and_uniform() {
        let f = fig(Measure::XorPair);
        let none = |_: &str| None;
        let strong = xor(&[[0.9, 0.3, 0.6, 0.2, 0.5]; 5]);
        assert_eq!(judge(&f, &strong, &none)[0].ours.verdict, "holds");
        let flat = xor(&[[0.3, 0.4, 0.9, 0.2, 0.2]; 5]);
        assert_eq!(judge(&f, &flat, &none)[0].ours.verdict, "fails");
        let between = xor(&[[0.8, 0.5, 0.95, 0.2, 0.4]; 5]);
        assert_eq!(judge(&f, &between, &none)[0].ours.verdict, "inconclusive");
        let baseline = Measured {
            learned: Some(false),
            ..strong.clone()
        };
        assert_eq!(judge(&f, &baseline, &none)[0].ours.verdict, "undecided");
        let rising = Measured {
            converged: Some(false),
            ..strong.clone()
        };
        let v = &judge(&f, &rising, &none)[0].ours;
        assert_eq!(v.verdict, "undecided");
        assert!(v.detail.contains("not converged"), "{}", v.detail);
    }

    #[test]
    fn weaker_pairs_tokens_with_the_other_figure() {
        let f = fig(Measure::XorPairWeaker);
        let m = xor(&[
            [0.5, 0.3, 0.6, 0.2, 0.30],
            [0.5, 0.3, 0.6, 0.2, 0.32],
            [0.5, 0.3, 0.6, 0.2, 0.28],
        ]);
        let strong = |_: &str| Some(vec![0.6, 0.65, 0.62]);
        let v = &judge(&f, &m, &strong)[0].ours;
        assert_eq!(v.verdict, "holds", "{}", v.detail);
        let weak = |_: &str| Some(vec![0.1, 0.12, 0.09]);
        assert_eq!(judge(&f, &m, &weak)[0].ours.verdict, "fails");
        let none = |_: &str| None;
        assert_eq!(judge(&f, &m, &none)[0].ours.verdict, "not run");
    }

    /// Two strings of two tokens of two bits and a query copying string 1 with one bit
    /// hidden: the mass on string 1 is read from the query's rows.
    #[test]
    fn matching_masses_find_the_copied_string() {
        let x = [1., -1., 1., 1., -1., 1., -1., -1., 0., 1., -1., 0.];
        // 6 tokens (2 strings + query), 2 read-out tokens; one head.
        let mut h = vec![vec![0f32; 6]; 6];
        h[4] = vec![0.1, 0.1, 0.3, 0.3, 0.1, 0.1];
        h[5] = vec![0.2, 0.2, 0.1, 0.1, 0.2, 0.2];
        let m = matching_masses(&[h], &x, 2);
        assert_eq!(m.len(), 2);
        assert!((m[0][0] - 0.6).abs() < 1e-6 && (m[0][1] - 0.2).abs() < 1e-6, "{m:?}");
        assert!((m[1][0] - 0.2).abs() < 1e-6 && (m[1][1] - 0.4).abs() < 1e-6, "{m:?}");
        let f = fig(Measure::MatchingString);
        let measured = Measured {
            learned: Some(true),
            converged: Some(true),
            matching: m,
            ..Measured::default()
        };
        // One of two tokens above: not most, and not at the others' mean for most.
        assert_eq!(judge(&f, &measured, &|_| None)[0].ours.verdict, "inconclusive");
    }

    #[test]
    fn layer_spread_compares_every_series_with_the_default_init() {
        let f = fig(Measure::LayerSpread);
        let m = |w: f64, b: f64| Measured {
            series: vec![
                ("attention weights".into(), vec![w; 4]),
                ("attention biases".into(), vec![b; 4]),
            ],
            ..Measured::default()
        };
        assert_eq!(judge(&f, &m(0.12, 0.05), &|_| None)[0].ours.verdict, "holds");
        assert_eq!(judge(&f, &m(0.02, 0.05), &|_| None)[0].ours.verdict, "fails");
    }
}

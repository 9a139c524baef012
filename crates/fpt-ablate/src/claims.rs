//! The paper's claims as checks over a table's cells (`[[claims]]` in a table's TOML).
//!
//! Each claim gets a verdict on our numbers and on the paper's:
//! - `holds` / `fails`: the 95% interval of the comparison lies wholly on one side of what
//!   the claim needs;
//! - `inconclusive`: the interval straddles it (more examples, evaluations or seeds would
//!   be needed);
//! - `undecided`: every pair of cells with numbers has a cell at its task's trivial
//!   baseline (a run that learned nothing is no evidence either way), unless the claim is
//!   itself about failure (`about_failure`);
//! - `not run`: no pair of cells has numbers.
//!
//! A pair is left out of the comparison, and named, when a cell is at its trivial baseline
//! (but for a `b` of "a beats b" that ended there: flat at it past its row's Table 6 count,
//! the model that did not learn);
//! when a cell on either side did not reach its plateau and is no bound either (not yet
//! flat, stopped before its row's Table 6 count, diverged), or its convergence was not
//! recorded; when both cells sit at the task's
//! ceiling (100% within their noise: the pair says nothing about the difference); and when
//! both ran one seed (a cell against a number: that cell) and no seed spread was measured
//! for a cell's backbone and task (the
//! spread of another backbone is never borrowed); and when a cell's model is not what its
//! row names (a Bit backbone that did not learn Bit Memory). Every verdict
//! names the pairs it used, its estimate and its interval: a paired, stratified bootstrap
//! over the held-out examples and seeds of the runs ([`crate::bootstrap`]) where every cell
//! recorded its per-example outcomes, else a normal interval from each cell's standard
//! error (the binomial error of its evaluation; the standard error of the seeds' mean where
//! it ran several), in both cases with the task's measured seed spread where a pair ran one
//! seed each.
//!
//! A cell whose runs ended at their step cap still rising ([`Convergence::Rising`]) is a
//! lower bound of where it ends, and is used as one: with weight +1 in the compared sum it
//! makes the sum a lower bound (the verdict may be `holds`, never `fails`: the interval is
//! open above), with weight -1 an upper bound (`fails`, never `holds`). Pairs bounded
//! opposite ways are left out (the way fewer pairs are bounded), so a mean is bounded one way.

use crate::bootstrap;
use fpt_spec::table::{Claim, ClaimKind, Select, TableSpec};
use fpt_train::outcomes::Outcomes;

/// A claim's verdict on one set of numbers.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Verdict {
    /// `holds`, `fails`, `inconclusive`, `undecided` or `not run`.
    pub verdict: String,
    /// The numbers that decide it: estimate, interval, the pairs used and those left out.
    pub detail: String,
}

/// A claim with its verdict on our numbers and on the paper's.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClaimReport {
    /// The claim.
    pub text: String,
    /// On our numbers.
    pub ours: Verdict,
    /// On the paper's numbers (where the table prints them).
    pub paper: Verdict,
}

/// Whether a cell's runs reached their plateau (`result.json`'s `converged`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Convergence {
    /// On a plateau (or a number that is not a training outcome, such as the paper's).
    #[default]
    Reached,
    /// Every run that did not reach its plateau ended at its cap still rising by the rule
    /// (its last half gained half a point or more, or its gain's interval lies above 0): the
    /// number is a lower bound of where the cell ends. It decides a claim only where a lower
    /// bound can: "a beats b" holds on a rising `a`, fails on a rising `b`.
    Rising,
    /// Not converged, and not a bound either: not yet flat (its gain's interval straddles
    /// 0 too widely to call), stopped before its row's Table 6 count, evaluated fewer than
    /// three times, or diverged.
    NotConverged,
    /// Not recorded (a run from before fpt recorded it).
    Unknown,
}

/// Which way the numbers of a comparison are bounds of where its cells end: a rising cell
/// with weight +1 makes the compared sum a lower bound, with weight -1 an upper one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    /// The true sum is at least the estimate: the claim can hold, never fail, on it.
    Lower,
    /// The true sum is at most the estimate: the claim can fail, never hold, on it.
    Upper,
}

/// One cell's numbers as a claim sees them.
#[derive(Debug, Clone, Default)]
pub struct CellValue<'a> {
    /// The cell's number (points of accuracy, steps, ...).
    pub value: f64,
    /// Its standard error (0 where none is known, e.g. the paper's numbers).
    pub se: f64,
    /// Why the cell is at its task's trivial baseline (`None`: it left it, or has none).
    pub at_baseline: Option<String>,
    /// Whether every run of the cell ended at its baseline (flat there past its row's Table 6
    /// count): as the side that must be beaten (`b` of "a beats b"), such a cell decides the
    /// claim; it is the model that did not learn.
    pub ended_at_baseline: bool,
    /// The per-example outcomes of each of its runs (seed order); empty where not recorded.
    pub runs: &'a [Outcomes],
    /// The task's measured seed spread at the scale for the cell's backbone (points; 0
    /// when unknown).
    pub seed_sd: f64,
    /// Whether the cell's runs reached their plateau.
    pub convergence: Convergence,
    /// Whether the number is at the task's ceiling (100% within its noise).
    pub at_ceiling: bool,
    /// Seeds the number averages (0: not a run of ours, e.g. the paper's number).
    pub seeds: usize,
    /// Whether a seed spread was measured for the cell's backbone and task (the rule for
    /// single-seed pairs).
    pub spread_known: bool,
    /// Why the cell's model is not what its row claims (a Bit backbone that did not learn
    /// Bit Memory): its pairs are left out.
    pub unfit: Option<String>,
}

impl CellValue<'_> {
    /// A number with no uncertainty and no baseline (the paper's).
    pub fn exact(value: f64) -> CellValue<'static> {
        CellValue {
            value,
            ..CellValue::default()
        }
    }
}

/// The cells `sel` picks, as (row, col) in row-major order.
pub fn select(table: &TableSpec, sel: &Select) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (r, row) in table.rows.iter().enumerate() {
        for (c, col) in table.cols.iter().enumerate() {
            if sel.row.as_ref().is_none_or(|l| *l == row.label) && sel.col.as_ref().is_none_or(|l| *l == col.label) {
                out.push((r, c));
            }
        }
    }
    out
}

/// Checks that a claim's selections name rows and columns of `table` and pair up.
pub fn validate(table: &TableSpec, claim: &Claim) -> Result<(), String> {
    let n = select(table, &claim.a).len();
    if n == 0 {
        return Err(format!("claim `{}`: `a` selects no cell", claim.text));
    }
    if claim.b.is_some() && claim.than.is_some() {
        return Err(format!(
            "claim `{}`: `b` and `than` both given: one or the other",
            claim.text
        ));
    }
    if claim.kind == ClaimKind::Ratio && claim.than.is_some() {
        return Err(format!(
            "claim `{}`: `ratio` compares `a` with `b`, not `than`",
            claim.text
        ));
    }
    if claim.kind != ClaimKind::Gap && (claim.c.is_some() || claim.d.is_some()) {
        return Err(format!(
            "claim `{}`: `c` and `d` belong to `gap` claims only",
            claim.text
        ));
    }
    let others: Vec<&Select> = match claim.kind {
        ClaimKind::Greater | ClaimKind::Comparable if claim.than.is_some() => vec![],
        ClaimKind::Greater | ClaimKind::Comparable | ClaimKind::Ratio => vec![claim.b.as_ref().ok_or_else(|| {
            format!(
                "claim `{}`: needs `b` (or, for `greater` and `comparable`, `than`)",
                claim.text
            )
        })?],
        ClaimKind::Best if claim.among.is_empty() => {
            return Err(format!("claim `{}`: `best` needs `among`", claim.text))
        }
        ClaimKind::Best => claim.among.iter().collect(),
        ClaimKind::Gap => match (&claim.b, &claim.c, &claim.d) {
            (Some(b), Some(c), Some(d)) => vec![b, c, d],
            _ => return Err(format!("claim `{}`: `gap` needs `b`, `c` and `d`", claim.text)),
        },
    };
    if claim.kind == ClaimKind::Ratio {
        if !(claim.by.is_finite() && claim.by > 0.0) {
            return Err(format!(
                "claim `{}`: `ratio` needs `by`, the factor (a positive number), got {}",
                claim.text, claim.by
            ));
        }
        if claim.within.is_some_and(|w| !(w.is_finite() && w > 1.0)) {
            return Err(format!(
                "claim `{}`: a `ratio`'s `within` is a factor above 1 (\"about `by` times\": `by / within` to `by * within`)",
                claim.text
            ));
        }
    }
    if claim.kind == ClaimKind::Comparable && !claim.within.is_some_and(|w| w > 0.0) {
        return Err(format!(
            "claim `{}`: `comparable` needs `within`, a positive margin",
            claim.text
        ));
    }
    for o in others {
        let m = select(table, o).len();
        if m != n {
            return Err(format!(
                "claim `{}`: `a` selects {n} cells and {o:?} selects {m}: they must pair up",
                claim.text
            ));
        }
    }
    Ok(())
}

fn name(s: &Select) -> String {
    match (&s.row, &s.col) {
        (Some(r), Some(c)) => format!("{r} / {c}"),
        (Some(r), None) => r.clone(),
        (None, Some(c)) => c.clone(),
        (None, None) => "all".into(),
    }
}

/// Why a pair is left out (the words of the verdicts).
const AT_BASELINE: &str = "at their trivial baseline";
const RISING: &str =
    "not converged (not yet flat across the last half of its steps, stopped before its row's Table 6 count, evaluated fewer than three times, or diverged; only converged cells, and cells still rising at their cap as the lower bounds they are, decide a claim)";
const MIXED_BOUNDS: &str =
    "still rising at their caps on both sides (a lower bound on each side bounds the difference neither way)";
const OTHER_WAY: &str =
    "still rising at their caps, bounding their pair the other way than most bounded pairs (a mean of bounds both ways is bounded neither way)";
const UNKNOWN_CONVERGENCE: &str =
    "convergence not known by the rule (a run from before fpt recorded it the way the rule needs)";
const AT_CEILING: &str = "both at the task's ceiling";
const UNFIT: &str =
    "not the model its row names (a Bit backbone that did not learn Bit Memory, or whose pretraining was not recorded)";
const NO_SPREAD: &str = "one seed (each) and no seed spread measured for the backbone and task";

/// A pair's name, or the cell's where it is compared with a number.
fn pair_name_or(table: &TableSpec, pa: (usize, usize), pb: &Option<(usize, usize)>) -> String {
    match pb {
        Some(pb) => pair_name(table, pa, *pb),
        None => format!("{} / {}", table.rows[pa.0].label, table.cols[pa.1].label),
    }
}

/// How a pair of cells is named: the part in which the two selections agree.
fn pair_name(table: &TableSpec, (ra, ca): (usize, usize), (rb, cb): (usize, usize)) -> String {
    let row = |r: usize| table.rows[r].label.as_str();
    let col = |c: usize| table.cols[c].label.as_str();
    if ca == cb {
        col(ca).to_string()
    } else if ra == rb {
        row(ra).to_string()
    } else {
        format!("{} / {} vs {} / {}", row(ra), col(ca), row(rb), col(cb))
    }
}

/// What one comparison decided, and how.
struct Comparison {
    verdict: Option<&'static str>,
    detail: String,
}

/// What `a` is compared with: other cells, a fixed number (`than`), or, for `gap`, the
/// difference of two other selections.
enum Other<'s> {
    Cells(&'s Select),
    Number(f64),
    Gap(&'s Select, &'s Select, &'s Select),
}

/// A cell of a table: (row, column).
type Cell = (usize, usize);

/// One cell of a comparison (or the fixed number it is compared with), its weight in the
/// compared sum (`a - b`: +1 and -1; `(a - b) - (c - d)`: +1, -1, -1, +1), and whether, as
/// the side that must be beaten, it may have ended at its baseline.
struct Term<'v> {
    w: f64,
    at: Option<(usize, usize)>,
    value: CellValue<'v>,
    beaten: bool,
}

/// The terms' weights summed per cell (a cell on both sides of a gap counts once, with its
/// net weight): what the interval is computed from.
fn merged<'t, 'v>(terms: &'t [Term<'v>]) -> Vec<(f64, &'t CellValue<'v>)> {
    let mut out: Vec<(f64, Option<Cell>, &CellValue)> = Vec::new();
    for t in terms {
        match out.iter_mut().find(|(_, at, _)| at.is_some() && *at == t.at) {
            Some(m) => m.0 += t.w,
            None => out.push((t.w, t.at, &t.value)),
        }
    }
    out.into_iter().map(|(w, _, v)| (w, v)).collect()
}

/// The cells among `terms` still rising at their cap (lower bounds).
fn rising_cells<'t>(terms: &'t [Term]) -> impl Iterator<Item = Cell> + 't {
    terms
        .iter()
        .filter(|t| t.value.convergence == Convergence::Rising)
        .filter_map(|t| t.at)
}

/// A group of terms' weighted sum.
fn sum_of(terms: &[(f64, &CellValue)]) -> f64 {
    terms.iter().fold(0.0, |acc, (w, v)| acc + w * v.value)
}

fn compare<'v>(
    table: &TableSpec,
    claim: &Claim,
    a: &Select,
    b: Other,
    value: &dyn Fn(usize, usize) -> Option<CellValue<'v>>,
) -> Comparison {
    let sa = select(table, a);
    let ratio = claim.kind == ClaimKind::Ratio;
    // Each group: the selections' cells in order (`None`: the fixed number).
    let (slots, head): (Vec<Vec<Option<Cell>>>, String) = match b {
        Other::Cells(b) => (
            vec![select(table, b).into_iter().map(Some).collect()],
            match ratio {
                true => format!("{} over {}", name(a), name(b)),
                false => format!("{} - {}", name(a), name(b)),
            },
        ),
        Other::Number(x) => (vec![vec![None; sa.len()]], format!("{} - {x}", name(a))),
        Other::Gap(b, c, d) => (
            [b, c, d]
                .iter()
                .map(|s| select(table, s).into_iter().map(Some).collect())
                .collect(),
            format!("({} - {}) - ({} - {})", name(a), name(b), name(c), name(d)),
        ),
    };
    let constant = match b {
        Other::Number(x) => x,
        _ => 0.0,
    };
    // The weight of each slot after `a`'s (+1), and whether it is a side to be beaten.
    let weights: &[(f64, bool)] = match b {
        Other::Gap(..) => &[(-1.0, true), (-1.0, false), (1.0, false)],
        _ => &[(-1.0, claim.kind != ClaimKind::Comparable)],
    };
    let label = |(r, c): (usize, usize)| format!("{} / {}", table.rows[r].label, table.cols[c].label);
    // A couple of cells named by the part in which they agree.
    let couple = |x: &Term, y: &Term| match (x.at, y.at) {
        (Some(pa), pb) => pair_name_or(table, pa, &pb),
        _ => String::new(),
    };
    let mut kept: Vec<(String, Vec<Term>, Option<Bound>)> = Vec::new();
    // (why, cell) of every cell whose pair is left out.
    let mut excluded: Vec<(&'static str, String)> = Vec::new();
    'pairs: for (i, &pa) in sa.iter().enumerate() {
        let mut terms: Vec<Term> = Vec::new();
        let Some(x) = value(pa.0, pa.1) else { continue };
        terms.push(Term {
            w: 1.0,
            at: Some(pa),
            value: x,
            beaten: false,
        });
        for (slot, &(w, beaten)) in slots.iter().zip(weights) {
            let at = slot[i];
            let v = match at {
                Some(p) => value(p.0, p.1),
                None => Some(CellValue::exact(constant)),
            };
            let Some(v) = v else { continue 'pairs };
            terms.push(Term {
                w,
                at,
                value: v,
                beaten,
            });
        }
        if ratio {
            // A ratio is compared on the log scale: ln a - ln b, each standard error
            // carried over as se / value; a number that is not positive has no ratio.
            if terms.iter().any(|t| t.value.value <= 0.0) {
                continue;
            }
            for t in terms.iter_mut() {
                t.value.se /= t.value.value;
                t.value.value = t.value.value.ln();
            }
        }
        let mut out: Vec<(&'static str, String)> = Vec::new();
        if !claim.about_failure {
            for t in &terms {
                // A side to be beaten that ended at its baseline (flat there past its Table 6
                // count) is the model that did not learn: "a beats b" is decided on it.
                if let (Some(at), Some(_)) = (t.at, &t.value.at_baseline) {
                    if !(t.beaten && t.value.ended_at_baseline) {
                        out.push((AT_BASELINE, label(at)));
                    }
                }
            }
        }
        // Converged cells decide a claim, and cells still rising at their cap as the lower
        // bounds they are (one way only); a cell not converged otherwise, or not judged by
        // the rule, says nothing of where it ends. The cells that must not be beaten are
        // named first.
        let behind = terms.iter().filter(|t| t.w < 0.0);
        let mut bounds: Vec<Bound> = Vec::new();
        for t in behind.chain(terms.iter().filter(|t| t.w >= 0.0)) {
            if let Some(at) = t.at {
                match t.value.convergence {
                    Convergence::Rising => bounds.push(if t.w > 0.0 { Bound::Lower } else { Bound::Upper }),
                    Convergence::NotConverged => out.push((RISING, label(at))),
                    Convergence::Unknown => out.push((UNKNOWN_CONVERGENCE, label(at))),
                    Convergence::Reached => {}
                }
            }
        }
        let bound = bounds.first().copied();
        if bounds.iter().any(|b| Some(*b) != bound) {
            out.extend(rising_cells(&terms).map(|at| (MIXED_BOUNDS, label(at))));
        }
        for t in &terms {
            if let (Some(at), Some(_)) = (t.at, &t.value.unfit) {
                out.push((UNFIT, label(at)));
            }
        }
        for two in terms.chunks(2) {
            if let [x, y] = two {
                if x.value.at_ceiling && y.value.at_ceiling {
                    out.push((AT_CEILING, couple(x, y)));
                }
            }
        }
        let group = terms
            .chunks(2)
            .filter_map(|two| match two {
                [x, y] => Some(couple(x, y)),
                _ => None,
            })
            .fold(Vec::<String>::new(), |mut names, n| {
                if !names.contains(&n) {
                    names.push(n);
                }
                names
            })
            .join(" vs ");
        // The cells of the pair (a number it is compared with has no seeds): a single seed
        // of one cell against a number swings with the seed as much as a pair does.
        let cells = || terms.iter().filter(|t| t.at.is_some());
        let one_seed = cells().all(|t| t.value.seeds == 1);
        if one_seed && cells().any(|t| !t.value.spread_known) {
            out.push((NO_SPREAD, group.clone()));
        }
        if !out.is_empty() {
            excluded.extend(out);
            continue;
        }
        kept.push((group, terms, bound));
    }
    // Pairs bounded opposite ways make a mean bounded neither way: kept are the exact pairs
    // and the pairs bounded the way most bounded pairs are (a tie: the lower); the others
    // are left out and named.
    let lower = kept.iter().filter(|k| k.2 == Some(Bound::Lower)).count();
    let upper = kept.iter().filter(|k| k.2 == Some(Bound::Upper)).count();
    let bound = match (lower, upper) {
        (0, 0) => None,
        (l, u) if l >= u => Some(Bound::Lower),
        _ => Some(Bound::Upper),
    };
    kept.retain(|(_, terms, b)| {
        let off = b.is_some() && *b != bound;
        if off {
            excluded.extend(rising_cells(terms).map(|at| (OTHER_WAY, label(at))));
        }
        !off
    });
    let left_out = if excluded.is_empty() {
        String::new()
    } else {
        let mut parts = Vec::new();
        for why in [
            AT_BASELINE,
            UNFIT,
            RISING,
            MIXED_BOUNDS,
            OTHER_WAY,
            UNKNOWN_CONVERGENCE,
            AT_CEILING,
            NO_SPREAD,
        ] {
            let mut who: Vec<&str> = excluded
                .iter()
                .filter(|(w, _)| *w == why)
                .map(|(_, c)| c.as_str())
                .collect();
            who.dedup();
            if !who.is_empty() {
                parts.push(format!("{why}: {}", who.join(", ")));
            }
        }
        format!("; left out, {}", parts.join("; "))
    };
    let with_numbers = kept.len() + excluded.len();
    if with_numbers == 0 {
        return Comparison {
            verdict: None,
            detail: format!("{head}: no pair of cells with numbers"),
        };
    }
    if kept.is_empty() {
        return Comparison {
            verdict: Some("undecided"),
            detail: format!("{head}: no pair of cells that can decide it{left_out}"),
        };
    }
    let k = kept.len() as f64;
    let sums: Vec<Vec<(f64, &CellValue)>> = kept.iter().map(|(_, t, _)| merged(t)).collect();
    // A ratio is of numbers without per-example outcomes (steps): never resampled.
    let resampled = !ratio && sums.iter().flatten().all(|(_, v)| !v.runs.is_empty());
    let (mean, (lo, hi), how) = if resampled {
        let combos: Vec<bootstrap::Combination> = sums
            .iter()
            .map(|terms| bootstrap::Combination {
                terms: terms.iter().map(|(w, v)| (*w, v.runs)).collect(),
                seed_sd: terms.iter().fold(0.0, |m: f64, (_, v)| m.max(v.seed_sd)),
            })
            .collect();
        let (m, i) = bootstrap::mean_combination(&combos);
        (m, i, "paired bootstrap over examples and seeds")
    } else {
        let mean = sums.iter().map(|t| sum_of(t)).sum::<f64>() / k;
        let var: f64 = sums
            .iter()
            .map(|terms| {
                // Seeds the numbers average (a cell of several seeds without per-example
                // outcomes averages them all the same: no seed spread to add).
                let seeds = terms.iter().map(|(_, v)| v.seeds).min().unwrap_or(0);
                let w2: f64 = terms.iter().map(|(w, _)| w * w).sum();
                let sd = terms.iter().fold(0.0, |m: f64, (_, v)| m.max(v.seed_sd));
                let spread = if seeds <= 1 { w2 * sd.powi(2) } else { 0.0 };
                terms.iter().fold(0.0, |acc, (w, v)| acc + w * w * v.se * v.se) + spread
            })
            .sum();
        let half = 1.96 * var.sqrt() / k;
        (
            mean,
            (mean - half, mean + half),
            "normal interval from each cell's standard error",
        )
    };
    let exact = !resampled && lo == hi;
    // A bound is open on one side: the true value may lie anywhere beyond it that way.
    let (lo_v, hi_v) = match bound {
        Some(Bound::Lower) => (lo, f64::INFINITY),
        Some(Bound::Upper) => (f64::NEG_INFINITY, hi),
        None => (lo, hi),
    };
    let (lo, hi, shown) = (lo_v, hi_v, (lo, hi));
    let (verdict, need) = match claim.kind {
        ClaimKind::Comparable => {
            let w = claim.within.unwrap_or(0.0);
            let v = if lo >= -w && hi <= w {
                "holds"
            } else if lo > w || hi < -w {
                "fails"
            } else {
                "inconclusive"
            };
            (v, format!("needed within +-{w}"))
        }
        ClaimKind::Ratio => ratio_verdict(claim, lo, hi),
        ClaimKind::Greater | ClaimKind::Best | ClaimKind::Gap => {
            let v = if lo > claim.by {
                "holds"
            } else if hi < claim.by {
                "fails"
            } else {
                "inconclusive"
            };
            (v, format!("needed > {}", claim.by))
        }
    };
    // How a number of the comparison reads: points (signed), or a factor; an interval
    // narrower than the shown digits gets more of them, so that it never reads as none
    // (+1.0 to +1.0).
    let width = (shown.1 - shown.0).abs();
    let digits = match width {
        w if w > 0.0 && w < 0.01 => 3,
        w if w > 0.0 && w < 0.1 => 2,
        _ => 1,
    };
    let show = |d: f64| match ratio {
        true => format!("x{:.2}", d.exp()),
        false => format!("{d:+.digits$}"),
    };
    let spread = if kept.len() > 1 {
        let d: Vec<f64> = sums.iter().map(|t| sum_of(t)).collect();
        let (l, h) = d.iter().fold((f64::MAX, f64::MIN), |(l, h), &v| (l.min(v), h.max(v)));
        format!(", per pair {} to {}", show(l), show(h))
    } else {
        String::new()
    };
    let names: Vec<&str> = kept.iter().map(|(n, _, _)| n.as_str()).collect();
    let interval = match exact {
        true => String::new(),
        false => format!(", 95% interval {} to {} ({how}", show(shown.0), show(shown.1)),
    };
    // The cells whose numbers are lower bounds, and what that makes of the estimate.
    let mut rising: Vec<String> = Vec::new();
    for at in kept.iter().flat_map(|(_, t, _)| rising_cells(t)) {
        if !rising.contains(&label(at)) {
            rising.push(label(at));
        }
    }
    // A claim that the value lies within a margin can only fail on a bound; one that it
    // exceeds something can hold on a lower bound and fail on an upper one.
    let within = claim.kind == ClaimKind::Comparable || (ratio && claim.within.is_some());
    let can = |lower: bool| match (within, lower) {
        (true, _) => "so it can fail here, not hold",
        (false, true) => "so it can hold here, not fail",
        (false, false) => "so it can fail here, not hold",
    };
    let (word, bound_note) = match bound {
        Some(Bound::Lower) => (
            "at least ",
            format!(
                "; a lower bound: {} ended at the step cap still rising, {}",
                rising.join(", "),
                can(true)
            ),
        ),
        Some(Bound::Upper) => (
            "at most ",
            format!(
                "; an upper bound: {} ended at the step cap still rising, subtracted, {}",
                rising.join(", "),
                can(false)
            ),
        ),
        None => ("", String::new()),
    };
    Comparison {
        verdict: Some(verdict),
        detail: format!(
            "{head}: {word}{}{interval}{}mean over {} of {} pairs: {}{spread}; {need}{bound_note}){left_out}",
            show(mean),
            if exact { " (" } else { "; " },
            kept.len(),
            sa.len(),
            names.join(", ")
        ),
    }
}

/// A `ratio` claim's verdict on the interval of ln(a / b): above `by` (a factor), or, with
/// `within`, inside `by / within` to `by * within` ("about `by` times").
fn ratio_verdict(claim: &Claim, lo: f64, hi: f64) -> (&'static str, String) {
    let by = claim.by.ln();
    match claim.within {
        Some(w) => {
            let (l, h) = (by - w.ln(), by + w.ln());
            let v = if lo >= l && hi <= h {
                "holds"
            } else if lo > h || hi < l {
                "fails"
            } else {
                "inconclusive"
            };
            (v, format!("needed x{:.2} to x{:.2}", l.exp(), h.exp()))
        }
        None => {
            let v = if lo > by {
                "holds"
            } else if hi < by {
                "fails"
            } else {
                "inconclusive"
            };
            (v, format!("needed > x{}", claim.by))
        }
    }
}

/// The verdict of `claim` on the numbers `value` gives per (row, column).
pub fn check<'v>(table: &TableSpec, claim: &Claim, value: &dyn Fn(usize, usize) -> Option<CellValue<'v>>) -> Verdict {
    let others: Vec<Other> = match (claim.kind, claim.than) {
        (ClaimKind::Greater | ClaimKind::Comparable, Some(x)) => vec![Other::Number(x)],
        (ClaimKind::Greater | ClaimKind::Comparable | ClaimKind::Ratio, _) => {
            claim.b.iter().map(Other::Cells).collect()
        }
        (ClaimKind::Best, _) => claim.among.iter().map(Other::Cells).collect(),
        (ClaimKind::Gap, _) => match (&claim.b, &claim.c, &claim.d) {
            (Some(b), Some(c), Some(d)) => vec![Other::Gap(b, c, d)],
            _ => vec![],
        },
    };
    let results: Vec<Comparison> = others
        .into_iter()
        .map(|o| compare(table, claim, &claim.a, o, value))
        .collect();
    let any = |v: &str| results.iter().any(|r| r.verdict == Some(v));
    let verdict = if results.is_empty() || results.iter().any(|r| r.verdict.is_none()) {
        "not run"
    } else if any("fails") {
        "fails"
    } else if any("undecided") {
        "undecided"
    } else if results.iter().all(|r| r.verdict == Some("holds")) {
        "holds"
    } else {
        "inconclusive"
    };
    Verdict {
        verdict: verdict.to_string(),
        detail: results.into_iter().map(|r| r.detail).collect::<Vec<_>>().join("; "),
    }
}

/// Every claim of `table` on the paper's own numbers (no noise, no baselines); a claim
/// beyond the paper (`beyond_paper`) reads `n/p`, one the paper makes in its text about
/// cells its tables print no numbers for (`in_text`) reads `in text`.
pub fn on_paper(table: &TableSpec) -> Vec<(String, Verdict)> {
    table
        .claims
        .iter()
        .map(|c| {
            if c.beyond_paper {
                let v = Verdict {
                    verdict: "n/p".into(),
                    detail: "not a claim of the paper: its rows are not in the paper".into(),
                };
                return (c.text.clone(), v);
            }
            if let Some(section) = &c.in_text {
                let v = Verdict {
                    verdict: "in text".into(),
                    detail: format!(
                        "the paper says it in its text ({section}); its tables print no numbers for these cells"
                    ),
                };
                return (c.text.clone(), v);
            }
            let v = check(table, c, &|r, col| {
                crate::paper::parse_paper(&table.paper[r][col]).map(CellValue::exact)
            });
            (c.text.clone(), v)
        })
        .collect()
}

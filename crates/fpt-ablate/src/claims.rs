//! The paper's claims as checks over a table's cells (`[[claims]]` in a table's TOML):
//! each gets a verdict, `holds`, `fails`, `inconclusive` (the difference is within the
//! evaluation's sampling noise) or `not run`, with the numbers that decide it.

use fpt_spec::table::{Claim, ClaimKind, Select, TableSpec};

/// A claim's verdict on one set of numbers.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Verdict {
    /// `holds`, `fails`, `inconclusive` or `not run`.
    pub verdict: String,
    /// The numbers that decide it.
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
    let others: Vec<&Select> = match claim.kind {
        ClaimKind::Greater => vec![claim
            .b
            .as_ref()
            .ok_or_else(|| format!("claim `{}`: needs `b`", claim.text))?],
        ClaimKind::Best if claim.among.is_empty() => {
            return Err(format!("claim `{}`: `best` needs `among`", claim.text))
        }
        ClaimKind::Best => claim.among.iter().collect(),
    };
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

/// One comparison: `a` vs `b`, paired, by more than `by`. `value` gives a cell's number and
/// its standard error (0 where none is known).
fn compare(
    table: &TableSpec,
    a: &Select,
    b: &Select,
    by: f64,
    value: &dyn Fn(usize, usize) -> Option<(f64, f64)>,
) -> (Option<&'static str>, String) {
    let (sa, sb) = (select(table, a), select(table, b));
    let mut diffs = Vec::new();
    let mut var = 0.0;
    for (&(ra, ca), &(rb, cb)) in sa.iter().zip(&sb) {
        if let (Some((x, ex)), Some((y, ey))) = (value(ra, ca), value(rb, cb)) {
            diffs.push(x - y);
            var += ex * ex + ey * ey;
        }
    }
    let name = |s: &Select| match (&s.row, &s.col) {
        (Some(r), Some(c)) => format!("{r} / {c}"),
        (Some(r), None) => r.clone(),
        (None, Some(c)) => c.clone(),
        (None, None) => "all".into(),
    };
    if diffs.is_empty() {
        return (
            None,
            format!("{} vs {}: no pair of cells with numbers", name(a), name(b)),
        );
    }
    let k = diffs.len() as f64;
    let mean = diffs.iter().sum::<f64>() / k;
    let noise = 2.0 * var.sqrt() / k;
    let verdict = if mean - by > noise {
        "holds"
    } else if mean - by < -noise {
        "fails"
    } else {
        "inconclusive"
    };
    let spread = if diffs.len() > 1 {
        let (lo, hi) = diffs
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), &d| (l.min(d), h.max(d)));
        format!(", per pair {lo:+.1} to {hi:+.1}")
    } else {
        String::new()
    };
    (
        Some(verdict),
        format!(
            "{} - {}: {mean:+.1} (mean over {} of {} pairs{spread}; needed > {by}{})",
            name(a),
            name(b),
            diffs.len(),
            sa.len(),
            if noise > 0.0 {
                format!(", noise +-{noise:.1}")
            } else {
                String::new()
            }
        ),
    )
}

/// The verdict of `claim` on the numbers `value` gives.
pub fn check(table: &TableSpec, claim: &Claim, value: &dyn Fn(usize, usize) -> Option<(f64, f64)>) -> Verdict {
    let others: Vec<Select> = match claim.kind {
        ClaimKind::Greater => claim.b.iter().cloned().collect(),
        ClaimKind::Best => claim.among.clone(),
    };
    let results: Vec<(Option<&str>, String)> = others
        .iter()
        .map(|o| compare(table, &claim.a, o, claim.by, value))
        .collect();
    let verdict = if results.iter().any(|(v, _)| v.is_none()) {
        "not run"
    } else if results.iter().any(|(v, _)| *v == Some("fails")) {
        "fails"
    } else if results.iter().all(|(v, _)| *v == Some("holds")) {
        "holds"
    } else {
        "inconclusive"
    };
    Verdict {
        verdict: verdict.to_string(),
        detail: results.into_iter().map(|(_, d)| d).collect::<Vec<_>>().join("; "),
    }
}

/// Every claim of `table` on the paper's own numbers (no noise).
pub fn on_paper(table: &TableSpec) -> Vec<(String, Verdict)> {
    table
        .claims
        .iter()
        .map(|c| {
            let v = check(table, c, &|r, col| {
                crate::report::parse_paper(&table.paper[r][col]).map(|x| (x, 0.0))
            });
            (c.text.clone(), v)
        })
        .collect()
}

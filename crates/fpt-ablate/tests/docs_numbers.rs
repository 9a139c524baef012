//! The numbers the README and docs/ quote from the committed reports are the reports'.
//! A quoted number carries a marker just before it, invisible in the rendered Markdown:
//! `<!--cell table2/cpu FPT|XOR ours-->100.0%` (the report `results/<id>/<scale>/report.json`,
//! the cell's row and column labels, and its field: `ours`, `paper`, `baseline`, `diff` or
//! `steps`); the number after it must be the field's value as written (to as many decimals as
//! it shows). `<!--cell claims-->` and `<!--cell claims paper-->` mark counts of the claims
//! `data/tables` carries (all; the paper's own), `<!--cell statements-->` the figures'
//! statements. Numbers that no report holds (timings,
//! runs outside the tables) are dated and name their commit instead.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every marked number in `text`: `(marker, number as written)`.
fn marked(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("<!--cell ") {
        let after = &rest[i + "<!--cell ".len()..];
        let Some(end) = after.find("-->") else { break };
        let marker = after[..end].trim().to_string();
        let tail = &after[end + 3..];
        let number: String = tail
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '-' || *c == '+')
            .collect();
        out.push((marker, number));
        rest = tail;
    }
    out
}

/// The claims the tables carry: all of them, or the paper's own (not `beyond_paper`).
fn claims(paper_only: bool) -> usize {
    let tables = root().join("data/tables");
    fpt_ablate::list(&tables)
        .unwrap()
        .iter()
        .map(|id| {
            let t = fpt_ablate::load_table(&tables, id).unwrap();
            t.claims.iter().filter(|c| !paper_only || !c.beyond_paper).count()
        })
        .sum()
}

/// The value of `field` of the cell `row|col` in the report `id/scale`, as the number
/// `written` shows it (its decimals), or why not. Two markers count instead:
/// `claims` (every claim entry of `data/tables`) and `claims paper` (the paper's own), and
/// one more, `statements` (the figures' statements).
fn check(marker: &str, written: &str) -> Result<(), String> {
    if marker == "statements" {
        let tables = root().join("data/tables");
        let n: usize = fpt_ablate::list(&tables)
            .unwrap()
            .iter()
            .map(|id| fpt_ablate::load_table(&tables, id).unwrap().statements.len())
            .sum();
        return match written == n.to_string() {
            true => Ok(()),
            false => Err(format!("`{marker}`: the text says {written}, the figures carry {n}")),
        };
    }
    if let Some(which) = marker.strip_prefix("claims") {
        let n = claims(which.trim() == "paper");
        return if written == n.to_string() {
            Ok(())
        } else {
            Err(format!("`{marker}`: the text says {written}, the tables carry {n}"))
        };
    }
    let parts: Vec<&str> = marker.splitn(3, ' ').collect();
    let [report, cell, field] = parts[..] else {
        return Err(format!("`{marker}`: expected `<id>/<scale> <row>|<col> <field>`"));
    };
    let (row, col) = cell
        .split_once('|')
        .ok_or_else(|| format!("`{marker}`: the cell is `row|col`"))?;
    let (row, col) = (row.replace('_', " "), col.replace('_', " "));
    let path = root().join("results").join(report).join("report.json");
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path).map_err(|e| format!("`{marker}`: {}: {e}", path.display()))?,
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    let c = json["cells"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["row"] == row.as_str() && c["col"] == col.as_str())
        .ok_or_else(|| format!("`{marker}`: no cell {row} / {col} in {}", path.display()))?;
    let value = c[field]
        .as_f64()
        .ok_or_else(|| format!("`{marker}`: the cell has no number `{field}`"))?;
    let decimals = written.split_once('.').map_or(0, |(_, d)| d.len());
    let shown = format!("{value:.decimals$}");
    let want = written.trim_start_matches('+');
    if shown == want || (shown == "-0.0" && want == "0.0") {
        Ok(())
    } else {
        Err(format!("`{marker}`: the text says {written}, the report {shown}"))
    }
}

#[test]
fn the_numbers_the_docs_quote_are_the_reports() {
    let mut files = vec![root().join("README.md")];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            files.push(p);
        }
    }
    let (mut seen, mut wrong) = (0, Vec::new());
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (marker, number) in marked(&text) {
            seen += 1;
            if let Err(e) = check(&marker, &number) {
                wrong.push(format!("{}: {e}", f.strip_prefix(root()).unwrap_or(f).display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "quoted numbers that are not the reports':\n{}",
        wrong.join("\n")
    );
    // The README's account of Table 2 quotes its cells (a test that finds no marker proves
    // nothing).
    assert!(seen >= 10, "only {seen} marked numbers in README.md and docs/");
}

#[test]
fn a_marker_that_misquotes_is_caught() {
    assert!(check("table2/cpu FPT|XOR ours", "100.0").is_ok());
    let e = check("table2/cpu FPT|XOR ours", "99.0").unwrap_err();
    assert!(e.contains("the text says 99.0, the report 100.0"), "{e}");
    assert!(check("table2/cpu Nope|XOR ours", "1")
        .unwrap_err()
        .contains("no cell Nope / XOR"));
    assert_eq!(
        marked("a <!--cell t/s A|B ours-->12.5% b <!--cell t/s A|C diff-->+3.0"),
        [
            ("t/s A|B ours".to_string(), "12.5".to_string()),
            ("t/s A|C diff".to_string(), "+3.0".to_string())
        ]
    );
}

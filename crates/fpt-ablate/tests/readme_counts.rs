//! Counts the README states about the committed results, held to what the code computes
//! from them (the claims block has its own test in `paper_settings.rs`).

use std::path::Path;

mod common;

/// "they are N reports and M run pages now": what `fpt report results` builds from the
/// committed `results/` tree.
#[test]
fn the_readmes_site_counts_are_the_committed_results() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let text = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    let at = text
        .find(" run pages now")
        .and_then(|j| text[..j].rfind("they are ").map(|i| (i, j)))
        .expect("README states the site's counts: \"they are N reports and M run pages now\"");
    let words: Vec<&str> = text[at.0..at.1].split(' ').collect();
    // "they are N reports and M"
    let (n, m): (usize, usize) = (words[2].parse().unwrap(), words[5].parse().unwrap());
    // Built from a copy of the committed tree (without the local run directories, which
    // differ from machine to machine) into a temporary directory.
    let (results, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    common::copy_tree(&root.join("results"), results.path(), &["runs"]);
    let site = fpt_ablate::site::site_with(results.path(), out.path(), false).unwrap();
    assert_eq!(
        (site.reports, site.runs),
        (n, m),
        "README says {n} reports and {m} run pages; the committed results make {} and {}",
        site.reports,
        site.runs
    );
}

/// The grid of Table 2 at the `cpu` scale that the README shows ("Measured: Table 2 at the
/// `cpu` scale") is the committed report's, row for row: a re-judged or re-run report that
/// changes a cell shows here until the README is updated.
#[test]
fn the_readmes_table2_grid_is_the_committed_reports() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let report = std::fs::read_to_string(root.join("results/table2/cpu/report.md")).unwrap();
    let grid = |text: &str, after: &str| -> Vec<String> {
        let start = text.find(after).unwrap_or_else(|| panic!("`{after}` not found"));
        text[start..]
            .lines()
            .skip_while(|l| !l.starts_with("| | Bit Memory"))
            .take_while(|l| l.starts_with('|'))
            .map(str::to_string)
            .collect()
    };
    let ours = grid(&readme, "### Measured: Table 2 at the `cpu` scale");
    let committed = grid(&report, "# ");
    assert!(ours.len() >= 4, "README's grid: {ours:?}");
    assert_eq!(
        ours, committed,
        "README's Table 2 grid differs from results/table2/cpu/report.md"
    );
}

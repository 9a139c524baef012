//! Counts the README states about the committed results, held to what the code computes
//! from them (the claims block has its own test in `paper_settings.rs`).

use std::path::Path;

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
    let out = tempfile::tempdir().unwrap();
    // Built into a temporary directory, the checkout's records left as they are.
    let site = fpt_ablate::site::site_with(&root.join("results"), out.path(), false).unwrap();
    assert_eq!(
        (site.reports, site.runs),
        (n, m),
        "README says {n} reports and {m} run pages; the committed results make {} and {}",
        site.reports,
        site.runs
    );
}

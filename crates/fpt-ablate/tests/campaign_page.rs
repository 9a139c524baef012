//! The campaign's page of the results site agrees with `--status`: every committed campaign
//! run is on it, in the state `fpt_ablate::campaign::status` gives it (done, or pending at
//! the same step), with a curve per task.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.path().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn the_campaign_page_says_what_status_says() {
    let t = tempfile::tempdir().unwrap();
    let results = t.path().join("results");
    copy_dir(&root().join("results/campaign"), &results.join("campaign"));
    copy_dir(
        &root().join("results/table2/converge"),
        &results.join("table2/converge"),
    );
    let out = t.path().join("site");
    fpt_ablate::site::site_with(&results, &out, false).unwrap();
    let html = std::fs::read_to_string(out.join("site/campaign.html")).unwrap();
    assert!(std::fs::read_to_string(out.join("index.html"))
        .unwrap()
        .contains("site/campaign.html"));
    let tables = root().join("data/tables");
    let scales = fpt_ablate::load_scales(&tables).unwrap();
    let table = fpt_ablate::at_scale(&fpt_ablate::load_table(&tables, "table2").unwrap(), &scales, "converge").unwrap();
    let cells = fpt_ablate::expand_unchecked(&table, &scales, "converge").unwrap();
    let rows: Vec<String> = table.rows.iter().map(|r| r.label.clone()).collect();
    let cols: Vec<String> = table.cols.iter().map(|c| c.label.clone()).collect();
    let order = fpt_ablate::CampaignOrder::of(&fpt_ablate::scale_of(&table, &scales, "converge").unwrap());
    let (mut seen, mut calls, mut callable) = (0, 0, 0);
    for s in fpt_ablate::campaign::status(&cells, &rows, &cols, &results, &order) {
        if s.state == "not started" {
            assert!(!html.contains(&s.key), "{} is not started but on the page", s.key);
            continue;
        }
        let row = html
            .split("<tr>")
            .find(|r| r.contains(&format!("<code>{}</code>", s.key)))
            .unwrap_or_else(|| panic!("{} ({}) is not on the page", s.key, s.state));
        let want = match s.state.as_str() {
            "pending" => format!("pending (step {})", s.step),
            other => other.to_string(),
        };
        assert!(row.contains(&want), "{}: --status says {want}: {row}", s.key);
        // A pending run's call as of its checkpoint, the same words on both.
        if let Some(call) = &s.call {
            assert!(
                row.contains(&format!("now {call}")),
                "{}: --status says now {call}: {row}",
                s.key
            );
            calls += 1;
        }
        let evals = std::fs::read_to_string(results.join("campaign").join(&s.key).join("metrics.jsonl"))
            .map_or(0, |m| m.lines().count());
        if s.state == "pending" && evals >= 3 {
            callable += 1;
        }
        seen += 1;
    }
    assert!(seen > 0);
    // Runs in progress with three evaluations or more have a call (the rule's least window).
    assert!(
        callable == 0 || calls > 0,
        "{callable} pending runs with 3+ evaluations, no call"
    );
    assert!(html.matches("<svg").count() >= 2, "a curve per task");
}

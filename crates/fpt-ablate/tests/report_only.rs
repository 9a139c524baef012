//! Rendering a report from records alone (`--report-only`).

use std::path::PathBuf;

mod common;
use common::write_mini;

/// Rendering from records alone (`--report-only`, what re-renders the committed reports)
/// shows a cell's recorded run even where this machine lacks its data, and a cell without
/// a run says why it cannot run here, naming its run's key as every other machine does.
#[test]
fn a_recorded_run_renders_where_its_data_is_not() {
    use fpt_ablate::reproduce::{reproduce, run_options, Request};
    let d = tempfile::tempdir().unwrap();
    write_mini(d.path());
    let no_exe = || -> std::io::Result<PathBuf> { Err(std::io::Error::other("no child processes in this test")) };
    let req = |out: &str, report_only: bool| {
        let mut opts = run_options(candle_core::Device::Cpu, Some(1), &no_exe).unwrap();
        opts.report_only = report_only;
        Request {
            tables: d.path().join("tables"),
            ids: vec!["table1".into()],
            scale: "mini".into(),
            out: d.path().join(out),
            opts,
            precision: fpt_spec::Precision::F32,
        }
    };
    let statuses = |out: &str| -> Vec<(String, Option<String>, Option<String>)> {
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.path().join(out).join("table1/mini/report.json")).unwrap())
                .unwrap();
        json["cells"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["status"].as_str().unwrap().to_string(),
                    c["why"].as_str().map(String::from),
                    c["run"].as_str().map(String::from),
                )
            })
            .collect()
    };
    reproduce(&req("results", false), &mut |_| {}).unwrap();
    let trained = statuses("results");
    assert_eq!(trained.iter().filter(|c| c.0 == "ran").count(), 4, "{trained:?}");
    // Records beside the reports, the run directories and the task's data gone.
    fpt_ablate::site::site_with(&d.path().join("results"), &d.path().join("site"), true).unwrap();
    std::fs::remove_dir_all(d.path().join("results/runs")).unwrap();
    std::fs::remove_file(d.path().join("series.jsonl")).unwrap();
    reproduce(&req("results", true), &mut |_| {}).unwrap();
    assert_eq!(statuses("results"), trained, "the recorded runs render as they did");
    // Without records: each run's cell is unavailable here, saying why, with its run's key.
    reproduce(&req("empty", true), &mut |_| {}).unwrap();
    let empty = statuses("empty");
    let unavailable: Vec<_> = empty.iter().filter(|c| c.0 == "unavailable" && c.2.is_some()).collect();
    assert_eq!(unavailable.len(), 4, "{empty:?}");
    for (c, t) in unavailable.iter().zip(trained.iter().filter(|c| c.2.is_some())) {
        assert!(
            c.1.as_deref().is_some_and(|w| w.starts_with("data not present")),
            "{c:?}"
        );
        assert_eq!(c.2, t.2, "the same run key as where it ran");
    }
}

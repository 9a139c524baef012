//! Every committed report obeys the rules it prints: a claim with a verdict (holds, fails,
//! inconclusive) rests only on pairs of cells that are converged, off their trivial
//! baseline, fit (a Bit backbone that learned its task) and not both at the task's ceiling;
//! a cell significantly below its baseline is said to be below it; an attention figure says
//! whether its run learned. Read from `results/<id>/<scale>/report.json` (and `report.md`)
//! as committed, against the table files that made them.

use fpt_ablate::claims::select;
use fpt_ablate::{at_scale, load_scales, load_table};
use std::path::{Path, PathBuf};

mod common;
use common::copy_tree;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every committed `report.json`: (table id, scale directory, path).
fn reports() -> Vec<(String, String, PathBuf)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root().join("results")).unwrap() {
        let dir = e.unwrap().path();
        let id = dir.file_name().unwrap().to_string_lossy().into_owned();
        if !(id.starts_with("table") || id.starts_with("fig")) || !dir.is_dir() {
            continue;
        }
        for s in std::fs::read_dir(&dir).unwrap() {
            let s = s.unwrap().path();
            let p = s.join("report.json");
            if p.is_file() {
                out.push((id.clone(), s.file_name().unwrap().to_string_lossy().into_owned(), p));
            }
        }
    }
    out.sort();
    out
}

/// The names a claim's detail gives the pairs it averaged: "over K of N pairs: A, B".
fn kept_pairs(detail: &str) -> Vec<String> {
    let Some(at) = detail.find(" pairs: ") else {
        return Vec::new();
    };
    let rest = &detail[at + " pairs: ".len()..];
    let end = rest.find([';', ')']).unwrap_or(rest.len());
    rest[..end]
        .split(", ")
        .map(|s| s.split(", per pair").next().unwrap().trim().to_string())
        .collect()
}

#[test]
fn every_decided_claim_rests_on_converged_learned_fit_cells() {
    let tables = root().join("data/tables");
    let mut decided = 0;
    let mut checked_reports = 0;
    for (id, scale_dir, path) in reports() {
        let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let Some(claims) = report["claims"].as_array() else {
            continue;
        };
        checked_reports += 1;
        let scale = scale_dir.trim_end_matches("-bf16");
        let scales = load_scales(&tables).unwrap();
        let table = at_scale(&load_table(&tables, &id).unwrap(), &scales, scale).unwrap();
        let Some(cells) = report["cells"].as_array() else {
            // A figure's statements: a decided one rests on a run that learned (or on no
            // run: Figure 6's weights).
            for c in claims {
                let verdict = c["ours"]["verdict"].as_str().unwrap();
                if ["holds", "fails", "inconclusive"].contains(&verdict) {
                    decided += 1;
                    assert_ne!(
                        report["learned"],
                        false,
                        "{}: `{}` decided on a run that did not learn",
                        path.display(),
                        c["text"]
                    );
                }
            }
            continue;
        };
        let cell = |r: usize, c: usize| {
            let (row, col) = (&table.rows[r].label, &table.cols[c].label);
            cells
                .iter()
                .find(|x| x["row"] == row.as_str() && x["col"] == col.as_str())
                .unwrap_or_else(|| panic!("{}: no cell {row} / {col}", path.display()))
        };
        for (claim, spec) in claims.iter().zip(&table.claims) {
            let verdict = claim["ours"]["verdict"].as_str().unwrap();
            if !["holds", "fails", "inconclusive"].contains(&verdict) {
                continue;
            }
            decided += 1;
            let detail = claim["ours"]["detail"].as_str().unwrap();
            let names = kept_pairs(detail);
            assert!(
                !names.is_empty(),
                "{}: `{verdict}` names no pair: {detail}",
                path.display()
            );
            let sa = select(&table, &spec.a);
            let slot = |s: &Option<fpt_spec::table::Select>| -> Vec<Option<(usize, usize)>> {
                match s {
                    Some(s) => select(&table, s).into_iter().map(Some).collect(),
                    None => vec![None; sa.len()],
                }
            };
            let (sb, sc, sd) = (slot(&spec.b), slot(&spec.c), slot(&spec.d));
            // A couple of cells is named by the part in which they agree; a gap's two
            // couples by both names (once where they agree).
            let couple = |(ra, ca): (usize, usize), pb: Option<(usize, usize)>| match pb {
                Some((_, cb)) if cb == ca => table.cols[ca].label.clone(),
                Some((rb, _)) if rb == ra => table.rows[ra].label.clone(),
                Some((rb, cb)) => format!(
                    "{} / {} vs {} / {}",
                    table.rows[ra].label, table.cols[ca].label, table.rows[rb].label, table.cols[cb].label
                ),
                None => format!("{} / {}", table.rows[ra].label, table.cols[ca].label),
            };
            let mut found = 0;
            for (i, &(ra, ca)) in sa.iter().enumerate() {
                let mut name = couple((ra, ca), sb[i]);
                if let (Some(c), d) = (sc[i], sd[i]) {
                    let second = couple(c, d);
                    if second != name {
                        name = format!("{name} vs {second}");
                    }
                }
                if !names.contains(&name) {
                    continue;
                }
                found += 1;
                let mut pair = vec![cell(ra, ca)];
                pair.extend([sb[i], sc[i], sd[i]].into_iter().flatten().map(|(r, c)| cell(r, c)));
                let what = format!("{}: claim `{}`, pair {name}", path.display(), spec.text);
                for (k, x) in pair.iter().enumerate() {
                    if !spec.about_failure {
                        assert!(x["at_baseline"].is_null(), "{what}: a cell at its baseline: {x}");
                    }
                    assert!(x["unfit"].is_null(), "{what}: an unfit cell: {x}");
                    if x["converged"] == false && x["lower_bound"] == true {
                        // Still rising at its cap: a lower bound, deciding only the way one
                        // can (its weight in the compared sum: a, b, c, d = +1, -1, -1, +1).
                        let weight = [1.0, -1.0, -1.0, 1.0][k];
                        let never = match spec.kind {
                            fpt_spec::table::ClaimKind::Comparable => "holds",
                            _ if weight > 0.0 => "fails",
                            _ => "holds",
                        };
                        assert_ne!(verdict, never, "{what}: `{never}` on a lower bound: {x}");
                        continue;
                    }
                    assert_eq!(x["converged"], true, "{what}: a cell not converged: {x}");
                }
                let at_ceiling = |x: &serde_json::Value| {
                    x["metric"] == "test-accuracy" && x["ours"].as_f64().is_some_and(|v| v >= 99.5)
                };
                assert!(
                    !(pair.len() == 2 && pair.iter().all(|x| at_ceiling(x))),
                    "{what}: a ceiling pair"
                );
            }
            assert_eq!(found, names.len(), "{}: pairs {names:?} not all found", path.display());
        }
        // Significantly below its baseline is said so, in the grid too.
        let md = std::fs::read_to_string(path.with_file_name("report.md")).unwrap();
        for x in cells {
            if let Some(why) = x["at_baseline"].as_str() {
                if why.contains("is below the baseline") {
                    let label = format!("| {} |", x["row"].as_str().unwrap());
                    let row = md.lines().find(|l| l.starts_with(&label)).unwrap();
                    assert!(row.contains("[below baseline]"), "{}: {row}", path.display());
                }
            }
        }
    }
    assert!(
        checked_reports >= 20,
        "only {checked_reports} reports with claims found"
    );
    // (How many are decided is what the campaign changes; the rules hold for each.)
    let _ = decided;
}

#[test]
fn an_attention_figure_says_whether_its_run_learned() {
    for (id, _, path) in reports() {
        let md = std::fs::read_to_string(path.with_file_name("report.md")).unwrap();
        if !md.contains("first layer") && !md.contains("First-layer") {
            continue;
        }
        if md.contains("Run: `") {
            assert!(
                md.contains("trivial baseline"),
                "{id}: the figure does not say whether its run learned: {}",
                path.display()
            );
        }
    }
}

/// Every committed report is what today's code renders from the committed records and
/// campaign copies (`fpt run-table ... --report-only` on a copy of `results/` without the
/// local run directories): a rule or a word changed in the code shows here until the
/// reports are re-rendered (`fpt run-table all --scale cpu --report-only`, and the
/// `cpu-full` and `converge` scales' tables likewise).
#[test]
fn every_committed_report_is_what_todays_code_renders() {
    let t = tempfile::tempdir().unwrap();
    copy_tree(&root().join("results"), t.path(), &["runs"]);
    let mut by_scale: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (id, scale, _) in reports() {
        // A precision comparison (`cpu-bf16`) keeps an earlier protocol's numbers on purpose.
        if ["cpu", "cpu-full", "converge"].contains(&scale.as_str()) {
            by_scale.entry(scale).or_default().push(id);
        }
    }
    let mut differ = Vec::new();
    for (scale, ids) in &by_scale {
        let req = fpt_ablate::reproduce::Request {
            tables: root().join("data/tables"),
            ids: ids.clone(),
            scale: scale.clone(),
            out: t.path().to_path_buf(),
            opts: fpt_ablate::RunOptions {
                report_only: true,
                jobs: 1,
                ..Default::default()
            },
            precision: fpt_spec::Precision::F32,
        };
        fpt_ablate::reproduce::reproduce(&req, &mut |_| {}).unwrap();
        for id in ids {
            let rel = Path::new(id).join(scale).join("report.json");
            // Where, when and by which build a report was written is not what it says.
            let read = |p: &Path| -> serde_json::Value {
                let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
                if let Some(o) = v.as_object_mut() {
                    o.remove("machine");
                    o.remove("provenance");
                    // Which builds made the runs, and how long each took: a run shared with
                    // another table's scale (the main job reruns Table 2's `cpu` cells) keeps
                    // its numbers but not its timing.
                    o.remove("runs_from");
                }
                for c in v["cells"].as_array_mut().into_iter().flatten() {
                    if let Some(o) = c.as_object_mut() {
                        o.remove("seconds");
                    }
                }
                // Nor is which data and weights the rendering machine holds: a cell without a
                // run reads the same whether it could run there or not.
                for c in v["cells"].as_array_mut().into_iter().flatten() {
                    let local = c["status"] == "unavailable"
                        && c["why"].as_str().is_some_and(|w| {
                            w.starts_with("data not present") || w.starts_with("backbone not available here")
                        });
                    if local {
                        c["status"] = "pending".into();
                        c["why"] = "not run yet (or run by another shard)".into();
                    }
                    // Nor is the precision a row in bf16 gets where no run exists yet: bf16 on a
                    // CPU with AVX512_BF16, f32 elsewhere (`expand.rs`), and with it the run's
                    // id. A cell that ran reads its own run's record on any machine.
                    if c["status"] == "pending" {
                        if let Some(o) = c.as_object_mut() {
                            o.remove("run");
                        }
                        for n in c["notes"].as_array_mut().into_iter().flatten() {
                            if let Some(s) = n.as_str() {
                                if let Some((kept, _)) = s.split_once("; this CPU has no AVX512_BF16") {
                                    *n = kept.into();
                                }
                            }
                        }
                        if let Some(d) = c["differs"].as_array_mut() {
                            d.retain(|x| x.as_str().is_none_or(|s| !s.starts_with("frozen weights in bf16")));
                        }
                    }
                }
                v
            };
            let (committed, rendered) = (read(&root().join("results").join(&rel)), read(&t.path().join(&rel)));
            if committed != rendered {
                differ.push(rel.display().to_string());
            }
        }
    }
    assert!(
        differ.is_empty(),
        "committed reports differ from what today's code renders from the committed records: {differ:?}"
    );
}

//! The harness end to end on a miniature table (a tiny GPT-2 fixture and custom data the
//! test writes), and every real table spec of `data/tables` loads and expands at every scale.

use fpt_ablate::{expand, load_scales, load_table, run, Plan, Report, RunOptions};
mod common;
use common::write_mini;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn every_table_and_figure_of_the_paper_has_a_spec_that_expands_at_every_scale() {
    let dir = root().join("data/tables");
    let ids = fpt_ablate::list(&dir).unwrap();
    let mut want: Vec<String> = (1..=22).map(|i| format!("table{i}")).collect();
    want.extend(["fig1", "fig3", "fig4", "fig5", "fig6"].map(String::from));
    assert_eq!(ids, want);
    let scales = load_scales(&dir).unwrap();
    assert_eq!(
        scales.keys().cloned().collect::<Vec<_>>(),
        ["converge", "cpu", "cpu-full", "paper", "smoke"]
    );
    assert_eq!(scales["cpu-full"].base.as_deref(), Some("cpu"), "cpu-full extends cpu");
    assert_eq!(scales["converge"].base.as_deref(), Some("cpu"), "converge extends cpu");
    assert!(
        scales["converge"].apply_converge_floor,
        "converge writes the Table 6 floors into its specs"
    );
    for id in &ids {
        let t = load_table(&dir, id).unwrap();
        if t.rows.is_empty() {
            continue;
        }
        for scale in ["smoke", "cpu", "paper"] {
            let cells = expand(&t, &scales, scale).unwrap();
            let rows = fpt_ablate::at_scale(&t, &scales, scale).unwrap().rows.len();
            assert_eq!(cells.len(), rows * t.cols.len(), "{id}");
            for c in &cells {
                if let Plan::Run { spec, .. } = &c.plan {
                    spec.validate().unwrap();
                }
            }
        }
    }
    // Table 2's paper numbers, spot-checked against the paper's text.
    let t = load_table(&dir, "table2").unwrap();
    assert_eq!(t.paper[1][3], "91.7%");
    assert_eq!(t.paper[3][6], "7.5%");
}

#[test]
fn a_table_runs_reports_skips_finished_cells_and_shards() {
    let d = tempfile::tempdir().unwrap();
    write_mini(d.path());
    let tables = d.path().join("tables");
    let t = load_table(&tables, "table1").unwrap();
    let scales = load_scales(&tables).unwrap();
    let cells = expand(&t, &scales, "mini").unwrap();
    assert_eq!(cells.len(), 6);
    assert!(matches!(&cells[2].plan, Plan::Unavailable(w) if w.contains("not at this scale")));
    assert!(matches!(&cells[5].plan, Plan::Count(_)));
    assert!(cells[0].notes[0].contains("tiny test fixture"));
    let out = d.path().join("results");

    // Two shards cover the four runs between them, without overlap.
    let mut lines = Vec::new();
    let n0 = run(
        &cells,
        &out,
        &RunOptions {
            shard: Some((0, 2)),
            ..Default::default()
        },
        &mut |l| lines.push(l.to_string()),
    )
    .unwrap()
    .count;
    let n1 = run(
        &cells,
        &out,
        &RunOptions {
            shard: Some((1, 2)),
            jobs: 2,
            ..Default::default()
        },
        &mut |l| lines.push(l.to_string()),
    )
    .unwrap()
    .count;
    assert_eq!((n0, n1), (2, 2), "{lines:?}");
    // Finished cells are skipped; --force reruns them.
    assert_eq!(run(&cells, &out, &RunOptions::default(), &mut |_| {}).unwrap().count, 0);
    assert_eq!(
        run(
            &cells,
            &out,
            &RunOptions {
                force: true,
                ..Default::default()
            },
            &mut |_| {}
        )
        .unwrap()
        .count,
        4
    );

    let r = Report::new(&t, "mini", &cells, &out);
    let ran: Vec<_> = r.cells.iter().filter(|c| c.status == "ran").collect();
    assert_eq!(ran.len(), 4);
    // The report says where its runs ran, from the runs' own results: build, kernel path,
    // CPU and device.
    let [(origin, n)] = r.runs_from.as_slice() else {
        panic!("{:?}", r.runs_from)
    };
    assert_eq!(*n, 4);
    let path = fpt_nn::kernels::KernelPath::active();
    assert!(
        origin.contains("device cpu")
            && origin.contains(&format!("{path} kernels"))
            && origin.contains("self-check passed"),
        "{origin}"
    );
    for c in &ran {
        let ours = c.ours.unwrap();
        assert!((0.0..=100.0).contains(&ours));
        assert_eq!(c.diff.unwrap(), ours - c.paper.unwrap());
    }
    assert_eq!(r.cells[2].status, "unavailable");
    assert_eq!(
        (r.cells[5].status.as_str(), r.cells[5].ours),
        ("counted", Some(354_823_168.0))
    );
    let dir = r.write(&out).unwrap();
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        md.contains("| FPT |") && md.contains("tiny test fixture") && md.contains("not at this scale"),
        "{md}"
    );
    // Learning curves of the four runs, as SVG and PNG.
    assert!(md.contains("![learning curves](curves.svg)"), "{md}");
    let curves = std::fs::read_to_string(dir.join("curves.svg")).unwrap();
    assert_eq!(curves.matches("<polyline").count(), 4);
    assert!(
        curves.contains("FPT / fpt") && curves.contains("Random / all"),
        "{curves}"
    );
    // PNG beside it where the build has the `png` feature; none (not a stale one) without.
    match cfg!(feature = "png") {
        true => assert_eq!(&std::fs::read(dir.join("curves.png")).unwrap()[..4], b"\x89PNG"),
        false => assert!(!dir.join("curves.png").exists()),
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(json["cells"].as_array().unwrap().len(), 6);
    assert_eq!(
        std::fs::read_to_string(dir.join("report.csv")).unwrap().lines().count(),
        7
    );
    // Every run says whether it reached its plateau; two evaluations (6 steps, evaluations
    // at 3 and 6) are too few for the trend rule: not converged, and the cell says why.
    for c in &ran {
        let k = c.curve.as_deref().unwrap();
        assert!(
            k.contains("evaluated 2 time(s); the trend rule needs three evaluations"),
            "{k}"
        );
        assert_eq!(c.converged, Some(false), "{k}");
    }

    // A diverged run: the report marks the cell with the paper's dagger and says where.
    let key = match &cells[0].plan {
        Plan::Run { key, .. } => key.clone(),
        p => panic!("{p:?}"),
    };
    let res_path = fpt_ablate::run_dir(&out, &key).join("result.json");
    let mut res: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&res_path).unwrap()).unwrap();
    res["diverged"] = true.into();
    res["diverged_at_step"] = 5.into();
    res["diverged_reason"] = "loss 1e9 above 100 x the first step's".into();
    std::fs::write(&res_path, serde_json::to_string(&res).unwrap()).unwrap();
    let r = Report::new(&t, "mini", &cells, &out);
    let md = r.markdown(&out);
    let fpt_row = md.lines().find(|l| l.starts_with("| FPT | ")).unwrap();
    // (These few steps leave the cell at its trivial baseline, which the grid marks too; a
    // diverged run is not converged.)
    assert!(
        fpt_row.contains("50.0% [†] [at baseline] [not converged] (50%)"),
        "{fpt_row}"
    );
    assert!(
        md.contains("diverged at step 5 (loss 1e9 above 100 x the first step's)"),
        "{md}"
    );
}

#[test]
fn paper_numbers_parse_as_printed() {
    use fpt_ablate::report::parse_paper;
    assert_eq!(parse_paper("38.4%"), Some(38.4));
    assert_eq!(parse_paper("89.0% [†]"), Some(89.0));
    assert_eq!(parse_paper("1×10^4"), Some(10000.0));
    assert_eq!(parse_paper("106K"), Some(106_000.0));
    assert_eq!(parse_paper("117M"), Some(117_000_000.0));
    assert_eq!(parse_paper("-"), None);
    assert_eq!(parse_paper("500 – 2000×"), Some(500.0));
}

#[test]
fn a_malformed_table_is_an_error_naming_the_file() {
    let d = tempfile::tempdir().unwrap();
    write_mini(d.path());
    let p = d.path().join("tables/table1.toml");
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace(r#"["70%", "80%", "124M"]"#, r#"["70%"]"#);
    std::fs::write(&p, text).unwrap();
    let e = load_table(&d.path().join("tables"), "table1").unwrap_err().to_string();
    assert!(
        e.contains("table1.toml") && e.contains("paper row 2") && e.contains("1 numbers for 3 columns"),
        "{e}"
    );
    std::fs::write(&p, "id = \"table1\"\ntitle = 3\n").unwrap();
    let e = load_table(&d.path().join("tables"), "table1").unwrap_err().to_string();
    assert!(e.contains("table1.toml") && e.contains("title"), "{e}");
    // A misspelt cell setting is an error naming it, not a cell that quietly ignores it.
    write_mini(d.path());
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace("init = \"random\"", "intit = \"random\"");
    std::fs::write(&p, text).unwrap();
    let e = load_table(&d.path().join("tables"), "table1").unwrap_err().to_string();
    assert!(e.contains("table1.toml") && e.contains("intit"), "{e}");
    // An alternate row that copies no row, or takes a row's label, is named.
    for (like, label, want) in [
        ("Pretrained", "FPT (other)", "`like` names no row (`Pretrained`)"),
        (
            "FPT",
            "Random",
            "alternate row `Random`: a row of the table has its label",
        ),
    ] {
        write_mini(d.path());
        let mut text = std::fs::read_to_string(&p).unwrap();
        text.push_str(&format!(
            "[[alternates]]\nlabel = \"{label}\"\nlike = \"{like}\"\nstands_in_for = \"gpt2\"\nsource = \"x\"\nnote = \"n\"\n"
        ));
        std::fs::write(&p, text).unwrap();
        let e = load_table(&d.path().join("tables"), "table1").unwrap_err().to_string();
        assert!(e.contains("table1.toml") && e.contains(want), "{e}");
    }
}

/// The run spec of cell (row, col) of a real table at a scale.
fn cell_spec(id: &str, scale: &str, row: usize, col: usize) -> Plan {
    let dir = root().join("data/tables");
    let t = load_table(&dir, id).unwrap();
    let cells = expand(&t, &load_scales(&dir).unwrap(), scale).unwrap();
    cells.into_iter().find(|c| c.row == row && c.col == col).unwrap().plan
}

#[test]
fn lstm_bit_pretrained_last_attention_and_output_only_cells_become_runs() {
    use fpt_spec::Init;
    // Table 3, row LSTM* (12 layers, residual, positions), column Bit Memory (col 0).
    let Plan::Run { spec, .. } = cell_spec("table3", "smoke", 2, 0) else {
        panic!("LSTM* runs")
    };
    assert_eq!(spec.backbone.source, "lstm");
    assert_eq!(spec.backbone.init, Init::Random);
    assert_eq!(spec.backbone.shape.layers, Some(12));
    assert_eq!(spec.backbone.shape.lstm_residual, Some(true));
    assert_eq!(spec.backbone.shape.lstm_positions, Some(true));
    assert_eq!(spec.backbone.shape.hidden, Some(32), "the smoke scale's substitution");
    assert_eq!(spec.train.lr, 3e-4, "the paper's LSTM learning rate");
    // Table 2, row Bit: the stand-in backbone pretrained on Bit Memory until it solves it, at
    // most the scale's budget: at cpu-full; the main job's cpu scale has no budget for it and
    // says so.
    let Plan::Run { spec, .. } = cell_spec("table2", "cpu-full", 2, 0) else {
        panic!("Bit runs at cpu-full")
    };
    assert_eq!(spec.backbone.init, Init::BitPretrained);
    let bp = spec.backbone.bit_pretrain.unwrap();
    assert_eq!((bp.steps, bp.until_accuracy), (3000, Some(0.99)));
    assert_eq!(
        spec.train.train_eval,
        fpt_spec::TrainEval::Never,
        "cpu-full inherits the cpu scale's settings"
    );
    assert!(spec.train.stop_on_plateau, "and table2's cpu protocol");
    let Plan::Unavailable(why) = cell_spec("table2", "cpu", 2, 0) else {
        panic!("no Bit row at the cpu scale")
    };
    assert!(why.contains("cpu-full"), "{why}");
    // Table 14, the last-attention column trains ff and the last block's attention (it
    // runs where CIFAR-10 is present; otherwise it waits for the data, not for code).
    let t14 = load_table(&root().join("data/tables"), "table14").unwrap();
    let col = t14
        .cols
        .iter()
        .position(|r| r.set.last_attention == Some(true))
        .unwrap();
    match cell_spec("table14", "paper", 0, col) {
        Plan::Run { spec, .. } => assert!(spec.train_groups.last_attention),
        Plan::Unavailable(why) => assert!(why.contains("data not present"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Table 10's columns (speedup, output-only accuracy) on a generated task, so that no
    // dataset needs to be present: both cells share one output-only run on cached features.
    let d = tempfile::tempdir().unwrap();
    std::fs::copy(root().join("data/tables/scales.toml"), d.path().join("scales.toml")).unwrap();
    let t10 = std::fs::read_to_string(root().join("data/tables/table10.toml")).unwrap();
    let t10 = t10
        .replace("task = \"listops\"", "task = \"bit-xor\"")
        .replace("task = \"cifar10-lra\"", "task = \"bit-memory\"")
        // Random weights: no checkpoint needs to be cached for the plan either.
        .replace("init = \"pretrained\"", "init = \"random\"");
    std::fs::write(d.path().join("table10.toml"), t10).unwrap();
    let t = load_table(d.path(), "table10").unwrap();
    let cells = expand(&t, &load_scales(d.path()).unwrap(), "smoke").unwrap();
    let at = |r: usize, c: usize| cells.iter().find(|x| x.row == r && x.col == c).unwrap().plan.clone();
    match (at(0, 0), at(0, 1)) {
        (Plan::Run { spec, key }, Plan::Run { key: key2, .. }) => {
            assert_eq!(key, key2);
            assert_eq!(spec.train.cached_epochs, Some(2));
            assert_eq!(spec.train_groups.to_string(), "out");
        }
        (a, b) => panic!("{a:?} {b:?}"),
    }
}

#[test]
fn an_attention_map_figure_trains_its_run_and_draws_svg_and_png() {
    let d = tempfile::tempdir().unwrap();
    write_mini(d.path());
    let tables = d.path().join("tables");
    std::fs::write(
        tables.join("fig3.toml"),
        r#"
id = "fig3"
title = "attention"
caption = "first-layer attention on Bit XOR"
kind = "attention-map"
[defaults]
task = "bit-xor"
backbone = "gpt2"
init = "pretrained"
train = "fpt"
"#,
    )
    .unwrap();
    let fig = load_table(&tables, "fig3").unwrap();
    let scales = load_scales(&tables).unwrap();
    let out = d.path().join("results");
    // Before its run exists the figure says what is missing.
    let dir = fpt_ablate::figure::render(
        &fig,
        &tables,
        &scales,
        "mini",
        &out,
        fpt_ablate::report::Sources::RunDirs,
    )
    .unwrap();
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("Not drawn") && md.contains("no checkpoint"), "{md}");
    let cells = expand(&fig, &scales, "mini").unwrap();
    assert_eq!(cells.len(), 1);
    assert_eq!(run(&cells, &out, &RunOptions::default(), &mut |_| {}).unwrap().count, 1);
    let dir = fpt_ablate::figure::render(
        &fig,
        &tables,
        &scales,
        "mini",
        &out,
        fpt_ablate::report::Sources::RunDirs,
    )
    .unwrap();
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        md.contains("| read-out position |") && md.contains("figure.svg"),
        "{md}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let t = json["tokens"].as_u64().unwrap() as usize;
    assert_eq!(t, 10, "Bit XOR of 5 bits: 10 tokens");
    let mean = json["mean"].as_array().unwrap();
    for row in mean {
        let sum: f64 = row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).sum();
        assert!((sum - 1.0).abs() < 1e-4, "attention rows are distributions: {sum}");
    }
    // GPT-2 is causal: the first query attends only to itself.
    assert!((mean[0][0].as_f64().unwrap() - 1.0).abs() < 1e-5);
    assert_eq!(json["xor_mass"].as_array().unwrap().len(), 5);
    let svg = std::fs::read_to_string(dir.join("figure.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.matches("<rect").count() > 100);
    if cfg!(feature = "png") {
        let png = std::fs::read(dir.join("figure.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }
}

/// Cells the paper did not run (`-` in its table: Table 12) are not run here either, and the
/// report shows `-` for them; Table 12's row 24 (GPT-2 medium) is noted.
#[test]
fn cells_the_paper_did_not_run_are_not_run() {
    let tables = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables");
    let t = load_table(&tables, "table12").unwrap();
    let scales = load_scales(&tables).unwrap();
    let cells = expand(&t, &scales, "smoke").unwrap();
    let dashes: Vec<(usize, usize)> = cells
        .iter()
        .filter(|c| matches!(c.plan, Plan::NotInPaper))
        .map(|c| (c.row, c.col))
        .collect();
    assert_eq!(dashes, vec![(0, 1), (1, 1), (2, 1), (4, 0)]);
    assert!(fpt_ablate::runs_of(&cells)
        .iter()
        .all(|(_, s)| s.backbone.depth != Some(24) || s.backbone.init != fpt_spec::Init::Pretrained));
    let d = tempfile::tempdir().unwrap();
    let md = fpt_ablate::Report::new(&t, "smoke", &cells, d.path()).markdown(d.path());
    let row1 = md.lines().find(|l| l.starts_with("| 1 | ")).unwrap();
    assert!(row1.ends_with("(12%) | - (-) |"), "{row1}");
    assert!(md.contains("GPT-2 medium"), "{md}");
}

/// Table 8's trained counts are computed as the paper counted them (LayerNorm, the 64
/// position rows CIFAR-10 uses, a 16-wide input layer, the output layer) and each cell shows
/// the sum; 106K / 190K / 300K in the paper.
#[test]
fn table8_counts_trained_parameters_as_the_paper_did() {
    let tables = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables");
    let t = load_table(&tables, "table8").unwrap();
    let scales = load_scales(&tables).unwrap();
    let cells = expand(&t, &scales, "smoke").unwrap();
    let d = tempfile::tempdir().unwrap();
    let r = Report::new(&t, "smoke", &cells, d.path());
    let trained: Vec<(f64, String)> = r
        .cells
        .iter()
        .filter(|c| c.col == "Trained Params")
        .map(|c| (c.ours.unwrap(), c.why.clone().unwrap()))
        .collect();
    // GPT-2 base: 12 x 2 x 2 x 768 + 2 x 768 LayerNorm, 64 x 768 positions, 16 x 768 + 768
    // input, 768 x 10 + 10 output.
    let base = (24 * 2 * 768 + 2 * 768) + 64 * 768 + (16 * 768 + 768) + (768 * 10 + 10);
    assert_eq!(trained[0].0, base as f64);
    assert_eq!(trained[1].0, 193_546.0);
    assert_eq!(trained[2].0, 303_370.0);
    assert!(
        trained[0].1.contains("64 of 1024 rows") && trained[0].1.contains("16 wide"),
        "{}",
        trained[0].1
    );
}

#[test]
fn a_cell_with_seeds_trains_each_seed_and_reports_their_mean_and_spread() {
    let d = tempfile::tempdir().unwrap();
    write_mini(d.path());
    let tables = d.path().join("tables");
    let mut toml = std::fs::read_to_string(tables.join("table1.toml")).unwrap();
    toml.push_str("\n[scales.mini.all]\nseeds = 3\n");
    std::fs::write(tables.join("table1.toml"), toml).unwrap();
    let t = load_table(&tables, "table1").unwrap();
    let cells = expand(&t, &load_scales(&tables).unwrap(), "mini").unwrap();
    let Plan::Run { spec, key } = &cells[0].plan else {
        panic!("{:?}", cells[0].plan)
    };
    // The next two seeds, each its own run; counted and unavailable cells get none.
    let seeds: Vec<u64> = cells[0].replicas.iter().map(|(_, s)| s.train.seed).collect();
    assert_eq!(seeds, vec![spec.train.seed + 1, spec.train.seed + 2]);
    for (k, s) in &cells[0].replicas {
        assert_eq!((k.as_str(), s.task.clone()), (s.key().as_str(), spec.task.clone()));
        assert_ne!(k, key);
    }
    assert!(cells[2].replicas.is_empty() && cells[5].replicas.is_empty());
    assert!(
        cells[0].notes.iter().any(|n| n.starts_with("3 seeds per cell")),
        "{:?}",
        cells[0].notes
    );
    assert_eq!(fpt_ablate::runs_of(&cells).len(), 12);

    let out = d.path().join("results");
    let trained = run(&cells, &out, &RunOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(trained.count, 12);
    // Give the three runs of the first cell known numbers: 50%, 60%, 70%.
    let keys: Vec<String> = std::iter::once(key.clone())
        .chain(cells[0].replicas.iter().map(|(k, _)| k.clone()))
        .collect();
    let set = |k: &str, acc: f64| {
        let p = fpt_ablate::run_dir(&out, k).join("result.json");
        let mut res: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        res["test_accuracy"] = acc.into();
        std::fs::write(&p, serde_json::to_string(&res).unwrap()).unwrap();
    };
    for (k, acc) in keys.iter().zip([0.5, 0.6, 0.7]) {
        set(k, acc);
    }
    let r = Report::new(&t, "mini", &cells, &out);
    let c = &r.cells[0];
    let s = c.seeds.as_ref().unwrap();
    assert_eq!(s.values.len(), 3);
    assert!(
        (c.ours.unwrap() - 60.0).abs() < 1e-9 && (s.sd - 10.0).abs() < 1e-9,
        "{c:?}"
    );
    assert_eq!(c.diff, Some(60.0 - 50.0));
    let md = r.markdown(&out);
    let row = md.lines().find(|l| l.starts_with("| FPT | ")).unwrap();
    assert!(row.contains("| 60.0% [+-10.0, 3 seeds] "), "{row}");
    assert!(md.contains(&format!("runs/{}", keys[2])), "{md}");
    assert!(
        r.csv().lines().nth(1).unwrap().contains(",\"50; 60; 70\","),
        "{}",
        r.csv()
    );

    // A seed still to run: the mean of those that finished, and the report says so.
    std::fs::remove_file(fpt_ablate::run_dir(&out, &keys[1]).join("result.json")).unwrap();
    let r = Report::new(&t, "mini", &cells, &out);
    assert_eq!(r.cells[0].ours, Some(60.0));
    assert!(r.markdown(&out).contains("[+-14.1, 2 of 3 seeds]"));
}

#[test]
fn reproduce_is_one_library_call_and_refuses_unknown_tables_and_scales() {
    use fpt_ablate::reproduce::{reproduce, run_options, Done, Progress, Request};
    let d = tempfile::tempdir().unwrap();
    write_mini(d.path());
    let no_exe = || -> std::io::Result<PathBuf> { Err(std::io::Error::other("no child processes in this test")) };
    let req = |ids: &[&str], scale: &str| Request {
        tables: d.path().join("tables"),
        ids: ids.iter().map(|s| s.to_string()).collect(),
        scale: scale.into(),
        out: d.path().join("results"),
        opts: run_options(candle_core::Device::Cpu, Some(1), &no_exe).unwrap(),
        precision: fpt_spec::Precision::F32,
    };
    let mut lines = Vec::new();
    let mut written = Vec::new();
    let done = reproduce(&req(&["all"], "mini"), &mut |p| match p {
        Progress::Line { id, line } => lines.push(format!("{id}: {line}")),
        Progress::Done(d) => written.push(format!("{d:?}")),
    })
    .unwrap();
    let [Done::Table { id, dir, trained }] = done.as_slice() else {
        panic!("{done:?}")
    };
    assert_eq!((id.as_str(), trained.count), ("table1", 4));
    assert!(dir.join("report.md").is_file() && dir.ends_with("table1/mini"));
    assert_eq!(written.len(), 1);
    assert!(lines.iter().any(|l| l.starts_with("table1: [4/4] run ")), "{lines:?}");
    // `rows`: only the FPT row's two runs train (in a fresh results directory); the report
    // still has every cell, Random's pending; an unknown row is an error naming the rows.
    let mut only = req(&["table1"], "mini");
    only.out = d.path().join("rows");
    only.opts.rows = vec!["FPT".into()];
    let done = reproduce(&only, &mut |_| {}).unwrap();
    let [Done::Table { dir, trained, .. }] = done.as_slice() else {
        panic!("{done:?}")
    };
    assert_eq!(trained.count, 2);
    let json = std::fs::read_to_string(dir.join("report.json")).unwrap();
    assert_eq!(json.matches("\"status\": \"pending\"").count(), 2, "{json}");
    only.opts.rows = vec!["Nope".into()];
    let e = reproduce(&only, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("no row") && e.contains("FPT, Random"), "{e}");
    // In bf16: the two FPT-group runs become their bf16 twins (trained anew, reported under
    // mini-bf16 beside their f32 runs); the full fine-tunes have no frozen weight and keep
    // their f32 runs.
    let bf16 = Request {
        precision: fpt_spec::Precision::Bf16,
        ..req(&["table1"], "mini")
    };
    let done = reproduce(&bf16, &mut |_| {}).unwrap();
    let [Done::Table { dir, trained, .. }] = done.as_slice() else {
        panic!("{done:?}")
    };
    assert!(dir.ends_with("table1/mini-bf16"), "{dir:?}");
    assert_eq!(trained.count, 2);
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(
        report.contains("bf16: frozen weight matrices stored in bf16"),
        "{report}"
    );
    assert!(
        report.contains("f32: every weight matrix of this run trains"),
        "{report}"
    );
    let cmp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("precision.json")).unwrap()).unwrap();
    let rows = cmp.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{cmp}");
    for r in rows {
        assert_ne!(r["bf16_run"], r["f32_run"]);
        assert!(r["bf16"].is_number() && r["f32"].is_number(), "{r}");
        let v = r["verdict"].as_str().unwrap();
        assert!(v == "within" || v.starts_with("differs"), "{r}");
        assert!(r["difference"].is_array(), "{r}");
    }
    assert!(std::fs::read_to_string(dir.join("precision.md"))
        .unwrap()
        .contains("| FPT / fpt |"));
    for (ids, scale, want) in [
        (&["table9"][..], "mini", "no table `table9`"),
        (&["table1"][..], "huge", "unknown scale `huge` (known: mini)"),
    ] {
        let e = reproduce(&req(ids, scale), &mut |_| {}).unwrap_err();
        assert!(
            matches!(&e, fpt_ablate::AblateError::Request(m) if m.contains(want)),
            "{e}"
        );
    }
    assert!(run_options(candle_core::Device::Cpu, Some(0), &no_exe).is_err());
    // More than one job on a CPU needs the binary that trains a run in a child process.
    let e = run_options(candle_core::Device::Cpu, Some(2), &no_exe).unwrap_err();
    assert!(e.to_string().contains("child process"), "{e}");
}

#[test]
fn the_claims_summary_reads_the_written_reports() {
    use fpt_ablate::reproduce::claims_summary;
    let d = tempfile::tempdir().unwrap();
    write_mini(d.path());
    let tables = d.path().join("tables");
    let mut toml = std::fs::read_to_string(tables.join("table1.toml")).unwrap();
    toml.push_str("\n[[claims]]\ntext = \"FPT beats Random | fpt\"\na = { row = \"FPT\", col = \"fpt\" }\nb = { row = \"Random\", col = \"fpt\" }\n");
    std::fs::write(tables.join("table1.toml"), toml).unwrap();
    let out = d.path().join("results");
    let ids = vec!["table1".to_string()];
    // Before any report: the claim is listed with the command that makes it.
    let s = claims_summary(&tables, &ids, "mini", &out).unwrap();
    assert!(
        s.contains(
            "| table1 | FPT beats Random \\| fpt | no report at this scale | `fpt run-table table1 --scale mini` |"
        ),
        "{s}"
    );
    let t = load_table(&tables, "table1").unwrap();
    let cells = expand(&t, &load_scales(&tables).unwrap(), "mini").unwrap();
    run(&cells, &out, &RunOptions::default(), &mut |_| {}).unwrap();
    let r = Report::new(&t, "mini", &cells, &out);
    r.write(&out).unwrap();
    let s = claims_summary(&tables, &ids, "mini", &out).unwrap();
    let c = &r.claims[0];
    assert!(
        s.contains(&format!(
            "| **{}** | {} | {} |",
            c.ours.verdict, c.ours.detail, c.paper.verdict
        )),
        "{s}"
    );
    // A report that is not one is an error naming the file.
    std::fs::write(out.join("table1/mini/report.json"), "{").unwrap();
    let e = claims_summary(&tables, &ids, "mini", &out).unwrap_err().to_string();
    assert!(e.contains("report.json") && e.contains("not a report"), "{e}");
}

/// A run another live process holds (its `.lock`: a second `run-table` on the same
/// results, or a table sharing the run) is left alone: not removed, not resumed, not
/// trained twice; the run counts as failed with the holder named, and trains once free.
#[test]
fn a_run_another_process_is_training_is_left_alone() {
    let d = tempfile::tempdir().unwrap();
    write_mini(d.path());
    let tables = d.path().join("tables");
    let t = load_table(&tables, "table1").unwrap();
    let cells: Vec<_> = expand(&t, &load_scales(&tables).unwrap(), "mini")
        .unwrap()
        .into_iter()
        .take(1)
        .collect();
    let Plan::Run { key, .. } = &cells[0].plan else {
        panic!("{:?}", cells[0].plan)
    };
    let out = d.path().join("results");
    let dir = fpt_ablate::run_dir(&out, key);
    std::fs::create_dir_all(&dir).unwrap();
    let mut holder = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    std::fs::write(dir.join(".lock"), holder.id().to_string()).unwrap();
    std::fs::write(dir.join("metrics.jsonl"), "in progress\n").unwrap();
    let mut lines = Vec::new();
    let done = run(&cells, &out, &RunOptions::default(), &mut |l| lines.push(l.to_string())).unwrap();
    assert_eq!(done.count, 0, "{lines:?}");
    let said = lines.join("\n");
    assert!(said.contains(&format!("process {}", holder.id())), "{said}");
    assert_eq!(
        std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap(),
        "in progress\n"
    );
    assert!(!dir.join("result.json").exists());
    // Once the holder is gone, its lock is stale and the run trains.
    holder.kill().unwrap();
    holder.wait().unwrap();
    let done = run(&cells, &out, &RunOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(done.count, 1);
    assert!(dir.join("result.json").is_file());
    // A worker handed a run that finished meanwhile (another process ended it after this
    // queue was made) keeps its result: nothing trains, nothing is rewritten.
    let (result, metrics) = (
        std::fs::read(dir.join("result.json")).unwrap(),
        std::fs::read(dir.join("metrics.jsonl")).unwrap(),
    );
    let Plan::Run { spec, .. } = &cells[0].plan else {
        unreachable!()
    };
    let spec_json = serde_json::to_string(spec.as_ref()).unwrap();
    let mut said = Vec::new();
    fpt_ablate::worker::serve(&dir, false, &mut spec_json.as_bytes(), &mut said).unwrap();
    assert!(said.is_empty(), "{}", String::from_utf8_lossy(&said));
    assert_eq!(std::fs::read(dir.join("result.json")).unwrap(), result);
    assert_eq!(std::fs::read(dir.join("metrics.jsonl")).unwrap(), metrics);
}

//! The `paper` scale's settings (what `cargo xtask reproduce tableN --scale paper --dry-run`
//! lists) against the hyperparameters the paper states (App. B-D, Table 6) for Tables 1, 2,
//! 3, 13 and 17: backbones and their sizes, inits, trained groups, learning rates, Bit
//! pretraining, depth and the Longformer revision.

use fpt_ablate::{describe, expand_unchecked, load_scales, load_table, Cell, Plan};
use fpt_spec::{Init, ResidualInit, RunSpec};
use std::path::Path;

fn cells(id: &str) -> (fpt_spec::table::TableSpec, Vec<Cell>) {
    let tables = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables");
    let t = load_table(&tables, id).unwrap();
    let scales = load_scales(&tables).unwrap();
    let c = expand_unchecked(&t, &scales, "paper").unwrap();
    (t, c)
}

fn spec<'a>(t: &fpt_spec::table::TableSpec, cells: &'a [Cell], row: &str, col: &str) -> &'a RunSpec {
    let c = cells
        .iter()
        .find(|c| t.rows[c.row].label == row && t.cols[c.col].label == col)
        .unwrap_or_else(|| panic!("no cell ({row}, {col})"));
    match &c.plan {
        Plan::Run { spec, .. } => spec,
        p => panic!("({row}, {col}) does not run at the paper scale: {p:?}"),
    }
}

/// (layers, hidden) of a backbone spec from its config, depth cut applied.
fn size(s: &RunSpec) -> (usize, usize) {
    let (c, _) = fpt_backbones::param_specs(&s.backbone).unwrap();
    (s.backbone.depth.unwrap_or(c.layers()), c.hidden_size())
}

/// Table 6's steps to convergence of the slower model (FPT / Random): Memory 1e4/4e4, XOR
/// 5e2/2e4, ListOps 2e3/6e3, MNIST 5e3/2e4, C10 4e5/4e5, C10 LRA 3e5/6e5, Homology 1e5/1e5.
fn table6_slower(task: &str) -> usize {
    match task {
        "bit-memory" => 40_000,
        "bit-xor" => 20_000,
        "listops" => 6_000,
        "mnist" => 20_000,
        "cifar10" => 400_000,
        "cifar10-lra" => 600_000,
        "homology" => 100_000,
        t => panic!("{t}"),
    }
}

/// Every run at the paper scale: App. B's optimizer settings and at least Table 6's budget.
fn check_common(cells: &[Cell]) {
    for c in cells {
        if let Plan::Run { spec, .. } = &c.plan {
            let lstm = spec.backbone.source == "lstm";
            let lr = if lstm {
                3e-4
            } else if spec.task.name.as_str() == "homology" {
                1e-4
            } else {
                1e-3
            };
            assert_eq!(spec.train.lr, lr, "{}", describe(&c.plan));
            assert_eq!(spec.train.clip_norm, Some(1.0));
            assert!((2..=16).contains(&spec.train.batch_size), "{}", describe(&c.plan));
            assert!(
                spec.train.steps >= table6_slower(spec.task.name.as_str()),
                "{}",
                describe(&c.plan)
            );
            if spec.backbone.init == Init::Random && spec.backbone.source.starts_with("gpt2") {
                // transformers 4.1.1: every weight N(0, 0.02).
                assert_eq!(spec.backbone.residual_init, ResidualInit::Unscaled);
            }
        }
    }
}

#[test]
fn table1_as_appendix_d1() {
    let (t, c) = cells("table1");
    check_common(&c);
    for col in ["Bit Memory", "XOR", "ListOps", "MNIST", "C10 LRA", "Homology"] {
        let s = spec(&t, &c, "FPT", col);
        assert_eq!(
            (s.backbone.source.as_str(), s.backbone.init),
            ("gpt2", Init::Pretrained)
        );
        assert_eq!(size(s), (12, 768));
        assert_eq!(s.train_groups.to_string(), "in,out,ln,pos");
    }
    // "FPT: 36-layer large size FPT model" on CIFAR-10.
    let s = spec(&t, &c, "FPT", "CIFAR-10");
    assert_eq!((s.backbone.source.as_str(), size(s)), ("gpt2-large", (36, 1280)));
    // "Full: 12-layer base size GPT-2 model (training all params)"; CIFAR-10: 3 layers, 768.
    for col in ["Bit Memory", "XOR", "MNIST"] {
        let s = spec(&t, &c, "Full", col);
        assert_eq!((s.backbone.init, size(s)), (Init::Random, (12, 768)));
        assert_eq!(s.train_groups.to_string(), fpt_spec::TrainGroups::all().to_string());
    }
    assert_eq!(size(spec(&t, &c, "Full", "CIFAR-10")), (3, 768));
    // Numbers from the literature are not runs.
    for col in ["ListOps", "C10 LRA", "Homology"] {
        let cell = c
            .iter()
            .find(|x| t.rows[x.row].label == "Full" && t.cols[x.col].label == col)
            .unwrap();
        assert!(matches!(cell.plan, Plan::PaperOnly(_)), "{col}");
    }
    // "LSTM: 3-layer, 768 hidden dimension LSTM model (training all params)".
    for col in ["Bit Memory", "XOR", "ListOps", "MNIST", "CIFAR-10", "C10 LRA"] {
        let s = spec(&t, &c, "LSTM", col);
        assert_eq!((s.backbone.source.as_str(), size(s)), ("lstm", (3, 768)));
        assert_eq!(s.train_groups.to_string(), fpt_spec::TrainGroups::all().to_string());
    }
}

#[test]
fn table2_as_appendix_d2() {
    let (t, c) = cells("table2");
    check_common(&c);
    for col in ["Bit Memory", "XOR", "ListOps", "MNIST", "C10", "C10 LRA", "Homology"] {
        let fpt = spec(&t, &c, "FPT", col);
        let random = spec(&t, &c, "Random", col);
        let bit = spec(&t, &c, "Bit", col);
        let vit = spec(&t, &c, "ViT", col);
        for s in [fpt, random, bit, vit] {
            assert_eq!(size(s), (12, 768), "{col}");
            assert_eq!(s.train_groups.to_string(), "in,out,ln,pos");
        }
        assert_eq!(fpt.backbone.init, Init::Pretrained);
        assert_eq!(random.backbone.init, Init::Random);
        assert_eq!(bit.backbone.init, Init::BitPretrained);
        // The paper does not state the Bit budget: the paper scale's Bit Memory budget.
        let bp = bit.backbone.bit_pretrain.unwrap();
        assert_eq!((bp.steps, bp.batch_size), (40_000, 16));
        // ViT-B/16 pretrained on ImageNet-21k.
        assert_eq!(vit.backbone.source, "google/vit-base-patch16-224-in21k");
        assert_eq!(vit.backbone.init, Init::Pretrained);
    }
}

#[test]
fn table3_as_appendix_d3() {
    let (t, c) = cells("table3");
    check_common(&c);
    for col in ["Bit Memory", "XOR", "ListOps", "MNIST", "CIFAR-10", "C10 LRA"] {
        let tr = spec(&t, &c, "Trans.", col);
        assert_eq!((tr.backbone.init, size(tr)), (Init::Random, (12, 768)));
        let lstm = spec(&t, &c, "LSTM", col);
        assert_eq!(size(lstm), (3, 768));
        assert!(lstm.backbone.shape.lstm_residual.is_none() && lstm.backbone.shape.lstm_positions.is_none());
        let star = spec(&t, &c, "LSTM*", col);
        assert_eq!(size(star), (12, 768));
        assert_eq!(
            (star.backbone.shape.lstm_residual, star.backbone.shape.lstm_positions),
            (Some(true), Some(true))
        );
        // Frozen: the recurrent weights do not train.
        for s in [lstm, star] {
            assert!(!s.train_groups.trains(fpt_spec::Role::Recurrent));
        }
    }
}

#[test]
fn table13_trains_the_stated_groups() {
    let (t, c) = cells("table13");
    check_common(&c);
    use fpt_spec::Role::{Attention, FeedForward};
    for col in ["Memory", "XOR", "ListOps", "MNIST", "C10", "C10 LRA", "Homology"] {
        for (row, ff, attn) in [
            ("FPT", false, false),
            ("+ Feedforward", true, false),
            ("+ Attention", false, true),
            ("+ Both", true, true),
        ] {
            let s = spec(&t, &c, row, col);
            assert_eq!(
                (s.backbone.source.as_str(), s.backbone.init),
                ("gpt2", Init::Pretrained)
            );
            assert_eq!(
                (s.train_groups.trains(FeedForward), s.train_groups.trains(Attention)),
                (ff, attn),
                "{row} / {col}"
            );
        }
    }
}

#[test]
fn table17_loads_each_architecture_at_a_revision_with_safetensors() {
    let (t, c) = cells("table17");
    check_common(&c);
    for row in ["ListOps", "CIFAR-10"] {
        for (col, source) in [
            ("GPT-2 (FPT Default)", "gpt2"),
            ("BERT", "bert-base-uncased"),
            ("T5", "t5-base"),
            ("Longformer", "allenai/longformer-base-4096@refs/pr/7"),
        ] {
            let s = spec(&t, &c, row, col);
            assert_eq!(
                (s.backbone.source.as_str(), s.backbone.init),
                (source, Init::Pretrained)
            );
            assert_eq!(s.train_groups.to_string(), "in,out,ln,pos");
        }
    }
    let cell = c.iter().find(|x| t.cols[x.col].label == "Longformer").unwrap();
    assert!(describe(&cell.plan).contains("refs/pr/7"));
    assert!(
        cell.notes.iter().any(|n| n.contains("pytorch_model.bin")),
        "{:?}",
        cell.notes
    );
}

/// Every claim written into the tables holds on the paper's own numbers (a claim that the
/// paper's table contradicts is a transcription error), and at least 15 tables carry one.
#[test]
fn every_claim_holds_on_the_papers_numbers() {
    let tables = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables");
    let scales = load_scales(&tables).unwrap();
    let mut with_claims = 0;
    for id in fpt_ablate::list(&tables).unwrap() {
        let t = load_table(&tables, &id).unwrap();
        if !t.claims.is_empty() {
            with_claims += 1;
        }
        // At the cpu scale every alternate row is there (each shows its paper row's numbers).
        let t = fpt_ablate::at_scale(&t, &scales, "cpu").unwrap();
        for ((text, v), c) in fpt_ablate::claims::on_paper(&t).into_iter().zip(&t.claims) {
            // The critics' claims are not the paper's: no verdict on its numbers.
            // Those the paper makes in its text, about cells its tables print no numbers
            // for, read `in text`.
            let want = match (c.beyond_paper, &c.in_text) {
                (true, _) => "n/p",
                (false, Some(_)) => "in text",
                (false, None) => "holds",
            };
            assert_eq!(v.verdict, want, "{id}: `{text}`: {}", v.detail);
        }
    }
    assert!(with_claims >= 18, "{with_claims} tables carry claims");
    // The paper's headline comes first in Table 1's report: FPT comparable to full training.
    let t1 = load_table(&tables, "table1").unwrap();
    let head = &t1.claims[0];
    assert_eq!(head.kind, fpt_spec::table::ClaimKind::Comparable);
    assert_eq!(
        (head.a.row.as_deref(), head.b.as_ref().and_then(|b| b.row.as_deref())),
        (Some("FPT"), Some("Full"))
    );
}

/// A claim decides on the numbers it is given: holds, fails, inconclusive within the
/// sampling noise, undecided where every pair has a cell at its trivial baseline, or not run.
/// A `b` that ended at its baseline (flat there past its Table 6 count) is the model that
/// did not learn: "FPT beats Random" is decided on it. One merely at its baseline (not yet
/// past its count, or not flat) decides nothing, as before; nor does an ended one in
/// "comparable".
#[test]
fn a_side_that_ended_at_its_baseline_decides_a_beats_claim() {
    use fpt_ablate::claims::CellValue;
    let tables = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables");
    let t = load_table(&tables, "table2").unwrap();
    let claim = &t.claims[0]; // FPT vs Random, mean over the tasks
    let row = |r: usize| t.rows[r].label.as_str();
    let v = |ended: bool| {
        fpt_ablate::claims::check(&t, claim, &|r, c| match (row(r), c) {
            ("FPT", 0) => Some(CellValue {
                value: 99.9,
                se: 0.1,
                ..CellValue::default()
            }),
            ("Random", 0) => Some(CellValue {
                value: 75.1,
                se: 0.1,
                at_baseline: Some("accuracy within the uncertainty of the baseline".into()),
                ended_at_baseline: ended,
                ..CellValue::default()
            }),
            _ => None,
        })
    };
    let ended = v(true);
    assert_eq!(ended.verdict, "holds", "{}", ended.detail);
    let at = v(false);
    assert_eq!(at.verdict, "undecided", "{}", at.detail);
    assert!(at.detail.contains("at their trivial baseline"), "{}", at.detail);
}

#[test]
fn claim_verdicts_follow_the_numbers_and_their_noise() {
    use fpt_ablate::claims::CellValue;
    let tables = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables");
    let t = load_table(&tables, "table2").unwrap();
    let claim = &t.claims[0]; // FPT vs Random, mean over the tasks
    let row = |r: usize| t.rows[r].label.as_str();
    let cell = |value: f64, se: f64, at: bool| CellValue {
        value,
        se,
        at_baseline: at.then(|| "accuracy within the uncertainty of the baseline".to_string()),
        ..CellValue::default()
    };
    // Random's cells in the columns `at` are at their baseline.
    let v = |fpt: f64, random: f64, se: f64, at: &[usize], claim: &fpt_spec::table::Claim| {
        fpt_ablate::claims::check(&t, claim, &|r, c| match (row(r), c) {
            ("FPT", 0..=3) => Some(cell(fpt, se, false)),
            ("Random", 0..=3) => Some(cell(random, se, at.contains(&c))),
            _ => None,
        })
    };
    assert_eq!(v(80.0, 50.0, 1.0, &[], claim).verdict, "holds");
    assert_eq!(v(50.0, 80.0, 1.0, &[], claim).verdict, "fails");
    // 4 pairs, each difference with sd sqrt(2) x 3: the mean's 95% half-width is 4.2.
    let close = v(52.0, 50.0, 3.0, &[], claim);
    assert_eq!(close.verdict, "inconclusive", "{}", close.detail);
    assert!(close.detail.contains("over 4 of 7 pairs"), "{}", close.detail);
    assert!(close.detail.contains("95% interval -2.2 to +6.2"), "{}", close.detail);
    // Pairs with a cell at its baseline are left out and named; with none left, undecided.
    let some = v(80.0, 50.0, 1.0, &[0, 1], claim);
    assert_eq!(some.verdict, "holds", "{}", some.detail);
    assert!(
        some.detail.contains("over 2 of 7 pairs: ListOps, MNIST"),
        "{}",
        some.detail
    );
    assert!(
        some.detail
            .contains("left out, at their trivial baseline: Random / Bit Memory, Random / XOR"),
        "{}",
        some.detail
    );
    let all = v(80.0, 50.0, 1.0, &[0, 1, 2, 3], claim);
    assert_eq!(all.verdict, "undecided", "{}", all.detail);
    // A claim about failure keeps them.
    let failure = fpt_spec::table::Claim {
        about_failure: true,
        ..claim.clone()
    };
    assert_eq!(v(80.0, 50.0, 1.0, &[0, 1, 2, 3], &failure).verdict, "holds");
    // `comparable`: within the margin either way, by the interval.
    let comparable = fpt_spec::table::Claim {
        kind: fpt_spec::table::ClaimKind::Comparable,
        within: Some(5.0),
        ..claim.clone()
    };
    assert_eq!(v(80.0, 79.0, 0.5, &[], &comparable).verdict, "holds");
    assert_eq!(v(80.0, 60.0, 0.5, &[], &comparable).verdict, "fails");
    assert_eq!(v(80.0, 76.0, 3.0, &[], &comparable).verdict, "inconclusive");
    let none = fpt_ablate::claims::check(&t, claim, &|_, _| None);
    assert_eq!(none.verdict, "not run");
}

#[test]
fn every_cell_says_how_many_seeds_it_ran() {
    let tables = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables");
    let scales = load_scales(&tables).unwrap();
    // Table 4 runs three seeds per cell at the cpu scale; Table 2 one, as the paper scale.
    for (id, scale, want) in [
        ("table4", "cpu", "3 seeds (0, 1, 2), their mean reported"),
        ("table4", "paper", "one seed (0)"),
        ("table2", "cpu", "one seed (0)"),
    ] {
        let t = load_table(&tables, id).unwrap();
        for c in expand_unchecked(&t, &scales, scale).unwrap() {
            if let Plan::Run { .. } = c.plan {
                assert!(
                    c.differs.iter().any(|d| d.starts_with(want)),
                    "{id} at {scale}: {:?}",
                    c.differs
                );
                assert_eq!(c.replicas.len() + 1, if want.starts_with('3') { 3 } else { 1 });
            }
        }
    }
}

/// The cpu scale's seed spreads are what Table 9's committed report measured: per task, the
/// largest spread over three seeds among its cells that left their trivial baseline.
#[test]
fn the_cpu_seed_spreads_are_table9s_measurements() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tables = root.join("data/tables");
    let spreads = &load_scales(&tables).unwrap()["cpu"].seed_spread;
    assert!(!spreads.is_empty());
    let t = load_table(&tables, "table9").unwrap();
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("results/table9/cpu/report.json")).unwrap()).unwrap();
    for (task, spread) in spreads {
        let cols: Vec<&str> = t
            .cols
            .iter()
            .filter(|c| c.set.task.as_deref() == Some(task.as_str()))
            .map(|c| c.label.as_str())
            .collect();
        let measured = report["cells"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| cols.contains(&c["col"].as_str().unwrap()) && c["at_baseline"].is_null())
            .filter_map(|c| c["seeds"]["sd"].as_f64())
            .fold(0.0, f64::max);
        assert!(
            (measured - spread.sd).abs() < 0.01,
            "{task}: {measured} measured, {} in scales.toml",
            spread.sd
        );
        // Measured on Table 9's backbone at this scale (the stand-in for GPT-2): it widens
        // that backbone's cells only.
        let standin = &load_scales(&tables).unwrap()["cpu"].backbones["gpt2"];
        assert_eq!(spread.backbone, standin.source, "{task}");
    }
}

/// The README's claims summary is what `fpt run-table all --scale cpu --claims` prints from
/// the committed reports (`FPT_BLESS=1` rewrites it).
#[test]
fn the_readme_claims_summary_is_the_reports() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let want = fpt_ablate::reproduce::claims_summary(
        &root.join("data/tables"),
        &["all".to_string()],
        "cpu",
        &root.join("results"),
    )
    .unwrap();
    let readme_path = root.join("README.md");
    let readme = std::fs::read_to_string(&readme_path).unwrap();
    let (begin, end) = (
        "<!-- fpt run-table all --scale cpu --claims: begin -->\n",
        "<!-- fpt run-table all --scale cpu --claims: end -->",
    );
    let i = readme.find(begin).expect("README has the claims block") + begin.len();
    let j = readme.find(end).expect("README has the claims block's end");
    if std::env::var_os("FPT_BLESS").is_some() {
        let text = format!("{}{want}{}", &readme[..i], &readme[j..]);
        std::fs::write(&readme_path, text).unwrap();
        return;
    }
    assert!(
        readme[i..j] == want,
        "README.md's claims block differs from the committed reports; rewrite it with FPT_BLESS=1 cargo test -p fpt-ablate --test paper_settings"
    );
}

/// Figures 3 and 5 at the cpu scale draw the runs of Table 2's FPT and Random cells on Bit
/// XOR (their settings mirror that table's), so the attention shown is of the runs reported.
#[test]
fn figures_3_and_5_draw_table2s_bit_xor_runs() {
    let tables = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables");
    let scales = load_scales(&tables).unwrap();
    let key = |id: &str, row: Option<&str>| {
        let t = load_table(&tables, id).unwrap();
        let cells = expand_unchecked(&t, &scales, "cpu").unwrap();
        let c = cells
            .iter()
            .find(|c| row.is_none_or(|r| t.rows[c.row].label == r && t.cols[c.col].label == "XOR"))
            .unwrap();
        match &c.plan {
            Plan::Run { key, .. } => key.clone(),
            p => panic!("{id}: {p:?}"),
        }
    };
    assert_eq!(key("fig3", None), key("table2", Some("FPT")));
    assert_eq!(key("fig5", None), key("table2", Some("Random")));
}

/// What the main job fetches: what Table 2's cells read at the cpu scale, nothing else
/// (no Fashion-MNIST, no SmolLM2: its rows run at cpu-full), whether it is on this machine or
/// not; cpu-full adds SmolLM2.
#[test]
fn table2_needs_exactly_its_cells_assets() {
    let tables = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables");
    let scales = load_scales(&tables).unwrap();
    let t = load_table(&tables, "table2").unwrap();
    let assets = fpt_ablate::assets(&expand_unchecked(&t, &scales, "cpu").unwrap());
    assert_eq!(
        assets,
        [
            "cifar10",
            "google/vit-base-patch16-224-in21k",
            "homology",
            "listops",
            "minilm",
            "mnist",
        ]
    );
    let full = fpt_ablate::assets(&expand_unchecked(&t, &scales, "cpu-full").unwrap());
    assert!(full.contains(&"smollm2".to_string()), "{full:?}");
    let paper = fpt_ablate::assets(&expand_unchecked(&t, &scales, "paper").unwrap());
    assert!(
        paper.contains(&"gpt2".to_string()) && !paper.contains(&"minilm".to_string()),
        "{paper:?}"
    );
}

/// Where GPT-2 is substituted and the scale has the budget (smoke, cpu-full; not the main
/// job's cpu scale), Table 2 carries SmolLM2 rows beside GPT-2's numbers and their claim; at
/// the paper scale (GPT-2 itself) neither.
#[test]
fn table2_carries_smollm2_rows_only_where_gpt2_is_substituted() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables");
    let scales = load_scales(&dir).unwrap();
    let t = load_table(&dir, "table2").unwrap();
    for (scale, alternates) in [("smoke", true), ("cpu", false), ("cpu-full", true), ("paper", false)] {
        let at = fpt_ablate::at_scale(&t, &scales, scale).unwrap();
        let labels: Vec<&str> = at.rows.iter().map(|r| r.label.as_str()).collect();
        let smollm2 = labels.iter().position(|l| *l == "FPT (SmolLM2)");
        assert_eq!(smollm2.is_some(), alternates, "{scale}: {labels:?}");
        assert_eq!(at.paper.len(), at.rows.len());
        let claims = at.claims.iter().filter(|c| c.text.contains("SmolLM2")).count();
        assert_eq!(claims, usize::from(alternates), "{scale}");
        // Idempotent: the table at its scale is itself at that scale.
        assert_eq!(fpt_ablate::at_scale(&at, &scales, scale).unwrap(), at);
        if let Some(r) = smollm2 {
            assert_eq!(at.paper[r], t.paper[0], "FPT (SmolLM2) shows GPT-2's FPT numbers");
            let cells = fpt_ablate::expand(&t, &scales, scale).unwrap();
            let c = cells.iter().find(|c| c.row == r && c.col == 1).unwrap();
            let Plan::Run { spec, .. } = &c.plan else {
                // The GGUF may be absent here: then the cell names it as unavailable.
                let Plan::Unavailable(why) = &c.plan else {
                    panic!("{:?}", c.plan)
                };
                assert!(why.contains("smollm2"), "{why}");
                continue;
            };
            assert_eq!(spec.backbone.source, "smollm2");
            // bf16 only where this CPU multiplies it natively; elsewhere the row keeps f32
            // and its note says why (expand.rs).
            let native = fpt_nn::KernelPath::detected() == fpt_nn::KernelPath::Avx512Bf16;
            let want = if native {
                fpt_spec::Precision::Bf16
            } else {
                fpt_spec::Precision::F32
            };
            assert_eq!(spec.backbone.precision, want);
            assert_eq!(
                c.notes.iter().any(|n| n.contains("this CPU has no AVX512_BF16")),
                !native,
                "{:?}",
                c.notes
            );
            assert_eq!(spec.backbone.init, fpt_spec::Init::Pretrained);
            assert!(
                c.notes.iter().any(|n| n.starts_with("gpt2 -> smollm2: SmolLM2-135M")),
                "{:?}",
                c.notes
            );
            assert!(
                c.notes
                    .iter()
                    .any(|n| n.contains("fpt adds its own learned position table (1024 rows")),
                "{:?}",
                c.notes
            );
            assert_eq!(
                c.differs.iter().any(|d| d == "frozen weights in bf16 (paper: f32)"),
                native,
                "{:?}",
                c.differs
            );
            assert!(
                c.differs
                    .iter()
                    .any(|d| d.starts_with("backbone smollm2 (30 x 576) (paper: gpt2")),
                "{:?}",
                c.differs
            );
        }
    }
}

/// What a reviewer recounting the claims asked for: a cell not converged (and no bound) is
/// left out on either side, "comparable" cannot hold on a lower bound; a pair at the
/// task's ceiling says nothing about the difference; single-seed pairs need a seed spread
/// measured for their backbone; and a cell averaging several seeds (without per-example
/// outcomes) is not widened by the seed spread again.
#[test]
fn claims_leave_out_rising_ceiling_and_spreadless_pairs() {
    use fpt_ablate::claims::{CellValue, Convergence};
    let tables = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables");
    let t = load_table(&tables, "table2").unwrap();
    let claim = &t.claims[0]; // FPT vs Random
    let row = |r: usize| t.rows[r].label.as_str();
    let ours = |value: f64, convergence: Convergence, seeds: usize, spread: bool| CellValue {
        value,
        se: 1.0,
        convergence,
        at_ceiling: value >= 99.5,
        seeds,
        spread_known: spread,
        seed_sd: if spread { 2.0 } else { 0.0 },
        ..CellValue::default()
    };
    let check = |claim: &fpt_spec::table::Claim, f: &dyn Fn(&str, usize) -> Option<CellValue<'static>>| {
        fpt_ablate::claims::check(&t, claim, &|r, c| f(row(r), c))
    };
    use Convergence::{NotConverged, Reached, Rising, Unknown};
    // Random not converged on XOR and MNIST (columns 1 and 3), FPT on Bit Memory (column 0):
    // all left out, either side; only converged cells (and bounds) decide.
    let v = check(claim, &|r, c| match (r, c) {
        ("FPT", 0..=3) => Some(ours(90.0, if c == 0 { NotConverged } else { Reached }, 3, true)),
        ("Random", 0..=3) => Some(ours(60.0, if c % 2 == 1 { NotConverged } else { Reached }, 3, true)),
        _ => None,
    });
    assert_eq!(v.verdict, "holds", "{}", v.detail);
    assert!(v.detail.contains("over 1 of 7 pairs: ListOps"), "{}", v.detail);
    assert!(
        v.detail.contains("not converged (not yet flat across the last half"),
        "{}",
        v.detail
    );
    assert!(
        v.detail.contains("FPT / Bit Memory, Random / XOR, Random / MNIST"),
        "{}",
        v.detail
    );
    // Unrecorded convergence of the beaten side: left out too; none left: undecided.
    let v = check(claim, &|r, c| match (r, c) {
        ("FPT", 0..=3) => Some(ours(90.0, Reached, 3, true)),
        ("Random", 0..=3) => Some(ours(60.0, Unknown, 3, true)),
        _ => None,
    });
    assert_eq!(v.verdict, "undecided", "{}", v.detail);
    assert!(v.detail.contains("convergence not known by the rule"), "{}", v.detail);
    // `comparable` needs both sides on their plateau: a lower bound may rise past the margin.
    let comparable = fpt_spec::table::Claim {
        kind: fpt_spec::table::ClaimKind::Comparable,
        within: Some(5.0),
        ..claim.clone()
    };
    let v = check(&comparable, &|r, c| match (r, c) {
        ("FPT", 0..=3) => Some(ours(80.0, NotConverged, 3, true)),
        ("Random", 0..=3) => Some(ours(80.0, Reached, 3, true)),
        _ => None,
    });
    assert_eq!(v.verdict, "undecided", "{}", v.detail);
    let v = check(&comparable, &|r, c| match (r, c) {
        ("FPT", 0..=3) => Some(ours(80.0, Rising, 3, true)),
        ("Random", 0..=3) => Some(ours(80.0, Reached, 3, true)),
        _ => None,
    });
    assert_eq!(v.verdict, "inconclusive", "{}", v.detail);
    assert!(v.detail.contains("at least +0.0"), "{}", v.detail);
    assert!(v.detail.contains("so it can fail here, not hold"), "{}", v.detail);
    // Both at 100%: the pair is left out (here XOR); the rest decide.
    let v = check(claim, &|r, c| match (r, c) {
        ("FPT", 0..=3) => Some(ours(if c == 1 { 100.0 } else { 90.0 }, Reached, 3, true)),
        ("Random", 0..=3) => Some(ours(if c == 1 { 100.0 } else { 60.0 }, Reached, 3, true)),
        _ => None,
    });
    assert!(v.detail.contains("both at the task's ceiling: XOR"), "{}", v.detail);
    assert!(v.detail.contains("over 3 of 7 pairs"), "{}", v.detail);
    // One seed each, and no spread measured for the backbone: no decision from that pair.
    let v = check(claim, &|r, c| match (r, c) {
        ("FPT", 0..=3) => Some(ours(90.0, Reached, 1, c != 3)),
        ("Random", 0..=3) => Some(ours(60.0, Reached, 1, c != 3)),
        _ => None,
    });
    assert!(
        v.detail.contains("one seed (each) and no seed spread measured"),
        "{}",
        v.detail
    );
    assert!(v.detail.contains("MNIST"), "{}", v.detail);
    assert!(v.detail.contains("over 3 of 7 pairs"), "{}", v.detail);
    // A cell of 3 seeds (normal interval, no per-example outcomes) is not widened by the seed
    // spread: 4 pairs with se 1 each side give a half-width of 1.96 x sqrt(8) / 4 = 1.4.
    let v = check(claim, &|r, c| match (r, c) {
        ("FPT", 0..=3) => Some(ours(62.0, Reached, 3, true)),
        ("Random", 0..=3) => Some(ours(60.0, Reached, 3, true)),
        _ => None,
    });
    assert!(v.detail.contains("95% interval +0.6 to +3.4"), "{}", v.detail);
    assert_eq!(v.verdict, "holds");
    // The same cells as single seeds are widened by the spread (2 points per cell).
    let v = check(claim, &|r, c| match (r, c) {
        ("FPT", 0..=3) => Some(ours(62.0, Reached, 1, true)),
        ("Random", 0..=3) => Some(ours(60.0, Reached, 1, true)),
        _ => None,
    });
    assert_eq!(v.verdict, "inconclusive", "{}", v.detail);
}

/// The converge report's pairs at the same step: the larger Table 6 count where both runs
/// reached it, else the shorter run's last evaluation; accuracies read at the latest
/// evaluation at or before it, from the run directories (pending runs included).
#[test]
fn equal_budget_pairs_read_both_rows_at_one_step() {
    use fpt_ablate::Plan;
    let tables = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables");
    let t = fpt_ablate::at_scale(
        &load_table(&tables, "table2").unwrap(),
        &load_scales(&tables).unwrap(),
        "converge",
    )
    .unwrap();
    let scales = load_scales(&tables).unwrap();
    let cells = fpt_ablate::expand_unchecked(&t, &scales, "converge").unwrap();
    let d = tempfile::tempdir().unwrap();
    let key_of = |row: &str, col: &str| {
        let c = cells
            .iter()
            .find(|c| t.rows[c.row].label == row && t.cols[c.col].label == col)
            .unwrap();
        match &c.plan {
            Plan::Run { key, .. } => key.clone(),
            p => panic!("{p:?}"),
        }
    };
    // Each line with the examples it scored where given (MNIST's whole split is 10,000
    // images; lines of older fpt have no count).
    let write = |key: &str, curve: &[(usize, f64, Option<usize>)]| {
        let dir = d.path().join("runs").join(key);
        std::fs::create_dir_all(&dir).unwrap();
        let lines: String = curve
            .iter()
            .map(|(s, a, n)| {
                let n = n.map(|n| format!(",\"examples\":{n}")).unwrap_or_default();
                format!(
                    "{{\"step\":{s},\"train_loss\":1.0,\"test_loss\":1.0,\"test_accuracy\":{a},\"lr\":0.001,\"grad_norm\":1.0,\"elapsed_s\":1.0{n}}}\n"
                )
            })
            .collect();
        std::fs::write(dir.join("metrics.jsonl"), lines).unwrap();
        dir
    };
    // MNIST (floors 5000 / 20000): both past 20000, read there. Random's evaluation then
    // predates the count and the scale's whole-split evaluation: its respec.jsonl says it
    // scored 2000 images.
    write(
        &key_of("FPT", "MNIST"),
        &[
            (10000, 0.95, Some(10000)),
            (20000, 0.96, Some(10000)),
            (25000, 0.97, Some(10000)),
        ],
    );
    let random = write(
        &key_of("Random", "MNIST"),
        &[(10000, 0.85, None), (19500, 0.90, None), (21000, 0.92, Some(10000))],
    );
    std::fs::write(
        random.join("respec.jsonl"),
        "{\"utc\":\"2026-11-27T08:36:43Z\",\"step\":19600,\"changes\":[\"task.eval_examples: 2000 -> 0\",\"train.eval_every: 500 -> 1000\"],\"why\":\"test\"}\n",
    )
    .unwrap();
    // XOR (500 / 20000): FPT stopped at 2000, so both are read there.
    write(&key_of("FPT", "XOR"), &[(1000, 1.0, None), (2000, 1.0, None)]);
    write(
        &key_of("Random", "XOR"),
        &[(1500, 0.80, None), (2000, 0.84, None), (20000, 1.0, None)],
    );
    let pairs = fpt_ablate::equal_budget::compute(&t, &cells, d.path());
    let mnist = pairs.iter().find(|p| p.col == "MNIST").unwrap();
    assert_eq!((mnist.step, mnist.why.as_str()), (20000, "the larger Table 6 count"));
    assert!(
        (mnist.accuracy.0 - 96.0).abs() < 1e-9 && (mnist.accuracy.1 - 90.0).abs() < 1e-9,
        "{mnist:?}"
    );
    // 10,000 images at 96% and 2000 at 90%: +-1.37 points (a whole split taken for 2000, or
    // the reverse, would give +-0.8 or +-2.0).
    let half = (mnist.interval.1 - mnist.interval.0) / 2.0;
    assert!(
        (half - 1.96 * (0.96f64 * 0.04 / 10000.0 + 0.9 * 0.1 / 2000.0).sqrt() * 100.0).abs() < 1e-6 && mnist.seeds == 1,
        "{mnist:?}"
    );
    let xor = pairs.iter().find(|p| p.col == "XOR").unwrap();
    assert_eq!(
        (xor.step, xor.why.as_str()),
        (2000, "the shorter run's last evaluation")
    );
    assert!((xor.difference - 16.0).abs() < 1e-9, "{xor:?}");
    // Columns without runs on both sides have no pair.
    assert!(pairs.iter().all(|p| p.col != "ListOps" && p.col != "Bit Memory"));
}

/// A diverged cell says what its number is: the best evaluation before divergence, or, where
/// the run diverged before its first evaluation, the diverged weights' own (no evidence).
#[test]
fn a_diverged_cell_says_what_its_number_is() {
    let template = include_str!("data/result-template.json");
    let mut r: fpt_train::RunResult = serde_json::from_str(template).unwrap();
    r.diverged = true;
    r.diverged_at_step = Some(300);
    r.best_step = 200;
    assert!(fpt_ablate::convergence::diverged_words(&r).contains("the best evaluation before it, at step 200"));
    r.best_step = 300;
    let w = fpt_ablate::convergence::diverged_words(&r);
    assert!(
        w.contains("before its first evaluation") && w.contains("no evidence"),
        "{w}"
    );
}

//! The bench's MiniLM MNIST shape (`fpt bench --backbone minilm --shape mnist`) is the
//! converge campaign's MNIST step (issue 56 item 8: what the GPU bench times is the work the
//! campaign does): the same backbone config, batch, trained groups and every trainer setting
//! that changes the step's work, for both rows (pretrained and random weights cost the same).

use fpt_ablate::{at_scale, expand_unchecked, load_scales, load_table, Plan};
use std::path::Path;

#[test]
fn the_minilm_mnist_bench_step_is_the_campaigns_mnist_step() {
    let tables = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables");
    let scales = load_scales(&tables).unwrap();
    let t = at_scale(&load_table(&tables, "table2").unwrap(), &scales, "converge").unwrap();
    let cells = expand_unchecked(&t, &scales, "converge").unwrap();
    let shape = fpt_train::bench::find(fpt_train::bench::Arch::Minilm, "mnist").unwrap();
    let bench = shape.spec(fpt_spec::TrainGroups::fpt(), fpt_spec::Precision::F32);
    let mut seen = 0;
    for c in &cells {
        let (row, col) = (&t.rows[c.row].label, &t.cols[c.col].label);
        let Plan::Run { spec, .. } = &c.plan else { continue };
        if !(col == "MNIST" && (row == "FPT" || row == "Random")) {
            continue;
        }
        seen += 1;
        let (ours, b) = (&spec.train, &bench.train);
        assert_eq!(spec.backbone.source, bench.backbone.source, "{row}");
        assert_eq!(
            spec.backbone.shape, bench.backbone.shape,
            "{row}: the config as published"
        );
        assert_eq!(spec.task.name, fpt_spec::TaskName::Mnist);
        // MNIST's fixed 4 x 4 patches: 49 tokens of 16 values, as the shape's.
        assert_eq!(spec.task.patch, None, "{row}");
        assert_eq!(
            (shape.tokens, shape.input),
            (49, fpt_tasks::InputKind::Vectors { width: 16 })
        );
        assert_eq!(
            (shape.batch, shape.classes, shape.readout),
            (ours.batch_size, 10, 1),
            "{row}"
        );
        assert_eq!(ours.micro_batch_size, b.micro_batch_size, "{row}");
        assert_eq!((ours.lr, ours.clip_norm), (b.lr, b.clip_norm), "{row}");
        assert_eq!(spec.train_groups, bench.train_groups, "{row}");
        assert_eq!(spec.input_dropout, bench.input_dropout, "{row}");
        assert_eq!(spec.backbone_dropout, bench.backbone_dropout, "{row}");
        assert_eq!(spec.backbone.precision, bench.backbone.precision, "{row}");
        assert_eq!(spec.model, bench.model, "{row}");
    }
    assert!(seen >= 2, "the converge scale's FPT and Random MNIST cells: {seen}");
}

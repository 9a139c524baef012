//! Exactly-zero input rows through the real SmolLM2-135M (issue 34): with fpt's learned
//! position table zeroed and the zero-bias input layer, blank inputs (MNIST's empty
//! patches) enter the stack as zero vectors; every RMSNorm then multiplies the gradient by
//! its scale / sqrt(eps) (~300), and 30 blocks of that overflow f32 in the first backward
//! pass (transformers: input-side gradients 1e32 by block 20, NaN at the first step). The
//! step must come back non-finite, so that the run loop marks the run diverged
//! (`divergence_is_caught_and_reported` in train.rs covers that part) instead of reporting
//! an accuracy; with the table at its N(0, 0.02) init (fpt's default) the same batch trains.
//! Skipped when the model is not installed, unless `FPT_REQUIRE_SMOLLM2=1` (CI sets it).

use candle_core::{Device, Tensor};
use fpt_spec::{BackboneSpec, Init, RunSpec, TaskSpec};
use fpt_train::Trainer;

#[test]
fn zero_input_rows_through_smollm2_are_caught_as_non_finite() {
    if let Err(e) = fpt_backbones::hub::smollm2_gguf() {
        if std::env::var("FPT_REQUIRE_SMOLLM2").is_ok_and(|v| v == "1") {
            panic!("FPT_REQUIRE_SMOLLM2=1 but {e}");
        }
        eprintln!("skipped: {e}");
        return;
    }
    // Blank "images": 8 tokens of 16 zeros each, two classes.
    let data = tempfile::tempdir().unwrap();
    let mut lines = String::new();
    for i in 0..8 {
        let split = if i < 6 { "train" } else { "test" };
        let tokens = vec![format!("[{}]", vec!["0.0"; 16].join(", ")); 8];
        lines.push_str(&format!(
            "{{\"features\": [{}], \"label\": {}, \"split\": \"{split}\"}}\n",
            tokens.join(", "),
            i % 2
        ));
    }
    let file = data.path().join("blank.jsonl");
    std::fs::write(&file, lines).unwrap();
    let mut spec = RunSpec::new(
        TaskSpec::parse(&format!("custom:{}", file.display())).unwrap(),
        BackboneSpec::new("smollm2", Init::Pretrained),
    );
    spec.train.batch_size = 2;
    spec.train.micro_batch_size = 2;
    spec.train.steps = 2;

    // fpt's init: the position rows are N(0, 0.02), so no input row is exactly zero.
    let mut tr = Trainer::new(&spec, &Device::Cpu).unwrap();
    let ok = tr.step().unwrap();
    assert!(
        ok.finite,
        "N(0, 0.02) positions: loss {} grad norm {}",
        ok.loss, ok.grad_norm
    );

    // The same model with its position table zeroed: zero rows enter block 0.
    let mut tr = Trainer::new(&spec, &Device::Cpu).unwrap();
    let (name, table) = tr
        .model()
        .trainable()
        .into_iter()
        .find(|(n, _)| n.contains("position"))
        .expect("a trained position table");
    table.set(&Tensor::zeros_like(table.as_tensor()).unwrap()).unwrap();
    let before: Vec<f32> = table.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
    let bad = tr.step().unwrap();
    assert!(
        !bad.finite,
        "{name} zeroed: loss {} grad norm {} should not be finite",
        bad.loss, bad.grad_norm
    );
    // The update was skipped: nothing moved, no step counted.
    assert_eq!(tr.steps_done(), 0);
    let after: Vec<f32> = table.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(before, after);
}

//! Train a frozen transformer on your own data through the library alone:
//! `cargo run --release --example custom_task -- DATA.jsonl OUT_DIR`.
//!
//! DATA.jsonl holds one example per line, `{"features": [[f, ...], ...], "label": N,
//! "split": "train" | "test"}` (see the README's "Your own data"). A small randomly
//! initialised GPT-2 is used so that nothing needs downloading; name a pretrained one
//! (`sentence-transformers/all-MiniLM-L6-v2` after `fpt fetch minilm`) with
//! `Init::Pretrained` for the real recipe.

use fpt::spec::{BackboneSpec, Init, RunSpec, ShapeOverrides, TaskSpec, TrainSpec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (data, out) = match &args[..] {
        [_, data, out] => (data, out),
        _ => return Err("usage: custom_task DATA.jsonl OUT_DIR".into()),
    };
    let task = TaskSpec::parse(&format!("custom:{data}"))?;
    let backbone = BackboneSpec {
        shape: ShapeOverrides {
            layers: Some(2),
            hidden: Some(64),
            heads: Some(4),
            ..Default::default()
        },
        ..BackboneSpec::new("gpt2", Init::Random)
    };
    let spec = RunSpec {
        train: TrainSpec {
            steps: 200,
            batch_size: 8,
            micro_batch_size: 8,
            eval_every: 50,
            ..TrainSpec::default()
        },
        ..RunSpec::new(task, backbone)
    };
    let device = fpt::candle_core::Device::Cpu;
    let result = fpt::train::train(&spec, out.as_ref(), &device, &mut |_| {})?;
    println!(
        "{}: test accuracy {:.4} -> {out}/result.json",
        result.task, result.test_accuracy
    );
    Ok(())
}

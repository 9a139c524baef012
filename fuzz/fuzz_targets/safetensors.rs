//! A checkpoint's model.safetensors (header, dtypes, shapes, values) under a valid tiny BERT
//! config: loading gives a model or an error naming the tensor, never a panic.
#![no_main]
use std::path::PathBuf;
use std::sync::OnceLock;

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("fpt-fuzz-safetensors-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("config.json"),
            include_str!("../../data/fixtures/bert-tiny/config.json"),
        )
        .unwrap();
        d
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let d = dir();
    std::fs::write(d.join("model.safetensors"), data).unwrap();
    let spec = fpt_spec::BackboneSpec {
        source: d.display().to_string(),
        init: fpt_spec::Init::Pretrained,
        shape: Default::default(),
        residual_init: Default::default(),
        depth: None,
        final_norm: true,
        bit_pretrain: None,
    };
    let _ = fpt_backbones::load(
        &spec,
        &fpt_spec::TrainGroups::fpt(),
        &candle_core::Device::Cpu,
        &mut fpt_nn::Rng::new(0),
    );
});

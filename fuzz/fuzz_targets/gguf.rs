//! A GGUF file: candle's header reader, fpt's config from its metadata, then loading the
//! backbone (every tensor's shape checked before its data is read, dequantized to f32).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("fpt-fuzz-{}.gguf", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let spec = fpt_spec::BackboneSpec {
        source: path.display().to_string(),
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

//! A run's spec.json: strict parsing, then the size checks that guard every allocation.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(spec) = serde_json::from_slice::<fpt_spec::RunSpec>(data) {
        let _ = spec.validate();
    }
});

//! A backbone's config.json: every architecture's parser and limits, then its tensor list
//! (which a config within the limits keeps small).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(c) = fpt_backbones::Config::from_json(text, std::path::Path::new("config.json")) {
            let _ = c.param_specs();
        }
    }
});

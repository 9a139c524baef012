//! The custom task's JSON Lines records.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = fpt_tasks::custom::check_records(data, std::path::Path::new("fuzz.jsonl"));
});

//! LRA's ListOps TSV, with both bracket modes.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    for b in [fpt_spec::Brackets::Drop, fpt_spec::Brackets::Keep] {
        let _ = fpt_tasks::listops::parse_tsv(data, std::path::Path::new("fuzz.tsv"), b, 512);
    }
});

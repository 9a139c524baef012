//! MNIST's IDX format, plain or gzip'd: any bytes give an `Idx` or an error, never a panic,
//! and never an inflation past the size the header declares.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = fpt_tasks::idx::decode(data);
});

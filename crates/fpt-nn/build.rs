//! Builds fpt-nn's kernel sources (`kernels/`):
//! - always: `host_grid.c`, the CUDA kernels' bodies driven over a simulated grid on the
//!   host, which the crate's tests compare with the CPU ops (a small static library; only
//!   the tests call it);
//! - with the `cuda` feature: `fpt_kernels.cu` compiled to PTX by `nvcc` for
//!   `CUDA_COMPUTE_CAP` (default 90: H100 and H200), embedded in the library and loaded
//!   by `src/cuda.rs` at the first launch.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let kernels = PathBuf::from("kernels");
    for f in [
        "fpt_ops.h",
        "fpt_attn.h",
        "fpt_attn_mma.h",
        "fpt_attn_mma_body.h",
        "fpt_lstm.h",
        "host_grid.c",
        "host_mma.c",
        "fpt_kernels.cu",
    ] {
        println!("cargo:rerun-if-changed=kernels/{f}");
    }
    // Under AddressSanitizer (`cargo xtask sanitize` sets -Zsanitizer=address in RUSTFLAGS)
    // the C bodies are instrumented too, so their indexing is checked with the Rust side's.
    println!("cargo:rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
    let asan = std::env::var("CARGO_ENCODED_RUSTFLAGS").is_ok_and(|f| f.contains("sanitizer=address"));
    let mut c = cc::Build::new();
    if asan {
        c.flag("-fsanitize=address");
    }
    c.file(kernels.join("host_grid.c"))
        .file(kernels.join("host_mma.c"))
        .include(&kernels)
        .flag_if_supported("-std=c99")
        // Each product and sum rounded on its own, as the CUDA kernels' FPT_MUL/FPT_ADD.
        .flag_if_supported("-ffp-contract=off")
        .opt_level(2)
        .warnings(true)
        .compile("fpt_host_grid");

    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
        println!("cargo:rerun-if-env-changed=CUDA_PATH");
        let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
        let nvcc = std::env::var_os("CUDA_PATH")
            .map(|p| PathBuf::from(p).join("bin").join("nvcc"))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("nvcc"));
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("fpt_kernels.ptx");
        let status = Command::new(&nvcc)
            .args(["-ptx", "-O3", "-std=c++17", "--expt-relaxed-constexpr"])
            .arg(format!("-arch=sm_{cap}"))
            .arg("-I")
            .arg(&kernels)
            .arg("-o")
            .arg(&out)
            .arg(kernels.join("fpt_kernels.cu"))
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "fpt-nn (feature cuda): could not run {} ({e}); `cargo xtask cuda-toolkit` installs one",
                    nvcc.display()
                )
            });
        assert!(
            status.success(),
            "fpt-nn (feature cuda): nvcc failed on kernels/fpt_kernels.cu ({status})"
        );
    }
}

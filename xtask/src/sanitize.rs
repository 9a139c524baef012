//! `cargo xtask sanitize`: fpt-nn's tests (every kernel path this CPU runs) under
//! AddressSanitizer, and its scalar-path unit tests (the matrix product, the element-wise
//! kernels, the bf16 packing, the kernel switch) under Miri.
//!
//! ASan runs on the pinned stable toolchain with `RUSTC_BOOTSTRAP=1` (its runtime ships with
//! the standard library), in its own target directory; a deliberately out-of-bounds canary
//! test must then be reported, so a run that silently lost the sanitizer fails. Miri needs
//! the nightly toolchain's `miri` component (installed with rustup when missing); where it
//! cannot be had, `--allow-no-miri` turns that into a printed warning.

use anyhow::{bail, Context, Result};
use std::process::Command;
use std::time::Instant;

fn host_triple() -> Result<String> {
    let out = Command::new("rustc").arg("-vV").output().context("running rustc -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .context("rustc -vV printed no host triple")
}

fn asan(triple: &str) -> Result<()> {
    let target_dir = super::root().join("target").join("sanitize");
    let cmd = |extra: &[&str]| {
        let mut c = super::cargo_command();
        c.current_dir(super::root())
            .args(["test", "-p", "fpt-nn", "--target", triple, "--target-dir"])
            .arg(&target_dir)
            // Dependencies without debug info (fpt-nn keeps it, so its frames in a report
            // have lines): the sanitized build took 334 s instead of 381 on a 2-core AMD
            // EPYC (2026-11-29); instrumentation and reports are the same.
            .args(["--config", "profile.dev.package.\"*\".debug=false"])
            .args(extra)
            .env("RUSTC_BOOTSTRAP", "1")
            .env("RUSTFLAGS", "-Zsanitizer=address")
            .env("RUSTDOCFLAGS", "-Zsanitizer=address")
            .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0");
        c
    };
    eprintln!("xtask sanitize: fpt-nn's tests under AddressSanitizer (dev profile: debug assertions on)");
    let status = cmd(&["--lib", "--tests"])
        .status()
        .context("running cargo test under ASan")?;
    if !status.success() {
        bail!("fpt-nn's tests failed under AddressSanitizer");
    }
    eprintln!("xtask sanitize: the canary (an out-of-bounds read) must be reported");
    let out = cmd(&[
        "--lib",
        "--",
        "--ignored",
        "--exact",
        "ops::sgemm::canary::asan_canary_reads_past_a_buffer",
    ])
    .output()
    .context("running the ASan canary")?;
    let text = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    let report = text.lines().find(|l| l.contains("ERROR: AddressSanitizer"));
    match report {
        Some(line) if !out.status.success() => {
            eprintln!(
                "xtask sanitize: the canary was reported, as it must be: {}",
                line.trim()
            )
        }
        _ => bail!("the ASan canary was not reported: the sanitizer is not active\n{text}"),
    }
    Ok(())
}

fn has_miri() -> bool {
    Command::new("rustup")
        .args(["run", "nightly", "cargo", "miri", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn miri() -> Result<()> {
    if !has_miri() {
        eprintln!("xtask sanitize: installing the nightly toolchain's miri and rust-src components");
        let ok = Command::new("rustup")
            .args(["component", "add", "miri", "rust-src", "--toolchain", "nightly"])
            .status()
            .is_ok_and(|s| s.success());
        if !ok || !has_miri() {
            bail!("Miri is not available (`rustup component add miri rust-src --toolchain nightly` failed)");
        }
    }
    eprintln!("xtask sanitize: the scalar-path unit tests under Miri (sgemm, bf16, fastmath, swiglu, kernels)");
    let status = Command::new("rustup")
        .current_dir(super::root())
        .args([
            "run",
            "nightly",
            "cargo",
            "miri",
            "test",
            "-p",
            "fpt-nn",
            "--lib",
            "--target-dir",
        ])
        .arg(super::root().join("target").join("miri"))
        .args([
            "--",
            "ops::sgemm::tests",
            "ops::bf16::tests",
            "ops::fastmath",
            "ops::swiglu::tests",
            "kernels::",
        ])
        .env("MIRIFLAGS", "-Zmiri-disable-isolation")
        .env_remove("RUSTUP_TOOLCHAIN")
        .status()
        .context("running cargo miri")?;
    if !status.success() {
        bail!("Miri found a problem in fpt-nn's scalar paths");
    }
    Ok(())
}

/// `cargo xtask sanitize`'s flags.
#[derive(Debug, clap::Args)]
pub struct SanitizeArgs {
    /// Go on (with a warning) where Miri cannot be installed
    #[arg(long)]
    allow_no_miri: bool,
    /// AddressSanitizer only
    #[arg(long, conflicts_with = "miri_only")]
    asan_only: bool,
    /// Miri only
    #[arg(long)]
    miri_only: bool,
}

pub fn sanitize(a: &SanitizeArgs) -> Result<()> {
    let allow_no_miri = a.allow_no_miri;
    let (run_asan, run_miri) = (!a.miri_only, !a.asan_only);
    if run_asan {
        let t = Instant::now();
        asan(&host_triple()?)?;
        eprintln!(
            "xtask sanitize: AddressSanitizer passed in {:.0} s",
            t.elapsed().as_secs_f64()
        );
    }
    if run_miri {
        let t = Instant::now();
        match miri() {
            Ok(()) => eprintln!("xtask sanitize: Miri passed in {:.0} s", t.elapsed().as_secs_f64()),
            Err(e) if allow_no_miri && !has_miri() => eprintln!("xtask sanitize: WARNING: Miri skipped: {e:#}"),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

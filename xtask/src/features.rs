//! `cargo xtask same-features`: the builds this project makes one after another resolve the
//! same features for every crate they share, so each reuses the artifacts the one before
//! left in `target/`.
//!
//! Cargo resolves features per build, over the packages the build selects: `cargo build
//! --release -p fpt-cli` (`cargo install`, `cargo xtask reproduce`, CI's fetch), `pip install
//! ./crates/fpt-py` (maturin: `-p fpt-py`) and `cargo test --release --workspace` each see
//! only their own dependency graph. A crate that one of them asks for with one more feature
//! (numpy's `num-complex/std`, tracing-subscriber's `tracing-core/default`) gets a new
//! fingerprint in the others, and with it everything above it: gemm, candle-core and every
//! fpt crate, minutes of a 2-core build each time. This check reads the features `cargo
//! tree` shows for each crate of each selection and fails naming every crate whose differ.

use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet};

/// A build's features, crate by crate.
type Features = BTreeMap<String, BTreeSet<String>>;

/// Parses `cargo tree --format "{p}|{f}" --prefix none` output: a line per crate, `name
/// vX.Y.Z [(source)]|f1,f2` (with ` (*)` after a crate shown before), its enabled features.
fn parse_tree(text: &str) -> Features {
    let mut out = Features::new();
    for line in text.lines() {
        let Some((package, feats)) = line.split_once('|') else {
            continue;
        };
        let mut words = package.split_whitespace();
        let (Some(name), Some(version)) = (words.next(), words.next()) else {
            continue;
        };
        let feats = feats.trim_end().trim_end_matches("(*)").trim_end();
        out.entry(format!("{name} {version}"))
            .or_default()
            .extend(feats.split(',').filter(|f| !f.is_empty()).map(str::to_string));
    }
    out
}

/// Every crate both builds hold whose features differ, as readable lines.
fn differences(wide: &Features, narrow: &Features) -> Vec<String> {
    let mut out = Vec::new();
    for (name, feats) in narrow {
        let Some(w) = wide.get(name) else { continue };
        if w != feats {
            let only_wide: Vec<_> = w.difference(feats).cloned().collect();
            let only_narrow: Vec<_> = feats.difference(w).cloned().collect();
            out.push(format!(
                "{name}: only in the workspace build {only_wide:?}, only in this one {only_narrow:?}"
            ));
        }
    }
    out
}

fn tree(selection: &[&str], edges: &str) -> Result<Features> {
    let out = super::cargo_command()
        .current_dir(super::root())
        .arg("tree")
        .args(selection)
        .args(["-e", edges, "--format", "{p}|{f}", "--prefix", "none"])
        .output()
        .context("running cargo tree")?;
    if !out.status.success() {
        bail!(
            "cargo tree {} failed: {}",
            selection.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(parse_tree(&String::from_utf8_lossy(&out.stdout)))
}

/// `cargo xtask same-features`.
pub fn check() -> Result<()> {
    // The test build: every member, dev-dependencies too.
    let wide = tree(&["--workspace"], "normal,build,dev")?;
    let mut bad = Vec::new();
    for (what, sel) in [
        ("cargo build --release -p fpt-cli", ["-p", "fpt-cli"]),
        ("pip install ./crates/fpt-py (maturin)", ["-p", "fpt-py"]),
    ] {
        let narrow = tree(&sel, "normal,build")?;
        let diff = differences(&wide, &narrow);
        if diff.is_empty() {
            eprintln!(
                "xtask same-features: `{what}` resolves the workspace's features for all its {} crates",
                narrow.len()
            );
        } else {
            bad.push(format!("`{what}`:\n  {}", diff.join("\n  ")));
        }
    }
    if !bad.is_empty() {
        bail!(
            "builds that rebuild what the test build made, for these crates' features (unify them: \
             see crates/fpt-nn/Cargo.toml's num-complex):\n{}",
            bad.join("\n")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_feature_one_build_adds_is_named_and_a_crate_only_one_build_holds_is_not() {
        let wide = parse_tree(
            "num-complex v0.4.6|bytemuck,default,std\nnumpy v0.25.0|default\ngemm v0.19.0|\n\
             num-complex v0.4.6|bytemuck,default,std (*)\n",
        );
        let narrow = parse_tree("num-complex v0.4.6|bytemuck\ngemm v0.19.0|\nclap v4.6.0 |std\n");
        let d = differences(&wide, &narrow);
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(
            d[0].starts_with("num-complex v0.4.6:") && d[0].contains("\"std\"") && !d[0].contains("\"bytemuck\""),
            "{d:?}"
        );
        assert!(differences(&wide, &wide).is_empty());
    }
}

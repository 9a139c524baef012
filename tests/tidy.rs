//! Tidy checks of the workspace itself (in the manner of rust-analyzer's): the map in
//! ARCHITECTURE.md names every module and its dependency line is the manifests'; the facade's
//! docs name every backbone and task; no workspace dependency goes unused; no placeholder
//! metadata; no source file is a hall.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every `.rs` file below `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

fn crate_dirs() -> Vec<PathBuf> {
    let mut d: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    d.sort();
    d
}

#[test]
fn every_module_file_is_named_in_architecture_md() {
    let map = read(&root().join("ARCHITECTURE.md"));
    let mut missing = Vec::new();
    let mut dirs: Vec<PathBuf> = crate_dirs().into_iter().map(|c| c.join("src")).collect();
    dirs.push(root().join("xtask/src"));
    for dir in dirs {
        for f in rust_files(&dir) {
            let name = f.file_name().unwrap().to_string_lossy().to_string();
            if ["lib.rs", "main.rs", "mod.rs"].contains(&name.as_str()) {
                continue;
            }
            // By its name, or as the end of a path (`ops/residual_branch.rs`).
            if !map.contains(&format!("`{name}`")) && !map.contains(&format!("/{name}`")) {
                missing.push(f.strip_prefix(root()).unwrap().display().to_string());
            }
        }
    }
    assert!(missing.is_empty(), "ARCHITECTURE.md does not name: {missing:?}");
}

#[test]
fn the_dependency_line_is_the_manifests() {
    let map = read(&root().join("ARCHITECTURE.md"));
    let at = map.find("## Dependency direction").expect("a dependency section");
    let line = map[at..].lines().nth(1).unwrap();
    // Groups separated by `<-`; each crate may depend only on crates of earlier groups.
    let groups: Vec<Vec<String>> = line
        .split("<-")
        .map(|g| {
            g.split('`')
                .filter(|s| s.starts_with("fpt-"))
                .map(String::from)
                .collect()
        })
        .collect();
    let group_of = |c: &str| groups.iter().position(|g| g.iter().any(|x| x == c));
    let mut named = 0;
    for dir in crate_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let g = group_of(&name).unwrap_or_else(|| panic!("{name} is not on the dependency line: {line}"));
        named += 1;
        let manifest = read(&dir.join("Cargo.toml"));
        let deps = manifest.split("[dependencies]").nth(1).unwrap_or("");
        let deps = deps.split("\n[").next().unwrap_or("");
        for dep in deps
            .lines()
            .filter_map(|l| l.split(['.', ' ', '=']).next())
            .filter(|d| d.starts_with("fpt-"))
        {
            let dg = group_of(dep).unwrap_or_else(|| panic!("{name} depends on {dep}, which is not on the line"));
            assert!(
                dg < g,
                "{name} depends on {dep}, which the line puts at or after it: {line}"
            );
        }
    }
    assert_eq!(
        named,
        groups.iter().map(Vec::len).sum::<usize>(),
        "the line names a crate that is not here: {line}"
    );
}

#[test]
fn the_facade_docs_name_every_backbone_and_task() {
    let docs = read(&root().join("src/lib.rs"));
    // A new task or architecture does not compile here until it has a name to look for.
    let task_word = |t: fpt::spec::TaskName| match t {
        fpt::spec::TaskName::BitMemory => "Bit Memory",
        fpt::spec::TaskName::BitXor => "Bit XOR",
        fpt::spec::TaskName::ListOps => "ListOps",
        fpt::spec::TaskName::Mnist => "MNIST",
        fpt::spec::TaskName::FashionMnist => "Fashion-MNIST",
        fpt::spec::TaskName::Cifar10 => "CIFAR-10",
        fpt::spec::TaskName::Cifar10Lra => "CIFAR-10 LRA",
        fpt::spec::TaskName::Homology => "remote homology",
        fpt::spec::TaskName::Custom => "JSONL",
        fpt::spec::TaskName::Text => "text corpora",
    };
    for t in fpt::spec::TaskName::ALL {
        assert!(docs.contains(task_word(t)), "src/lib.rs does not name the task {t}");
    }
    // Every registered architecture, by each of its names: registering one is enough for
    // this test to ask for it.
    for r in fpt::backbones::ARCHITECTURES {
        assert!(!r.names.is_empty(), "a registration has no name: {r:?}");
        for name in r.names {
            assert!(docs.contains(name), "src/lib.rs does not name the backbone {name}");
        }
    }
}

#[test]
fn every_workspace_dependency_is_used_and_no_metadata_is_a_placeholder() {
    let ws = read(&root().join("Cargo.toml"));
    let deps = ws
        .split("[workspace.dependencies]")
        .nth(1)
        .unwrap()
        .split("\n[")
        .next()
        .unwrap();
    let mut manifests = vec![read(&root().join("Cargo.toml"))];
    manifests.extend(crate_dirs().iter().map(|d| read(&d.join("Cargo.toml"))));
    manifests.push(read(&root().join("xtask/Cargo.toml")));
    for name in deps
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split('=').next())
        .map(str::trim)
        .filter(|n| !n.is_empty())
    {
        let used = manifests.iter().any(|m| {
            m.contains(&format!("{name}.workspace = true")) || m.contains(&format!("{name} = {{ workspace = true"))
        });
        assert!(used, "workspace dependency `{name}` is used by no member");
    }
    for (i, m) in manifests.iter().enumerate() {
        for placeholder in ["example.invalid", "example.com", "TODO", "FIXME", "not used yet"] {
            assert!(
                !m.contains(placeholder),
                "manifest {i} holds the placeholder `{placeholder}`"
            );
        }
    }
}

#[test]
fn no_source_file_is_a_hall() {
    // The matrix product's kernels are one file on purpose (its invariants are local).
    let mut dirs: Vec<PathBuf> = crate_dirs();
    dirs.push(root().join("xtask"));
    for dir in dirs {
        for f in rust_files(&dir) {
            if f.ends_with("ops/sgemm.rs") {
                continue;
            }
            let lines = read(&f).lines().count();
            assert!(lines <= 800, "{} has {lines} lines: split it by concept", f.display());
        }
    }
}

/// Every copy between the host and a device tensor goes through `fpt_nn::transfer`, which
/// counts them (a steady training step's copies are tested in
/// `crates/fpt-train/tests/transfers.rs`): candle's own constructors from host data and
/// read-backs appear outside it only where no device copy can happen or none happens
/// inside a training step, file by file with the reason, and the count is pinned so a new
/// one is either routed through `transfer` or added here with its reason.
#[test]
fn host_device_copies_go_through_the_counted_place() {
    const ALLOWED: &[(&str, usize, &str)] = &[
        (
            "crates/fpt-nn/src/transfer.rs",
            7,
            "the counted place itself (two for the FPT_CHECK_DEVICE read-back)",
        ),
        // CPU-only kernels: their results are made on the host for the host.
        (
            "crates/fpt-nn/src/layers.rs",
            1,
            "CPU: a frozen bias read for the packed product",
        ),
        (
            "crates/fpt-nn/src/ops/attention.rs",
            1,
            "CPU: the fused attention's gradient",
        ),
        ("crates/fpt-nn/src/ops/bf16.rs", 2, "CPU: the bf16 product's results"),
        ("crates/fpt-nn/src/ops/gelu.rs", 1, "CPU: the fused GELU's gradient"),
        (
            "crates/fpt-nn/src/ops/layer_norm.rs",
            10,
            "CPU: the fused norms' gradients",
        ),
        ("crates/fpt-nn/src/ops/linear.rs", 5, "CPU: the products' gradients"),
        (
            "crates/fpt-nn/src/ops/loss.rs",
            6,
            "CPU: the fused loss's gradient; `correct` in evaluation",
        ),
        ("crates/fpt-nn/src/ops/lstm.rs", 1, "CPU: the fused LSTM's gradient"),
        (
            "crates/fpt-nn/src/ops/mod.rs",
            1,
            "CPU: grad_like, the fused ops' gradients",
        ),
        (
            "crates/fpt-nn/src/ops/rotary.rs",
            3,
            "CPU: the fused rotary op's results",
        ),
        (
            "crates/fpt-nn/src/ops/softmax.rs",
            2,
            "CPU: the fused softmax's gradients",
        ),
        ("crates/fpt-nn/src/ops/swiglu.rs", 4, "CPU: the fused SwiGLU's results"),
        // Once, when a model is built or loaded.
        ("crates/fpt-nn/src/init.rs", 2, "weights drawn at construction"),
        (
            "crates/fpt-model/src/lib.rs",
            2,
            "the output layer drawn at construction",
        ),
        (
            "crates/fpt-backbones/src/lstm.rs",
            1,
            "the LSTM's weights drawn at construction",
        ),
        ("crates/fpt-backbones/src/load.rs", 3, "weights read at load"),
        ("crates/fpt-backbones/src/weights.rs", 1, "weights read at load"),
        (
            "crates/fpt-backbones/src/gguf.rs",
            1,
            "GGUF weights dequantized at load",
        ),
        // Outside the training step.
        (
            "crates/fpt-backbones/src/golden.rs",
            8,
            "the self-check's golden comparisons",
        ),
        ("crates/fpt-train/src/trajectory.rs", 4, "the self-check's trajectories"),
        ("crates/fpt-train/src/checkpoint.rs", 2, "checkpoints written and read"),
        (
            "crates/fpt-train/src/optim.rs",
            1,
            "grad_norm of the CPU baselines' loops",
        ),
        (
            "crates/fpt-train/src/linear_baseline.rs",
            5,
            "the linear baseline (CPU)",
        ),
        (
            "crates/fpt-train/src/output_only.rs",
            2,
            "output-only training on cached features",
        ),
        ("crates/fpt-tasks/src/baseline.rs", 2, "trivial baselines computed once"),
        (
            "crates/fpt-ablate/src/figure.rs",
            3,
            "figures drawn from trained models (on the CPU: attention, weights, the example's inputs)",
        ),
        ("crates/fpt-cli/src/forward.rs", 1, "`fpt forward` writes its result"),
    ];
    let raw = [
        "Tensor::from_vec(",
        "Tensor::new(",
        "Tensor::from_slice(",
        ".to_device(",
        ".to_vec1",
        ".to_vec2",
        ".to_vec3",
        ".to_scalar",
    ];
    // Modules compiled for tests only (`#[cfg(test)] mod ...;`): no device there.
    const TEST_ONLY: &[&str] = &[
        "crates/fpt-nn/src/host_grid.rs",
        "crates/fpt-nn/src/ops/attention_tiled_tests.rs",
    ];
    let mut found = Vec::new();
    for dir in crate_dirs() {
        for f in rust_files(&dir.join("src")) {
            let rel = f.strip_prefix(root()).unwrap().to_string_lossy().replace('\\', "/");
            if TEST_ONLY.contains(&rel.as_str()) {
                continue;
            }
            let text = read(&f);
            let mut n = 0;
            for line in text.lines() {
                let l = line.trim_start();
                if l.starts_with("#[cfg(test)]") {
                    break; // the unit tests at the end of a file
                }
                if !l.starts_with("//") && raw.iter().any(|r| l.contains(r)) {
                    n += 1;
                }
            }
            if n > 0 {
                found.push((rel, n));
            }
        }
    }
    let mut wrong = Vec::new();
    for (file, n) in &found {
        match ALLOWED.iter().find(|(f, _, _)| f == file) {
            Some((_, want, _)) if want == n => {}
            Some((_, want, why)) => wrong.push(format!("{file}: {n} raw copies, {want} allowed ({why})")),
            None => wrong.push(format!("{file}: {n} raw copies; use fpt_nn::transfer")),
        }
    }
    for (file, want, _) in ALLOWED {
        if !found.iter().any(|(f, _)| f == file) {
            wrong.push(format!("{file}: {want} allowed, none found (update the table)"));
        }
    }
    assert!(
        wrong.is_empty(),
        "host-device copies outside fpt_nn::transfer:\n{}",
        wrong.join("\n")
    );
}

/// fpt-nn's blocked product (`ops/sgemm.rs`) never names its bf16 variant (`ops/bf16.rs`,
/// which builds on it and hands it its micro-kernel as a `PanelFormat`): the dependency runs
/// one way.
#[test]
fn the_bf16_product_builds_on_sgemm_not_the_reverse() {
    let sgemm = read(&root().join("crates/fpt-nn/src/ops/sgemm.rs"));
    let bad: Vec<&str> = sgemm
        .lines()
        .filter(|l| !l.trim_start().starts_with("//") && (l.contains("bf16::") || l.contains("super::bf16")))
        .collect();
    assert!(bad.is_empty(), "ops/sgemm.rs names ops/bf16.rs: {bad:?}");
    let bf16 = read(&root().join("crates/fpt-nn/src/ops/bf16.rs"));
    assert!(
        bf16.contains("super::sgemm::"),
        "ops/bf16.rs is expected to build on ops/sgemm.rs"
    );
}

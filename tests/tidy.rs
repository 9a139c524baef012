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

//! Records the git commit (with `+dirty` when the tree differs from it) and the build
//! profile, for the provenance every result records (`selfcheck::build_info`).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(c) if !c.is_empty() => {
            let dirty = git(&["--no-optional-locks", "status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{c}+dirty")
            } else {
                c
            }
        }
        _ => "unknown".into(),
    };
    println!("cargo:rustc-env=FPT_GIT_COMMIT={commit}");
    println!(
        "cargo:rustc-env=FPT_BUILD_PROFILE={}",
        std::env::var("PROFILE").unwrap_or_else(|_| "unknown".into())
    );
    // A new commit, or any change to the sources or fixtures, reruns this script.
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={git_dir}/HEAD");
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={git_dir}/{r}");
        }
    }
    for dir in ["../../crates", "../../data", "../../src", "../../xtask/src"] {
        println!("cargo:rerun-if-changed={dir}");
    }
}

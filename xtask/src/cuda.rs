//! The CUDA path on a machine without a GPU or a system CUDA toolkit:
//! - `cargo xtask cuda-toolkit [--dir DIR]` installs the CUDA 13.0 toolkit parts from PyPI
//!   wheels into a virtual environment (nvcc and headers, the runtime, cuBLAS, cuRAND,
//!   NVRTC, CCCL), links the unversioned names the linker wants, builds a link stub
//!   `libcuda.so` (SONAME `libcuda.so.1`, every driver symbol cudarc declares, empty: the
//!   real driver is loaded at run time on the GPU machine), and writes `DIR/env.sh`.
//! - `cargo xtask cuda-build` builds `fpt` with `--features cuda` under that environment
//!   into `target/cuda/release/fpt` (kernels for `CUDA_COMPUTE_CAP`, default 90: H100/H200).
//! - `cargo xtask gpu-check [--device D] [--out FILE]` builds it and runs `fpt gpu-check`
//!   (on a GPU machine, run the carried binary: `target/cuda/release/fpt gpu-check`).
//!
//! CUDA 13.0 because the device machines' driver (580) is CUDA 13.0: a newer toolkit's
//! kernels and driver calls would not load there.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The wheels, pinned to CUDA 13.0.
const WHEELS: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.88",
    // nvcc's dependencies, pinned too: unpinned, pip takes the newest (13.5), whose cicc
    // writes PTX 9.5 that 13.0's ptxas refuses.
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-nvrtc==13.0.88",
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-cublas==13.0.2.14",
    "nvidia-curand==10.4.0.35",
];

fn default_dir() -> PathBuf {
    super::root().join("target").join("cuda-toolkit")
}

/// Where the CUDA toolkit lives.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DirArgs {
    /// The toolkit's directory [default: target/cuda-toolkit]
    #[arg(long)]
    dir: Option<PathBuf>,
}

impl DirArgs {
    fn dir(&self) -> PathBuf {
        self.dir.clone().unwrap_or_else(default_dir)
    }
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let st = cmd.status().with_context(|| format!("running {what}"))?;
    if !st.success() {
        bail!("{what} failed ({st})");
    }
    Ok(())
}

/// The `nvidia/cu13` directory of the venv's site-packages.
fn cuda_root(dir: &Path) -> Result<PathBuf> {
    let lib = dir.join("venv").join("lib");
    for e in std::fs::read_dir(&lib).with_context(|| format!("reading {}", lib.display()))? {
        let p = e?.path().join("site-packages").join("nvidia").join("cu13");
        if p.join("bin").is_dir() {
            return Ok(p);
        }
    }
    bail!(
        "no nvidia/cu13 with a bin/ under {} (did the pip install finish?)",
        lib.display()
    )
}

/// The driver functions cudarc declares (`fn cu...(` in its driver bindings), from the
/// registry copy cargo fetched.
fn driver_symbols() -> Result<Vec<String>> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .context("no CARGO_HOME or HOME")?;
    let mut found = std::collections::BTreeSet::new();
    let src = home.join("registry").join("src");
    let mut stack: Vec<PathBuf> = std::fs::read_dir(&src)
        .with_context(|| format!("reading {}", src.display()))?
        .flatten()
        .flat_map(|reg| std::fs::read_dir(reg.path()).into_iter().flatten().flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with("cudarc-"))
        .map(|e| e.path().join("src").join("driver"))
        .collect();
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                for line in text.lines() {
                    let l = line.trim();
                    let l = l.strip_prefix("pub ").unwrap_or(l);
                    let l = l.strip_prefix("unsafe ").unwrap_or(l);
                    if let Some(rest) = l.strip_prefix("fn cu") {
                        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                        if rest[name.len()..].starts_with('(') {
                            found.insert(format!("cu{name}"));
                        }
                    }
                }
            }
        }
    }
    if found.is_empty() {
        bail!(
            "no cudarc driver bindings under {} (run `cargo fetch` first)",
            src.display()
        );
    }
    Ok(found.into_iter().collect())
}

pub fn toolkit(args: &DirArgs) -> Result<()> {
    let dir = args.dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let venv = dir.join("venv");
    if !venv.join("bin").join("pip").is_file() {
        eprintln!("xtask cuda-toolkit: a virtual environment at {}", venv.display());
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            "python3 -m venv",
        )?;
    }
    eprintln!("xtask cuda-toolkit: pip install {}", WHEELS.join(" "));
    run(
        Command::new(venv.join("bin").join("pip"))
            .args(["install", "--disable-pip-version-check", "-q"])
            .args(WHEELS),
        "pip install (the CUDA 13.0 wheels)",
    )?;
    let root = cuda_root(&dir)?;
    // The linker wants unversioned names; the wheels ship `libX.so.N` only.
    let link = dir.join("lib");
    std::fs::create_dir_all(&link)?;
    for e in std::fs::read_dir(root.join("lib"))?.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if let Some((base, _)) = name.split_once(".so.") {
            let to = link.join(format!("{base}.so"));
            let _ = std::fs::remove_file(&to);
            std::os::unix::fs::symlink(e.path(), &to)?;
        }
    }
    // cudarc's driver symbols come from the registry: fetch the cuda build's crates first.
    run(
        super::cargo_command().current_dir(super::root()).args(["fetch"]),
        "cargo fetch",
    )?;
    let syms = match driver_symbols() {
        Ok(s) => s,
        Err(_) => {
            // cudarc is only fetched when a cuda build resolves it: resolve one.
            run(
                super::cargo_command()
                    .current_dir(super::root())
                    .args(["metadata", "--format-version", "1", "--features", "cuda", "-q"])
                    .stdout(std::process::Stdio::null()),
                "cargo metadata --features cuda",
            )?;
            driver_symbols()?
        }
    };
    let c = dir.join("libcuda-stub.c");
    let mut text = String::from(
        "/* Link stub for libcuda.so (generated by cargo xtask cuda-toolkit): every driver\n   function cudarc declares, empty. Never loaded: the binary names libcuda.so.1, the\n   GPU machine's driver. */\n",
    );
    for s in &syms {
        text.push_str(&format!("int {s}(void) {{ return 999; }}\n"));
    }
    std::fs::write(&c, text)?;
    run(
        Command::new("cc")
            .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
            .arg(link.join("libcuda.so"))
            .arg(&c),
        "cc (the libcuda link stub)",
    )?;
    let env = dir.join("env.sh");
    let r = root.display();
    let l = link.display();
    std::fs::write(
        &env,
        format!(
            "# Written by cargo xtask cuda-toolkit: the environment candle's CUDA build needs.\n\
             export CUDA_ROOT={r}\nexport CUDA_PATH={r}\nexport CUDA_HOME={r}\nexport CUDA_TOOLKIT_ROOT_DIR={r}\n\
             export PATH={r}/bin:$PATH\nexport LIBRARY_PATH={l}:{r}/lib:${{LIBRARY_PATH:-}}\n\
             export LD_LIBRARY_PATH={r}/lib:${{LD_LIBRARY_PATH:-}}\n\
             export CUDA_COMPUTE_CAP=${{CUDA_COMPUTE_CAP:-90}}\n"
        ),
    )?;
    eprintln!(
        "xtask cuda-toolkit: ready ({} driver symbols in the stub); `source {}` or `cargo xtask cuda-build`",
        syms.len(),
        env.display()
    );
    Ok(())
}

/// `cargo` with the toolkit's environment.
fn cargo_with_env(dir: &Path) -> Result<Command> {
    let root = cuda_root(dir).context("run `cargo xtask cuda-toolkit` first")?;
    let link = dir.join("lib");
    let path = format!(
        "{}:{}",
        root.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = super::cargo_command();
    cmd.current_dir(super::root())
        .env("CUDA_ROOT", &root)
        .env("CUDA_PATH", &root)
        .env("CUDA_HOME", &root)
        .env("CUDA_TOOLKIT_ROOT_DIR", &root)
        .env("PATH", path)
        .env(
            "LIBRARY_PATH",
            format!("{}:{}", link.display(), root.join("lib").display()),
        )
        .env("LD_LIBRARY_PATH", root.join("lib"))
        .env(
            "CUDA_COMPUTE_CAP",
            std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into()),
        );
    Ok(cmd)
}

/// Lints the CUDA code: `cargo clippy -D warnings` of fpt-nn, fpt-train and fpt-cli with
/// `--features cuda` in `target/cuda`. Every crate and kernel is compiled (candle's and
/// fpt's by nvcc, in their build scripts) but nothing is linked: a clean checkout's CI
/// runs this instead of [`build`], some minutes shorter.
pub fn clippy(args: &DirArgs) -> Result<()> {
    let dir = args.dir();
    let t0 = std::time::Instant::now();
    let target = super::root().join("target").join("cuda");
    run(
        cargo_with_env(&dir)?
            .args(["clippy", "-p", "fpt-nn", "-p", "fpt-train", "-p", "fpt-cli"])
            .args(["--features", "cuda", "--target-dir"])
            .arg(&target)
            .args(["--", "-D", "warnings"]),
        "cargo clippy --features cuda",
    )?;
    eprintln!(
        "xtask cuda-clippy: the CUDA code is lint-free ({:.0} s)",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Builds the release `fpt` with `--features cuda`; returns its path.
pub fn build(args: &DirArgs) -> Result<PathBuf> {
    let dir = args.dir();
    let t0 = std::time::Instant::now();
    // A target directory of its own: the CUDA binary needs the driver to start, the CPU
    // one (target/release/fpt) must keep working here.
    let target = super::root().join("target").join("cuda");
    eprintln!(
        "xtask cuda-build: cargo build --release -p fpt-cli --features cuda --target-dir {}",
        target.display()
    );
    run(
        cargo_with_env(&dir)?
            .args([
                "build",
                "--release",
                "-p",
                "fpt-cli",
                "--features",
                "cuda",
                "--target-dir",
            ])
            .arg(&target),
        "cargo build --features cuda",
    )?;
    let bin = target.join("release").join("fpt");
    eprintln!(
        "xtask cuda-build: {} built in {:.0} s",
        bin.display(),
        t0.elapsed().as_secs_f64()
    );
    // What a GPU machine without Rust gets: the binary stripped and gzipped (the kernels'
    // PTX makes it 67 MB stripped, over what a device call carries; 19 MB gzipped).
    let carry = target.join("fpt-cuda.gz");
    let stripped = target.join("fpt-cuda");
    std::fs::copy(&bin, &stripped).with_context(|| format!("copying {}", bin.display()))?;
    run(Command::new("strip").arg(&stripped), "strip")?;
    let gz = std::fs::File::create(&carry).with_context(|| format!("creating {}", carry.display()))?;
    run(
        Command::new("gzip").args(["-c", "-6"]).arg(&stripped).stdout(gz),
        "gzip",
    )?;
    eprintln!(
        "xtask cuda-build: {} to carry to a GPU machine (`gunzip -c fpt-cuda.gz > fpt && chmod +x fpt`)",
        carry.display()
    );
    Ok(bin)
}

/// `cargo xtask gpu-check`'s flags (all but `--dir` go to `fpt gpu-check`).
#[derive(Debug, clap::Args)]
pub struct GpuCheckArgs {
    #[command(flatten)]
    toolkit: DirArgs,
    /// Device: `cuda:N`, or `cpu` to try the command end to end with the ordinary build
    #[arg(long)]
    device: Option<String>,
    /// Where `fpt gpu-check` writes its JSON
    #[arg(long)]
    out: Option<PathBuf>,
    /// Steps of the training run on each device
    #[arg(long)]
    steps: Option<usize>,
    /// The bench shape
    #[arg(long)]
    shape: Option<String>,
}

pub fn gpu_check(a: &GpuCheckArgs) -> Result<()> {
    let mut pass: Vec<String> = Vec::new();
    if let Some(d) = &a.device {
        pass.extend(["--device".into(), d.clone()]);
    }
    if let Some(o) = &a.out {
        pass.extend(["--out".into(), o.display().to_string()]);
    }
    if let Some(n) = a.steps {
        pass.extend(["--steps".into(), n.to_string()]);
    }
    if let Some(s) = &a.shape {
        pass.extend(["--shape".into(), s.clone()]);
    }
    // `--device cpu` tries the command end to end with the ordinary build.
    let cpu = a.device.as_deref() == Some("cpu");
    let bin = if cpu { super::build_fpt()? } else { build(&a.toolkit)? };
    run(Command::new(&bin).arg("gpu-check").args(&pass), "fpt gpu-check")
}

//! Sweeps on a Slurm cluster: `cargo xtask slurm-script` writes the sbatch scripts of a sharded
//! sweep (build, prepare, an array of shards, merge, each job depending on the one before),
//! and `cargo xtask slurm-check` proves them under a real Slurm on this machine: a one-node
//! cluster from Debian's packages (slurmctld, slurmd, munge), as root, without systemd or
//! cgroups, started here and torn down at the end, also on failure.
//!
//! The sweep's shape (the same in both):
//! - a **prepare** job fetches the data and models once and runs `fpt selfcheck`; the shards
//!   depend on it (`--dependency=afterok`), so no two nodes fetch the same asset;
//! - an **array** of N shards, `fpt run-table ... --shard I/N`: each trains a disjoint,
//!   deterministic slice of the distinct runs (by spec hash) into its own directory; a
//!   shard submitted again skips its finished runs and resumes an interrupted one from its
//!   checkpoint. A Bit-pretrained backbone that several shards need is built once, under a
//!   file lock in the shared `$FPT_HOME/backbones`;
//! - a **merge** gathers the shards' runs and renders every report (`cargo xtask merge`).
//!
//! On a cluster, the repository (with its `target/` and the shard directories) and
//! `$FPT_HOME` must be on a filesystem every node sees.

use crate::{mmss, root};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// What a sweep runs and how its jobs are asked for.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// Table and figure ids (`all` for every one).
    pub ids: Vec<String>,
    /// `smoke`, `cpu` or `paper`.
    pub scale: String,
    /// Array tasks.
    pub shards: usize,
    /// Where the shard directories (`shard-I`), the merged results and the logs go.
    pub out: PathBuf,
    /// The `fpt` binary every job runs.
    pub bin: PathBuf,
    /// GPUs per shard (0: a CPU sweep).
    pub gpus: usize,
    /// CPU cores per shard.
    pub cpus: usize,
    /// Time limit per job, hours (`None`: the partition's).
    pub hours: Option<u32>,
    /// Partition (`None`: the default).
    pub partition: Option<String>,
    /// Runs at once inside a shard (`fpt run-table --jobs`).
    pub jobs: usize,
}

impl Sweep {
    fn header(&self, name: &str, log: &str, cpus: usize, gpus: usize) -> String {
        let mut h = format!(
            "#!/usr/bin/env bash\n#SBATCH --job-name={name}\n#SBATCH --output={}/{log}\n#SBATCH --cpus-per-task={cpus}\n",
            self.out.join("logs").display()
        );
        if gpus > 0 {
            h.push_str(&format!("#SBATCH --gres=gpu:{gpus}\n"));
        }
        if let Some(t) = self.hours {
            h.push_str(&format!("#SBATCH --time={t}:00:00\n"));
        }
        if let Some(p) = &self.partition {
            h.push_str(&format!("#SBATCH --partition={p}\n"));
        }
        h.push_str("set -euo pipefail\n");
        h
    }

    fn device(&self) -> &'static str {
        if self.gpus > 0 {
            " --device cuda"
        } else {
            ""
        }
    }

    /// The job that fetches every asset once and checks the build.
    pub fn prepare_script(&self) -> String {
        let bin = self.bin.display();
        // On a GPU sweep the self-check runs on a GPU too.
        let mut s = self.header("fpt-prepare", "prepare-%j.log", 1, self.gpus.min(1));
        s.push_str("# Fetch what the tables use (an asset that cannot be had is reported by the shards'\n# cells as unavailable), then check this build against the committed references.\n");
        s.push_str(&format!(
            "for asset in $({bin} run-table {} --scale {} --tables {} --assets); do\n    {bin} fetch \"$asset\" || echo \"fpt-prepare: could not fetch $asset\"\ndone\n",
            self.ids.join(" "),
            self.scale,
            root().join("data/tables").display()
        ));
        s.push_str(&format!("{bin} selfcheck{}\n", self.device()));
        s
    }

    /// The array job: shard `$SLURM_ARRAY_TASK_ID` of `shards`.
    pub fn shard_script(&self) -> String {
        let mut s = self.header("fpt-shard", "shard-%A_%a.log", self.cpus, self.gpus);
        s.push_str(&format!(
            "# Shard I of {n}: a disjoint slice of the distinct runs; submitted again, it skips its\n# finished runs and resumes an interrupted one from its checkpoint.\nI=${{SLURM_ARRAY_TASK_ID:?submit as an array job: sbatch --array=0-{last}}}\nexport RAYON_NUM_THREADS=${{SLURM_CPUS_PER_TASK:-{cpus}}}\nexec {bin} run-table {ids} --scale {scale} --tables {tables} --shard \"$I/{n}\" --jobs {jobs}{device} --out {out}/shard-$I\n",
            n = self.shards,
            last = self.shards.saturating_sub(1),
            cpus = self.cpus,
            bin = self.bin.display(),
            ids = self.ids.join(" "),
            scale = self.scale,
            tables = root().join("data/tables").display(),
            jobs = self.jobs,
            device = self.device(),
            out = self.out.display(),
        ));
        s
    }

    /// The job that merges the shards and renders every report.
    pub fn merge_script(&self) -> String {
        let mut s = self.header("fpt-merge", "merge-%j.log", 1, 0);
        let shards: Vec<String> = (0..self.shards)
            .map(|i| format!("{}/shard-{i}", self.out.display()))
            .collect();
        s.push_str(&format!(
            "cd {}\n{} xtask merge --scale {} --out {}/merged {}\n",
            root().display(),
            crate::cargo(),
            self.scale,
            self.out.display(),
            shards.join(" ")
        ));
        s
    }

    /// Writes the scripts into `dir` and returns the commands that submit them.
    pub fn write(&self, dir: &Path) -> Result<Vec<String>> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::create_dir_all(self.out.join("logs")).with_context(|| format!("creating {}", self.out.display()))?;
        for (name, text) in [
            ("prepare.sh", self.prepare_script()),
            ("shard.sh", self.shard_script()),
            ("merge.sh", self.merge_script()),
        ] {
            let p = dir.join(name);
            std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        }
        let d = dir.display();
        Ok(vec![
            format!("P=$(sbatch --parsable {d}/prepare.sh)"),
            format!(
                "S=$(sbatch --parsable --dependency=afterok:$P --array=0-{} {d}/shard.sh)",
                self.shards.saturating_sub(1)
            ),
            format!("sbatch --dependency=afterok:$S {d}/merge.sh"),
        ])
    }
}

/// `cargo xtask slurm-script`'s flags.
#[derive(Debug, clap::Args)]
pub struct ScriptArgs {
    /// Scale of the sweep
    #[arg(long, default_value = "paper")]
    scale: String,
    /// Array tasks (shards)
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    shards: u64,
    /// GPUs per shard (0: a CPU sweep)
    #[arg(long, default_value_t = 1)]
    gpus_per_task: usize,
    /// CPU cores per shard
    #[arg(long, default_value_t = 8)]
    cpus_per_task: usize,
    /// Time limit per job, hours
    #[arg(long = "time", value_name = "HOURS", default_value_t = 48)]
    hours: u32,
    /// Partition [default: the cluster's]
    #[arg(long)]
    partition: Option<String>,
    /// Runs at once inside a shard (`fpt run-table --jobs`)
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Where shard directories, merged results and logs go [default: target/slurm/out]
    #[arg(long)]
    out: Option<PathBuf>,
    /// Where the scripts are written [default: target/slurm/scripts]
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Table and figure ids [default: all]
    ids: Vec<String>,
}

/// Writes a sweep's sbatch scripts and prints how to submit them.
pub fn script(a: &ScriptArgs) -> Result<()> {
    let mut sweep = Sweep {
        ids: a.ids.clone(),
        scale: a.scale.clone(),
        shards: a.shards as usize,
        out: a.out.clone().unwrap_or_else(|| root().join("target/slurm/out")),
        bin: root().join("target/release/fpt"),
        gpus: a.gpus_per_task,
        cpus: a.cpus_per_task,
        hours: Some(a.hours),
        partition: a.partition.clone(),
        jobs: a.jobs,
    };
    let dir = a.dir.clone().unwrap_or_else(|| root().join("target/slurm/scripts"));
    if sweep.ids.is_empty() {
        sweep.ids.push("all".into());
    }
    if sweep.gpus > 0 {
        eprintln!("xtask: the scripts run a CUDA build of fpt: build it first on a GPU node (FPT_CUDA=1 cargo xtask cuda-build, see docs/backbones.md, section GPU)");
    }
    let cmds = sweep.write(&dir)?;
    println!("# Scripts in {}; submit from a login node:", dir.display());
    for c in cmds {
        println!("{c}");
    }
    println!(
        "# Reports: {}/merged/<table>/{}/report.md",
        sweep.out.display(),
        sweep.scale
    );
    Ok(())
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A one-node Slurm cluster of this machine, stopped when dropped.
struct Cluster {
    conf: PathBuf,
    started_munged: bool,
}

impl Cluster {
    fn start(dir: &Path) -> Result<Cluster> {
        for d in ["state", "spool", "log"] {
            std::fs::create_dir_all(dir.join(d))?;
        }
        let host = run(Command::new("hostname").arg("-s"))?;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mem_kb: u64 = std::fs::read_to_string("/proc/meminfo")?
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .context("reading MemTotal from /proc/meminfo")?;
        let d = dir.display();
        let conf = dir.join("slurm.conf");
        std::fs::write(
            &conf,
            format!(
                "# A one-node cluster for `cargo xtask slurm-check`: no cgroups, no accounting.\n\
                 ClusterName=fptcheck\nSlurmctldHost={host}\nSlurmUser=root\nSlurmdUser=root\n\
                 AuthType=auth/munge\nCredType=cred/munge\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
                 SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nSchedulerType=sched/backfill\nMpiDefault=none\n\
                 ReturnToService=2\nMinJobAge=3600\nStateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
                 SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
                 SlurmctldLogFile={d}/log/slurmctld.log\nSlurmdLogFile={d}/log/slurmd.log\n\
                 JobCompType=jobcomp/none\nAccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none\n\
                 NodeName={host} CPUs={cpus} RealMemory={} State=UNKNOWN\n\
                 PartitionName=fpt Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
                mem_kb / 1024 * 9 / 10
            ),
        )?;
        // munged: the package's key; its directories as the daemon wants them.
        let started_munged = if Command::new("munge")
            .arg("-n")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            false
        } else {
            for d in ["/run/munge", "/var/log/munge", "/var/lib/munge"] {
                std::fs::create_dir_all(d)?;
                let _ = Command::new("chown").args(["munge:munge", d]).status();
            }
            run(Command::new("munged").arg("--force"))?;
            true
        };
        let cluster = Cluster { conf, started_munged };
        run(Command::new("slurmctld").arg("-f").arg(&cluster.conf))?;
        run(Command::new("slurmd").arg("-f").arg(&cluster.conf))?;
        let t0 = Instant::now();
        loop {
            let state = cluster.cmd("sinfo").args(["-h", "-o", "%t"]).output()?;
            let state = String::from_utf8_lossy(&state.stdout).trim().to_string();
            if state == "idle" {
                break;
            }
            if t0.elapsed() > Duration::from_secs(60) {
                bail!(
                    "the node did not become idle in 60 s (sinfo: `{state}`); see {}/log",
                    dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Ok(cluster)
    }

    /// A Slurm client command pointed at this cluster.
    fn cmd(&self, name: &str) -> Command {
        let mut c = Command::new(name);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    fn sbatch(&self, args: &[&str]) -> Result<String> {
        let id = run(self.cmd("sbatch").arg("--parsable").args(args))?;
        Ok(id.split(';').next().unwrap_or(&id).to_string())
    }

    /// Waits until job `id` (every task of an array) has left the queue, then returns each
    /// task's state as `scontrol show job` gives it.
    fn wait(&self, id: &str, limit: Duration) -> Result<Vec<(String, String)>> {
        let t0 = Instant::now();
        loop {
            let q = run(self.cmd("squeue").args(["-h", "-j", id, "-o", "%i %T"]))?;
            if q.is_empty() {
                break;
            }
            if t0.elapsed() > limit {
                bail!("job {id} still queued after {} s: {q}", limit.as_secs());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        self.states(id)
    }

    /// (task, state) of every task of job `id`: `<job>_<array index>` for an array's tasks.
    fn states(&self, id: &str) -> Result<Vec<(String, String)>> {
        let text = run(self.cmd("scontrol").args(["show", "job", id, "-o"]))?;
        Ok(text
            .lines()
            .map(|l| {
                let field = |k: &str| l.split_whitespace().find_map(|f| f.strip_prefix(k)).unwrap_or("");
                let task = match (field("ArrayJobId="), field("ArrayTaskId=")) {
                    ("", _) | (_, "") => field("JobId=").to_string(),
                    (job, i) => format!("{job}_{i}"),
                };
                (task, field("JobState=").to_string())
            })
            .collect())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.cmd("scontrol").arg("shutdown").output();
        std::thread::sleep(Duration::from_secs(1));
        if self.started_munged {
            let _ = Command::new("munged").arg("--stop").output();
        }
        eprintln!("xtask: slurm-check: the cluster is stopped");
    }
}

/// Every cell of the `ids` reports at `scale` under `dir`: (table, row, column, status,
/// number, run).
fn cells(dir: &Path, ids: &[&str], scale: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for id in ids {
        let p = dir.join(id).join(scale).join("report.json");
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?)
                .with_context(|| format!("{} is not JSON", p.display()))?;
        for c in r["cells"].as_array().into_iter().flatten() {
            out.push(format!(
                "{id} | {} | {} | {} | {} | {}",
                c["row"], c["col"], c["status"], c["ours"], c["run"]
            ));
        }
    }
    Ok(out)
}

/// Fails unless the reports under `a` and `b` have the same cells, numbers and run keys.
fn same_cells(a: &Path, b: &Path, ids: &[&str], scale: &str) -> Result<usize> {
    let (x, y) = (cells(a, ids, scale)?, cells(b, ids, scale)?);
    let differ: Vec<String> = x
        .iter()
        .zip(&y)
        .filter(|(p, q)| p != q)
        .map(|(p, q)| format!("  {p}\n  {q}"))
        .collect();
    if x.len() != y.len() || !differ.is_empty() {
        bail!(
            "the reports of {} and {} differ ({} vs {} cells):\n{}",
            a.display(),
            b.display(),
            x.len(),
            y.len(),
            differ.join("\n")
        );
    }
    let ran = x.iter().filter(|c| c.contains("| \"ran\" |")).count();
    Ok(ran)
}

/// Copies the finished runs of the shard directories into `out/runs`, then renders the
/// reports of `ids` from them.
fn merge(bin: &Path, shards: &[PathBuf], out: &Path, ids: &[&str], scale: &str) -> Result<()> {
    crate::gather_runs(shards, out)?;
    let mut args = vec!["run-table"];
    args.extend(ids);
    let tables = root().join("data/tables");
    let out_s = out.to_str().context("non-UTF-8 path")?;
    args.extend([
        "--scale",
        scale,
        "--tables",
        tables.to_str().context("non-UTF-8 path")?,
        "--out",
        out_s,
        "--report-only",
    ]);
    run(Command::new(bin).args(&args))?;
    Ok(())
}

/// `cargo xtask slurm-check`'s flags.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Array tasks (at least 2: one is cancelled in the second part)
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..))]
    shards: u64,
    /// Keep the two sweeps' result directories (`plain/`, `cancelled/`) afterwards
    #[arg(long)]
    keep: bool,
    /// The unsharded reference already made by this checkout's build: a directory holding
    /// Tables 2 and 13 at the smoke scale (`cargo xtask reproduce all --scale smoke --out
    /// DIR`, as CI's smoke stage writes it), compared against instead of running them again
    #[arg(long, value_name = "DIR")]
    reference: Option<PathBuf>,
}

/// The smoke scale of Tables 2 and 13 as a Slurm array job on a one-node cluster of this
/// machine, against an unsharded run; then again with one array task cancelled mid-run and
/// submitted anew.
pub fn check(a: &CheckArgs) -> Result<()> {
    let (shards, keep) = (a.shards as usize, a.keep);
    let uid = run(Command::new("id").arg("-u"))?;
    if uid != "0" {
        bail!("slurm-check starts slurmctld, slurmd and munged and may install them: run it as root");
    }
    let (ids, scale) = (["table2", "table13"], "smoke");
    if let Some(dir) = &a.reference {
        for id in ids {
            let p = dir.join(id).join(scale).join("report.json");
            if !p.is_file() {
                bail!(
                    "--reference {}: no {} (expected an unsharded run of {} at the {scale} scale there)",
                    dir.display(),
                    p.display(),
                    ids.join(" and ")
                );
            }
        }
    }
    let mut stages: Vec<(&str, f64)> = Vec::new();
    let t = Instant::now();
    if Command::new("slurmctld").arg("-V").output().is_err() {
        eprintln!("xtask: slurm-check: installing slurm-wlm and munge from Debian's packages");
        let install = || {
            Command::new("apt-get")
                .args(["install", "-y", "--no-install-recommends", "slurm-wlm", "munge"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .is_ok_and(|s| s.success())
        };
        if !install() {
            let _ = Command::new("apt-get").arg("update").status();
            if !install() {
                bail!("apt-get install slurm-wlm munge failed");
            }
        }
    }
    stages.push(("install", t.elapsed().as_secs_f64()));
    let t = Instant::now();
    // The default features, as `cargo test --release` builds them: CI builds nothing again.
    let bin = crate::build_fpt()?;
    stages.push(("build", t.elapsed().as_secs_f64()));
    let work = root().join("target/slurm-check");
    if work.exists() {
        std::fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    let t = Instant::now();
    let cluster = Cluster::start(&work.join("cluster"))?;
    stages.push(("cluster up", t.elapsed().as_secs_f64()));
    let sweep = |out: PathBuf| Sweep {
        ids: ids.iter().map(|s| s.to_string()).collect(),
        scale: scale.into(),
        shards,
        out,
        bin: bin.clone(),
        gpus: 0,
        cpus: 1,
        hours: None,
        partition: None,
        jobs: 1,
    };
    let shard_dirs = |out: &Path| (0..shards).map(|i| out.join(format!("shard-{i}"))).collect::<Vec<_>>();

    // The reference: the same tables, unsharded, on this machine (or as given).
    let t = Instant::now();
    let single = match &a.reference {
        Some(dir) => dir.clone(),
        None => {
            let single = work.join("single");
            let mut args = vec!["run-table"];
            args.extend(ids);
            args.extend(["--scale", scale, "--out", single.to_str().context("non-UTF-8 path")?]);
            run(Command::new(&bin).current_dir(root()).args(&args))?;
            single
        }
    };
    stages.push((
        if a.reference.is_some() {
            "unsharded run (given)"
        } else {
            "unsharded run"
        },
        t.elapsed().as_secs_f64(),
    ));

    // 1. The array job, to the end.
    // The sweep's scripts under `out/scripts`, submitted: the prepare job, then the array
    // depending on it; returns their job ids.
    let submit = |sweep: &Sweep| -> Result<(String, String)> {
        let scripts = sweep.out.join("scripts");
        sweep.write(&scripts)?;
        let path = |name: &str| scripts.join(name).to_str().map(String::from).context("non-UTF-8 path");
        let prep = cluster.sbatch(&[&path("prepare.sh")?])?;
        let array = cluster.sbatch(&[
            &format!("--dependency=afterok:{prep}"),
            &format!("--array=0-{}", shards - 1),
            &path("shard.sh")?,
        ])?;
        Ok((prep, array))
    };
    let t = Instant::now();
    let plain = sweep(work.join("plain"));
    let (prep, array) = submit(&plain)?;
    let limit = Duration::from_secs(1800);
    for (job, state) in cluster
        .wait(&prep, limit)?
        .into_iter()
        .chain(cluster.wait(&array, limit)?)
    {
        if state != "COMPLETED" {
            bail!("job {job} ended {state}; see {}", work.join("plain/logs").display());
        }
    }
    stages.push(("array job", t.elapsed().as_secs_f64()));
    let t = Instant::now();
    merge(&bin, &shard_dirs(&plain.out), &work.join("plain/merged"), &ids, scale)?;
    let ran = same_cells(&single, &work.join("plain/merged"), &ids, scale)?;
    eprintln!(
        "xtask: slurm-check: {shards} shards merged: every cell identical to the unsharded run ({ran} cells ran)"
    );
    stages.push(("merge and compare", t.elapsed().as_secs_f64()));

    // 2. The same, with one task cancelled mid-run and submitted again.
    let t = Instant::now();
    let broken = sweep(work.join("cancelled"));
    let (_, array) = submit(&broken)?;
    // Cancel task 1 once it has finished a run and is still going.
    let victim = format!("{array}_1");
    let runs = broken.out.join("shard-1/runs");
    let finished = |dir: &Path| -> usize {
        std::fs::read_dir(dir)
            .map(|d| d.flatten().filter(|e| e.path().join("result.json").is_file()).count())
            .unwrap_or(0)
    };
    let t_wait = Instant::now();
    loop {
        let state = run(cluster.cmd("squeue").args(["-h", "-j", &victim, "-o", "%T"]))?;
        if state == "RUNNING" && finished(&runs) >= 1 {
            break;
        }
        if state.is_empty() || t_wait.elapsed() > limit {
            bail!("task {victim} ended (or never ran) before it could be cancelled mid-run: state `{state}`, {} runs finished", finished(&runs));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    run(cluster.cmd("scancel").arg(&victim))?;
    let before = finished(&runs);
    // The runs it was in the middle of, and whether each had a checkpoint to resume from
    // (the smoke scale's 3-step runs write none before their end: they start again).
    let interrupted: Vec<String> = std::fs::read_dir(&runs)
        .map(|d| {
            d.flatten()
                .filter(|e| !e.path().join("result.json").is_file())
                .map(|e| {
                    let ck = e.path().join("checkpoints/LATEST").is_file();
                    format!(
                        "{} ({})",
                        e.file_name().to_string_lossy(),
                        if ck {
                            "resumes from its checkpoint"
                        } else {
                            "no checkpoint yet: starts again"
                        }
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let states = cluster.wait(&array, limit)?;
    eprintln!(
        "xtask: slurm-check: cancelled {victim} after {before} finished runs of its shard (states: {})",
        states
            .iter()
            .map(|(j, s)| format!("{j} {s}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (task, state) in &states {
        let want = if *task == victim { "CANCELLED" } else { "COMPLETED" };
        if state != want {
            bail!(
                "task {task} ended {state}, not {want}; see {}",
                work.join("cancelled/logs").display()
            );
        }
    }
    // The shard again: it skips the runs it finished and resumes the one it was in.
    let again = cluster.sbatch(&[
        "--array=1",
        work.join("cancelled/scripts/shard.sh").to_str().context("path")?,
    ])?;
    for (job, state) in cluster.wait(&again, limit)? {
        if state != "COMPLETED" {
            bail!(
                "job {job} (shard 1 again) ended {state}; see {}",
                work.join("cancelled/logs").display()
            );
        }
    }
    let after = finished(&runs);
    stages.push((
        "array job, one task cancelled and resubmitted",
        t.elapsed().as_secs_f64(),
    ));
    let t = Instant::now();
    merge(
        &bin,
        &shard_dirs(&broken.out),
        &work.join("cancelled/merged"),
        &ids,
        scale,
    )?;
    same_cells(&single, &work.join("cancelled/merged"), &ids, scale)?;
    eprintln!(
        "xtask: slurm-check: shard 1 cancelled with {before} runs finished and {} in progress ({}), resubmitted, {after} finished: every cell identical to the unsharded run",
        interrupted.len(),
        interrupted.join(", ")
    );
    stages.push(("merge and compare", t.elapsed().as_secs_f64()));

    let t = Instant::now();
    drop(cluster);
    stages.push(("teardown", t.elapsed().as_secs_f64()));
    if !keep {
        let _ = std::fs::remove_dir_all(work.join("plain"));
        let _ = std::fs::remove_dir_all(work.join("cancelled"));
    }
    let total: f64 = stages.iter().map(|s| s.1).sum();
    let parts: Vec<String> = stages.iter().map(|(n, s)| format!("{n} {}", mmss(*s))).collect();
    println!("slurm-check passed: {}; total {}", parts.join(", "), mmss(total));
    Ok(())
}

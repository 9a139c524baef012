//! The IDX format of MNIST and Fashion-MNIST (plain or gzip): a big-endian header
//! `0x00 0x00 type ndim`, `ndim` u32 sizes, then the row-major data. fpt reads the unsigned
//! byte type (0x08), which is what both datasets use.

use crate::{Result, TaskError};
use std::io::Read;
use std::path::Path;

/// An IDX array of bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idx {
    /// Sizes of each dimension.
    pub dims: Vec<usize>,
    /// The data, row-major.
    pub data: Vec<u8>,
}

/// Reads the file at `path`, gunzipping it when it starts with the gzip magic. A gzip stream
/// is inflated only as far as its IDX header says the data goes (plus one byte, to tell
/// trailing data): a stream that claims more than [`fpt_spec::limits::MAX_FILE_BYTES`], or
/// inflates past its declared size, is refused without being inflated further.
pub fn read(path: &Path) -> Result<Idx> {
    let raw = std::fs::read(path).map_err(TaskError::io(path))?;
    decode(&raw).map_err(|msg| TaskError::data(path, msg))
}

/// An IDX file's bytes, plain or gzip'd (see [`read`]).
pub fn decode(raw: &[u8]) -> std::result::Result<Idx, String> {
    if raw.starts_with(&[0x1f, 0x8b]) {
        parse(&inflate(raw)?)
    } else {
        parse(raw)
    }
}

/// Inflates a gzip'd IDX file, stopping at the size its header declares.
fn inflate(raw: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let mut z = flate2::read::GzDecoder::new(raw);
    let gz = |e: std::io::Error| format!("not a valid gzip file: {e}");
    let mut head = [0u8; 4];
    z.read_exact(&mut head).map_err(gz)?;
    let mut out = head.to_vec();
    let ndim = head[3] as usize;
    let mut sizes = vec![0u8; 4 * ndim];
    z.read_exact(&mut sizes).map_err(gz)?;
    out.extend_from_slice(&sizes);
    let declared = sizes
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes(c.try_into().expect("4 bytes")) as u64)
        .try_fold(1u64, |a, d| a.checked_mul(d))
        .filter(|&n| n <= fpt_spec::limits::MAX_FILE_BYTES)
        .ok_or_else(|| {
            format!(
                "header declares more than fpt's limit of {} bytes of data; not inflating it",
                fpt_spec::limits::MAX_FILE_BYTES
            )
        })?;
    // One byte past the declared end tells trailing data from the exact size.
    z.take(declared + 1).read_to_end(&mut out).map_err(gz)?;
    Ok(out)
}

/// Parses IDX bytes.
pub fn parse(b: &[u8]) -> std::result::Result<Idx, String> {
    if b.len() < 4 {
        return Err(format!("{} bytes is too short for an IDX header", b.len()));
    }
    if b[0] != 0 || b[1] != 0 {
        return Err(format!(
            "wrong magic {:02x}{:02x}{:02x}{:02x} (an IDX file starts with 00 00, then the type and the number of dimensions)",
            b[0], b[1], b[2], b[3]
        ));
    }
    if b[2] != 0x08 {
        return Err(format!("data type 0x{:02x} is not unsigned bytes (0x08)", b[2]));
    }
    let ndim = b[3] as usize;
    if ndim == 0 {
        return Err("header says 0 dimensions".into());
    }
    let head = 4 + 4 * ndim;
    if b.len() < head {
        return Err(format!(
            "truncated header: {ndim} dimensions need {head} bytes, the file has {}",
            b.len()
        ));
    }
    let dims: Vec<usize> = (0..ndim)
        .map(|i| u32::from_be_bytes(b[4 + 4 * i..8 + 4 * i].try_into().expect("4 bytes")) as usize)
        .collect();
    let n = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n as u64 <= fpt_spec::limits::MAX_FILE_BYTES)
        .ok_or_else(|| format!("header declares sizes {dims:?}, more data than fpt reads"))?;
    let have = b.len() - head;
    if have != n {
        return Err(format!(
            "header says {dims:?} = {n} bytes of data, the file has {have}{}",
            if have < n { " (truncated)" } else { " (trailing bytes)" }
        ));
    }
    Ok(Idx {
        dims,
        data: b[head..].to_vec(),
    })
}

/// IDX bytes of `data` with sizes `dims` (for tests and tools).
pub fn encode(dims: &[usize], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, 0x08, dims.len() as u8];
    for &d in dims {
        out.extend_from_slice(&(d as u32).to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    /// A gzip bomb (a small file inflating to far more than its header declares) is refused
    /// after inflating just past the declared size; a header declaring an absurd size is
    /// refused before inflating anything.
    #[test]
    fn gzip_is_inflated_only_as_far_as_the_header_declares() {
        let good = encode(&[2, 3], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(parse(&inflate(&gzip(&good)).unwrap()).unwrap().dims, vec![2, 3]);
        // 2 x 3 declared, 64 MiB of zeros behind it.
        let mut bomb = encode(&[2, 3], &[0; 6]);
        bomb.resize(64 << 20, 0);
        let inflated = inflate(&gzip(&bomb)).unwrap();
        assert_eq!(
            inflated.len(),
            4 + 4 * 2 + 6 + 1,
            "stopped one byte past the declared data"
        );
        assert!(parse(&inflated).unwrap_err().contains("trailing"));
        let huge = encode(&[u32::MAX as usize, u32::MAX as usize, 16], &[]);
        assert!(inflate(&gzip(&huge)).unwrap_err().contains("limit"));
        assert!(parse(&huge).unwrap_err().contains("more data"));
    }
}

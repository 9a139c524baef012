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

/// Reads the file at `path`, gunzipping it when it starts with the gzip magic.
pub fn read(path: &Path) -> Result<Idx> {
    let raw = std::fs::read(path).map_err(TaskError::io(path))?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(|e| TaskError::data(path, format!("not a valid gzip file: {e}")))?;
        out
    } else {
        raw
    };
    parse(&bytes).map_err(|msg| TaskError::data(path, msg))
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
        .ok_or("sizes overflow")?;
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

//! Remote homology detection (TAPE, Rao et al. 2019; SCOP 1.75 folds): the fold (one of
//! 1195) of a protein sequence (REFERENCE-DATA.md §2).
//!
//! Reads TAPE's JSON files (`remote_homology_<split>.json`: a list of records, of which
//! `primary` and `fold_label` are used) from `<dir>` or `<dir>/remote_homology/`. TAPE's
//! LMDB files are not read (every Rust LMDB binding builds the C library, and the records
//! are Python pickles); TAPE publishes the same data as JSON, which `fpt fetch homology`
//! downloads. Tokens: TAPE's IUPAC vocabulary (30 ids: `<pad>` 0, `<mask>` 1, `<cls>` 2,
//! `<sep>` 3, `<unk>` 4, the 25 letters A..Z without J as 5-29), each sequence `<cls> residues <sep>`; an unknown
//! residue is an error, as in TAPE. Sequences whose encoding is longer than 1024 are left
//! out (the reference code skips whole batches whose padded length exceeds 1024; fpt skips
//! only the long examples and reports how many). Batches are padded with 0 to their longest
//! sequence, as TAPE's collate does. Evaluation defaults to `valid` (the reference code).

use crate::data::{eval_split, task_from_spec, Dataset, DatasetTask, Encoding, Examples};
use crate::{Result, TaskError};
use fpt_nn::Rng;
use fpt_spec::TaskSpec;
use std::path::{Path, PathBuf};

/// Fold classes.
pub const CLASSES: usize = 1195;
/// Vocabulary size.
pub const VOCAB: usize = 30;
/// TAPE's splits.
pub const SPLITS: [&str; 5] = [
    "train",
    "valid",
    "test_fold_holdout",
    "test_superfamily_holdout",
    "test_family_holdout",
];

/// TAPE's IUPAC letters, ids 5-29 in this order (there is no J).
pub const RESIDUES: &str = "ABCDEFGHIKLMNOPQRSTUVWXYZ";

/// The IUPAC id of a residue letter (`A` 5 ... `Z` 29; `J` and anything else: none).
pub fn residue_id(c: char) -> Option<u32> {
    RESIDUES
        .find(c)
        .filter(|_| c.is_ascii_uppercase())
        .map(|i| 5 + i as u32)
}

/// The JSON file of `split` in `dir` (or `dir/remote_homology/`).
pub fn split_file(dir: &Path, split: &str) -> PathBuf {
    let name = format!("remote_homology_{split}.json");
    let inner = dir.join("remote_homology").join(&name);
    if inner.is_file() {
        inner
    } else {
        dir.join(name)
    }
}

/// What reading a split left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Records longer than the maximum length.
    pub too_long: usize,
}

/// Reads one TAPE JSON split, keeping sequences of at most `max_len` ids.
pub fn read_json(path: &Path, max_len: usize) -> Result<(Dataset, Skipped)> {
    let text = std::fs::read_to_string(path).map_err(TaskError::io(path))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| TaskError::data(path, format!("not valid JSON: {e}")))?;
    let records = v
        .as_array()
        .ok_or_else(|| TaskError::data(path, "expected a JSON list of records (TAPE's JSON format)"))?;
    let mut seqs = Vec::new();
    let mut labels = Vec::new();
    let mut lengths = Vec::new();
    let mut skipped = Skipped::default();
    for (i, r) in records.iter().enumerate() {
        let name = match r.get("id") {
            Some(serde_json::Value::String(s)) => format!("record {i} (id {s})"),
            _ => format!("record {i}"),
        };
        let primary = r
            .get("primary")
            .and_then(|p| p.as_str())
            .ok_or_else(|| TaskError::data(path, format!("{name}: field `primary` is missing or not a string")))?;
        let fold = r.get("fold_label").and_then(|f| f.as_u64()).ok_or_else(|| {
            TaskError::data(
                path,
                format!("{name}: field `fold_label` is missing or not a non-negative integer"),
            )
        })?;
        if fold as usize >= CLASSES {
            return Err(TaskError::data(
                path,
                format!("{name}, field fold_label: {fold} (folds are 0-{})", CLASSES - 1),
            ));
        }
        let mut ids = Vec::with_capacity(primary.len() + 2);
        ids.push(2);
        for (k, c) in primary.chars().enumerate() {
            ids.push(residue_id(c).ok_or_else(|| {
                TaskError::data(
                    path,
                    format!(
                        "{name}, field primary: unknown residue `{c}` at position {k} (IUPAC letters A-Z except J)"
                    ),
                )
            })?);
        }
        ids.push(3);
        if ids.len() > max_len {
            skipped.too_long += 1;
            continue;
        }
        lengths.push(ids.len() as u32);
        seqs.push(ids);
        labels.push(fold as u32);
    }
    Ok((
        Dataset {
            examples: Examples::Tokens(seqs),
            labels,
            lengths,
        },
        skipped,
    ))
}

/// The homology task from TAPE JSON files in `dir`.
pub fn task(dir: &Path, spec: &TaskSpec, root: &Rng) -> Result<DatasetTask> {
    let split = eval_split(spec, &SPLITS[1..], "valid")?;
    let max_len = spec.data.max_len.unwrap_or(1024);
    let read = |s: &str| {
        let p = split_file(dir, s);
        if !p.is_file() {
            return Err(TaskError::Missing {
                task: "homology".into(),
                dir: dir.to_path_buf(),
                what: format!("remote_homology_{s}.json not found"),
                hint: "run `fpt fetch homology` where the network allows (TAPE's JSON archive), or unpack data_raw_pytorch/remote_homology.tar.gz there".into(),
            });
        }
        let (d, skipped) = read_json(&p, max_len)?;
        if skipped.too_long > 0 {
            tracing::info!(file = %p.display(), skipped = skipped.too_long, "sequences longer than {max_len} ids left out");
        }
        Ok(d)
    };
    let train = read("train")?;
    let eval = read(split)?;
    let encoding = Encoding::Tokens {
        len: max_len,
        pad: 0,
        per_batch: true,
        left: false,
    };
    task_from_spec(spec, train, eval, encoding, CLASSES, VOCAB, root)
}

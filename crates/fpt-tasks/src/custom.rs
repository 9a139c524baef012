//! Your own sequence-classification data (`--task custom:PATH`).
//!
//! The format is JSON Lines: one record per line, each with a `label` (a class id, 0 or
//! more) and either
//! - `tokens`: a list of token ids (0 or more), through an Embedding input layer, or
//! - `features`: a list of equal-width number vectors (one per time step / token), through
//!   a Linear input layer (time series, tabular rows as one-vector sequences, sensor traces).
//!
//! Splits come from separate files, `PATH/train.jsonl` and `PATH/test.jsonl` (or
//! `valid.jsonl` / `val.jsonl`), or from a `split` field (`train`, `test`, `valid`/`val`) in
//! the records of the single file `PATH`. Every record of a dataset must be of one kind and
//! (features) one width. Classes = the largest label + 1; token vocabulary = the largest id
//! plus 2 (the extra id pads). Sequences are padded at the *start* to the longest record (or cut
//! to `--max-len`, keeping the first tokens), so the classifier, which reads the last
//! position, always reads a real token.
//!
//! ```text
//! {"tokens": [3, 1, 4, 1, 5], "label": 1, "split": "train"}
//! {"features": [[0.1, 2.0], [0.3, 1.5], [0.2, 1.1]], "label": 0, "split": "test"}
//! ```

use crate::data::{eval_split, task_from_spec, Dataset, DatasetTask, Encoding, Examples};
use crate::{Result, TaskError};
use fpt_nn::Rng;
use fpt_spec::TaskSpec;
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

enum Seq {
    Tokens(Vec<u32>),
    Features(usize, Vec<f32>),
}

struct Rows {
    seqs: Vec<Seq>,
    labels: Vec<u32>,
}

/// One record as written: strict (an unknown or repeated key is an error naming it).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    #[serde(default)]
    label: Option<serde_json::Value>,
    #[serde(default)]
    tokens: Option<serde_json::Value>,
    #[serde(default)]
    features: Option<serde_json::Value>,
    #[serde(default)]
    split: Option<serde_json::Value>,
}

/// The split names a record may give (`val` is read as `valid`).
const SPLITS: [&str; 4] = ["train", "test", "valid", "val"];

/// One record: its sequence, its label (`None` where it has none: only
/// [`read_for_prediction`] accepts that), its split.
fn parse_line(path: &Path, line_no: usize, line: &str) -> Result<(Seq, Option<u32>, Option<String>)> {
    let at = |msg: String| TaskError::data(path, format!("line {line_no}: {msg}"));
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| at(format!("not a JSON object: {e}")))?;
    if !v.is_object() {
        return Err(at("not a JSON object".into()));
    }
    let r: Record = serde_json::from_str(line).map_err(|e| {
        at(format!(
            "{e} (a record has `label`, `tokens` or `features`, and optionally `split`)"
        ))
    })?;
    let max_label = fpt_spec::limits::MAX_CLASSES as u64 - 1;
    let label = match &r.label {
        None => None,
        Some(l) => {
            let label = l
                .as_u64()
                .ok_or_else(|| at(format!("field `label`: `{l}` is not a non-negative integer")))?;
            if label > max_label {
                return Err(at(format!(
                    "field `label`: {label} is above fpt's limit of {max_label} (labels are class ids 0, 1, ...)"
                )));
            }
            Some(label as u32)
        }
    };
    let split = match &r.split {
        None => None,
        Some(serde_json::Value::String(s)) if SPLITS.contains(&s.as_str()) => Some(s.clone()),
        Some(serde_json::Value::String(s)) => {
            return Err(at(format!(
                "field `split`: `{s}` is not a split name (train, test, valid or val)"
            )))
        }
        Some(_) => return Err(at("field `split` must be a string".into())),
    };
    let max_id = fpt_spec::limits::MAX_VOCAB as u64 - 2;
    let seq = match (r.tokens.as_ref(), r.features.as_ref()) {
        (Some(_), Some(_)) => return Err(at("has both `tokens` and `features`; give one".into())),
        (None, None) => return Err(at("needs a `tokens` or a `features` field".into())),
        (Some(t), None) => {
            let a = t
                .as_array()
                .ok_or_else(|| at("field `tokens` must be a list of ids".into()))?;
            let ids = a
                .iter()
                .enumerate()
                .map(|(k, x)| match x.as_u64() {
                    Some(i) if i <= max_id => Ok(i as u32),
                    Some(i) => Err(at(format!(
                        "field `tokens`, item {k}: id {i} is above fpt's limit of {max_id}"
                    ))),
                    None => Err(at(format!(
                        "field `tokens`, item {k}: `{x}` is not a non-negative integer id"
                    ))),
                })
                .collect::<Result<Vec<u32>>>()?;
            if ids.is_empty() {
                return Err(at("field `tokens` is empty".into()));
            }
            Seq::Tokens(ids)
        }
        (None, Some(f)) => {
            let a = f
                .as_array()
                .ok_or_else(|| at("field `features` must be a list of vectors".into()))?;
            if a.is_empty() {
                return Err(at("field `features` is empty".into()));
            }
            let mut width = None;
            let mut flat = Vec::new();
            for (k, row) in a.iter().enumerate() {
                let r = row
                    .as_array()
                    .ok_or_else(|| at(format!("field `features`, item {k}: not a list of numbers")))?;
                if r.is_empty() {
                    return Err(at(format!(
                        "field `features`, item {k}: an empty vector (each needs at least one number)"
                    )));
                }
                if *width.get_or_insert(r.len()) != r.len() {
                    return Err(at(format!(
                        "field `features`, item {k}: {} numbers, expected {} (all vectors must have one width)",
                        r.len(),
                        width.unwrap_or(0)
                    )));
                }
                if r.len() > fpt_spec::limits::MAX_INPUT_WIDTH {
                    return Err(at(format!(
                        "field `features`, item {k}: {} numbers, above fpt's limit of {}",
                        r.len(),
                        fpt_spec::limits::MAX_INPUT_WIDTH
                    )));
                }
                for (j, x) in r.iter().enumerate() {
                    // f32 is what the model computes in: a value beyond its range is refused
                    // rather than turned into infinity.
                    let v = x.as_f64().map(|x| x as f32).filter(|x| x.is_finite()).ok_or_else(|| {
                        at(format!(
                            "field `features`, item {k}, number {j}: `{x}` is not a finite 32-bit float"
                        ))
                    })?;
                    flat.push(v);
                }
            }
            Seq::Features(width.unwrap_or(0), flat)
        }
    };
    Ok((seq, label, split))
}

/// Reads one JSONL file, grouping records by their `split` field (or all under `default`).
fn read_file(path: &Path, default: Option<&str>) -> Result<BTreeMap<String, Rows>> {
    let f = std::fs::File::open(path).map_err(TaskError::io(path))?;
    parse_records(std::io::BufReader::new(f), path, default)
}

/// Checks JSON Lines records as the custom task reads them (`path` names the source in
/// errors): every line a valid record. What the fuzz target exercises.
pub fn check_records(r: impl BufRead, path: &Path) -> Result<usize> {
    Ok(parse_records(r, path, Some("train"))?
        .values()
        .map(|r| r.labels.len())
        .sum())
}

fn parse_records(r: impl BufRead, path: &Path, default: Option<&str>) -> Result<BTreeMap<String, Rows>> {
    let mut out: BTreeMap<String, Rows> = BTreeMap::new();
    for (n, line) in r.lines().enumerate() {
        let line = line.map_err(|e| crate::line_error(path, n + 1, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let (seq, label, split) = parse_line(path, n + 1, &line)?;
        let label = label.ok_or_else(|| {
            TaskError::data(
                path,
                format!(
                    "line {}: field `label` is missing (training data needs a class id per record)",
                    n + 1
                ),
            )
        })?;
        let split = match (split, default) {
            (Some(s), _) => s,
            (None, Some(d)) => d.to_string(),
            (None, None) => {
                return Err(TaskError::data(
                    path,
                    format!(
                        "line {}: field `split` is missing (a single file needs train/test in each record)",
                        n + 1
                    ),
                ))
            }
        };
        let split = if split == "val" { "valid".to_string() } else { split };
        let rows = out.entry(split).or_insert(Rows {
            seqs: Vec::new(),
            labels: Vec::new(),
        });
        rows.seqs.push(seq);
        rows.labels.push(label);
    }
    Ok(out)
}

/// Reads custom data from a JSONL file or a directory of `train.jsonl` / `test.jsonl` /
/// `valid.jsonl`; returns the splits by name.
pub fn read(path: &Path) -> Result<BTreeMap<String, Dataset>> {
    let mut splits: BTreeMap<String, Rows> = BTreeMap::new();
    let mut files: Vec<(PathBuf, Option<&str>)> = Vec::new();
    if path.is_dir() {
        for (f, s) in [
            ("train.jsonl", "train"),
            ("test.jsonl", "test"),
            ("valid.jsonl", "valid"),
            ("val.jsonl", "valid"),
        ] {
            if path.join(f).is_file() {
                files.push((path.join(f), Some(s)));
            }
        }
        if files.is_empty() {
            return Err(TaskError::Missing {
                task: "custom".into(),
                dir: path.to_path_buf(),
                what: "no train.jsonl / test.jsonl".into(),
                hint: "see `fpt_tasks::custom` (docs/usage.md: Your own data) for the format".into(),
            });
        }
    } else if path.is_file() {
        files.push((path.to_path_buf(), None));
    } else {
        return Err(TaskError::Missing {
            task: "custom".into(),
            dir: path.to_path_buf(),
            what: "no such file or directory".into(),
            hint: "give custom:FILE.jsonl or custom:DIR".into(),
        });
    }
    for (f, default) in &files {
        for (name, rows) in read_file(f, *default)? {
            let e = splits.entry(name).or_insert(Rows {
                seqs: Vec::new(),
                labels: Vec::new(),
            });
            e.seqs.extend(rows.seqs);
            e.labels.extend(rows.labels);
        }
    }
    // One kind (and one width) across every split.
    let first = &files[0].0;
    let mut kind: Option<Kind> = None;
    let mut out = BTreeMap::new();
    for (name, rows) in splits {
        let mut g = Gather {
            kind,
            ..Gather::default()
        };
        for (i, seq) in rows.seqs.into_iter().enumerate() {
            g.push(seq).map_err(|(this, before)| {
                TaskError::data(
                    first,
                    format!(
                        "split `{name}`, record {i}: mixes {} with the dataset's {} (one kind and width per dataset)",
                        describe(this),
                        describe(before)
                    ),
                )
            })?;
        }
        kind = g.kind;
        let (examples, lengths) = g.finish().unwrap_or((Examples::Tokens(Vec::new()), Vec::new()));
        out.insert(
            name,
            Dataset {
                examples,
                labels: rows.labels,
                lengths,
            },
        );
    }
    Ok(out)
}

/// Examples to predict (`fpt predict --inputs`): one JSONL file of records in the custom
/// format, each with `tokens` or `features` (one kind and width for the file), a `label`
/// optional (scored where given) and any `split` ignored. Returns the examples (label 0
/// where none was given) and the labels as written.
pub fn read_for_prediction(path: &Path) -> Result<(Dataset, Vec<Option<u32>>)> {
    let f = std::fs::File::open(path).map_err(TaskError::io(path))?;
    let (mut g, mut labels) = (Gather::default(), Vec::new());
    for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| crate::line_error(path, n + 1, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let (seq, label, _) = parse_line(path, n + 1, &line)?;
        g.push(seq).map_err(|(this, before)| {
            TaskError::data(
                path,
                format!(
                    "line {}: {} where the file's first record has {} (one kind and width per file)",
                    n + 1,
                    describe(this),
                    describe(before)
                ),
            )
        })?;
        labels.push(label);
    }
    let (examples, lengths) = g.finish().ok_or_else(|| TaskError::data(path, "has no records"))?;
    let data = Dataset {
        examples,
        labels: labels.iter().map(|l| l.unwrap_or(0)).collect(),
        lengths,
    };
    Ok((data, labels))
}

/// A sequence kind: token ids `(true, 0)`, or feature vectors of a width `(false, width)`.
type Kind = (bool, usize);

/// Sequences gathered into one dataset's examples: one kind (and width) for all.
#[derive(Default)]
struct Gather {
    kind: Option<Kind>,
    tokens: Vec<Vec<u32>>,
    feats: Vec<Vec<f32>>,
    lengths: Vec<u32>,
}

impl Gather {
    /// Adds `s`; `Err((its kind, the kind before))` when it differs from the ones before.
    fn push(&mut self, s: Seq) -> std::result::Result<(), (Kind, Kind)> {
        let this = match &s {
            Seq::Tokens(_) => (true, 0),
            Seq::Features(w, _) => (false, *w),
        };
        let kind = *self.kind.get_or_insert(this);
        if kind != this {
            return Err((this, kind));
        }
        match s {
            Seq::Tokens(t) => {
                self.lengths.push(t.len() as u32);
                self.tokens.push(t)
            }
            Seq::Features(w, f) => {
                self.lengths.push((f.len() / w) as u32);
                self.feats.push(f)
            }
        }
        Ok(())
    }

    /// The examples and their lengths (`None` when nothing was added).
    fn finish(self) -> Option<(Examples, Vec<u32>)> {
        let examples = match self.kind? {
            (false, width) => Examples::Features {
                width,
                seqs: self.feats,
            },
            (true, _) => Examples::Tokens(self.tokens),
        };
        Some((examples, self.lengths))
    }
}

fn describe((tokens, width): Kind) -> String {
    if tokens {
        "token ids".into()
    } else {
        format!("feature vectors of width {width}")
    }
}

/// The custom task at `path`.
pub fn task(path: &Path, spec: &TaskSpec, root: &Rng) -> Result<DatasetTask> {
    let mut splits = read(path)?;
    let have: Vec<String> = splits.keys().cloned().collect();
    let train = splits.remove("train").ok_or_else(|| TaskError::Missing {
        task: "custom".into(),
        dir: path.to_path_buf(),
        what: format!("no `train` split (found: {})", have.join(", ")),
        hint: "add train.jsonl, or records with \"split\": \"train\"".into(),
    })?;
    let names: Vec<&str> = ["test", "valid"]
        .into_iter()
        .filter(|s| splits.contains_key(*s))
        .collect();
    let Some(&default) = names.first() else {
        return Err(TaskError::Missing {
            task: "custom".into(),
            dir: path.to_path_buf(),
            what: format!("no `test` or `valid` split (found: {})", have.join(", ")),
            hint: "add test.jsonl, or records with \"split\": \"test\"".into(),
        });
    };
    let split = eval_split(spec, &names, default)?;
    let eval = splits.remove(split).expect("listed above");
    let classes = train
        .labels
        .iter()
        .chain(&eval.labels)
        .max()
        .map_or(1, |m| *m as usize + 1);
    if classes < 2 {
        return Err(TaskError::data(
            path,
            "every label is 0: a classifier needs at least 2 classes (labels 0 and 1 at least)",
        ));
    }
    let longest = train.lengths.iter().chain(&eval.lengths).max().copied().unwrap_or(1) as usize;
    let len = spec.data.max_len.unwrap_or(longest).max(1);
    let (encoding, vocab) = match &train.examples {
        Examples::Tokens(t) => {
            let max_id = t
                .iter()
                .chain(match &eval.examples {
                    Examples::Tokens(e) => e.iter(),
                    _ => [].iter(),
                })
                .flat_map(|s| s.iter())
                .max()
                .copied()
                .unwrap_or(0);
            (
                Encoding::Tokens {
                    len,
                    pad: max_id + 1,
                    per_batch: false,
                    left: true,
                },
                max_id as usize + 2,
            )
        }
        _ => (Encoding::Features { len, left: true }, 0),
    };
    task_from_spec(spec, train, eval, encoding, classes, vocab, root)
}

//! ListOps (Long Range Arena, Tay et al. 2021): the value (0-9) of a nested expression of
//! MAX, MIN, MED (median) and SM (sum mod 10) over digits.
//!
//! - [`generate`] follows LRA's `lra_benchmarks/data/listops.py` (REFERENCE-DATA.md §1): a
//!   node is a digit with probability 3/4 (always at depth 10), else an operator over 2-10
//!   children; a tree is kept when its length (operators, digits and closing `]`) lies
//!   strictly between 500 and 2000; duplicates are dropped; the first 96,000 unique trees
//!   are the training split, the next 2,000 validation, the last 2,000 test. fpt's random
//!   stream is its own (seeded), so the trees are not LRA's, but they are drawn from the same
//!   distribution and written in the same format.
//! - [`write_tsv`] / [`read_tsv`]: LRA's TSV (`Source<TAB>Target` header, one tree per row,
//!   `( ( ( [MAX 2 ) 9 ) ] )`), so the published `basic_{train,val,test}.tsv` load too.
//! - Tokenization ([`Brackets`]): `drop` is the reference code's (pad + 10 digits + 4
//!   operators = 15 ids; every bracket lost, a known LRA bug), `keep` keeps the closing `]`
//!   as its own token (16 ids), which LRA's maintainers say is required. Sequences are cut to
//!   the first 512 ids and padded with 0 at the end; the classifier reads position 511 (as
//!   the reference code, often padding).

use crate::data::{eval_split, task_from_spec, Dataset, DatasetTask, Encoding, Examples};
use crate::{Result, TaskError};
use fpt_nn::Rng;
use fpt_spec::{Brackets, TaskSpec};
use std::collections::HashSet;
use std::io::{BufWriter, Write};
use std::path::Path;

/// Generator settings (LRA's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GenConfig {
    /// Training trees.
    pub train: usize,
    /// Validation trees.
    pub val: usize,
    /// Test trees.
    pub test: usize,
    /// Maximum depth (the root is depth 1).
    pub max_depth: usize,
    /// Maximum operator arguments.
    pub max_args: usize,
    /// Trees must be longer than this...
    pub min_length: usize,
    /// ...and shorter than this.
    pub max_length: usize,
    /// Seed of the generator's random stream.
    pub seed: u64,
}

impl Default for GenConfig {
    fn default() -> Self {
        Self {
            train: 96_000,
            val: 2_000,
            test: 2_000,
            max_depth: 10,
            max_args: 10,
            min_length: 500,
            max_length: 2_000,
            seed: 0,
        }
    }
}

const OPS: [&str; 4] = ["[MIN", "[MAX", "[MED", "[SM"];

/// Appends a random tree to `out` (LRA's string form) and returns (value, length).
fn tree(depth: usize, c: &GenConfig, rng: &mut Rng, out: &mut String) -> (u32, usize) {
    let r = if depth < c.max_depth { rng.uniform() } else { 1.0 };
    if r > 0.25 {
        let v = rng.below(10) as u32;
        out.push(char::from(b'0' + v as u8));
        return (v, 1);
    }
    let m = 2 + rng.below(c.max_args as u64 - 1) as usize;
    // Children are generated before the operator is drawn (as LRA does), but the operator
    // comes first in the text: write the children into their own buffer.
    let mut children = String::new();
    let mut values = Vec::with_capacity(m);
    let mut length = 2;
    for i in 0..m {
        if i > 0 {
            children.push(' ');
        }
        let (v, l) = tree(depth + 1, c, rng, &mut children);
        values.push(v);
        length += l;
        children.push_str(" )");
    }
    let op = rng.below(4) as usize;
    for _ in 0..=m {
        out.push_str("( ");
    }
    out.push_str(OPS[op]);
    out.push(' ');
    out.push_str(&children);
    out.push_str(" ] )");
    (apply(op, &mut values), length)
}

fn apply(op: usize, v: &mut [u32]) -> u32 {
    match op {
        0 => *v.iter().min().expect("children"),
        1 => *v.iter().max().expect("children"),
        2 => {
            // int(np.median(v)): the mean of the two middle values for an even count, truncated.
            v.sort_unstable();
            let n = v.len();
            if n % 2 == 1 {
                v[n / 2]
            } else {
                (v[n / 2 - 1] + v[n / 2]) / 2
            }
        }
        _ => v.iter().sum::<u32>() % 10,
    }
}

/// Generated trees of the three splits: `(source, target)` rows.
pub struct Generated {
    /// Training rows.
    pub train: Vec<(String, u32)>,
    /// Validation rows.
    pub val: Vec<(String, u32)>,
    /// Test rows.
    pub test: Vec<(String, u32)>,
    /// Trees drawn in all (accepted or not).
    pub drawn: usize,
}

/// Generates the three splits. `progress(done, total)` is called every 1,000 accepted trees.
pub fn generate(c: &GenConfig, progress: &mut dyn FnMut(usize, usize)) -> Generated {
    let total = c.train + c.val + c.test;
    let mut rng = Rng::new(c.seed).fork("listops");
    let mut seen = HashSet::with_capacity(total);
    let mut rows = Vec::with_capacity(total);
    let mut drawn = 0;
    let mut s = String::new();
    while rows.len() < total {
        s.clear();
        drawn += 1;
        let (v, len) = tree(1, c, &mut rng, &mut s);
        if len > c.min_length && len < c.max_length && seen.insert(s.clone()) {
            rows.push((s.clone(), v));
            if rows.len() % 1000 == 0 {
                progress(rows.len(), total);
            }
        }
    }
    let test = rows.split_off(c.train + c.val);
    let val = rows.split_off(c.train);
    Generated {
        train: rows,
        val,
        test,
        drawn,
    }
}

/// Writes rows in LRA's TSV format (header `Source\tTarget`, `\r\n` line ends as Python's
/// csv writer), to a temporary file renamed into place.
pub fn write_tsv(path: &Path, rows: &[(String, u32)]) -> Result<()> {
    fpt_spec::files::write_atomic_with(path, |tmp| {
        let mut w = BufWriter::new(std::fs::File::create(tmp)?);
        w.write_all(b"Source\tTarget\r\n")?;
        for (s, t) in rows {
            write!(w, "{s}\t{t}\r\n")?;
        }
        w.flush()?;
        w.get_ref().sync_all()
    })
    .map_err(TaskError::io(path))
}

/// Token ids: 0 padding, digits 1-10, MIN 11, MAX 12, MED 13, SM 14, and (brackets kept)
/// the closing `]` 15.
pub fn vocab_size(b: Brackets) -> usize {
    match b {
        Brackets::Drop => 15,
        Brackets::Keep => 16,
    }
}

fn token_id(tok: &str, b: Brackets) -> Option<Option<u32>> {
    Some(match tok {
        "(" | ")" => None,
        "]" | "X" => match b {
            Brackets::Drop => None,
            Brackets::Keep => Some(15),
        },
        t if t.len() == 1 && t.as_bytes()[0].is_ascii_digit() => Some(1 + (t.as_bytes()[0] - b'0') as u32),
        t => {
            let name = t.strip_prefix('[').unwrap_or(t);
            Some(match name {
                "MIN" => 11,
                "MAX" => 12,
                "MED" => 13,
                "SM" => 14,
                _ => return None,
            })
        }
    })
}

/// Tokenizes one source string; `Err(token)` names an unknown token.
pub fn tokenize(source: &str, b: Brackets) -> std::result::Result<Vec<u32>, String> {
    let mut out = Vec::with_capacity(source.len() / 3);
    for tok in source.split_ascii_whitespace() {
        match token_id(tok, b) {
            Some(Some(id)) => out.push(id),
            Some(None) => {}
            None => return Err(tok.to_string()),
        }
    }
    Ok(out)
}

/// Reads an LRA ListOps TSV file: sequences cut to `max_len` ids (lengths before the cut
/// are kept for reports).
pub fn read_tsv(path: &Path, b: Brackets, max_len: usize) -> Result<Dataset> {
    let f = std::fs::File::open(path).map_err(TaskError::io(path))?;
    parse_tsv(std::io::BufReader::with_capacity(1 << 20, f), path, b, max_len)
}

/// [`read_tsv`] on any reader (`path` names it in errors).
pub fn parse_tsv(r: impl std::io::BufRead, path: &Path, b: Brackets, max_len: usize) -> Result<Dataset> {
    let mut seqs = Vec::new();
    let mut labels = Vec::new();
    let mut lengths = Vec::new();
    for (n, line) in r.lines().enumerate() {
        let line = line.map_err(|e| crate::line_error(path, n + 1, e))?;
        let line = line.trim_end_matches('\r');
        let row = n + 1;
        if n == 0 {
            let cols: Vec<&str> = line.split('\t').collect();
            if cols != ["Source", "Target"] {
                return Err(TaskError::data(
                    path,
                    format!("line 1: header is {cols:?}, expected [\"Source\", \"Target\"] (LRA's TSV)"),
                ));
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        let (source, target) = line
            .split_once('\t')
            .ok_or_else(|| TaskError::data(path, format!("line {row}: no tab between the Source and Target fields")))?;
        let t: u32 =
            target.trim().parse().ok().filter(|t| *t < 10).ok_or_else(|| {
                TaskError::data(path, format!("line {row}, field Target: `{target}` is not a digit 0-9"))
            })?;
        let ids = tokenize(source, b)
            .map_err(|tok| TaskError::data(path, format!("line {row}, field Source: unknown token `{tok}`")))?;
        lengths.push(ids.len() as u32);
        let mut ids = ids;
        ids.truncate(max_len);
        seqs.push(ids);
        labels.push(t);
    }
    if seqs.is_empty() {
        return Err(TaskError::data(
            path,
            "holds no example (an empty file, or its header alone): the split is empty; `fpt fetch listops` writes it again",
        ));
    }
    Ok(Dataset {
        examples: Examples::Tokens(seqs),
        labels,
        lengths,
    })
}

type CacheKey = (std::path::PathBuf, Brackets, usize);
type CacheEntry = (Option<std::time::SystemTime>, u64, std::sync::Arc<Dataset>);

/// [`read_tsv`] with a per-process cache keyed by path, size and modification time: the
/// harness builds many ListOps runs in one process, and parsing the 634 MB training file
/// takes seconds.
pub fn read_tsv_cached(path: &Path, b: Brackets, max_len: usize) -> Result<Dataset> {
    static CACHE: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<CacheKey, CacheEntry>>> =
        std::sync::OnceLock::new();
    let meta = std::fs::metadata(path).map_err(TaskError::io(path))?;
    let stamp = (meta.modified().ok(), meta.len());
    let key = (path.to_path_buf(), b, max_len);
    let cache = CACHE.get_or_init(Default::default);
    if let Some((m, len, d)) = cache.lock().expect("cache lock").get(&key) {
        if (*m, *len) == stamp {
            return Ok((**d).clone());
        }
    }
    let d = read_tsv(path, b, max_len)?;
    cache
        .lock()
        .expect("cache lock")
        .insert(key, (stamp.0, stamp.1, std::sync::Arc::new(d.clone())));
    Ok(d)
}

/// The file of a split (`train`, `val`, `test`) in `dir`: LRA's `basic_<split>.tsv`.
pub fn split_file(dir: &Path, split: &str) -> std::path::PathBuf {
    dir.join(format!("basic_{split}.tsv"))
}

/// The ListOps task from the TSV files in `dir`. Evaluation runs on `val` by default (the
/// reference code reports it as "test"); `eval_split = "test"` selects the test file.
pub fn task(dir: &Path, spec: &TaskSpec, root: &Rng) -> Result<DatasetTask> {
    let split = eval_split(spec, &["val", "test"], "val")?;
    let max_len = spec.data.max_len.unwrap_or(512);
    let b = spec.data.brackets;
    let read = |s: &str| {
        let p = split_file(dir, s);
        if !p.is_file() {
            return Err(TaskError::Missing {
                task: "listops".into(),
                dir: dir.to_path_buf(),
                what: format!("{} not found", p.file_name().and_then(|f| f.to_str()).unwrap_or("")),
                hint: "run `fpt fetch listops` (generates LRA-format files locally, under a minute) or put LRA's basic_{train,val,test}.tsv there".into(),
            });
        }
        read_tsv_cached(&p, b, max_len)
    };
    let train = read("train")?;
    let eval = read(split)?;
    let encoding = Encoding::Tokens {
        len: max_len,
        pad: 0,
        per_batch: false,
        left: false,
    };
    task_from_spec(spec, train, eval, encoding, 10, vocab_size(b), root)
}

//! Causal language modelling corpora for `fpt pretrain` (task `text:<corpus>`): every
//! example is a window of `T + 1` tokens; the model reads the first `T` and predicts each
//! next token (labels are the window shifted by one, read out at all `T` positions).
//!
//! Corpora:
//! - `austen`: Jane Austen's six novels (Debian's `r-cran-janeaustenr`, fetched with
//!   `fpt fetch austen`): the last 10% of each novel's lines is held out; a byte-level BPE
//!   (the `tokenizers` crate, trained on the training text only) encodes both splits.
//!   Training windows start at random offsets; evaluation takes consecutive
//!   non-overlapping windows of the held-out text.
//! - `uniform`: i.i.d. tokens, uniform over the vocabulary (the follow-up slides' "Rand.").
//! - `zipf`: i.i.d. tokens with p(k) proportional to 1/(k+1) (the "Zipf" baseline).
//! - `parens`: the stack-based grammar of the follow-up slides: at each step, with
//!   probability 0.4 (or when the stack is empty) a Zipf-drawn token is emitted and pushed,
//!   otherwise the stack is popped and the popped token is emitted again, so every token
//!   opens and later closes a properly nested "parenthesis".
//!
//! Artificial corpora are generated fresh for every batch (like the bit tasks); their
//! evaluation sets are fixed seeded samples.

use crate::{Batch, InputKind, Inputs, Result, Split, Task, TaskDims, TaskError};
use candle_core::Device;
use fpt_nn::Rng;
use fpt_spec::{TaskName, TaskSpec};
use std::path::{Path, PathBuf};

/// The artificial corpora.
pub const ARTIFICIAL: [&str; 3] = ["uniform", "zipf", "parens"];
/// Default window length.
pub const DEFAULT_SEQ_LEN: usize = 128;
/// Default vocabulary of the artificial corpora.
pub const DEFAULT_VOCAB: usize = 4096;
/// Evaluation windows of an artificial corpus when `eval_examples` is 0.
const DEFAULT_EVAL: usize = 512;
/// Files of a prepared text corpus directory.
pub const TRAIN_IDS: &str = "train.ids";
/// Held-out token ids (u16 little-endian).
pub const TEST_IDS: &str = "test.ids";
/// The tokenizer (Hugging Face `tokenizer.json`).
pub const TOKENIZER: &str = "tokenizer.json";
/// Corpus facts (`vocab`, token counts, source).
pub const CORPUS_JSON: &str = "corpus.json";

/// Where a text corpus comes from.
#[derive(Debug, Clone)]
enum Source {
    /// Token ids of a prepared corpus: training and held-out.
    Ids { train: Vec<u16>, test: Vec<u16> },
    /// Generated.
    Artificial { kind: &'static str, cdf: Vec<f64> },
}

/// A causal language-modelling task over a corpus.
pub struct TextTask {
    vocab: usize,
    seq_len: usize,
    source: Source,
    /// Evaluation windows (`T + 1` tokens each) per split.
    eval_test: Vec<Vec<u32>>,
    eval_train: Vec<Vec<u32>>,
}

/// Corpora `fpt fetch` prepares under `$FPT_HOME/data/<name>`.
pub const FETCHED: [&str; 1] = ["austen"];

/// The directory of a prepared corpus: `$FPT_HOME/data/<name>` for a fetched corpus
/// (`austen`), else the path as given.
pub fn corpus_dir(name: &Path) -> PathBuf {
    if FETCHED.iter().any(|f| Path::new(f) == name) {
        crate::paths::home().join("data").join(name)
    } else {
        name.to_path_buf()
    }
}

fn read_ids(path: &Path) -> Result<Vec<u16>> {
    let bytes = std::fs::read(path).map_err(TaskError::io(path))?;
    if bytes.len() % 2 != 0 {
        return Err(TaskError::data(
            path,
            format!("{} bytes: not a whole number of u16 ids", bytes.len()),
        ));
    }
    Ok(bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect())
}

/// The vocabulary size recorded in a prepared corpus's `corpus.json`.
pub fn corpus_vocab(dir: &Path) -> Result<usize> {
    let p = dir.join(CORPUS_JSON);
    let text = std::fs::read_to_string(&p).map_err(|_| TaskError::Missing {
        task: "text".into(),
        dir: dir.to_path_buf(),
        what: format!("{CORPUS_JSON} not found"),
        hint: "run `fpt fetch austen` (or give text:DIR of a prepared corpus)".into(),
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| TaskError::data(&p, e.to_string()))?;
    v.get("vocab")
        .and_then(|x| x.as_u64())
        .map(|x| x as usize)
        .ok_or_else(|| TaskError::data(&p, "missing field `vocab` (a positive integer)"))
}

/// Zipf's law over `vocab` ranks, as a cumulative distribution.
fn zipf_cdf(vocab: usize) -> Vec<f64> {
    let w: Vec<f64> = (0..vocab).map(|k| 1.0 / (k + 1) as f64).collect();
    let total: f64 = w.iter().sum();
    let mut acc = 0.0;
    w.iter()
        .map(|x| {
            acc += x / total;
            acc
        })
        .collect()
}

fn draw(cdf: &[f64], rng: &mut Rng) -> u32 {
    let u = rng.uniform();
    cdf.partition_point(|&c| c < u).min(cdf.len() - 1) as u32
}

/// `n` tokens of an artificial corpus.
fn generate(kind: &str, cdf: &[f64], n: usize, rng: &mut Rng) -> Vec<u32> {
    let vocab = cdf.len() as u64;
    match kind {
        "uniform" => (0..n).map(|_| rng.below(vocab) as u32).collect(),
        "zipf" => (0..n).map(|_| draw(cdf, rng)).collect(),
        _ => {
            let mut stack: Vec<u32> = Vec::new();
            let mut out = Vec::with_capacity(n);
            while out.len() < n {
                if stack.is_empty() || rng.uniform() < 0.4 {
                    let t = draw(cdf, rng);
                    stack.push(t);
                    out.push(t);
                } else {
                    out.push(stack.pop().expect("not empty"));
                }
            }
            out
        }
    }
}

impl TextTask {
    /// The corpus `spec.path` names (see the module docs); `spec.data.max_len` is the
    /// window (default 128), `spec.data.vocab` the artificial vocabulary (default 4096).
    pub fn new(spec: &TaskSpec, root: &Rng) -> Result<Self> {
        let invalid = |msg: String| TaskError::Invalid { task: "text", msg };
        let name = spec.path.clone().ok_or_else(|| {
            invalid(format!(
                "name a corpus: text:austen, text:DIR, or one of text:{}",
                ARTIFICIAL.join(", text:")
            ))
        })?;
        let seq_len = spec.data.max_len.unwrap_or(DEFAULT_SEQ_LEN);
        if seq_len < 2 {
            return Err(invalid(format!("window of {seq_len} tokens (need at least 2)")));
        }
        let label = name.to_string_lossy().to_string();
        let (vocab, source) = match ARTIFICIAL.iter().find(|k| **k == label) {
            Some(kind) => {
                let vocab = spec.data.vocab.unwrap_or(DEFAULT_VOCAB);
                if !(2..=65536).contains(&vocab) {
                    return Err(invalid(format!("vocabulary of {vocab} (choose 2..=65536)")));
                }
                let cdf = match *kind {
                    "uniform" => (1..=vocab).map(|k| k as f64 / vocab as f64).collect(),
                    _ => zipf_cdf(vocab),
                };
                (vocab, Source::Artificial { kind, cdf })
            }
            None => {
                if spec.data.vocab.is_some() {
                    return Err(invalid(
                        "`vocab` applies to the artificial corpora only (a prepared corpus has its tokenizer's)".into(),
                    ));
                }
                let dir = corpus_dir(&name);
                let vocab = corpus_vocab(&dir)?;
                let train = read_ids(&dir.join(TRAIN_IDS))?;
                let test = read_ids(&dir.join(TEST_IDS))?;
                for (file, ids) in [(TRAIN_IDS, &train), (TEST_IDS, &test)] {
                    if ids.len() <= seq_len {
                        return Err(TaskError::data(
                            &dir.join(file),
                            format!("{} tokens, fewer than one window of {}", ids.len(), seq_len + 1),
                        ));
                    }
                    if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
                        return Err(TaskError::data(
                            &dir.join(file),
                            format!("token {i} is id {id}, outside the vocabulary of {vocab}"),
                        ));
                    }
                }
                (vocab, Source::Ids { train, test })
            }
        };
        let mut t = Self {
            vocab,
            seq_len,
            source,
            eval_test: Vec::new(),
            eval_train: Vec::new(),
        };
        t.eval_test = t.eval_windows(Split::Test, spec.eval_examples, &mut root.fork("text-eval-test"));
        t.eval_train = t.eval_windows(Split::Train, spec.eval_examples, &mut root.fork("text-eval-train"));
        Ok(t)
    }

    fn eval_windows(&self, split: Split, n: usize, rng: &mut Rng) -> Vec<Vec<u32>> {
        let w = self.seq_len + 1;
        match &self.source {
            Source::Ids { train, test } => {
                let ids = if split == Split::Test { test } else { train };
                // Consecutive windows overlapping by one token, so every held-out token
                // but the first is predicted exactly once.
                let all = (ids.len() - 1) / self.seq_len;
                let take = if n == 0 { all } else { n.min(all) };
                (0..take)
                    .map(|k| {
                        ids[k * self.seq_len..k * self.seq_len + w]
                            .iter()
                            .map(|&x| x as u32)
                            .collect()
                    })
                    .collect()
            }
            Source::Artificial { kind, cdf } => {
                let take = if n == 0 { DEFAULT_EVAL } else { n };
                (0..take).map(|_| generate(kind, cdf, w, rng)).collect()
            }
        }
    }

    fn to_batch(&self, windows: &[Vec<u32>], device: &Device) -> Result<Batch> {
        let n = windows.len();
        let t = self.seq_len;
        let mut x = Vec::with_capacity(n * t);
        let mut y = Vec::with_capacity(n * t);
        for w in windows {
            x.extend_from_slice(&w[..t]);
            y.extend_from_slice(&w[1..]);
        }
        Ok(Batch {
            inputs: Inputs::Tokens(fpt_nn::transfer::upload(x, (n, t), device)?),
            labels: fpt_nn::transfer::upload(y, (n, t), device)?,
        })
    }

    /// The unigram model's perplexity on the held-out windows, with add-one smoothed counts
    /// from the training ids (prepared corpora) or the generating distribution
    /// (artificial): the floor a language model must beat.
    pub fn unigram_perplexity(&self) -> f64 {
        let probs: Vec<f64> = match &self.source {
            Source::Ids { train, .. } => {
                let mut c = vec![1.0f64; self.vocab];
                for &id in train {
                    c[id as usize] += 1.0;
                }
                let total: f64 = c.iter().sum();
                c.into_iter().map(|x| x / total).collect()
            }
            Source::Artificial { cdf, .. } => {
                let mut prev = 0.0;
                cdf.iter()
                    .map(|&c| {
                        let p = c - prev;
                        prev = c;
                        p
                    })
                    .collect()
            }
        };
        let (mut nll, mut n) = (0.0, 0usize);
        for w in &self.eval_test {
            for &id in &w[1..] {
                nll -= probs[id as usize].max(1e-300).ln();
                n += 1;
            }
        }
        (nll / n.max(1) as f64).exp()
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.vocab
    }
}

impl Task for TextTask {
    fn name(&self) -> TaskName {
        TaskName::Text
    }
    fn dims(&self) -> TaskDims {
        TaskDims {
            input: InputKind::Tokens { vocab: self.vocab },
            seq_len: self.seq_len,
            readout_tokens: self.seq_len,
            labels_per_example: self.seq_len,
            classes: self.vocab,
        }
    }
    fn train_batch(&mut self, n: usize, rng: &mut Rng, device: &Device) -> Result<Batch> {
        let w = self.seq_len + 1;
        let windows: Vec<Vec<u32>> = match &self.source {
            Source::Ids { train, .. } => (0..n)
                .map(|_| {
                    let start = rng.below((train.len() - w + 1) as u64) as usize;
                    train[start..start + w].iter().map(|&x| x as u32).collect()
                })
                .collect(),
            Source::Artificial { kind, cdf } => (0..n).map(|_| generate(kind, cdf, w, rng)).collect(),
        };
        self.to_batch(&windows, device)
    }
    fn eval_len(&self, split: Split) -> usize {
        match split {
            Split::Test => self.eval_test.len(),
            Split::Train => self.eval_train.len(),
        }
    }
    fn eval_batch(&self, split: Split, start: usize, n: usize, device: &Device) -> Result<Batch> {
        let set = match split {
            Split::Test => &self.eval_test,
            Split::Train => &self.eval_train,
        };
        let start = start.min(set.len());
        let end = (start + n).min(set.len());
        self.to_batch(&set[start..end], device)
    }
}

/// Austen's novels from the `r-cran-janeaustenr` package's `data/Rdata.rdb`: R's lazy-load
/// database, one record per novel (4-byte big-endian length, then zlib), each an R
/// serialisation (format 2 or 3, XDR) of a character vector, one element per line.
/// Returns the novels' lines in file order.
pub fn austen_novels(rdb: &[u8], path: &Path) -> Result<Vec<Vec<String>>> {
    use std::io::Read;
    let bad = |msg: String| TaskError::data(path, msg);
    let mut novels = Vec::new();
    let mut at = 0usize;
    while at + 4 <= rdb.len() {
        let want = u32::from_be_bytes(rdb[at..at + 4].try_into().expect("4 bytes")) as usize;
        let mut z = flate2::read::ZlibDecoder::new(&rdb[at + 4..]);
        let mut out = Vec::with_capacity(want);
        z.read_to_end(&mut out)
            .map_err(|e| bad(format!("record at byte {at}: zlib: {e}")))?;
        if out.len() != want {
            return Err(bad(format!(
                "record at byte {at}: {} bytes, header says {want}",
                out.len()
            )));
        }
        at += 4 + z.total_in() as usize;
        novels.push(r_strings(&out).map_err(|m| bad(format!("record {}: {m}", novels.len())))?);
    }
    if novels.is_empty() {
        return Err(bad("no records".into()));
    }
    Ok(novels)
}

/// The elements of an R-serialised character vector (XDR, format 2 or 3).
fn r_strings(b: &[u8]) -> std::result::Result<Vec<String>, String> {
    let mut at = 0usize;
    let int = |at: &mut usize| -> std::result::Result<i32, String> {
        let v = b.get(*at..*at + 4).ok_or("truncated")?;
        *at += 4;
        Ok(i32::from_be_bytes(v.try_into().expect("4 bytes")))
    };
    if b.get(..2) != Some(b"X\n") {
        return Err("not an XDR R serialisation (no `X\\n` header)".into());
    }
    at += 2;
    let version = int(&mut at)?;
    let _writer = int(&mut at)?;
    let _reader = int(&mut at)?;
    match version {
        2 => {}
        3 => {
            let n = int(&mut at)? as usize;
            at += n; // native encoding name
        }
        v => return Err(format!("serialisation format {v} (2 or 3 expected)")),
    }
    let flags = int(&mut at)?;
    if flags & 0xff != 16 {
        return Err(format!(
            "object type {} (a character vector, 16, expected)",
            flags & 0xff
        ));
    }
    let len = int(&mut at)?;
    if len < 0 {
        return Err("long vectors are not supported".into());
    }
    let mut out = Vec::with_capacity(len as usize);
    for i in 0..len {
        let f = int(&mut at)?;
        if f & 0xff != 9 {
            return Err(format!("element {i}: type {} (a string, 9, expected)", f & 0xff));
        }
        let n = int(&mut at)?;
        if n < 0 {
            out.push(String::new()); // NA
            continue;
        }
        let s = b
            .get(at..at + n as usize)
            .ok_or_else(|| format!("element {i}: truncated"))?;
        at += n as usize;
        out.push(String::from_utf8_lossy(s).into_owned());
    }
    Ok(out)
}

/// Trains a byte-level BPE of `vocab` tokens (one special token, `<|endoftext|>`) on the
/// text file `train`, and saves it as a Hugging Face `tokenizer.json` at `out`.
pub fn train_bpe(train: &Path, vocab: usize, out: &Path) -> Result<tokenizers::Tokenizer> {
    use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{AddedToken, TokenizerBuilder};
    let err = |e: tokenizers::Error| TaskError::data(out, format!("training the tokenizer: {e}"));
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab)
        .min_frequency(2)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(vec![AddedToken::from("<|endoftext|>", true)])
        .build();
    let mut tok: tokenizers::TokenizerImpl<BPE, tokenizers::NormalizerWrapper, ByteLevel, ByteLevel, ByteLevel> =
        TokenizerBuilder::new()
            .with_model(BPE::default())
            .with_normalizer(None)
            .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
            .with_post_processor(Some(ByteLevel::default()))
            .with_decoder(Some(ByteLevel::default()))
            .build()
            .map_err(err)?;
    tok.train_from_files(&mut trainer, vec![train.display().to_string()])
        .map_err(err)?;
    tok.save(out, false).map_err(err)?;
    tokenizers::Tokenizer::from_file(out).map_err(err)
}

/// Token ids of `text` with `tok` (`path` names the tokenizer in errors).
pub fn encode(tok: &tokenizers::Tokenizer, text: &str, path: &Path) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    // Line by line: BPE on one 4 MB string is slow and memory hungry.
    for chunk in text.split_inclusive('\n') {
        let e = tok
            .encode(chunk, false)
            .map_err(|e| TaskError::data(path, format!("encoding: {e}")))?;
        ids.extend_from_slice(e.get_ids());
    }
    Ok(ids)
}

//! Language-modelling corpora: the R lazy-load reader behind `fpt fetch austen`, the BPE,
//! prepared corpora (windows, shifted labels, bad files named), and the artificial corpora's
//! statistics.

use candle_core::Device;
use fpt_nn::Rng;
use fpt_spec::TaskSpec;
use fpt_tasks::text::{austen_novels, TextTask};
use fpt_tasks::{Inputs, Split, Task};
use std::io::Write;
use std::path::Path;

/// An R serialisation (XDR, format 3) of a character vector.
fn r_character(lines: &[&str]) -> Vec<u8> {
    let mut b = b"X\n".to_vec();
    for v in [3i32, 0x040200, 0x030500, 5] {
        b.extend_from_slice(&v.to_be_bytes());
    }
    b.extend_from_slice(b"UTF-8");
    b.extend_from_slice(&16i32.to_be_bytes());
    b.extend_from_slice(&(lines.len() as i32).to_be_bytes());
    for l in lines {
        b.extend_from_slice(&0x00040009i32.to_be_bytes());
        b.extend_from_slice(&(l.len() as i32).to_be_bytes());
        b.extend_from_slice(l.as_bytes());
    }
    b
}

/// One lazy-load record: big-endian length, then zlib.
fn record(payload: &[u8]) -> Vec<u8> {
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(payload).unwrap();
    let mut out = (payload.len() as u32).to_be_bytes().to_vec();
    out.extend(z.finish().unwrap());
    out
}

#[test]
fn reads_the_character_vectors_of_an_r_lazy_load_database() {
    let mut rdb = record(&r_character(&["SENSE AND SENSIBILITY", "", "by Jane Austen"]));
    rdb.extend(record(&r_character(&["PERSUASION", "Chapter 1"])));
    let novels = austen_novels(&rdb, Path::new("Rdata.rdb")).unwrap();
    assert_eq!(novels.len(), 2);
    assert_eq!(novels[0], vec!["SENSE AND SENSIBILITY", "", "by Jane Austen"]);
    assert_eq!(novels[1][1], "Chapter 1");

    // A record that is not a character vector, a bad header, and a truncated stream are
    // named, not misread.
    let mut ints = r_character(&["x"]);
    let at = 2 + 16 + 5;
    ints[at..at + 4].copy_from_slice(&13i32.to_be_bytes());
    let e = austen_novels(&record(&ints), Path::new("Rdata.rdb"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Rdata.rdb") && e.contains("record 0") && e.contains("type 13"),
        "{e}"
    );
    let e = austen_novels(&record(b"RDX2\nnot xdr"), Path::new("Rdata.rdb"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not an XDR"), "{e}");
    let mut cut = record(&r_character(&["a long enough line"]));
    cut.truncate(cut.len() - 6);
    let e = austen_novels(&cut, Path::new("Rdata.rdb")).unwrap_err().to_string();
    assert!(e.contains("Rdata.rdb") && e.contains("record at byte 0"), "{e}");
}

#[test]
fn bpe_round_trips_and_prepared_corpora_give_shifted_windows() {
    let tmp = tempfile::tempdir().unwrap();
    let text = "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.\n".repeat(40);
    std::fs::write(tmp.path().join("train.txt"), &text).unwrap();
    let tok =
        fpt_tasks::text::train_bpe(&tmp.path().join("train.txt"), 400, &tmp.path().join("tokenizer.json")).unwrap();
    let ids = fpt_tasks::text::encode(&tok, &text, Path::new("t")).unwrap();
    assert!(
        ids.len() < text.len() / 3,
        "BPE merges: {} ids for {} bytes",
        ids.len(),
        text.len()
    );
    assert!(ids.iter().all(|&i| i < 400));
    assert_eq!(tok.decode(&ids, false).unwrap(), text, "decoding restores the text");

    let dir = tmp.path().join("corpus");
    std::fs::create_dir_all(&dir).unwrap();
    let write_ids = |name: &str, ids: &[u16]| {
        let b: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        std::fs::write(dir.join(name), b).unwrap();
    };
    write_ids("train.ids", &(0..200u16).map(|i| i % 50).collect::<Vec<_>>());
    write_ids("test.ids", &(0..41u16).collect::<Vec<_>>());
    std::fs::write(dir.join("corpus.json"), r#"{"vocab": 50}"#).unwrap();
    let mut spec = TaskSpec::parse(&format!("text:{}", dir.display())).unwrap();
    spec.data.max_len = Some(10);
    let mut task = TextTask::new(&spec, &fpt_nn::Rng::new(0)).unwrap();
    // 41 held-out ids: 4 windows of 10 inputs, each overlapping the next by one token.
    assert_eq!(task.eval_len(Split::Test), 4);
    let b = task.eval_batch(Split::Test, 1, 1, &Device::Cpu).unwrap();
    let Inputs::Tokens(x) = &b.inputs else {
        panic!("token inputs")
    };
    assert_eq!(
        x.flatten_all().unwrap().to_vec1::<u32>().unwrap(),
        (10..20).collect::<Vec<u32>>()
    );
    assert_eq!(
        b.labels.flatten_all().unwrap().to_vec1::<u32>().unwrap(),
        (11..21).collect::<Vec<u32>>()
    );
    let b = task.train_batch(3, &mut Rng::new(1), &Device::Cpu).unwrap();
    let Inputs::Tokens(x) = &b.inputs else {
        panic!("token inputs")
    };
    let (x, y) = (x.to_vec2::<u32>().unwrap(), b.labels.to_vec2::<u32>().unwrap());
    for (xi, yi) in x.iter().zip(&y) {
        assert_eq!(&xi[1..], &yi[..9], "labels are the inputs shifted by one");
        assert_eq!((xi[0] + 1) % 50, xi[1]);
    }

    // Bad corpora are named: an id outside the vocabulary, a split shorter than a window.
    write_ids("test.ids", &[1, 2, 77, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
    let e = TextTask::new(&spec, &fpt_nn::Rng::new(0)).err().unwrap().to_string();
    assert!(e.contains("test.ids") && e.contains("token 2 is id 77"), "{e}");
    write_ids("test.ids", &[1, 2, 3]);
    let e = TextTask::new(&spec, &fpt_nn::Rng::new(0)).err().unwrap().to_string();
    assert!(e.contains("test.ids") && e.contains("fewer than one window"), "{e}");
    std::fs::remove_file(dir.join("corpus.json")).unwrap();
    let e = TextTask::new(&spec, &fpt_nn::Rng::new(0)).err().unwrap().to_string();
    assert!(e.contains("corpus.json") && e.contains("fpt fetch austen"), "{e}");
}

/// Tokens of one artificial corpus, and the fraction that repeat the top of a greedy stack
/// replay (the grammar's pops).
fn stats(corpus: &str) -> (Vec<u32>, f64, f64) {
    let mut spec = TaskSpec::parse(&format!("text:{corpus}")).unwrap();
    spec.data.max_len = Some(255);
    let mut task = TextTask::new(&spec, &fpt_nn::Rng::new(0)).unwrap();
    let b = task.train_batch(40, &mut Rng::new(7), &Device::Cpu).unwrap();
    let Inputs::Tokens(x) = &b.inputs else {
        panic!("token inputs")
    };
    let rows = x.to_vec2::<u32>().unwrap();
    let (mut pops, mut n) = (0usize, 0usize);
    for r in &rows {
        let mut stack: Vec<u32> = Vec::new();
        for &t in r {
            if stack.last() == Some(&t) {
                stack.pop();
                pops += 1;
            } else {
                stack.push(t);
            }
            n += 1;
        }
    }
    let all: Vec<u32> = rows.concat();
    (all, pops as f64 / n as f64, task.unigram_perplexity())
}

#[test]
fn artificial_corpora_have_their_distributions() {
    let (uniform, u_pops, u_ppl) = stats("uniform");
    let (zipf, z_pops, z_ppl) = stats("zipf");
    let (parens, p_pops, _) = stats("parens");
    // Uniform over 4096: the unigram perplexity is the vocabulary size, no token dominates.
    assert!((u_ppl - 4096.0).abs() < 1.0, "{u_ppl}");
    let share0 = |v: &[u32]| v.iter().filter(|&&t| t == 0).count() as f64 / v.len() as f64;
    assert!(share0(&uniform) < 0.005);
    // Zipf over 4096: p(0) = 1 / H_4096 = 0.1153.
    assert!((share0(&zipf) - 0.1153).abs() < 0.02, "{}", share0(&zipf));
    assert!(z_ppl < 1000.0, "{z_ppl}");
    // The stack grammar pops (repeats the open token) about 60% of the time once the stack
    // is non-empty; i.i.d. corpora almost never repeat the top.
    assert!(p_pops > 0.4 && p_pops < 0.65, "{p_pops}");
    assert!(u_pops < 0.01 && z_pops < 0.1, "{u_pops} {z_pops}");
    assert!(parens.iter().all(|&t| t < 4096));
}

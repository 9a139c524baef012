//! `fpt predict RUN_DIR --inputs FILE --out FILE`: a trained run's predictions on new
//! examples, one per line of the output (JSONL, or CSV when the output ends in `.csv`).

use crate::parse_device;
use anyhow::{Context, Result};
use clap::Args;
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct PredictArgs {
    /// The run directory (its latest checkpoint predicts).
    pub(crate) dir: PathBuf,
    /// The examples: JSON Lines in the custom task's format (`tokens` or `features` per
    /// record; a `label` is optional and scored where given; `split` is ignored), or, for
    /// runs of MNIST and Fashion-MNIST, an IDX file of images (`[n, rows, cols]` bytes, plain
    /// or gzip'd, as `t10k-images-idx3-ubyte`). For a run of a built-in token task, the
    /// records hold what its model reads (token ids).
    #[arg(long)]
    pub(crate) inputs: PathBuf,
    /// With IDX images: their labels, an IDX file `[n]` (scored).
    #[arg(long, value_name = "FILE")]
    pub(crate) labels: Option<PathBuf>,
    /// Where to write the predictions: one line per example, JSONL (`{"index", "class",
    /// "probabilities"[, "label"]}`), or CSV (`index,class,p0,p1,..[,label]`) when the name
    /// ends in `.csv`. Written whole or not at all.
    #[arg(long)]
    pub(crate) out: PathBuf,
    /// Device: `cpu`, or `cuda` / `cuda:N` when built with `--features cuda`.
    #[arg(long, default_value = "cpu")]
    pub(crate) device: String,
}

/// Refuses an output path that is one of the inputs (the same file, or a hard or symbolic
/// link to it), before anything is read: predictions never replace the data they came from.
fn refuse_output_over_inputs(out: &std::path::Path, inputs: &[&std::path::Path]) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    // The output need not exist; where it does, it is compared by device and inode (hard
    // links, symlinks followed); where it does not, by its canonical parent and name.
    let same = |input: &std::path::Path| -> bool {
        match (std::fs::metadata(out), std::fs::metadata(input)) {
            (Ok(o), Ok(i)) => o.dev() == i.dev() && o.ino() == i.ino(),
            _ => false,
        }
    };
    for input in inputs {
        if same(input) {
            anyhow::bail!(
                "--out {} is the input file {} (the same file or a link to it): refused, nothing read or written; choose another output path",
                out.display(),
                input.display()
            );
        }
    }
    Ok(())
}

pub(crate) fn predict(a: PredictArgs) -> Result<()> {
    let mut inputs = vec![a.inputs.as_path()];
    inputs.extend(a.labels.as_deref());
    refuse_output_over_inputs(&a.out, &inputs)?;
    let device = parse_device(&a.device)?;
    let (data, labels) = if is_idx(&a.inputs) {
        fpt_tasks::images::read_idx_for_prediction(&a.inputs, a.labels.as_deref())?
    } else {
        if let Some(l) = &a.labels {
            anyhow::bail!(
                "--labels {}: only IDX images take a labels file (JSONL records carry their own `label`)",
                l.display()
            );
        }
        fpt_tasks::custom::read_for_prediction(&a.inputs)?
    };
    let predictor = fpt_train::Predictor::open(&a.dir, &device)?;
    let dims = predictor.dims();
    // A label the run cannot have is refused, not scored.
    if let Some((i, l)) = labels
        .iter()
        .enumerate()
        .find_map(|(i, l)| l.filter(|&l| l as usize >= dims.classes).map(|l| (i, l)))
    {
        anyhow::bail!(
            "{}: example {i} has label {l}, but the run has {} classes (0..{}): refused, nothing written",
            a.labels.as_deref().unwrap_or(&a.inputs).display(),
            dims.classes,
            dims.classes - 1
        );
    }
    let p = predictor.predict(&data)?;
    let cut = (0..data.len()).filter(|&i| data.seq_len(i) > dims.seq_len).count();
    if cut > 0 {
        eprintln!(
            "fpt predict: {cut} example(s) longer than the run's {} tokens were cut to {}, as the run's task cuts its own sequences",
            dims.seq_len, dims.seq_len
        );
    }
    let csv = a.out.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv"));
    let k = p.probabilities.first().map_or(0, Vec::len);
    let any_label = labels.iter().any(Option::is_some);
    let mut text = String::new();
    if csv {
        let head: Vec<String> = (0..k).map(|c| format!("p{c}")).collect();
        let _ = writeln!(
            text,
            "index,class,{}{}",
            head.join(","),
            if any_label { ",label" } else { "" }
        );
    }
    for (i, (class, probs)) in p.classes.iter().zip(&p.probabilities).enumerate() {
        if csv {
            let ps: Vec<String> = probs.iter().map(|v| v.to_string()).collect();
            let label = match (any_label, labels[i]) {
                (false, _) => String::new(),
                (true, Some(l)) => format!(",{l}"),
                (true, None) => ",".into(),
            };
            let _ = writeln!(text, "{i},{class},{}{label}", ps.join(","));
        } else {
            let mut v = serde_json::json!({ "index": i, "class": class, "probabilities": probs });
            if let Some(l) = labels[i] {
                v["label"] = serde_json::json!(l);
            }
            let _ = writeln!(text, "{v}");
        }
    }
    fpt_spec::files::write_atomic(&a.out, text.as_bytes()).with_context(|| format!("writing {}", a.out.display()))?;
    let scored: Vec<(u32, u32)> = labels
        .iter()
        .zip(&p.classes)
        .filter_map(|(l, c)| l.map(|l| (l, *c)))
        .collect();
    let accuracy = if scored.is_empty() {
        String::new()
    } else {
        let right = scored.iter().filter(|(l, c)| l == c).count();
        format!(
            "; accuracy {:.4} on the {} labelled",
            right as f64 / scored.len() as f64,
            scored.len()
        )
    };
    eprintln!(
        "fpt predict: {} examples, checkpoint of step {}{accuracy} -> {}",
        p.classes.len(),
        p.step,
        a.out.display()
    );
    Ok(())
}

/// Whether `path` starts as an IDX file does (`00 00 08`: unsigned bytes) or is gzip'd
/// (JSON Lines inputs are read plain).
fn is_idx(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 3];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|_| head == [0, 0, 8] || head[..2] == [0x1f, 0x8b])
}

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

pub(crate) fn predict(a: PredictArgs) -> Result<()> {
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
    let p = fpt_train::predict_run(&a.dir, &data, &device)?;
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

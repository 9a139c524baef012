//! Per-example outcomes of an evaluation, and the judgement they allow: did a run leave its
//! task's trivial baseline ([`fpt_tasks::baseline`])?
//!
//! A run's final evaluation keeps, per held-out example, how many of its labels were
//! predicted right (bit tasks: of its bits), and how often each class was predicted. They
//! are written to `outcomes.json` in the run directory, so that reports can resample them
//! (paired bootstrap over examples, `fpt_ablate::claims`), and they decide
//! [`BaselineCheck`] in `result.json`. A run is **at baseline** when any of these holds:
//! - its accuracy is within the 95% interval of the baseline's on the same examples (the
//!   paired difference of per-example scores, normal interval, does not exclude 0 from
//!   above);
//! - its predictions collapsed onto one class (95% or more of them, where the evaluated
//!   labels' majority class is under 90%);
//! - its training loss (the mean over each evaluation interval) never went below the
//!   trivial predictor's loss.

use candle_core::{DType, Tensor};
use fpt_tasks::{Baseline, BaselineKind};
use serde::{Deserialize, Serialize};

/// Counts predictions of one evaluation as it runs: loss, right labels per example,
/// predictions per class.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    loss_sum: f64,
    labels: usize,
    /// Right labels per example, in evaluation order.
    pub correct: Vec<u32>,
    /// Predictions per class.
    pub predicted: Vec<u64>,
}

impl Tally {
    /// Adds a batch: `logits` `[examples * labels_per_example, classes]`, `targets` the
    /// matching class ids.
    pub fn add(&mut self, logits: &Tensor, targets: &Tensor, labels_per_example: usize) -> crate::Result<()> {
        let loss = fpt_nn::transfer::download_scalar::<f64>(
            &fpt_nn::ops::cross_entropy(logits, targets)?.to_dtype(DType::F64)?,
        )?;
        let pred = fpt_nn::transfer::download_vec::<u32>(&logits.argmax(candle_core::D::Minus1)?)?;
        let want = fpt_nn::transfer::download_vec::<u32>(targets)?;
        self.add_host(loss, &pred, &want, labels_per_example);
        Ok(())
    }

    /// Adds batches kept on the device, `(logits, targets)` each as [`Tally::add`] takes
    /// them, read back in three downloads (each batch's mean loss, every prediction, every
    /// target): the tally of adding them one by one, to the last bit.
    pub fn add_batches(&mut self, batches: &[(Tensor, Tensor)], labels_per_example: usize) -> crate::Result<()> {
        if batches.is_empty() {
            return Ok(());
        }
        let losses = batches
            .iter()
            .map(|(l, t)| Ok(fpt_nn::ops::cross_entropy(l, t)?.to_dtype(DType::F64)?.reshape(1)?))
            .collect::<crate::Result<Vec<_>>>()?;
        let losses = fpt_nn::transfer::download_vec::<f64>(&Tensor::cat(&losses, 0)?)?;
        let (logits, targets): (Vec<Tensor>, Vec<Tensor>) = batches.iter().cloned().unzip();
        let pred = fpt_nn::transfer::download_vec::<u32>(&Tensor::cat(&logits, 0)?.argmax(candle_core::D::Minus1)?)?;
        let want = fpt_nn::transfer::download_vec::<u32>(&Tensor::cat(&targets, 0)?)?;
        let mut at = 0;
        for ((_, t), loss) in batches.iter().zip(losses) {
            let n = t.elem_count();
            self.add_host(loss, &pred[at..at + n], &want[at..at + n], labels_per_example);
            at += n;
        }
        Ok(())
    }

    /// Adds a batch read back: its mean loss, predictions and targets.
    fn add_host(&mut self, loss: f64, pred: &[u32], want: &[u32], labels_per_example: usize) {
        let count = want.len();
        self.loss_sum += loss * count as f64;
        for row in pred
            .chunks(labels_per_example.max(1))
            .zip(want.chunks(labels_per_example.max(1)))
        {
            self.correct
                .push(row.0.iter().zip(row.1).filter(|(p, w)| p == w).count() as u32);
        }
        for &p in pred {
            let p = p as usize;
            if p >= self.predicted.len() {
                self.predicted.resize(p + 1, 0);
            }
            self.predicted[p] += 1;
        }
        self.labels += count;
    }

    /// Mean loss and accuracy over the labels counted.
    pub fn loss_and_accuracy(&self) -> (f64, f64) {
        let right: u64 = self.correct.iter().map(|&c| c as u64).sum();
        let n = self.labels.max(1) as f64;
        (self.loss_sum / n, right as f64 / n)
    }
}

/// The per-example outcomes of one evaluation (`outcomes.json`). The trivial baseline's
/// per-example scores are not kept: the task gives them again ([`Baseline::scores`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcomes {
    /// The step evaluated.
    pub step: usize,
    /// Labels per example (bits of a bit task's string; 1 for classification).
    pub labels_per_example: usize,
    /// Right labels per example, in the split's order.
    pub correct: Vec<u32>,
    /// Predictions per class.
    pub predicted: Vec<u64>,
    /// The evaluated labels' fingerprint ([`Baseline::fingerprint`]): runs with equal
    /// fingerprints were evaluated on the same examples, and pair up.
    pub fingerprint: String,
}

impl Outcomes {
    /// From a finished tally and the baseline on the same split.
    pub fn new(step: usize, labels_per_example: usize, tally: &Tally, base: &Baseline) -> Outcomes {
        Outcomes {
            step,
            labels_per_example,
            correct: tally.correct.clone(),
            predicted: tally.predicted.clone(),
            fingerprint: base.fingerprint.clone(),
        }
    }

    /// Per-example scores (share of the labels right), in 0..1.
    pub fn scores(&self) -> Vec<f64> {
        let l = self.labels_per_example.max(1) as f64;
        self.correct.iter().map(|&c| c as f64 / l).collect()
    }
}

/// Whether a run left its task's trivial baseline, with the numbers (`result.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineCheck {
    /// The trivial predictor.
    pub kind: BaselineKind,
    /// It, in words.
    pub describe: String,
    /// Its accuracy on the evaluated examples, in 0..1.
    pub accuracy: f64,
    /// Its loss per label (nats).
    pub loss: f64,
    /// The run's accuracy minus the baseline's, on the same examples, in 0..1.
    pub margin: f64,
    /// The 95% interval of `margin` (paired over examples).
    pub margin_interval: (f64, f64),
    /// Share of all predictions that went to the most-predicted class (`None`: not recorded).
    pub top_prediction_share: Option<f64>,
    /// The lowest training loss over the evaluation intervals (`None` if none was finite).
    pub lowest_train_loss: Option<f64>,
    /// True when the run left its baseline (none of the reasons holds).
    pub left: bool,
    /// Why the run is at baseline (empty when it left it).
    pub reasons: Vec<String>,
    /// Classes of the evaluated split never seen in training (they cannot be learned).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes_only_in_eval: Vec<u32>,
}

/// The standard error of the mean of `d`.
pub fn standard_error(d: &[f64]) -> f64 {
    let n = d.len().max(1) as f64;
    let mean = d.iter().sum::<f64>() / n;
    let var = if d.len() > 1 {
        d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (var / n).sqrt()
}

/// Mean and 95% normal interval of `d`'s mean.
pub fn mean_interval(d: &[f64]) -> (f64, (f64, f64)) {
    let mean = d.iter().sum::<f64>() / d.len().max(1) as f64;
    let half = 1.96 * standard_error(d);
    (mean, (mean - half, mean + half))
}

pub use crate::convergence::{
    accuracy_trend, convergence, keep_for_convergence, plateau, Plateau, FLAT_GAIN, RISING_GAIN,
};

/// One evaluation's per-example scores, kept for the convergence rule ([`convergence`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalScores {
    /// The step evaluated.
    pub step: usize,
    /// Labels per example.
    pub labels_per_example: usize,
    /// Right labels per example, in the split's order.
    pub correct: Vec<u32>,
}

impl EvalScores {
    /// From a finished tally.
    pub fn new(step: usize, labels_per_example: usize, tally: &Tally) -> Self {
        EvalScores {
            step,
            labels_per_example,
            correct: tally.correct.clone(),
        }
    }

    pub(crate) fn scores(&self) -> impl Iterator<Item = f64> + '_ {
        let l = self.labels_per_example.max(1) as f64;
        self.correct.iter().map(move |&c| c as f64 / l)
    }
}

/// The share of predictions above which a run counts as collapsed onto one class.
pub const COLLAPSE_SHARE: f64 = 0.95;

/// The reason a run is at baseline by its accuracy, if it is: the interval of its margin
/// over the baseline does not exclude 0 from above.
fn accuracy_reason(base: &Baseline, margin: f64, (lo, hi): (f64, f64), examples: usize, how: &str) -> Option<String> {
    (lo <= 0.0).then(|| {
        // Below it, where even the interval's top is under 0; else within its noise.
        let relation = if hi < 0.0 {
            "is below"
        } else {
            "is within the uncertainty of"
        };
        format!(
            "accuracy {:.1}% {relation} the baseline's {:.1}% ({}; difference {:+.1} points, 95% interval {:+.1} to {:+.1} over {examples} examples{how})",
            100.0 * (base.accuracy + margin),
            100.0 * base.accuracy,
            base.describe(),
            100.0 * margin,
            100.0 * lo,
            100.0 * hi,
        )
    })
}

/// The lowest finite training loss, and the reason a run is at baseline by it, if it is.
fn loss_reason(base: &Baseline, train_losses: &[f64]) -> (Option<f64>, Option<String>) {
    let lowest = train_losses
        .iter()
        .copied()
        .filter(|l| l.is_finite())
        .fold(None, |m: Option<f64>, l| Some(m.map_or(l, |m| m.min(l))));
    let why = match lowest {
        Some(l) if l < base.loss => None,
        Some(l) => Some(format!(
            "training loss never below the trivial predictor's {:.4} (lowest {l:.4})",
            base.loss
        )),
        None => Some("no finite training loss".into()),
    };
    (lowest, why)
}

fn check_of(
    base: &Baseline,
    margin: f64,
    interval: (f64, f64),
    top_prediction_share: Option<f64>,
    lowest_train_loss: Option<f64>,
    reasons: Vec<String>,
) -> BaselineCheck {
    BaselineCheck {
        kind: base.kind,
        describe: base.describe(),
        accuracy: base.accuracy,
        loss: base.loss,
        margin,
        margin_interval: interval,
        top_prediction_share,
        lowest_train_loss,
        left: reasons.is_empty(),
        reasons,
        classes_only_in_eval: base.classes_only_in_eval.clone(),
    }
}

/// Judges a run's final evaluation `out` against the baseline `base` on the same split;
/// `train_losses` are its training losses per evaluation interval.
pub fn judge(base: &Baseline, out: &Outcomes, train_losses: &[f64]) -> BaselineCheck {
    let diffs: Vec<f64> = out.scores().iter().zip(&base.scores).map(|(s, b)| s - b).collect();
    let (margin, interval) = mean_interval(&diffs);
    let total: u64 = out.predicted.iter().sum();
    let top = out.predicted.iter().copied().max().unwrap_or(0);
    let top_share = top as f64 / total.max(1) as f64;
    let (lowest, loss_why) = loss_reason(base, train_losses);
    let mut reasons: Vec<String> = accuracy_reason(base, margin, interval, diffs.len(), "")
        .into_iter()
        .collect();
    if top_share >= COLLAPSE_SHARE && base.majority_share < 0.9 {
        let class = out.predicted.iter().position(|&c| c == top).unwrap_or(0);
        reasons.push(format!(
            "predictions collapsed: {:.1}% of them are class {class} (the evaluated labels' most frequent class is {:.1}% of them)",
            100.0 * top_share,
            100.0 * base.majority_share
        ));
    }
    reasons.extend(loss_why);
    check_of(base, margin, interval, Some(top_share), lowest, reasons)
}

/// Judges a run from its accuracy alone, for results written before fpt kept per-example
/// outcomes: the interval of the difference is the widest the two accuracies allow (each
/// example's score as spread as a coin with that mean, the two perfectly anti-correlated),
/// so a run is called off its baseline only when even that interval excludes it.
/// Collapsed predictions cannot be seen and are not assessed.
pub fn judge_summary(base: &Baseline, accuracy: f64, examples: usize, train_losses: &[f64]) -> BaselineCheck {
    let sd = |p: f64| (p.clamp(0.0, 1.0) * (1.0 - p.clamp(0.0, 1.0))).sqrt();
    let margin = accuracy - base.accuracy;
    let half = 1.96 * (sd(accuracy) + sd(base.accuracy)) / (examples.max(1) as f64).sqrt();
    let interval = (margin - half, margin + half);
    let how = ", from the accuracies alone: the run's per-example outcomes were not recorded";
    let (lowest, loss_why) = loss_reason(base, train_losses);
    let mut reasons: Vec<String> = accuracy_reason(base, margin, interval, examples, how)
        .into_iter()
        .collect();
    reasons.extend(loss_why);
    check_of(base, margin, interval, None, lowest, reasons)
}

/// Writes `outcomes.json` into a run directory.
pub fn write(out_dir: &std::path::Path, outcomes: &Outcomes) -> crate::Result<()> {
    crate::write_atomic(
        &out_dir.join("outcomes.json"),
        serde_json::to_string(outcomes).expect("outcomes serialise").as_bytes(),
    )
}

/// Reads `outcomes.json` from a run directory, if it is there and parses.
pub fn read(out_dir: &std::path::Path) -> Option<Outcomes> {
    let text = std::fs::read_to_string(out_dir.join("outcomes.json")).ok()?;
    serde_json::from_str(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(scores: Vec<f64>, majority_share: f64, loss: f64) -> Baseline {
        let accuracy = scores.iter().sum::<f64>() / scores.len() as f64;
        Baseline {
            kind: BaselineKind::MajorityClass,
            accuracy,
            loss,
            majority_class: 0,
            majority_share,
            classes_only_in_eval: vec![],
            scores,
            fingerprint: "f".into(),
        }
    }

    fn outcomes(correct: Vec<u32>, predicted: Vec<u64>) -> Outcomes {
        Outcomes {
            step: 1,
            labels_per_example: 1,
            correct,
            predicted,
            fingerprint: "f".into(),
        }
    }

    #[test]
    fn a_majority_predictor_is_at_baseline_for_every_reason() {
        // 80/20 labels; the run predicts class 0 always: exactly the baseline.
        let b = base((0..100).map(|i| f64::from(u8::from(i < 80))).collect(), 0.8, 0.5);
        let o = outcomes((0..100).map(|i| u32::from(i < 80)).collect(), vec![100, 0]);
        let j = judge(&b, &o, &[0.52, 0.51]);
        assert!(!j.left);
        assert_eq!(j.reasons.len(), 3, "{:?}", j.reasons);
        assert_eq!(j.margin, 0.0);
    }

    #[test]
    fn a_run_well_above_its_baseline_left_it() {
        let b = base((0..200).map(|i| f64::from(u8::from(i % 10 == 0))).collect(), 0.1, 2.3);
        let o = outcomes(
            (0..200).map(|i| u32::from(i % 4 != 0)).collect(),
            vec![20, 20, 20, 20, 20, 20, 20, 20, 20, 20],
        );
        let j = judge(&b, &o, &[2.2, 1.1]);
        assert!(j.left, "{:?}", j.reasons);
        assert!((j.margin - 0.65).abs() < 1e-12);
        assert!(j.margin_interval.0 > 0.5 && j.margin_interval.1 < 0.8);
        assert_eq!(j.lowest_train_loss, Some(1.1));
    }

    #[test]
    fn a_small_margin_within_the_noise_is_at_baseline() {
        // 52 of 100 right against a 50% baseline: well within the interval.
        let b = base((0..100).map(|i| f64::from(u8::from(i % 2 == 0))).collect(), 0.5, 0.69);
        let o = outcomes((0..100).map(|i| u32::from(i < 52)).collect(), vec![50, 50]);
        let j = judge(&b, &o, &[0.6]);
        assert!(!j.left);
        assert_eq!(j.reasons.len(), 1, "{:?}", j.reasons);
        assert!(j.reasons[0].contains("within the uncertainty"));
    }

    #[test]
    fn the_tally_counts_labels_per_example() {
        let dev = candle_core::Device::Cpu;
        // Two examples of 3 labels, 2 classes.
        let logits = Tensor::new(&[[1f32, 0.], [0., 1.], [1., 0.], [1., 0.], [1., 0.], [0., 1.]], &dev).unwrap();
        let targets = Tensor::new(&[0u32, 1, 1, 0, 0, 0], &dev).unwrap();
        let mut t = Tally::default();
        t.add(&logits, &targets, 3).unwrap();
        assert_eq!(t.correct, vec![2, 2]);
        assert_eq!(t.predicted, vec![4, 2]);
        assert!((t.loss_and_accuracy().1 - 4.0 / 6.0).abs() < 1e-12);
    }
}

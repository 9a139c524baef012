//! Trivial baselines: what a predictor that learned nothing from its inputs scores on the
//! evaluated split of a task. A number at such a baseline is no evidence that a model
//! learned, so runs are judged against it (`fpt_train::judge`) and claims never rest on it.
//!
//! Two trivial predictors:
//! - **majority class**: every label predicted as the evaluated split's most frequent
//!   class (chance on a balanced task such as Bit XOR; ListOps' most frequent answer);
//! - **copy the visible bits** (Bit Memory, paper §2.1): the query's visible bits copied,
//!   the masked ones guessed, which scores `visible + masked / 2` of each string's bits
//!   (75% in expectation).
//!
//! Each comes with the loss per label in nats of the best constant predictor (the entropy of
//! the training labels' class frequencies: no constant prediction does better on the
//! training data; ln 2 for the bit tasks). A training loss that never goes below it means
//! the run learned nothing about its inputs. (Bit Memory's copy predictor would reach
//! ln 2 per masked bit, but a model trained with dropout on its inputs cannot be that sure
//! of the visible ones, so its accuracy, not its loss, is held against the copy.) A class
//! that occurs in the evaluated split but never in training can never be learned; it is
//! listed.

use crate::{Inputs, Result, Split, Task};
use candle_core::Device;
use std::collections::BTreeSet;

/// Which trivial predictor a baseline is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BaselineKind {
    /// Every label predicted as the evaluated split's most frequent class.
    MajorityClass,
    /// Bit Memory: the visible query bits copied, the masked ones guessed.
    CopyVisibleBits,
}

/// A task's trivial baseline on one evaluated split.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Baseline {
    /// The trivial predictor.
    pub kind: BaselineKind,
    /// Its accuracy over the split's labels, in 0..1.
    pub accuracy: f64,
    /// Its loss per label in nats (see the module docs).
    pub loss: f64,
    /// The split's most frequent class.
    pub majority_class: u32,
    /// That class's share of the split's labels, in 0..1.
    pub majority_share: f64,
    /// Classes of the evaluated split that never occur in training (they cannot be learned).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes_only_in_eval: Vec<u32>,
    /// The predictor's score on each example (the share of its labels it gets right), in
    /// the split's order: the paired reference a run's own scores are compared with.
    #[serde(skip)]
    pub scores: Vec<f64>,
    /// SHA-256 (16 hex digits) of the split's labels in order: two runs with the same
    /// fingerprint were evaluated on the same examples, so their outcomes pair up.
    pub fingerprint: String,
}

impl Baseline {
    /// One line for reports: `majority class 3 (17.5% of the evaluated labels)`.
    pub fn describe(&self) -> String {
        match self.kind {
            BaselineKind::MajorityClass => format!(
                "majority class {} ({:.1}% of the evaluated labels)",
                self.majority_class,
                100.0 * self.majority_share
            ),
            BaselineKind::CopyVisibleBits => format!(
                "copy the visible bits, guess the masked ones ({:.1}% of the evaluated bits)",
                100.0 * self.accuracy
            ),
        }
    }
}

/// The labels of an evaluation split, one row per example (read on the CPU).
pub fn eval_labels<T: Task + ?Sized>(task: &T, split: Split) -> Result<Vec<Vec<u32>>> {
    let mut rows = Vec::with_capacity(task.eval_len(split));
    let n = task.eval_len(split);
    while rows.len() < n {
        let b = task.eval_batch(split, rows.len(), 256, &Device::Cpu)?;
        if b.inputs.batch_size() == 0 {
            break;
        }
        rows.extend(b.labels.to_vec2::<u32>()?);
    }
    Ok(rows)
}

/// Label counts per class (`classes` wide, or wider where a label exceeds it).
pub fn class_counts<'a>(labels: impl IntoIterator<Item = &'a u32>, classes: usize) -> Vec<u64> {
    let mut counts = vec![0u64; classes];
    for &l in labels {
        let l = l as usize;
        if l >= counts.len() {
            counts.resize(l + 1, 0);
        }
        counts[l] += 1;
    }
    counts
}

/// Entropy in nats of the class frequencies `counts` (the loss of the best constant predictor).
pub fn entropy(counts: &[u64]) -> f64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0.0;
    }
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / total as f64;
            -p * p.ln()
        })
        .sum()
}

fn fingerprint(rows: &[Vec<u32>]) -> String {
    let bytes: Vec<u8> = rows.iter().flatten().flat_map(|l| l.to_le_bytes()).collect();
    fpt_spec::files::sha256_hex(&bytes)[..16].to_string()
}

/// The majority-class baseline of `eval` (the evaluated split's labels, one row per
/// example), with the constant predictor's loss from the training labels' counts `train`.
pub fn majority(eval: &[Vec<u32>], train: &[u64], classes: usize) -> Baseline {
    let counts = class_counts(eval.iter().flatten(), classes);
    let total: u64 = counts.iter().sum();
    // The most frequent class; ties go to the smallest id.
    let (majority_class, top) = counts
        .iter()
        .enumerate()
        .fold((0usize, 0u64), |b, (c, &n)| if n > b.1 { (c, n) } else { b });
    let scores: Vec<f64> = eval
        .iter()
        .map(|row| row.iter().filter(|&&l| l as usize == majority_class).count() as f64 / row.len().max(1) as f64)
        .collect();
    let share = top as f64 / total.max(1) as f64;
    let seen: BTreeSet<usize> = (0..train.len()).filter(|&c| train[c] > 0).collect();
    let classes_only_in_eval = (0..counts.len())
        .filter(|c| counts[*c] > 0 && !seen.contains(c))
        .map(|c| c as u32)
        .collect();
    Baseline {
        kind: BaselineKind::MajorityClass,
        accuracy: share,
        loss: entropy(train),
        majority_class: majority_class as u32,
        majority_share: share,
        classes_only_in_eval,
        scores,
        fingerprint: fingerprint(eval),
    }
}

/// The majority-class baseline of any task on `split`: the labels of the split, and for
/// the constant predictor's loss the training split's labels where the task stores them
/// (else the fixed training-distribution sample it evaluates as `Split::Train`).
pub fn majority_of<T: Task + ?Sized>(task: &T, split: Split) -> Result<Baseline> {
    let classes = task.dims().classes;
    let eval = eval_labels(task, split)?;
    let train = match task.splits().into_iter().find(|(name, _)| *name == "train") {
        Some((_, data)) => class_counts(&data.labels, classes),
        None => class_counts(eval_labels(task, Split::Train)?.iter().flatten(), classes),
    };
    Ok(majority(&eval, &train, classes))
}

/// Bit Memory's copy baseline on `split`: per string, the visible query bits (non-zero
/// inputs among the last `n_bits` values of each example) are right and half the masked
/// ones are; its loss is the constant predictor's.
pub fn copy_visible_bits<T: Task + ?Sized>(task: &T, split: Split, n_bits: usize) -> Result<Baseline> {
    let mut base = majority_of(task, split)?;
    let (mut scores, mut right, mut bits) = (Vec::new(), 0.0, 0usize);
    let n = task.eval_len(split);
    while scores.len() < n {
        let b = task.eval_batch(split, scores.len(), 64, &Device::Cpu)?;
        let Inputs::Vectors(x) = &b.inputs else {
            unreachable!("Bit Memory's inputs are vectors")
        };
        let rows = x.flatten_from(1)?.to_vec2::<f32>()?;
        if rows.is_empty() {
            break;
        }
        for row in rows {
            let query = &row[row.len() - n_bits..];
            let masked = query.iter().filter(|v| **v == 0.0).count();
            let score = (n_bits - masked) as f64 + 0.5 * masked as f64;
            right += score;
            bits += n_bits;
            scores.push(score / n_bits as f64);
        }
    }
    base.kind = BaselineKind::CopyVisibleBits;
    base.accuracy = right / bits.max(1) as f64;
    base.scores = scores;
    Ok(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majority_counts_the_evaluated_split_and_names_unlearnable_classes() {
        let eval = vec![vec![2], vec![2], vec![0], vec![3], vec![2]];
        let b = majority(&eval, &[5, 0, 5], 4);
        assert_eq!(b.majority_class, 2);
        assert!((b.accuracy - 0.6).abs() < 1e-12);
        assert_eq!(b.scores, vec![1.0, 1.0, 0.0, 0.0, 1.0]);
        assert_eq!(b.classes_only_in_eval, vec![3]);
        assert!((b.loss - std::f64::consts::LN_2).abs() < 1e-12);
        // Same labels, same fingerprint; a change anywhere changes it.
        assert_eq!(b.fingerprint, majority(&eval, &[1], 4).fingerprint);
        let mut other = eval.clone();
        other[4][0] = 0;
        assert_ne!(b.fingerprint, majority(&other, &[1], 4).fingerprint);
    }

    #[test]
    fn entropy_of_an_80_20_split() {
        let h = entropy(&[80, 20]);
        assert!((h - (-(0.8f64 * 0.8f64.ln()) - 0.2 * 0.2f64.ln())).abs() < 1e-12);
        assert_eq!(entropy(&[7, 0]), 0.0);
    }

    #[test]
    fn copy_baseline_is_exact_per_string() {
        let root = fpt_nn::Rng::new(3);
        let t = crate::BitMemory::new(100, 5, 10, 40, &root).unwrap();
        let b = t.baseline(Split::Test).unwrap();
        assert_eq!(b.kind, BaselineKind::CopyVisibleBits);
        assert_eq!(b.scores.len(), 40);
        // Each string: visible bits right, half the masked ones.
        let rows = eval_labels(&t, Split::Test).unwrap();
        assert_eq!(rows.len(), 40);
        let mean = b.scores.iter().sum::<f64>() / 40.0;
        assert!((mean - b.accuracy).abs() < 1e-12);
        assert!((b.accuracy - 0.75).abs() < 0.03, "{}", b.accuracy);
        // The constant predictor's loss: the bits are balanced, so close to ln 2.
        assert!((b.loss - std::f64::consts::LN_2).abs() < 0.01, "{}", b.loss);
    }
}

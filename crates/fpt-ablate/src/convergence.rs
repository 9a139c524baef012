//! How a report judges a run's convergence: fpt's rule, re-derived for runs recorded before
//! it where their records allow, and the words a cell shows for it.

/// Whether a run is converged by fpt's rule ([`fpt_train::outcomes::convergence`]: no gain
/// above the noise across the last half of its steps, paired over the held-out examples,
/// and not before `floor`, its row's Table 6 count), with the reason in words. Runs judged
/// by the rule are read as they recorded it. Older runs (a fixed window of evaluations, or
/// none recorded) are re-derived as far as their records allow: one that stopped before
/// its floor, or whose test said it was rising, is not converged; one whose accuracy rose
/// across its last half by more than even the widest interval the two accuracies allow is
/// not either; otherwise the rule cannot be applied (the per-example outcomes of its
/// earlier evaluations were not kept): `None`.
pub fn converged_by_rule(
    res: &fpt_train::RunResult,
    evals: &[fpt_train::EvalRecord],
    floor: Option<usize>,
) -> (Option<bool>, String) {
    let (call, words) = call_by_rule(res, evals, floor);
    (call.converged(), words)
}

/// What the rule says of a finished run ([`call_by_rule`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// Flat across the last half of its steps, past its floor (or ended at its ceiling).
    Converged,
    /// Still rising at its end (its last half gained half a point or more, or the gain's
    /// interval lies above 0): its number is a lower bound of where it would end.
    Rising,
    /// Not converged and no bound: not yet flat, stopped before its floor, evaluated fewer
    /// than three times, or diverged.
    NotConverged,
    /// The rule cannot be applied to its records.
    Unknown,
}

impl Call {
    /// Converged (`Some(true)`), not (`Some(false)`), or not known.
    pub fn converged(self) -> Option<bool> {
        match self {
            Call::Converged => Some(true),
            Call::Rising | Call::NotConverged => Some(false),
            Call::Unknown => None,
        }
    }
}

/// [`converged_by_rule`], telling a run still rising at its end (a lower bound) from one
/// not converged otherwise.
pub fn call_by_rule(
    res: &fpt_train::RunResult,
    evals: &[fpt_train::EvalRecord],
    floor: Option<usize>,
) -> (Call, String) {
    let floor = floor.or(res.plateau.as_ref().and_then(|p| p.floor));
    if res.diverged {
        return (Call::NotConverged, "diverged: no plateau".into());
    }
    if let Some(p) = res.plateau.as_ref().filter(|p| p.rule.as_deref() == Some("trend")) {
        let call = match (p.converged(), p.rising) {
            (true, _) => Call::Converged,
            (false, true) => Call::Rising,
            (false, false) => Call::NotConverged,
        };
        return (call, format!("{}{}", plateau_words(p), line_end_words(evals, p)));
    }
    // Too few evaluations for any trend (the rule's window needs three).
    if res.plateau.is_none() && evals.len() < 3 {
        return (
            Call::NotConverged,
            format!(
                "not converged: evaluated {} time(s); the trend rule needs three evaluations in the last half of a run",
                evals.len()
            ),
        );
    }
    // Still rising by its own test: a lower bound, whatever else is said of it.
    if let Some(p) = res.plateau.as_ref().filter(|p| p.rising) {
        return (Call::Rising, plateau_words(p));
    }
    if let Some(f) = floor.filter(|&f| res.steps < f) {
        return (
            Call::NotConverged,
            format!(
                "not converged: it stopped at step {}, before step {f}, the paper's Table 6 count for its row and task",
                res.steps
            ),
        );
    }
    // The trend rule on the accuracies alone (every evaluation of the last half): rising
    // when their line gains half a point or more, or its interval lies above 0.
    if let Some(last) = evals.last() {
        let from = evals.iter().rposition(|e| e.step <= last.step / 2).unwrap_or(0);
        let points: Vec<(usize, f64)> = evals[from..].iter().map(|e| (e.step, e.test_accuracy)).collect();
        if let Some((gain, (lo, hi))) = fpt_train::outcomes::accuracy_trend(&points) {
            if gain >= fpt_train::outcomes::RISING_GAIN || lo > 0.0 {
                return (
                    Call::Rising,
                    format!(
                        "not converged: still rising by the trend of its last half ({:+.1} points from step {} to step {} on the line through its {} evaluations; 95% interval {:+.1} to {:+.1})",
                        100.0 * gain,
                        points[0].0,
                        last.step,
                        points.len(),
                        100.0 * lo,
                        100.0 * hi
                    ),
                );
            }
        }
    }
    // The accuracies alone over the last half: rising only if even the widest interval the
    // two allow (each example a coin with its accuracy, the two anti-correlated) says so.
    if let Some(last) = evals.last() {
        if let Some(first) = evals.iter().rev().find(|e| e.step <= last.step / 2) {
            let n = res.eval_examples.max(1) as f64;
            let sd = |p: f64| (p.clamp(0.0, 1.0) * (1.0 - p.clamp(0.0, 1.0))).sqrt();
            let gain = last.test_accuracy - first.test_accuracy;
            let half = 1.96 * (sd(last.test_accuracy) + sd(first.test_accuracy)) / n.sqrt();
            if gain - half > 0.0 {
                return (
                    Call::Rising,
                    format!(
                        "not converged: {:+.1} points from step {} to step {} (the last half of its steps; at least {:+.1} by the widest interval the two accuracies allow)",
                        100.0 * gain,
                        first.step,
                        last.step,
                        100.0 * (gain - half)
                    ),
                );
            }
        }
    }
    let why = match res.plateau.as_ref().and_then(|p| p.rule.as_deref()) {
        Some("half") => "called converged by the earlier rule (two evaluations, paired over the examples), which one low evaluation could make; the trend rule (every evaluation of the last half) cannot be re-derived: the run kept the per-example outcomes of its last evaluations only",
        _ => "convergence cannot be re-derived by the rule (the trend of the last half of the run, over the examples): the run kept the per-example outcomes of its last evaluations only",
    };
    (Call::Unknown, why.into())
}

/// Where the least-squares line through `points` (`(step, accuracy)` in step order) stands
/// at its last step: where the run's trend says it ended, which one evaluation's jitter
/// (a few tenths of a point between checkpoints on MNIST) does not move. `None` with fewer
/// than three points.
pub fn line_end(points: &[(usize, f64)]) -> Option<f64> {
    let (gain, _) = fpt_train::outcomes::accuracy_trend(points)?;
    let n = points.len() as f64;
    let (first, last) = (points.first()?.0 as f64, points.last()?.0 as f64);
    let xbar = points.iter().map(|p| p.0 as f64).sum::<f64>() / n;
    let abar = points.iter().map(|p| p.1).sum::<f64>() / n;
    Some(abar + gain / (last - first) * (last - xbar))
}

/// A trend window's line end beside its last evaluation, in words: the cell's number is the
/// last evaluation (its per-example outcomes are what the claims resample), and a reader
/// sees how far one evaluation stands from the trend. Empty where the run's records lack
/// the window's evaluations.
fn line_end_words(evals: &[fpt_train::EvalRecord], p: &fpt_train::outcomes::Plateau) -> String {
    let points: Vec<(usize, f64)> = evals
        .iter()
        .filter(|e| e.step >= p.from_step && e.step <= p.to_step)
        .map(|e| (e.step, e.test_accuracy))
        .collect();
    match (line_end(&points), points.last()) {
        (Some(end), Some(&(step, last))) if step == p.to_step => format!(
            "; the line ends at {:.2}% at step {step}, the last evaluation {:.2}%",
            100.0 * end,
            100.0 * last
        ),
        _ => String::new(),
    }
}

/// A run's baseline check as its steps to convergence read it: a run that ended less than
/// `tolerance` (the spec's `convergence_tolerance`, in 0..1) above its task's trivial
/// baseline has a count that measures no speed. Its steps to convergence are those of the
/// first evaluation from which every later one stays within `tolerance` of the best; when
/// the whole gain over the baseline is under `tolerance`, every evaluation at or above the
/// baseline already is, so the count marks where the run reached its baseline, not how fast
/// it learned (Random / Bit Memory of the converge campaign: 0.28 points over copying the
/// visible bits, "converged" at 1000, its first evaluation, against FPT's 4000 to 99.9%).
/// Such a run is at its baseline for a step count, with the reason; every other check is
/// returned as it is.
pub fn steps_measure_nothing(
    mut b: fpt_train::outcomes::BaselineCheck,
    tolerance: f64,
) -> fpt_train::outcomes::BaselineCheck {
    if b.left && b.margin < tolerance {
        b.reasons.push(format!(
            "{:+.2} points over the baseline's {:.1}% ({}), less than the {:.1}-point tolerance that defines its steps to convergence: every evaluation at or above the baseline is within it of the best, so the count marks where it reached its baseline, not how fast it learned",
            100.0 * b.margin,
            100.0 * b.accuracy,
            b.describe,
            100.0 * tolerance
        ));
        b.left = false;
    }
    b
}

/// The plateau test of a run in words (a cell's `curve`).
pub fn plateau_words(p: &fpt_train::outcomes::Plateau) -> String {
    let what = if p.rising {
        "still rising (the number is a lower bound)"
    } else if p.before_floor() {
        "not converged: before its row's Table 6 count"
    } else if !p.flat() {
        "not converged: not yet flat (the gain's interval reaches a point, or the flat call has not held)"
    } else if p.ceiling == Some(true) {
        "converged at its ceiling (within half a point of every label right, it cannot gain half a point more; a smaller gain does not keep it rising)"
    } else {
        "converged (flat across the last half of its steps)"
    };
    let how = if p.rule.as_deref() == Some("trend") {
        format!(
            "the line through {} evaluations; 95% interval {:+.1} to {:+.1} over the held-out examples and the evaluations' scatter; flat at {} of the {} evaluations in a row it needs",
            p.window + 1,
            100.0 * p.interval.0,
            100.0 * p.interval.1,
            p.flat_for.unwrap_or(0),
            p.hold.unwrap_or(0)
        )
    } else {
        format!(
            "{} evaluations; 95% interval {:+.1} to {:+.1}, paired over the held-out examples",
            p.window,
            100.0 * p.interval.0,
            100.0 * p.interval.1
        )
    };
    format!(
        "{what}: {:+.1} points from step {} to step {} ({how})",
        100.0 * p.gain,
        p.from_step,
        p.to_step,
    )
}

/// How the last two evaluations of a run compare, measured against the standard error of
/// an accuracy: from the final evaluation's per-example outcomes where the run kept them
/// (a bit task's string counts as one example of many bits), else the binomial error over
/// `n` examples.
pub fn curve_state(
    evals: &[fpt_train::EvalRecord],
    n: usize,
    outcomes: Option<&fpt_train::outcomes::Outcomes>,
) -> Option<String> {
    let [.., a, b] = evals else {
        return None;
    };
    let (p, q) = (a.test_accuracy, b.test_accuracy);
    let m = 0.5 * (p + q);
    let se = match outcomes {
        Some(o) => fpt_train::outcomes::standard_error(&o.scores()),
        None => (m * (1.0 - m) / n.max(1) as f64).sqrt(),
    };
    let noise = 2.0 * std::f64::consts::SQRT_2 * se;
    let state = if (q - p).abs() <= noise {
        "flat"
    } else if q > p {
        "rising"
    } else {
        "falling"
    };
    Some(format!(
        "{state}: {:.1}% at step {} -> {:.1}% at step {} (noise +-{:.1})",
        100.0 * p,
        a.step,
        100.0 * q,
        b.step,
        100.0 * noise
    ))
}

/// How a diverged run's cell says it diverged: where, why, and what its number is (the best
/// evaluation before divergence; or, with none before it, the diverged weights' own, which
/// is no evidence of learning).
pub fn diverged_words(res: &fpt_train::RunResult) -> String {
    let at = res.diverged_at_step;
    let step = at.map_or("?".into(), |s| s.to_string());
    let why = res.diverged_reason.as_deref().unwrap_or("non-finite loss");
    if at.is_none_or(|s| res.best_step < s) {
        format!(
            "diverged at step {step} ({why}); the number is the best evaluation before it, at step {}",
            res.best_step
        )
    } else {
        format!(
            "diverged at step {step} ({why}) before its first evaluation; the number is the diverged weights' evaluation at step {}, no evidence of learning",
            res.best_step
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{line_end, steps_measure_nothing};
    use fpt_train::outcomes::BaselineCheck;

    fn check(margin: f64) -> BaselineCheck {
        BaselineCheck {
            kind: fpt_tasks::BaselineKind::MajorityClass,
            describe: "the majority class".into(),
            accuracy: 0.749,
            loss: 0.5,
            margin,
            margin_interval: (margin - 0.001, margin + 0.001),
            top_prediction_share: None,
            lowest_train_loss: None,
            left: true,
            reasons: vec![],
            classes_only_in_eval: vec![],
        }
    }

    /// Random / Bit Memory of the converge campaign ended 0.28 points above copying the
    /// visible bits, left by its interval, but under the 1-point tolerance of its steps to
    /// convergence: for a step count it is at its baseline. A run 2 points over it is not,
    /// and one already at its baseline keeps its own reasons only.
    #[test]
    fn a_gain_under_the_tolerance_makes_no_speed() {
        let near = steps_measure_nothing(check(0.0028), 0.01);
        assert!(!near.left);
        assert_eq!(near.reasons.len(), 1);
        assert!(
            near.reasons[0].contains("+0.28 points over the baseline's 74.9%"),
            "{:?}",
            near.reasons
        );
        assert!(near.reasons[0].contains("1.0-point tolerance"), "{:?}", near.reasons);
        let learned = steps_measure_nothing(check(0.02), 0.01);
        assert!(learned.left && learned.reasons.is_empty());
        let mut at = check(0.0);
        at.left = false;
        at.reasons.push("within the uncertainty".into());
        assert_eq!(steps_measure_nothing(at.clone(), 0.01), at);
    }

    /// On a straight line the line ends at the last point; on a flat stretch that ends on a
    /// low evaluation (FPT / MNIST seed 0 of the converge campaign: 96.69, 97.39, 96.70 at
    /// its last three) it ends near the stretch's mean, not at the low one.
    #[test]
    fn the_line_end_is_where_the_trend_stands_not_the_last_evaluation() {
        let straight: Vec<(usize, f64)> = (0..5).map(|i| (1000 * i, 0.90 + 0.01 * i as f64)).collect();
        assert!((line_end(&straight).unwrap() - 0.94).abs() < 1e-12);
        let flat = [
            (26000, 0.9694),
            (30000, 0.9720),
            (40000, 0.9741),
            (48000, 0.9669),
            (50000, 0.9739),
            (52000, 0.9670),
        ];
        let end = line_end(&flat).unwrap();
        // The six points' mean is 97.055%; their line falls 0.16 points across them and
        // ends at 96.99%, above the last evaluation's 96.70%.
        assert!((end - 0.96993).abs() < 1e-4, "{end}");
        assert!(end - 0.9670 > 0.002, "{end}");
        assert_eq!(line_end(&flat[..2]), None);
    }
}

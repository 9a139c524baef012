//! What a campaign run's time goes to: its evaluations' share of it, from the seconds each
//! evaluation took (`eval_s` in `metrics.jsonl`) against the seconds between lines (issue
//! 54: evaluations spaced to take at most a fifth of a run's time).

use std::path::Path;

/// How much of a run's time its evaluations take: for each timed evaluation, its seconds
/// over the seconds since the line before (the steps between and the evaluation). Typical
/// is the median: one evaluation starved by other work on the machine (one took 1505 s
/// where the others took 96) must not set the spacing.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EvalShare {
    /// Each timed evaluation's share of its span, in the run's order.
    pub shares: Vec<f64>,
}

impl EvalShare {
    /// The median share (the mean of the middle two for an even count).
    pub fn typical(&self) -> f64 {
        let mut v = self.shares.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n == 0 {
            return 0.0;
        }
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }

    /// The largest share.
    pub fn largest(&self) -> f64 {
        self.shares.iter().copied().fold(0.0, f64::max)
    }

    /// "12% of its time (median of 5 timed evaluations; the slowest 55%)".
    pub fn describe(&self) -> String {
        let n = self.shares.len();
        let slowest = if n > 1 && self.largest() > 1.5 * self.typical() {
            format!("; the slowest {:.0}%, beside other work", 100.0 * self.largest())
        } else {
            String::new()
        };
        format!(
            "{:.0}% of its time (median of {n} timed evaluations{slowest})",
            100.0 * self.typical()
        )
    }
}

/// The time a run spent evaluating: over each pair of consecutive lines of `metrics.jsonl`
/// whose later one timed its evaluation (`eval_s`) in the same stretch (its `elapsed_s`
/// grew by more than the evaluation took), the evaluation's seconds over the seconds between
/// the two lines (the steps between them and that evaluation). `None` before any was timed.
pub fn eval_time(dir: &Path) -> Option<EvalShare> {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).ok()?;
    let recs: Vec<fpt_train::EvalRecord> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let shares: Vec<f64> = recs
        .windows(2)
        .filter_map(|w| {
            let (e, span) = (w[1].eval_s?, w[1].elapsed_s - w[0].elapsed_s);
            (w[1].step > w[0].step && span > e).then(|| e / span)
        })
        .collect();
    (!shares.is_empty()).then_some(EvalShare { shares })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The evaluation share counts each timed evaluation with the stretch before it, and
    /// never a span across a restart that lost time (elapsed not above the evaluation).
    #[test]
    fn eval_time_sums_timed_evaluations_over_their_stretches() {
        let dir = std::env::temp_dir().join(format!("fpt-eval-time-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let line = |step: usize, elapsed: f64, eval: Option<f64>| {
            let mut v = serde_json::json!({"step": step, "train_loss": 1.0, "test_loss": 1.0,
                "test_accuracy": 0.5, "lr": 0.001, "grad_norm": 1.0, "elapsed_s": elapsed});
            if let Some(e) = eval {
                v["eval_s"] = serde_json::json!(e);
            }
            v.to_string()
        };
        let lines = [
            line(1000, 100.0, None),
            line(2000, 220.0, Some(20.0)),
            line(3000, 340.0, Some(30.0)),
            line(4000, 345.0, Some(30.0)),
        ];
        std::fs::write(dir.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
        let e = eval_time(&dir).unwrap();
        assert_eq!(e.shares, [20.0 / 120.0, 30.0 / 120.0]);
        assert!((e.typical() - 25.0 / 120.0).abs() < 1e-12);
        // One evaluation starved by other work moves the median, not the whole share.
        let starved = EvalShare {
            shares: vec![0.07, 0.05, 0.55, 0.06, 0.08],
        };
        assert_eq!(starved.typical(), 0.07);
        assert_eq!(
            starved.describe(),
            "7% of its time (median of 5 timed evaluations; the slowest 55%, beside other work)"
        );
        std::fs::write(dir.join("metrics.jsonl"), line(1000, 100.0, None)).unwrap();
        assert_eq!(eval_time(&dir), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! The uncertainty of a claim's comparison, in the manner of rliable (Agarwal et al. 2021,
//! *Deep RL at the Edge of the Statistical Precipice*): a stratified bootstrap, each pair
//! of cells a stratum, the statistic the mean over pairs of the paired difference.
//!
//! One replicate: for every pair, its seeds are drawn with replacement (the cells' runs
//! pair by seed: seed `i` of both was evaluated on the same examples when their
//! fingerprints agree), then each drawn seed's held-out examples are drawn with
//! replacement, the same indices for both cells, and the difference of their mean
//! per-example scores is taken. A pair with one seed per cell cannot show the seed-to-seed
//! spread; where that spread was measured for the task at the scale
//! (`data/tables/seed-spread.toml`), a normal draw of it (the difference of two seeds:
//! `sqrt(2)` times the spread) is added to the replicate, so that a single-seed difference
//! within the seed spread stays inconclusive.

use fpt_nn::Rng;
use fpt_train::outcomes::Outcomes;

/// Replicates per interval.
pub const REPLICATES: usize = 2000;

/// One pair of cells: each cell's runs (one per seed, seed order) and the task's measured
/// seed spread (points; 0 when unknown).
#[derive(Debug, Clone, Copy)]
pub struct Pair<'a> {
    /// The cell that should be ahead.
    pub a: &'a [Outcomes],
    /// The cell it is compared with.
    pub b: &'a [Outcomes],
    /// The task's seed spread (standard deviation across seeds, in points).
    pub seed_sd: f64,
}

fn mean_score(o: &Outcomes, idx: &[usize]) -> f64 {
    let l = o.labels_per_example.max(1) as f64;
    idx.iter().map(|&i| o.correct[i] as f64).sum::<f64>() / (l * idx.len().max(1) as f64)
}

fn draw(rng: &mut Rng, n: usize) -> Vec<usize> {
    (0..n).map(|_| rng.below(n as u64) as usize).collect()
}

/// A weighted sum of cells (each cell's runs, one per seed, seed order), the statistic of a
/// claim that compares differences ("the gap a - b exceeds the gap c - d": weights +1, -1,
/// -1, +1). A [`Pair`] is the sum with weights +1 and -1.
#[derive(Debug, Clone)]
pub struct Combination<'a> {
    /// (weight, runs) per cell.
    pub terms: Vec<(f64, &'a [Outcomes])>,
    /// The task's seed spread (standard deviation across seeds, in points).
    pub seed_sd: f64,
}

impl<'a> From<&Pair<'a>> for Combination<'a> {
    fn from(p: &Pair<'a>) -> Self {
        Combination {
            terms: vec![(1.0, p.a), (-1.0, p.b)],
            seed_sd: p.seed_sd,
        }
    }
}

/// One replicate of a combination, in points. Per drawn seed, each cell's held-out examples
/// are drawn once and shared with every later cell evaluated on the same examples (the same
/// fingerprint and count), so paired cells are resampled together.
fn replicate(p: &Combination, rng: &mut Rng) -> f64 {
    let seeds = p.terms.iter().map(|(_, r)| r.len()).min().unwrap_or(0);
    let mut sum = 0.0;
    for _ in 0..seeds {
        let s = rng.below(seeds as u64) as usize;
        let mut drawn: Vec<(&Outcomes, Vec<usize>)> = Vec::with_capacity(p.terms.len());
        let mut value = 0.0;
        for (w, runs) in &p.terms {
            let o = &runs[s];
            let shared = drawn
                .iter()
                .find(|(d, _)| d.fingerprint == o.fingerprint && d.correct.len() == o.correct.len());
            let idx = match shared {
                Some((_, idx)) => idx.clone(),
                None => draw(rng, o.correct.len()),
            };
            value += w * mean_score(o, &idx);
            drawn.push((o, idx));
        }
        sum += value;
    }
    let mut d = 100.0 * sum / seeds.max(1) as f64;
    if seeds == 1 && p.seed_sd > 0.0 {
        // Each cell's number is one draw of its seed spread.
        let w2: f64 = p.terms.iter().map(|(w, _)| w * w).sum();
        d += rng.normal() * p.seed_sd * w2.sqrt();
    }
    d
}

/// The point estimate (mean over pairs of the paired difference, in points) and the 95%
/// percentile interval of its bootstrap distribution. Deterministic: the replicates draw
/// from a fixed seed.
pub fn mean_difference(pairs: &[Pair]) -> (f64, (f64, f64)) {
    let combos: Vec<Combination> = pairs.iter().map(Combination::from).collect();
    mean_combination(&combos)
}

/// [`mean_difference`] of weighted sums of cells: the mean over the combinations of each
/// one's weighted sum, in points, and its 95% percentile interval. The draws of a
/// two-cell combination with weights +1 and -1 are those of its [`Pair`].
pub fn mean_combination(combos: &[Combination]) -> (f64, (f64, f64)) {
    let k = combos.len().max(1) as f64;
    let all = |o: &Outcomes| mean_score(o, &(0..o.correct.len()).collect::<Vec<_>>());
    let point = combos
        .iter()
        .map(|p| {
            let seeds = p.terms.iter().map(|(_, r)| r.len()).min().unwrap_or(0);
            let sum: f64 = (0..seeds)
                .map(|s| p.terms.iter().fold(0.0, |acc, (w, r)| acc + w * all(&r[s])))
                .sum();
            100.0 * sum / seeds.max(1) as f64
        })
        .sum::<f64>()
        / k;
    let mut rng = Rng::new(0).fork("claims-bootstrap");
    let mut reps: Vec<f64> = (0..REPLICATES)
        .map(|_| combos.iter().map(|p| replicate(p, &mut rng)).sum::<f64>() / k)
        .collect();
    reps.sort_by(f64::total_cmp);
    let at = |q: f64| reps[((q * (REPLICATES - 1) as f64).round() as usize).min(REPLICATES - 1)];
    (point, (at(0.025), at(0.975)))
}

/// One set of runs of one cell (one per seed): the mean accuracy in points and the 95%
/// percentile interval of its bootstrap over seeds and, within each, held-out examples.
/// Deterministic, as [`mean_difference`].
pub fn mean_accuracy(runs: &[Outcomes]) -> (f64, (f64, f64)) {
    let n = runs.len().max(1);
    let all = |o: &Outcomes| mean_score(o, &(0..o.correct.len()).collect::<Vec<_>>());
    let point = 100.0 * runs.iter().map(all).sum::<f64>() / n as f64;
    if runs.is_empty() {
        return (point, (point, point));
    }
    let mut rng = Rng::new(0).fork("seeds-bootstrap");
    let mut reps: Vec<f64> = (0..REPLICATES)
        .map(|_| {
            let sum: f64 = (0..n)
                .map(|_| {
                    let o = &runs[rng.below(n as u64) as usize];
                    let idx = draw(&mut rng, o.correct.len());
                    mean_score(o, &idx)
                })
                .sum();
            100.0 * sum / n as f64
        })
        .collect();
    reps.sort_by(f64::total_cmp);
    let at = |q: f64| reps[((q * (REPLICATES - 1) as f64).round() as usize).min(REPLICATES - 1)];
    (point, (at(0.025), at(0.975)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(correct: Vec<u32>, fingerprint: &str) -> Outcomes {
        Outcomes {
            step: 1,
            labels_per_example: 1,
            correct,
            predicted: vec![],
            fingerprint: fingerprint.into(),
        }
    }

    #[test]
    fn a_clear_difference_has_an_interval_that_excludes_zero() {
        let a = [run((0..400).map(|i| u32::from(i % 10 != 0)).collect(), "x")];
        let b = [run((0..400).map(|i| u32::from(i % 2 == 0)).collect(), "x")];
        let (d, (lo, hi)) = mean_difference(&[Pair {
            a: &a,
            b: &b,
            seed_sd: 0.0,
        }]);
        assert!((d - 40.0).abs() < 1e-9);
        assert!(lo > 30.0 && hi < 50.0 && lo < d && d < hi, "{lo} {hi}");
    }

    #[test]
    fn pairing_narrows_the_interval_of_correlated_runs() {
        // b is a with 8 of 400 examples flipped to wrong: a 2-point difference that pairing
        // resolves and independent resampling would not.
        let ca: Vec<u32> = (0..400).map(|i| u32::from(i % 3 != 0)).collect();
        let mut cb = ca.clone();
        let mut flipped = 0;
        for c in cb.iter_mut() {
            if *c == 1 && flipped < 8 {
                *c = 0;
                flipped += 1;
            }
        }
        let (a, b) = ([run(ca.clone(), "x")], [run(cb.clone(), "x")]);
        let (_, (lo, _)) = mean_difference(&[Pair {
            a: &a,
            b: &b,
            seed_sd: 0.0,
        }]);
        assert!(lo > 0.0, "paired: {lo}");
        let (a, b) = ([run(ca, "x")], [run(cb, "y")]);
        let (_, (lo, _)) = mean_difference(&[Pair {
            a: &a,
            b: &b,
            seed_sd: 0.0,
        }]);
        assert!(lo < 0.0, "unpaired: {lo}");
    }

    #[test]
    fn a_single_seed_difference_within_the_seed_spread_is_not_resolved() {
        let a = [run((0..2000).map(|i| u32::from(i % 10 < 8)).collect(), "x")];
        let b = [run((0..2000).map(|i| u32::from(i % 10 < 7)).collect(), "x")];
        let pair = |sd| Pair {
            a: &a,
            b: &b,
            seed_sd: sd,
        };
        let (_, (lo, _)) = mean_difference(&[pair(0.0)]);
        assert!(lo > 0.0, "{lo}");
        // Ten points of difference against a seed spread of 6 points.
        let (_, (lo, _)) = mean_difference(&[pair(6.0)]);
        assert!(lo < 0.0, "{lo}");
    }

    #[test]
    fn several_seeds_are_resampled() {
        // Seeds disagree wildly: the interval is wide though each seed has many examples.
        let a = [
            run(vec![1; 1000], "s0"),
            run(vec![0; 1000], "s1"),
            run(vec![1; 1000], "s2"),
        ];
        let b = [
            run(vec![0; 1000], "s0"),
            run(vec![1; 1000], "s1"),
            run(vec![0; 1000], "s2"),
        ];
        let (d, (lo, hi)) = mean_difference(&[Pair {
            a: &a,
            b: &b,
            seed_sd: 0.0,
        }]);
        assert!((d - 100.0 / 3.0).abs() < 1e-9);
        assert!(lo < 0.0 && hi > 60.0, "{lo} {hi}");
    }

    /// A gap with a cell on both sides, `(a - b) - (c - a)`, is `2a - b - c`; its examples
    /// are drawn once per replicate for every cell evaluated on them, so a cell counted
    /// twice moves with itself.
    #[test]
    fn a_combination_resamples_shared_examples_together() {
        let a = [run((0..500).map(|i| u32::from(i % 10 < 8)).collect(), "x")];
        let b = [run((0..500).map(|i| u32::from(i % 10 < 5)).collect(), "x")];
        let c = [run((0..500).map(|i| u32::from(i % 10 < 9)).collect(), "x")];
        let gap = Combination {
            terms: vec![(1.0, &a[..]), (-1.0, &b[..]), (-1.0, &c[..]), (1.0, &a[..])],
            seed_sd: 0.0,
        };
        let (d, (lo, hi)) = mean_combination(&[gap]);
        assert!((d - (2.0 * 80.0 - 50.0 - 90.0)).abs() < 1e-9, "{d}");
        assert!(lo < d && d < hi && lo > 0.0, "{lo} {hi}");
        let net = Combination {
            terms: vec![(2.0, &a[..]), (-1.0, &b[..]), (-1.0, &c[..])],
            seed_sd: 0.0,
        };
        assert_eq!(mean_combination(&[net]), (d, (lo, hi)));
    }

    /// A set's mean accuracy sits inside its interval, which narrows with more examples and
    /// widens when the seeds disagree.
    #[test]
    fn a_sets_interval_holds_its_mean_and_reflects_seed_spread() {
        let same = |k: usize, n: usize| run((0..n).map(|i| u32::from(i % 10 < k)).collect(), "f");
        let (m, (lo, hi)) = mean_accuracy(&[same(7, 200), same(7, 200)]);
        assert!((m - 70.0).abs() < 1e-9 && lo < m && m < hi, "{m} {lo} {hi}");
        let (_, (lo2, hi2)) = mean_accuracy(&[same(7, 2000), same(7, 2000)]);
        assert!(hi2 - lo2 < hi - lo, "more examples, a narrower interval");
        let (m3, (lo3, hi3)) = mean_accuracy(&[same(5, 200), same(9, 200)]);
        assert!((m3 - 70.0).abs() < 1e-9);
        assert!(hi3 - lo3 > hi - lo, "disagreeing seeds, a wider interval");
    }
}

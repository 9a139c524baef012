//! The claim kinds beyond "a beats b": a gap between two differences (`gap`), a factor
//! between two step counts (`ratio`), a cell within a margin of a number (`comparable` with
//! `than`), each on the table it encodes a claim of, with numbers chosen so the verdict is
//! known by hand.

use fpt_ablate::claims::{check, validate, CellValue};
use fpt_ablate::load_table;
use fpt_spec::table::{Claim, ClaimKind, TableSpec};
use std::path::Path;

fn table(id: &str) -> TableSpec {
    let tables = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tables");
    load_table(&tables, id).unwrap()
}

fn claim<'t>(t: &'t TableSpec, starts: &str) -> &'t Claim {
    t.claims
        .iter()
        .find(|c| c.text.starts_with(starts))
        .unwrap_or_else(|| panic!("{}: no claim `{starts}...`", t.id))
}

fn cell(value: f64, se: f64) -> CellValue<'static> {
    CellValue {
        value,
        se,
        ..CellValue::default()
    }
}

/// Table 3's "the architecture makes up most of the gain from the random LSTM to FPT":
/// `(Trans. - LSTM) - (FPT - Trans.)`, decided by hand: Trans. counts twice, so its error
/// counts with weight 2 in the interval.
#[test]
fn a_gap_claim_weighs_a_cell_on_both_sides_once_with_its_net_weight() {
    let t = table("table3");
    let c = claim(&t, "The transformer architecture makes up most");
    assert_eq!(c.kind, ClaimKind::Gap);
    let row = |r: usize| t.rows[r].label.clone();
    let v = |trans: f64, lstm: f64, fpt: f64| {
        check(&t, c, &|r, col| match (row(r).as_str(), col) {
            ("Trans.", 0..=3) => Some(cell(trans, 1.0)),
            ("LSTM", 0..=3) => Some(cell(lstm, 1.0)),
            ("FPT", 0..=3) => Some(cell(fpt, 1.0)),
            _ => None,
        })
    };
    // (80 - 50) - (90 - 80) = 20 in each of 4 pairs. Per pair the variance is 2^2 + 1 + 1 =
    // 6 (Trans. with its net weight 2): the mean's half-width is 1.96 sqrt(4 x 6) / 4 = 2.4.
    let holds = v(80.0, 50.0, 90.0);
    assert_eq!(holds.verdict, "holds", "{}", holds.detail);
    assert!(
        holds
            .detail
            .contains("(Trans. - LSTM) - (FPT - Trans.): +20.0, 95% interval +17.6 to +22.4"),
        "{}",
        holds.detail
    );
    assert!(
        holds
            .detail
            .contains("over 4 of 7 pairs: Bit Memory, XOR, ListOps, MNIST"),
        "{}",
        holds.detail
    );
    // (60 - 50) - (95 - 60) = -25: the architecture is the smaller part of the gain.
    assert_eq!(v(60.0, 50.0, 95.0).verdict, "fails");
    // (70 - 50) - (90 - 70) = 0: the interval straddles it.
    assert_eq!(v(70.0, 50.0, 90.0).verdict, "inconclusive");
}

/// In a gap, the side to be beaten (`b`) may be a model that ended at its baseline; any
/// other cell at its baseline, or not converged, leaves its pair out.
#[test]
fn a_gap_leaves_out_pairs_as_a_beats_b_does() {
    let t = table("table3");
    let c = claim(&t, "The transformer architecture makes up most");
    let row = |r: usize| t.rows[r].label.clone();
    let at = || Some("accuracy within the uncertainty of the baseline".to_string());
    let v = |lstm_ended: bool, fpt_rising: bool| {
        check(&t, c, &|r, col| match (row(r).as_str(), col) {
            ("Trans.", 3) => Some(cell(80.0, 0.5)),
            ("LSTM", 3) => Some(CellValue {
                at_baseline: at(),
                ended_at_baseline: lstm_ended,
                ..cell(11.0, 0.5)
            }),
            ("FPT", 3) => Some(CellValue {
                convergence: match fpt_rising {
                    true => fpt_ablate::claims::Convergence::NotConverged,
                    false => fpt_ablate::claims::Convergence::Reached,
                },
                ..cell(90.0, 0.5)
            }),
            _ => None,
        })
    };
    assert_eq!(v(true, false).verdict, "holds", "{}", v(true, false).detail);
    let at_baseline = v(false, false);
    assert_eq!(at_baseline.verdict, "undecided", "{}", at_baseline.detail);
    assert!(
        at_baseline.detail.contains("at their trivial baseline: LSTM / MNIST"),
        "{}",
        at_baseline.detail
    );
    let rising = v(true, true);
    assert_eq!(rising.verdict, "undecided", "{}", rising.detail);
    assert!(rising.detail.contains("FPT / MNIST"), "{}", rising.detail);
}

/// Table 7's gaps between train-test gaps, on the paper's numbers: Linformer's 58 points
/// against the vanilla transformer's 28, and its 28 against FPT's -0.1.
#[test]
fn table7s_overfitting_gaps_hold_on_the_papers_numbers() {
    let t = table("table7");
    for (start, want) in [("Linformer overfits the most", 30.0), ("FPT underfits where", 28.1)] {
        let c = claim(&t, start);
        let v = check(&t, c, &|r, col| {
            fpt_ablate::paper::parse_paper(&t.paper[r][col]).map(CellValue::exact)
        });
        assert_eq!(v.verdict, "holds", "{}", v.detail);
        assert!(v.detail.contains(&format!("{want:+.1}")), "{}", v.detail);
    }
}

/// Table 6's "Bit Memory pretraining is about 6x slower than FPT on Bit XOR": a factor on
/// the log scale, each count's error (half an evaluation interval, or the seeds') carried
/// as a relative error.
#[test]
fn a_ratio_claim_compares_factors_with_their_interval() {
    let t = table("table6");
    let c = claim(&t, "Bit Memory pretraining is about 6x slower");
    assert_eq!(c.kind, ClaimKind::Ratio);
    let row = |r: usize| t.rows[r].label.clone();
    let v = |bit: (f64, f64), fpt: (f64, f64)| {
        check(&t, c, &|r, col| match (row(r).as_str(), col) {
            ("Bit", 1) => Some(cell(bit.0, bit.1)),
            ("FPT", 1) => Some(cell(fpt.0, fpt.1)),
            _ => None,
        })
    };
    // 3000 / 500 = 6, relative errors 0.083 and 0.1: x4.65 to x7.74, inside x3 to x12.
    let six = v((3000.0, 250.0), (500.0, 50.0));
    assert_eq!(six.verdict, "holds", "{}", six.detail);
    assert!(
        six.detail
            .contains("Bit / XOR over FPT / XOR: x6.00, 95% interval x4.65 to x7.74"),
        "{}",
        six.detail
    );
    assert!(six.detail.contains("needed x3.00 to x12.00"), "{}", six.detail);
    // 40x (Random's speed-up in the paper) is not about 6x.
    assert_eq!(v((20000.0, 250.0), (500.0, 50.0)).verdict, "fails");
    // 2.5x with a wide error straddles 3x.
    assert_eq!(v((1250.0, 500.0), (500.0, 50.0)).verdict, "inconclusive");
    // The paper prints no Bit counts: its verdict is its text.
    let (_, paper) = fpt_ablate::claims::on_paper(&t)
        .into_iter()
        .find(|(text, _)| *text == c.text)
        .unwrap();
    assert_eq!(paper.verdict, "in text", "{}", paper.detail);
    assert!(paper.detail.contains("§3.4"), "{}", paper.detail);
}

/// Table 2's "a random frozen transformer does about as well on MNIST as a linear
/// classifier (92%)": `comparable` with a number.
#[test]
fn comparable_with_a_number() {
    let t = table("table2");
    let c = claim(&t, "A frozen random transformer does about as well on MNIST");
    let row = |r: usize| t.rows[r].label.clone();
    let v = |x: f64| {
        check(&t, c, &|r, col| match (row(r).as_str(), col) {
            ("Random", 3) => Some(cell(x, 0.3)),
            _ => None,
        })
    };
    assert_eq!(v(92.5).verdict, "holds");
    assert_eq!(v(85.0).verdict, "fails");
    assert_eq!(v(90.3).verdict, "inconclusive");
    assert!(
        v(92.5).detail.contains("Random / MNIST - 92: +0.5"),
        "{}",
        v(92.5).detail
    );
}

/// Malformed claims are refused by name.
#[test]
fn malformed_gap_and_ratio_claims_are_refused() {
    let t = table("table6");
    let ratio = claim(&t, "Bit Memory pretraining is about 6x slower").clone();
    let err = |c: &Claim| validate(&t, c).unwrap_err();
    assert!(err(&Claim {
        by: 0.0,
        ..ratio.clone()
    })
    .contains("`ratio` needs `by`"));
    assert!(err(&Claim {
        within: Some(1.0),
        ..ratio.clone()
    })
    .contains("a factor above 1"));
    assert!(err(&Claim {
        than: Some(3.0),
        b: None,
        ..ratio.clone()
    })
    .contains("not `than`"));
    let t3 = table("table3");
    let gap = claim(&t3, "The transformer architecture makes up most").clone();
    assert!(validate(&t3, &gap).is_ok());
    let no_d = Claim { d: None, ..gap.clone() };
    assert!(validate(&t3, &no_d)
        .unwrap_err()
        .contains("`gap` needs `b`, `c` and `d`"));
    let stray = Claim {
        kind: ClaimKind::Greater,
        ..gap
    };
    assert!(validate(&t3, &stray)
        .unwrap_err()
        .contains("`c` and `d` belong to `gap`"));
}

/// The claims about a failing model say so (`about_failure`), so that their cells at the
/// trivial baseline count as evidence: Table 4's three (the 3-layer LSTM beats the 12-layer
/// one; the 12-layer one near chance on MNIST and CIFAR-10), Table 5's first and third (the 12-layer
/// LSTM variants), Table 11's at one layer and Table 12's two. (That
/// every claim holds on the paper's numbers is `every_claim_holds_on_the_papers_numbers`.)
#[test]
fn claims_about_a_failure_say_so() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tables = root.join("data/tables");
    let mut failures = Vec::new();
    for id in fpt_ablate::list(&tables).unwrap() {
        let t = load_table(&tables, &id).unwrap();
        for c in &t.claims {
            let failure = c.text.contains("12-layer") && c.text.contains("LSTM") && !c.text.contains("Even with")
                || c.text.contains("stay far below")
                || c.text.contains("floor")
                || c.text.contains("Neither init does well");
            assert_eq!(c.about_failure, failure, "{id}: `{}`", c.text);
            if failure {
                failures.push(id.clone());
            }
        }
    }
    assert_eq!(
        failures,
        ["table4", "table4", "table4", "table5", "table5", "table11", "table12", "table12"]
    );
}

/// A cell that ended at its cap still rising is a lower bound: it decides "a beats b" one
/// way only. On the side to be beaten (Random / MNIST) its bound makes the difference an
/// upper bound: the claim can fail, never hold; on the winning side it can hold, never fail.
/// A cell not converged otherwise (not yet flat) still leaves its pair out.
#[test]
fn a_cell_still_rising_at_its_cap_decides_one_way() {
    use fpt_ablate::claims::Convergence;
    let t = table("table2");
    let c = claim(&t, "Language pretraining beats random initialisation on MNIST");
    let row = |r: usize| t.rows[r].label.clone();
    let mnist = t.cols.iter().position(|c| c.label == "MNIST").unwrap();
    let v = |fpt: (f64, Convergence), random: (f64, Convergence)| {
        check(&t, c, &|r, col| match (row(r).as_str(), col == mnist) {
            ("FPT", true) => Some(CellValue {
                convergence: fpt.1,
                ..cell(fpt.0, 0.2)
            }),
            ("Random", true) => Some(CellValue {
                convergence: random.1,
                ..cell(random.0, 0.2)
            }),
            _ => None,
        })
    };
    let (done, up, not) = (Convergence::Reached, Convergence::Rising, Convergence::NotConverged);
    // Random still rising and already above FPT: FPT cannot end ahead of it.
    let fails = v((96.7, done), (97.5, up));
    assert_eq!(fails.verdict, "fails", "{}", fails.detail);
    assert!(fails.detail.contains("at most -0.8"), "{}", fails.detail);
    assert!(
        fails.detail.contains("an upper bound: Random / MNIST"),
        "{}",
        fails.detail
    );
    // Random still rising below FPT: it may yet pass it; nothing is decided.
    let open = v((96.7, done), (94.0, up));
    assert_eq!(open.verdict, "inconclusive", "{}", open.detail);
    // The same numbers converged decide it.
    assert_eq!(v((96.7, done), (94.0, done)).verdict, "holds");
    // FPT still rising above a converged Random: it holds; below, nothing is decided.
    assert_eq!(v((96.7, up), (94.0, done)).verdict, "holds");
    assert_eq!(v((94.0, up), (96.7, done)).verdict, "inconclusive");
    // Both rising: each a lower bound, the difference bounded neither way.
    let both = v((96.7, up), (94.0, up));
    assert_eq!(both.verdict, "undecided", "{}", both.detail);
    assert!(both.detail.contains("on both sides"), "{}", both.detail);
    // Not yet flat is no bound: left out, as before.
    let flat = v((96.7, done), (90.0, not));
    assert_eq!(flat.verdict, "undecided", "{}", flat.detail);
    assert!(flat.detail.contains("not converged"), "{}", flat.detail);
}

/// A mean over pairs bounded both ways is bounded neither way: the pairs bounded the way
/// fewer are (a tie: the upper ones) are left out and named, the rest decide.
#[test]
fn a_mean_keeps_the_pairs_bounded_one_way() {
    use fpt_ablate::claims::Convergence;
    let t = table("table2");
    let c = claim(
        &t,
        "Language pretraining beats random initialisation (FPT vs Random, mean",
    );
    let row = |r: usize| t.rows[r].label.clone();
    let col = |c: usize| t.cols[c].label.clone();
    let v = check(&t, c, &|r, k| match (row(r).as_str(), col(k).as_str()) {
        // Bit Memory: FPT rising (a lower bound of the difference).
        ("FPT", "Bit Memory") => Some(CellValue {
            convergence: Convergence::Rising,
            ..cell(99.0, 0.3)
        }),
        ("Random", "Bit Memory") => Some(cell(75.0, 0.3)),
        // MNIST: Random rising (an upper bound): the other way, left out.
        ("FPT", "MNIST") => Some(cell(96.0, 0.2)),
        ("Random", "MNIST") => Some(CellValue {
            convergence: Convergence::Rising,
            ..cell(95.0, 0.2)
        }),
        _ => None,
    });
    assert_eq!(v.verdict, "holds", "{}", v.detail);
    assert!(v.detail.contains("at least +24.0"), "{}", v.detail);
    assert!(v.detail.contains("mean over 1 of 7 pairs: Bit Memory"), "{}", v.detail);
    assert!(
        v.detail.contains("the other way than most bounded pairs") && v.detail.contains("Random / MNIST"),
        "{}",
        v.detail
    );
}

/// One seed of a cell against a number swings with the seed as a pair does: without a
/// measured seed spread it decides nothing; with one, or with several seeds, it does.
#[test]
fn one_seed_against_a_number_needs_a_seed_spread() {
    let t = table("table2");
    let c = claim(&t, "The frozen pretrained transformer solves XOR");
    let row = |r: usize| t.rows[r].label.clone();
    let xor = t.cols.iter().position(|c| c.label == "XOR").unwrap();
    let v = |seeds: usize, spread_known: bool| {
        check(&t, c, &|r, col| match (row(r).as_str(), col == xor) {
            ("FPT", true) => Some(CellValue {
                seeds,
                spread_known,
                seed_sd: if spread_known { 0.1 } else { 0.0 },
                ..cell(100.0, 0.01)
            }),
            _ => None,
        })
    };
    let alone = v(1, false);
    assert_eq!(alone.verdict, "undecided", "{}", alone.detail);
    assert!(alone.detail.contains("no seed spread measured"), "{}", alone.detail);
    assert_eq!(v(1, true).verdict, "holds", "{}", v(1, true).detail);
    assert_eq!(v(3, false).verdict, "holds", "{}", v(3, false).detail);
}

/// A narrow interval is shown with the digits that tell its ends apart: three seeds at 100%
/// with a standard error of 0.01 points give a half-width of 1.96 x 0.01 = 0.0196 against
/// 99%, which one decimal would print as "+1.0 to +1.0", as though there were none.
#[test]
fn a_narrow_interval_is_shown_with_the_digits_that_separate_its_ends() {
    let t = table("table2");
    let c = claim(&t, "The frozen pretrained transformer solves XOR");
    let row = |r: usize| t.rows[r].label.clone();
    let xor = t.cols.iter().position(|c| c.label == "XOR").unwrap();
    let v = |se: f64| {
        check(&t, c, &|r, col| match (row(r).as_str(), col == xor) {
            ("FPT", true) => Some(CellValue {
                seeds: 3,
                ..cell(100.0, se)
            }),
            _ => None,
        })
    };
    let narrow = v(0.01);
    assert_eq!(narrow.verdict, "holds", "{}", narrow.detail);
    assert!(
        narrow.detail.contains("+1.00, 95% interval +0.98 to +1.02"),
        "{}",
        narrow.detail
    );
    // A half-width of 1.96 points reads with one decimal, as everywhere else.
    let wide = v(1.0);
    assert!(
        wide.detail.contains("+1.0, 95% interval -1.0 to +3.0"),
        "{}",
        wide.detail
    );
}

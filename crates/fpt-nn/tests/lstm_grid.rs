//! The layer-norm LSTM's GPU kernels (`kernels/fpt_lstm.h`: one block of 256 lanes per
//! batch row, the row's whole recurrence in one launch each way), their bodies run here over
//! the host grid (`FPT_LSTM=grid`'s op on the CPU), against the recurrence in stock candle
//! ops and the CPU's fused op: values and every gradient, hidden sizes under and over the
//! block's lanes, dropout, `W_hh` training and frozen, and a long sequence whose gradient
//! passes below 2^-100.

mod common;
use candle_core::{backprop::GradStore, DType, Device, Result, Tensor, Var};
use common::*;
use fpt_nn::ops::{self, LstmChoice};

/// A layer's seven inputs: `xi`, `W_hh`, `b_hh`, the norms' four vectors.
fn inputs(b: usize, t: usize, h: usize, seed: u64) -> Result<Vec<Tensor>> {
    let shapes: [&[usize]; 7] = [&[b, t, 4 * h], &[4 * h, h], &[4 * h], &[4 * h], &[4 * h], &[h], &[h]];
    shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            // W_hh at the scale the layer's initialisation gives it (1 / sqrt(H)).
            let scale = if i == 1 { 1.0 / (h as f64).sqrt() } else { 1.0 };
            randn(s, seed + i as u64, DType::F32)? * scale
        })
        .collect()
}

fn params(ts: &[Tensor]) -> ops::LnLstmParams<'_> {
    ops::LnLstmParams {
        b_hh: &ts[2],
        ln_h2h: (&ts[3], &ts[4]),
        ln_cell: (&ts[5], &ts[6]),
        eps: 1e-6,
    }
}

fn largest(t: &Tensor) -> Result<f64> {
    t.abs()?.flatten_all()?.max(0)?.to_dtype(DType::F64)?.to_scalar::<f64>()
}

/// The grid op against `reference` (the composed ops or the CPU's fused op) for the inputs
/// that `trains` marks: values within `tol`, gradients within `tol` of their largest.
fn agree(
    case: &str,
    (b, t, h): (usize, usize, usize),
    trains: [bool; 7],
    dropout: bool,
    reference: LstmChoice,
) -> Result<()> {
    let tol = 2e-5;
    let tensors = inputs(b, t, h, 30)?;
    let (h0, c0) = (randn(&[b, h], 1, DType::F32)?, randn(&[b, h], 2, DType::F32)?);
    let masks = dropout
        .then(|| Tensor::from_vec(ops::dropout_mask_values(t * b * h, 0.3, 42), (t, b, h), &Device::Cpu))
        .transpose()?;
    let (vars, ts) = training(&tensors, &trains)?;
    let p = params(&ts);
    let run = |c: LstmChoice| -> Result<(Tensor, GradStore)> {
        let y = ops::ln_lstm_as(c, &ts[0], &ts[1], &p, &h0, &c0, masks.as_ref())?;
        let g = loss(&y, 99)?.backward()?;
        Ok((y, g))
    };
    let (yg, gg) = run(LstmChoice::Grid)?;
    let (yr, gr) = run(reference)?;
    assert_eq!(yg.dims(), &[b, t, h]);
    let dv = max_abs_diff(&yg, &yr)?;
    assert!(dv < tol, "{case}: values differ by {dv}");
    for (i, v) in vars.iter().enumerate() {
        match v {
            Some(v) => {
                let a = gg
                    .get(v)
                    .unwrap_or_else(|| panic!("{case}: grid, no gradient for input {i}"));
                let r = gr
                    .get(v)
                    .unwrap_or_else(|| panic!("{case}: reference, no gradient for input {i}"));
                let d = max_abs_diff(a, r)?;
                let scale = largest(r)?;
                assert!(scale > 0.0, "{case}: the reference's gradient of input {i} is zero");
                assert!(
                    d < tol * (1.0 + scale),
                    "{case}: gradient of input {i} differs by {d} (largest {scale})"
                );
            }
            None => assert!(gg.get(&ts[i]).is_none(), "{case}: frozen input {i} got a gradient"),
        }
    }
    Ok(())
}

const ALL: [bool; 7] = [true; 7];
/// The FPT setting: the recurrent weight and bias frozen.
const FPT: [bool; 7] = [true, false, false, true, true, true, true];

#[test]
fn grid_kernels_equal_the_composed_recurrence() -> Result<()> {
    // Fewer columns than lanes, with and without dropout, W_hh training and frozen.
    agree("small, all, dropout", (3, 5, 6), ALL, true, LstmChoice::Composed)?;
    agree("small, fpt, dropout", (3, 5, 6), FPT, true, LstmChoice::Composed)?;
    agree("small, all", (2, 7, 9), ALL, false, LstmChoice::Composed)?;
    // Several columns a lane (4H = 1200 over 256 lanes, H = 300 over 256 too).
    agree("wide, all, dropout", (2, 4, 300), ALL, true, LstmChoice::Composed)?;
    Ok(())
}

#[test]
fn grid_kernels_equal_the_cpu_fused_op() -> Result<()> {
    // The bench's LSTM shape but shorter: 3 rows of hidden 256 (a column or four a lane).
    agree("lstm width, all, dropout", (3, 12, 256), ALL, true, LstmChoice::Auto)?;
    agree("lstm width, fpt", (4, 10, 256), FPT, false, LstmChoice::Auto)?;
    Ok(())
}

/// ListOps reads one token out after 512: the gradient handed back through time shrinks
/// below 2^-100; the kernels zero what they hand on below it, as the CPU's fused op does,
/// and their gradients agree with the composed ops' (IEEE all the way) where they are large.
#[test]
fn grid_kernels_flush_a_long_sequences_vanishing_gradient() -> Result<()> {
    let (b, t, h) = (2, 400, 8);
    let tiny = 0.5f64.powi(100);
    let tensors = inputs(b, t, h, 50)?;
    let (h0, c0) = (randn(&[b, h], 5, DType::F32)?, randn(&[b, h], 6, DType::F32)?);
    let xi = Var::from_tensor(&tensors[0])?;
    let p = params(&tensors);
    let grad = |c: LstmChoice| -> Result<Vec<f64>> {
        let y = ops::ln_lstm_as(c, xi.as_tensor(), &tensors[1], &p, &h0, &c0, None)?;
        let g = loss(&y.narrow(1, t - 1, 1)?, 7)?.backward()?;
        g.get(&xi)
            .expect("xi gets a gradient")
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()
    };
    let (g, c, f) = (
        grad(LstmChoice::Grid)?,
        grad(LstmChoice::Composed)?,
        grad(LstmChoice::Auto)?,
    );
    let in_tiny = |v: &[f64]| v.iter().filter(|x| **x != 0.0 && x.abs() < tiny).count();
    assert!(
        in_tiny(&c) > 0,
        "the composed gradient never goes below 2^-100: too short a test"
    );
    assert_eq!(in_tiny(&g), 0, "the grid's gradient holds values in (0, 2^-100)");
    let scale = c.iter().fold(0f64, |m, x| m.max(x.abs()));
    for (name, other) in [("composed", &c), ("fused", &f)] {
        let d = g.iter().zip(other).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            d < 1e-5 * scale,
            "grid vs {name}: gradients differ by {d} (largest {scale})"
        );
    }
    Ok(())
}

#[test]
fn grid_refuses_what_it_cannot_run() -> Result<()> {
    let tensors = inputs(2, 3, 4, 70)?;
    let (h0, c0) = (randn(&[2, 4], 1, DType::F32)?, randn(&[2, 4], 2, DType::F32)?);
    let p = params(&tensors);
    // Shapes that do not fit: the operand named, before any kernel runs.
    let e = ops::ln_lstm_as(LstmChoice::Grid, &tensors[0], &tensors[2], &p, &h0, &c0, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("W_hh"), "{e}");
    // Another number format: the choice and the formats named.
    let xb = tensors[0].to_dtype(DType::BF16)?;
    let e = ops::ln_lstm_as(LstmChoice::Grid, &xb, &tensors[1], &p, &h0, &c0, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("FPT_LSTM=grid") && e.contains("BF16"), "{e}");
    // A hidden size whose rows overflow a block's shared memory: the way out named.
    let h = 2000;
    let big = inputs(1, 1, h, 80)?;
    let (h0, c0) = (
        Tensor::zeros((1, h), DType::F32, &Device::Cpu)?,
        Tensor::zeros((1, h), DType::F32, &Device::Cpu)?,
    );
    let e = ops::ln_lstm_as(LstmChoice::Grid, &big[0], &big[1], &params(&big), &h0, &c0, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("shared memory") && e.contains("FPT_LSTM=composed"), "{e}");
    Ok(())
}

/// Dropout drawn from each step's seed: the kernels draw the multipliers themselves (on a
/// GPU only the seeds cross), and they are exactly the masks the CPU's ops are handed
/// (`dropout_mask_values(B H, p, seed)` a step): the same values and gradients to the last
/// bit, through the grid and through the CPU's fused op, at a batch whose `B H` spans more
/// than one block of the mask (16,384 values).
#[test]
fn seeded_dropout_is_the_masks_it_stands_for() -> Result<()> {
    // 40 x 420 = 16,800 values a step: a second block of the mask.
    for (b, t, h, p) in [(3usize, 6usize, 8usize, 0.3f64), (40, 3, 420, 0.1)] {
        let tensors = inputs(b, t, h, 90)?;
        let (h0, c0) = (randn(&[b, h], 3, DType::F32)?, randn(&[b, h], 4, DType::F32)?);
        let seeds: Vec<u64> = (0..t as u64).map(|s| 1000 + 7 * s).collect();
        let mut m = Vec::new();
        for &s in &seeds {
            m.extend(ops::dropout_mask_values(b * h, p, s));
        }
        let masks = Tensor::from_vec(m, (t, b, h), &Device::Cpu)?;
        let xi = Var::from_tensor(&tensors[0])?;
        let pr = params(&tensors);
        for choice in [LstmChoice::Grid, LstmChoice::Auto] {
            let run = |seeded: bool| -> Result<(Vec<f32>, Vec<f32>)> {
                let y = if seeded {
                    ops::ln_lstm_seeded_as(choice, xi.as_tensor(), &tensors[1], &pr, &h0, &c0, p, &seeds)?
                } else {
                    ops::ln_lstm_as(choice, xi.as_tensor(), &tensors[1], &pr, &h0, &c0, Some(&masks))?
                };
                let g = loss(&y, 5)?.backward()?;
                let gx = g
                    .get(&xi)
                    .expect("xi gets a gradient")
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                Ok((y.flatten_all()?.to_vec1::<f32>()?, gx))
            };
            let (a, z) = (run(true)?, run(false)?);
            assert!(a.0.contains(&0.0), "{choice:?} b={b} h={h}: no output was dropped");
            assert_eq!(a, z, "{choice:?} b={b} h={h}: seeded and masked differ");
        }
        let e = ops::ln_lstm_seeded_as(
            LstmChoice::Grid,
            xi.as_tensor(),
            &tensors[1],
            &pr,
            &h0,
            &c0,
            p,
            &seeds[1..],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("seeds"), "{e}");
    }
    Ok(())
}

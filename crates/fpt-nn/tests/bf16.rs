//! Products with frozen bf16 weights (`precision: bf16`) on every kernel path: the rounding
//! against the `half` crate's, and the products (forward, input gradient, the fused
//! residual branch) against an f64 product of the same bf16 operands. Every path must give
//! that product up to f32 summation error, so a wrong pairing, a dropped depth or an
//! unrounded operand fails here.

mod common;
use candle_core::{DType, Device, Result, Tensor, Var};
use common::*;
use fpt_nn::ops::bf16::{round, round_f32, widen};
use fpt_nn::{ops, KernelPath, Linear, Param};

/// The f64 product `round(a) W^T (+ b)` (`W: [n, k]` bf16) and its per-element scale
/// `sum |round(a_ip) W_jp|`, for the tolerance.
fn reference(a: &[f32], w: &[half::bf16], b: Option<&[f32]>, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let m = a.len() / k;
    let (mut y, mut s) = (vec![0f64; m * n], vec![0f64; m * n]);
    for i in 0..m {
        for j in 0..n {
            let (mut acc, mut mag) = (b.map_or(0.0, |b| b[j] as f64), 0.0);
            for p in 0..k {
                let t = round_f32(a[i * k + p]) as f64 * widen(w[j * k + p]) as f64;
                acc += t;
                mag += t.abs();
            }
            y[i * n + j] = acc;
            s[i * n + j] = mag;
        }
    }
    (y, s)
}

/// Every value within f32 summation error of the reference: `|got - want| <= 1e-6 *
/// (k + 8) * scale` (the sums' worst-case bound is about `k * 2^-24 * scale`).
fn assert_close(got: &[f32], want: &[f64], scale: &[f64], k: usize, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, ((g, w), s)) in got.iter().zip(want).zip(scale).enumerate() {
        let tol = 1e-6 * (k as f64 + 8.0) * s.max(1e-30);
        assert!(
            ((*g as f64) - w).abs() <= tol,
            "{what}: element {i}: {g} vs {w} (tolerance {tol:.2e}) on the {} path",
            KernelPath::active()
        );
    }
}

#[test]
fn rounding_matches_the_half_crate_and_flushes_subnormals() {
    // Round to nearest, ties to even, as `half` (an outside implementation), on normal
    // values; ties exactly; subnormals to signed zero, as the processor's conversion.
    let mut rng = fpt_nn::Rng::new(7);
    for _ in 0..100_000 {
        let x = f32::from_bits(rng.next_u64() as u32);
        if !x.is_finite() || x.abs() < f32::MIN_POSITIVE {
            continue;
        }
        assert_eq!(round(x).to_bits(), half::bf16::from_f32(x).to_bits(), "{x:e}");
    }
    // 1 + 2^-8 is halfway between 1 and the next bf16 (1 + 2^-7): ties to even (1).
    assert_eq!(round_f32(1.0 + 2f32.powi(-8)), 1.0);
    assert_eq!(round_f32(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
    assert_eq!(round(1e-40).to_bits(), 0);
    assert_eq!(round(-1e-40).to_bits(), 0x8000);
    assert!(widen(round(f32::NAN)).is_nan());
    assert_eq!(round_f32(f32::INFINITY), f32::INFINITY);
}

#[test]
fn bf16_linear_matches_the_f64_product_of_its_operands() -> Result<()> {
    every_path(bf16_linear_on_one_path)
}

fn bf16_linear_on_one_path() -> Result<()> {
    // Edges of every block: one value; odd depths (a padded last pair); partial tiles of
    // rows and columns; two bf16 depth panels (k > 1536); two column blocks (n > 3072).
    for (m, k, n) in [
        (1, 1, 1),
        (5, 7, 3),
        (13, 33, 45),
        (30, 1601, 40),
        (3, 64, 3100),
        (200, 96, 70),
    ] {
        let x = randn(&[m, k], 1, DType::F32)?;
        let w = randn(&[n, k], 2, DType::F32)?.to_dtype(DType::BF16)?;
        let b = randn(&[n], 3, DType::F32)?;
        let layer = Linear::new(Param::new(w.clone(), false)?, Some(Param::new(b.clone(), false)?));
        let xv = Var::from_tensor(&x)?;
        for round_trip in 0..2 {
            // The second forward reads the panels packed by the first.
            let y = layer.forward(xv.as_tensor())?;
            assert_eq!(y.dtype(), DType::F32);
            let ws = w.flatten_all()?.to_vec1::<half::bf16>()?;
            let (want, scale) = reference(
                &x.flatten_all()?.to_vec1::<f32>()?,
                &ws,
                Some(&b.to_vec1::<f32>()?),
                n,
                k,
            );
            assert_close(
                &y.flatten_all()?.to_vec1()?,
                &want,
                &scale,
                k,
                &format!("y, {m}x{k}x{n} #{round_trip}"),
            );
            // dx = round(dy) W: the reference with W^T as the weight.
            let dy = randn(&[m, n], 4, DType::F32)?;
            let g = (y * &dy)?.sum_all()?.backward()?;
            let dx = g.get(xv.as_tensor()).expect("dx");
            let wt: Vec<half::bf16> = (0..k * n).map(|i| ws[(i % n) * k + i / n]).collect();
            let (want, scale) = reference(&dy.flatten_all()?.to_vec1::<f32>()?, &wt, None, k, n);
            assert_close(
                &dx.flatten_all()?.to_vec1()?,
                &want,
                &scale,
                n,
                &format!("dx, {m}x{k}x{n}"),
            );
            assert!(g.get(&w).is_none(), "a frozen bf16 weight gets no gradient");
        }
    }
    Ok(())
}

#[test]
fn bf16_products_differ_from_f32_ones_by_the_rounding() -> Result<()> {
    // The check above cannot pass by accident on f32 operands: the bf16 product is not the
    // f32 one (both operands rounded: about 2^-9 of each term), and the op takes the bf16
    // path on every kernel path (the same result on each, up to summation order).
    let (m, k, n) = (17, 300, 50);
    let x = randn(&[m, k], 5, DType::F32)?;
    let w = randn(&[n, k], 6, DType::F32)?;
    let wb = w.to_dtype(DType::BF16)?;
    let f32_y = ops::linear(&x, &w, None)?;
    let mut outs = Vec::new();
    for y in fpt_nn::kernels::on_every_path(|_| ops::linear(&x, &wb, None)) {
        outs.push(y?);
    }
    let d = max_abs_diff(&outs[0], &f32_y)?;
    assert!(d > 1e-3, "bf16 and f32 products agree to {d}: no rounding happened");
    for o in &outs[1..] {
        assert!(max_abs_diff(o, &outs[0])? < 1e-4, "paths disagree");
    }
    // A bf16 weight needs an f32 input: f64 is refused with both dtypes named.
    let e = ops::linear(&x.to_dtype(DType::F64)?, &wb, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("F64") && e.contains("BF16"), "{e}");
    Ok(())
}

#[test]
fn fused_branch_with_bf16_weights_matches_its_composition() -> Result<()> {
    every_path(fused_branch_on_one_path)
}

fn fused_branch_on_one_path() -> Result<()> {
    // A GPT-2 style pre-norm MLP branch with frozen bf16 weights: the fused op (packed bf16
    // panels on the avx512bf16 path, widened products elsewhere) against the same branch
    // composed of the layers' own ops.
    let (b, t, d, f) = (2, 9, 40, 96);
    let dev = Device::Cpu;
    let lin = |o: usize, i: usize, s: u64| -> Result<Linear> {
        Ok(Linear::new(
            Param::new(
                randn(&[o, i], s, DType::F32)?.affine(0.2, 0.0)?.to_dtype(DType::BF16)?,
                false,
            )?,
            Some(Param::new(randn(&[o], s + 1, DType::F32)?, false)?),
        ))
    };
    let (up, down) = (lin(f, d, 10)?, lin(d, f, 20)?);
    let norm = fpt_nn::LayerNorm {
        weight: Param::new(Tensor::ones(d, DType::F32, &dev)?, true)?,
        bias: Param::new(Tensor::zeros(d, DType::F32, &dev)?, true)?,
        eps: 1e-5,
    };
    let branch = fpt_nn::ResidualBranch {
        norm: &norm,
        norm_at: fpt_nn::NormAt::Input,
        input: &up,
        mid: fpt_nn::BranchMid::GeluNew,
        output: &down,
    };
    let x = Var::from_tensor(&randn(&[b, t, d], 30, DType::F32)?)?;
    assert!(
        branch.is_fused(x.as_tensor()),
        "bf16 frozen layers run the fused branch"
    );
    let fused = branch.forward(x.as_tensor(), None)?;
    let composed = branch.forward_composed(x.as_tensor(), None)?;
    assert!(max_abs_diff(&fused, &composed)? < 1e-4);
    let gf = loss(&fused, 3)?.backward()?;
    let gc = loss(&composed, 3)?.backward()?;
    assert!(max_abs_diff(gf.get(x.as_tensor()).expect("dx"), gc.get(x.as_tensor()).expect("dx"))? < 1e-4);
    let gamma = norm.weight.tensor();
    assert!(max_abs_diff(gf.get(gamma).expect("dgamma"), gc.get(gamma).expect("dgamma"))? < 1e-3);
    Ok(())
}

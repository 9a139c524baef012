//! Each fused op against its composed reference (values and gradients) and against
//! finite differences in f64; the frozen linear op against the gradient-store invariant.

mod common;
use candle_core::{DType, Device, Result, Tensor, Var};
use common::*;
use fpt_nn::{ops, Rng};

#[test]
fn layer_norm_matches_reference_and_finite_differences() -> Result<()> {
    every_path(layer_norm_matches_reference_and_finite_differences_on_one_path)
}

fn layer_norm_matches_reference_and_finite_differences_on_one_path() -> Result<()> {
    // Rows of whole 8-lane chunks, with a tail, shorter than one chunk, and enough rows to
    // be split across threads (the reductions keep 8 partial sums and add the tail last).
    for d in [16, 21, 5] {
        check(
            &[&[3, 5, d], &[d], &[d]],
            |t| ops::layer_norm(&t[0], &t[1], &t[2], 1e-5),
            |t| ops::layer_norm_composed(&t[0], &t[1], &t[2], 1e-5),
            1e-5,
        )?;
    }
    check(
        &[&[48, 700], &[700], &[700]],
        |t| ops::layer_norm(&t[0], &t[1], &t[2], 1e-5),
        |t| ops::layer_norm_composed(&t[0], &t[1], &t[2], 1e-5),
        1e-5,
    )
}

#[test]
fn rms_norm_matches_reference_and_finite_differences() -> Result<()> {
    every_path(rms_norm_matches_reference_and_finite_differences_on_one_path)
}

fn rms_norm_matches_reference_and_finite_differences_on_one_path() -> Result<()> {
    // Whole 8-lane chunks with a tail, a row shorter than a chunk, and rows enough to split
    // across threads (SmolLM2's width).
    for d in [16, 21, 5] {
        check(
            &[&[3, 5, d], &[d]],
            |t| ops::rms_norm(&t[0], &t[1], 1e-5),
            |t| ops::rms_norm_composed(&t[0], &t[1], 1e-5),
            1e-5,
        )?;
    }
    check(
        &[&[40, 576], &[576]],
        |t| ops::rms_norm(&t[0], &t[1], 1e-5),
        |t| ops::rms_norm_composed(&t[0], &t[1], 1e-5),
        1e-5,
    )
}

#[test]
fn swiglu_matches_reference_and_finite_differences() -> Result<()> {
    every_path(swiglu_matches_reference_and_finite_differences_on_one_path)
}

fn swiglu_matches_reference_and_finite_differences_on_one_path() -> Result<()> {
    // Whole 8-lane chunks with a tail, and SmolLM2's 1536-wide feed-forward over enough rows
    // to split into several chunks and threads.
    check(
        &[&[3, 5, 21], &[3, 5, 21]],
        |t| ops::swiglu(&t[0], &t[1]),
        |t| ops::swiglu_composed(&t[0], &t[1]),
        1e-5,
    )?;
    check(
        &[&[24, 1536], &[24, 1536]],
        |t| ops::swiglu(&t[0], &t[1]),
        |t| ops::swiglu_composed(&t[0], &t[1]),
        1e-5,
    )?;
    // Far into both tails: silu(-100) = -0 (no NaN), silu(100) = 100, derivatives 0 and 1.
    let g = Var::from_tensor(&Tensor::new(&[-100f32, -20.0, 0.0, 20.0, 100.0], &Device::Cpu)?)?;
    let u = Tensor::ones(5, DType::F32, &Device::Cpu)?;
    let y = ops::swiglu(g.as_tensor(), &u)?;
    let grads = y.sum_all()?.backward()?;
    let (y, dg) = (y.to_vec1::<f32>()?, grads.get(&g).expect("gradient").to_vec1::<f32>()?);
    for (i, x) in [-100f64, -20.0, 0.0, 20.0, 100.0].into_iter().enumerate() {
        let s = 1.0 / (1.0 + (-x).exp());
        let (want_y, want_d) = (x * s, s * (1.0 + x * (1.0 - s)));
        assert!(
            (y[i] as f64 - want_y).abs() <= 1e-6 * (1.0 + want_y.abs()),
            "silu({x}) = {}",
            y[i]
        );
        assert!((dg[i] as f64 - want_d).abs() <= 1e-6, "silu'({x}) = {}", dg[i]);
    }
    Ok(())
}

#[test]
fn rotary_matches_reference_and_finite_differences() -> Result<()> {
    every_path(rotary_matches_reference_and_finite_differences_on_one_path)
}

fn rotary_matches_reference_and_finite_differences_on_one_path() -> Result<()> {
    // Tables as Llama builds them (the frequencies repeated for the two halves), and
    // arbitrary ones (halves differ) so that the backward's use of each half is checked.
    for (t, heads, d, repeated) in [(5, 3, 8, true), (7, 2, 6, false), (49, 9, 64, true)] {
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for p in 0..t {
            for i in 0..d {
                let f = if repeated { i % (d / 2) } else { i } as f64;
                let a = p as f64 * (0.3 + 0.1 * f);
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        let cos = Tensor::from_vec(cos, (t, d), &Device::Cpu)?;
        let sin = Tensor::from_vec(sin, (t, d), &Device::Cpu)?;
        check(
            &[&[2, t, heads * d]],
            |x| ops::rotary(&x[0], &cos, &sin, heads),
            |x| ops::rotary_composed(&x[0], &cos, &sin, heads),
            1e-5,
        )?;
    }
    Ok(())
}

#[test]
fn causal_softmax_matches_reference_and_finite_differences() -> Result<()> {
    every_path(causal_softmax_matches_reference_and_finite_differences_on_one_path)
}

fn causal_softmax_matches_reference_and_finite_differences_on_one_path() -> Result<()> {
    check(
        &[&[2, 3, 6, 6]],
        |t| ops::masked_softmax(&t[0], 0.37, ops::Mask::Causal),
        |t| ops::masked_softmax_composed(&t[0], 0.37, ops::Mask::Causal),
        1e-6,
    )?;
    check(
        &[&[2, 4, 9]],
        |t| ops::masked_softmax(&t[0], 1.0, ops::Mask::None),
        |t| ops::masked_softmax_composed(&t[0], 1.0, ops::Mask::None),
        1e-6,
    )?;
    check(
        &[&[2, 9, 9]],
        |t| ops::masked_softmax(&t[0], 0.5, ops::Mask::Band(2)),
        |t| ops::masked_softmax_composed(&t[0], 0.5, ops::Mask::Band(2)),
        1e-6,
    )
}

#[test]
fn causal_softmax_gives_zero_to_the_future() -> Result<()> {
    every_path(causal_softmax_gives_zero_to_the_future_on_one_path)
}

fn causal_softmax_gives_zero_to_the_future_on_one_path() -> Result<()> {
    let band = ops::masked_softmax(&randn(&[1, 6, 6], 1, DType::F32)?, 1.0, ops::Mask::Band(1))?
        .squeeze(0)?
        .to_vec2::<f32>()?;
    for (i, row) in band.iter().enumerate() {
        for (j, &p) in row.iter().enumerate() {
            assert_eq!(p == 0.0, j.abs_diff(i) > 1, "band row {i}: {row:?}");
        }
    }
    let y = ops::masked_softmax(&randn(&[1, 4, 4], 1, DType::F32)?, 1.0, ops::Mask::Causal)?;
    let y = y.squeeze(0)?.to_vec2::<f32>()?;
    for (i, row) in y.iter().enumerate() {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        for (j, &p) in row.iter().enumerate() {
            assert_eq!(p == 0.0, j > i, "row {i}: {row:?}");
        }
    }
    Ok(())
}

#[test]
fn gelu_new_matches_reference_and_finite_differences() -> Result<()> {
    every_path(gelu_new_matches_reference_and_finite_differences_on_one_path)
}

fn gelu_new_matches_reference_and_finite_differences_on_one_path() -> Result<()> {
    check(
        &[&[4, 33]],
        |t| ops::gelu_new(&t[0]),
        |t| ops::gelu_new_composed(&t[0]),
        1e-6,
    )?;
    // Far tails: no NaN from exp overflow.
    let x = Tensor::new(&[-100f32, -20.0, 0.0, 20.0, 100.0], &Device::Cpu)?;
    let y = ops::gelu_new(&x)?.to_vec1::<f32>()?;
    assert_eq!(y, vec![-0.0, -0.0, 0.0, 20.0, 100.0]);
    Ok(())
}

#[test]
fn linear_matches_reference_and_finite_differences() -> Result<()> {
    every_path(linear_matches_reference_and_finite_differences_on_one_path)
}

fn linear_matches_reference_and_finite_differences_on_one_path() -> Result<()> {
    // All three arguments trainable.
    check(
        &[&[2, 3, 5], &[7, 5], &[7]],
        |t| ops::linear(&t[0], &t[1], Some(&t[2])),
        |t| ops::linear_composed(&t[0], &t[1], Some(&t[2])),
        1e-5,
    )?;
    // Only x is an input here: W and b are frozen constants captured by the closures.
    let w = randn(&[7, 5], 3, DType::F32)?;
    let b = randn(&[7], 4, DType::F32)?;
    check(
        &[&[2, 3, 5]],
        |t| ops::linear(&t[0], &w.to_dtype(t[0].dtype())?, Some(&b.to_dtype(t[0].dtype())?)),
        |t| ops::linear_composed(&t[0], &w.to_dtype(t[0].dtype())?, Some(&b.to_dtype(t[0].dtype())?)),
        1e-5,
    )?;
    check(
        &[&[4, 5]],
        |t| ops::linear(&t[0], &w.to_dtype(t[0].dtype())?, None),
        |t| ops::linear_composed(&t[0], &w.to_dtype(t[0].dtype())?, None),
        1e-5,
    )
}

#[test]
fn frozen_linear_never_puts_the_weight_in_the_grad_store() -> Result<()> {
    every_path(frozen_linear_never_puts_the_weight_in_the_grad_store_on_one_path)
}

fn frozen_linear_never_puts_the_weight_in_the_grad_store_on_one_path() -> Result<()> {
    let x = Var::from_tensor(&randn(&[4, 8], 1, DType::F32)?)?;
    let w = randn(&[6, 8], 2, DType::F32)?;
    let b = randn(&[6], 3, DType::F32)?;
    // The stock matmul computes and stores gradients for the plain tensors too (under the
    // id of the transposed view of `w`, and for `b`): the store holds more than x ...
    let g = ops::linear_composed(x.as_tensor(), &w, Some(&b))?
        .sum_all()?
        .backward()?;
    assert!(
        g.get_ids().count() > 1,
        "candle's matmul is expected to store frozen gradients"
    );
    // ... the frozen op stores the gradient of x and nothing else.
    let g = ops::linear(x.as_tensor(), &w, Some(&b))?.sum_all()?.backward()?;
    assert_eq!(g.get_ids().collect::<Vec<_>>(), vec![&x.as_tensor().id()]);
    assert!(g.get(&w).is_none() && g.get(&b).is_none());
    // Data in, trainable weight: the data gets no gradient, the weight and bias do.
    let data = randn(&[4, 8], 5, DType::F32)?;
    let (wv, bv) = (Var::from_tensor(&w)?, Var::from_tensor(&b)?);
    let g = ops::linear(&data, wv.as_tensor(), Some(bv.as_tensor()))?
        .sum_all()?
        .backward()?;
    let ids: std::collections::HashSet<_> = g.get_ids().copied().collect();
    let want: std::collections::HashSet<_> = [wv.as_tensor().id(), bv.as_tensor().id()].into_iter().collect();
    assert_eq!(ids, want);
    Ok(())
}

#[test]
fn dropout_is_seeded_and_inverted() -> Result<()> {
    every_path(dropout_is_seeded_and_inverted_on_one_path)
}

fn dropout_is_seeded_and_inverted_on_one_path() -> Result<()> {
    let x = Tensor::ones((100, 100), DType::F32, &Device::Cpu)?;
    let a = ops::dropout(&x, 0.1, &mut Rng::new(5))?;
    let b = ops::dropout(&x, 0.1, &mut Rng::new(5))?;
    assert_eq!(a.to_vec2::<f32>()?, b.to_vec2::<f32>()?);
    let v = a.flatten_all()?.to_vec1::<f32>()?;
    let zeros = v.iter().filter(|&&z| z == 0.0).count();
    assert!((800..1200).contains(&zeros), "{zeros} zeros");
    assert!(v.iter().all(|&z| z == 0.0 || (z - 1.0 / 0.9).abs() < 1e-6));
    // Gradient flows through the kept entries only.
    let xv = Var::from_tensor(&x)?;
    let mut rng = Rng::new(5);
    let g = ops::dropout(xv.as_tensor(), 0.1, &mut rng)?.sum_all()?.backward()?;
    assert_eq!(g.get(&xv).unwrap().to_vec2::<f32>()?, a.to_vec2::<f32>()?);
    Ok(())
}

#[test]
fn cross_entropy_matches_closed_form() -> Result<()> {
    every_path(cross_entropy_matches_closed_form_on_one_path)
}

fn cross_entropy_matches_closed_form_on_one_path() -> Result<()> {
    let logits = Tensor::new(&[[2.0f32, 0.0], [0.0, 1.0], [1.0, 1.0]], &Device::Cpu)?;
    let targets = Tensor::new(&[0u32, 0, 1], &Device::Cpu)?;
    let l = ops::cross_entropy(&logits, &targets)?.to_scalar::<f32>()?;
    let want = ((1.0 + (-2.0f32).exp()).ln() + (1.0 + 1.0f32.exp()).ln() + 2.0f32.ln()) / 3.0;
    assert!((l - want).abs() < 1e-6, "{l} vs {want}");
    assert_eq!(ops::correct(&logits, &targets)?, 1);
    let v = Var::from_tensor(&logits)?;
    let g = ops::cross_entropy(v.as_tensor(), &targets)?.backward()?;
    let g = g.get(&v).unwrap().to_vec2::<f32>()?;
    // d/dlogits = (softmax - onehot) / n
    let p0 = 1.0 / (1.0 + (-2.0f32).exp());
    assert!((g[0][0] - (p0 - 1.0) / 3.0).abs() < 1e-6);
    Ok(())
}

#[test]
fn fused_cross_entropy_matches_reference_and_finite_differences() -> Result<()> {
    every_path(fused_cross_entropy_matches_reference_and_finite_differences_on_one_path)
}

fn fused_cross_entropy_matches_reference_and_finite_differences_on_one_path() -> Result<()> {
    let targets = Tensor::new(&[3u32, 0, 2, 1, 4], &Device::Cpu)?;
    check(
        &[&[5, 5]],
        |t| ops::cross_entropy(&t[0], &targets),
        |t| ops::cross_entropy_composed(&t[0], &targets),
        1e-6,
    )?;
    let bad = Tensor::new(&[7u32, 0, 0, 0, 0], &Device::Cpu)?;
    let e = ops::cross_entropy(&randn(&[5, 5], 1, DType::F32)?, &bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("target 7"), "{e}");
    Ok(())
}

#[test]
fn gelu_erf_matches_reference_and_finite_differences() -> Result<()> {
    every_path(gelu_erf_matches_reference_and_finite_differences_on_one_path)
}

fn gelu_erf_matches_reference_and_finite_differences_on_one_path() -> Result<()> {
    check(
        &[&[3, 41]],
        |t| ops::gelu_erf(&t[0]),
        |t| ops::gelu_erf_composed(&t[0]),
        1e-6,
    )
}

/// The fused attention (split and packed) against its composed reference, values and
/// gradients, with each mask kind, with and without dropout; and its gradient against
/// central finite differences in f32 (the fused kernel is f32 only).
#[test]
fn fused_attention_matches_reference_and_finite_differences() -> Result<()> {
    every_path(fused_attention_matches_reference_and_finite_differences_on_one_path)
}

fn fused_attention_matches_reference_and_finite_differences_on_one_path() -> Result<()> {
    let (b, t, heads, d) = (2, 7, 3, 4);
    let c = heads * d;
    for mask in [ops::Mask::None, ops::Mask::Causal, ops::Mask::Band(2)] {
        for dropout in [None, Some((0.3, 42u64))] {
            let spec = ops::AttentionSpec {
                heads,
                scale: 0.4,
                mask,
                dropout,
            };
            let qkv = Var::from_tensor(&randn(&[b, t, 3 * c], 1, DType::F32)?)?;
            let x = qkv.as_tensor();
            let parts: Vec<Var> = (0..3)
                .map(|i| Var::from_tensor(&x.narrow(2, i * c, c)?.contiguous()?))
                .collect::<Result<_>>()?;
            let (q, k, v) = (parts[0].as_tensor(), parts[1].as_tensor(), parts[2].as_tensor());
            let fused = ops::attention(q, k, v, spec)?;
            let packed = ops::attention_packed(x, spec)?;
            let reference = ops::attention_composed(q, k, v, spec)?;
            let what = format!("{mask:?} dropout {dropout:?}");
            assert!(max_abs_diff(&fused, &reference)? < 1e-5, "{what}: values");
            assert!(max_abs_diff(&packed, &reference)? < 1e-5, "{what}: packed values");
            let gf = loss(&fused, 3)?.backward()?;
            let gr = loss(&reference, 3)?.backward()?;
            let gp = loss(&packed, 3)?.backward()?;
            let gpacked = gp.get(&qkv).expect("packed gradient");
            for (i, p) in parts.iter().enumerate() {
                let want = gr.get(p).expect("reference gradient");
                let got = gf.get(p).expect("fused gradient");
                assert!(max_abs_diff(got, want)? < 1e-5, "{what}: gradient {i}");
                let got = gpacked.narrow(2, i * c, c)?;
                assert!(max_abs_diff(&got, want)? < 1e-5, "{what}: packed gradient {i}");
            }
            // Finite differences on the packed op (f32: step 1e-2, loose tolerance).
            let g = gpacked.flatten_all()?.to_vec1::<f32>()?;
            let base = x.flatten_all()?.to_vec1::<f32>()?;
            let h = 1e-2f32;
            for j in (0..base.len()).step_by(11) {
                let eval = |delta: f32| -> Result<f64> {
                    let mut p = base.clone();
                    p[j] += delta;
                    let xi = Tensor::from_vec(p, x.shape(), &Device::Cpu)?;
                    loss(&ops::attention_packed(&xi, spec)?, 3)?
                        .to_dtype(DType::F64)?
                        .to_scalar::<f64>()
                };
                let num = (eval(h)? - eval(-h)?) / (2.0 * h as f64);
                let err = (num - g[j] as f64).abs() / (1.0 + num.abs());
                assert!(err < 2e-3, "{what}: elem {j}: analytic {} numeric {num}", g[j]);
            }
        }
    }
    Ok(())
}

#[test]
fn fused_attention_dropout_depends_on_the_seed_only() -> Result<()> {
    every_path(fused_attention_dropout_depends_on_the_seed_only_on_one_path)
}

fn fused_attention_dropout_depends_on_the_seed_only_on_one_path() -> Result<()> {
    let x = randn(&[1, 6, 3 * 8], 5, DType::F32)?;
    let spec = |seed| ops::AttentionSpec {
        heads: 2,
        scale: 0.5,
        mask: ops::Mask::Causal,
        dropout: Some((0.5, seed)),
    };
    let a = ops::attention_packed(&x, spec(1))?;
    let b = ops::attention_packed(&x, spec(1))?;
    let c = ops::attention_packed(&x, spec(2))?;
    assert_eq!(max_abs_diff(&a, &b)?, 0.0);
    assert!(max_abs_diff(&a, &c)? > 1e-3, "another seed, another mask");
    let m = ops::attention_dropout_mask(1, 2, 6, 0.5, 1, &Device::Cpu)?;
    let kept = m.flatten_all()?.to_vec1::<f32>()?;
    assert!(kept.iter().all(|&v| v == 0.0 || v == 2.0));
    let zeros = kept.iter().filter(|&&v| v == 0.0).count();
    assert!((18..=54).contains(&zeros), "{zeros} of 72 dropped at p = 0.5");
    Ok(())
}

#[test]
fn fused_dropout_add_matches_reference() -> Result<()> {
    every_path(fused_dropout_add_matches_reference_on_one_path)
}

fn fused_dropout_add_matches_reference_on_one_path() -> Result<()> {
    let (p, seed) = (0.25, 9u64);
    let shape = [3, 50_000]; // several mask chunks, drawn in parallel
    let x = Var::from_tensor(&randn(&shape, 1, DType::F32)?)?;
    let y = Var::from_tensor(&randn(&shape, 2, DType::F32)?)?;
    let fused = ops::dropout_add(x.as_tensor(), y.as_tensor(), p, seed)?;
    let mask = Tensor::from_vec(ops::dropout_mask_values(150_000, p, seed), &shape, &Device::Cpu)?;
    let reference = (x.as_tensor() + y.as_tensor().mul(&mask)?)?;
    assert_eq!(max_abs_diff(&fused, &reference)?, 0.0);
    let kept = mask.flatten_all()?.to_vec1::<f32>()?;
    let dropped = kept.iter().filter(|&&v| v == 0.0).count() as f64 / kept.len() as f64;
    assert!((dropped - p).abs() < 0.01, "dropped {dropped}");
    assert!(kept.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
    let gf = loss(&fused, 4)?.backward()?;
    let gr = loss(&reference, 4)?.backward()?;
    for v in [&x, &y] {
        assert_eq!(
            max_abs_diff(gf.get(v).expect("fused"), gr.get(v).expect("reference"))?,
            0.0
        );
    }
    // Another seed draws another mask; a frozen branch input gets no gradient.
    let other = ops::dropout_add(x.as_tensor(), y.as_tensor(), p, seed + 1)?;
    assert!(max_abs_diff(&fused, &other)? > 0.1);
    let frozen = y.as_tensor().detach();
    let g = loss(&ops::dropout_add(x.as_tensor(), &frozen, p, seed)?, 4)?.backward()?;
    assert!(g.get(&frozen).is_none() && g.get(&x).is_some());
    Ok(())
}

/// Attention for the last queries only: the last rows of the full attention, and the same
/// gradient wherever only those rows feed the loss; with dropout, its gradient against
/// finite differences.
#[test]
fn attention_for_the_last_queries_matches_the_full_one() -> Result<()> {
    every_path(attention_for_the_last_queries_matches_the_full_one_on_one_path)
}

fn attention_for_the_last_queries_matches_the_full_one_on_one_path() -> Result<()> {
    let (b, t, heads, d, last) = (2, 9, 2, 4, 3);
    let c = heads * d;
    for mask in [ops::Mask::Causal, ops::Mask::None] {
        let spec = ops::AttentionSpec {
            heads,
            scale: 0.5,
            mask,
            dropout: None,
        };
        let qkv = Var::from_tensor(&randn(&[b, t, 3 * c], 3, DType::F32)?)?;
        let part = ops::attention_packed_last(qkv.as_tensor(), spec, last)?;
        let full = ops::attention_packed(qkv.as_tensor(), spec)?.narrow(1, t - last, last)?;
        assert_eq!(part.dims(), &[b, last, c]);
        assert!(max_abs_diff(&part, &full)? < 1e-6, "{mask:?}: values");
        let gp = loss(&part, 5)?.backward()?;
        let gf = loss(&full, 5)?.backward()?;
        let d = max_abs_diff(gp.get(&qkv).expect("part"), gf.get(&qkv).expect("full"))?;
        assert!(d < 1e-6, "{mask:?}: gradients differ by {d}");
    }
    let spec = ops::AttentionSpec {
        heads,
        scale: 0.5,
        mask: ops::Mask::Causal,
        dropout: Some((0.3, 11)),
    };
    let x = randn(&[b, t, 3 * c], 4, DType::F32)?;
    let v = Var::from_tensor(&x)?;
    let g = loss(&ops::attention_packed_last(v.as_tensor(), spec, last)?, 6)?
        .backward()?
        .get(&v)
        .expect("gradient")
        .flatten_all()?
        .to_vec1::<f32>()?;
    let base = x.flatten_all()?.to_vec1::<f32>()?;
    for j in (0..base.len()).step_by(7) {
        let eval = |delta: f32| -> Result<f64> {
            let mut p = base.clone();
            p[j] += delta;
            let xi = Tensor::from_vec(p, x.shape(), &Device::Cpu)?;
            loss(&ops::attention_packed_last(&xi, spec, last)?, 6)?
                .to_dtype(DType::F64)?
                .to_scalar::<f64>()
        };
        let num = (eval(1e-2)? - eval(-1e-2)?) / 2e-2;
        let err = (num - g[j] as f64).abs() / (1.0 + num.abs());
        assert!(err < 2e-3, "elem {j}: analytic {} numeric {num}", g[j]);
    }
    Ok(())
}

/// A frozen `Linear` packs its weight once and reuses it: the same values and input
/// gradient as the plain op, on the first and later calls, and a replaced weight is packed
/// again (never read stale). Trainable weights take the plain path.
#[test]
fn frozen_linear_layer_reuses_its_packed_weight_exactly() -> Result<()> {
    every_path(frozen_linear_layer_reuses_its_packed_weight_exactly_on_one_path)
}

fn frozen_linear_layer_reuses_its_packed_weight_exactly_on_one_path() -> Result<()> {
    // Several column and depth blocks of the product.
    let (m, k, n) = (37, 900, 3100);
    let w = randn(&[n, k], 1, DType::F32)?;
    let b = randn(&[n], 2, DType::F32)?;
    let mut layer = fpt_nn::Linear::new(
        fpt_nn::Param::new(w.clone(), false)?,
        Some(fpt_nn::Param::new(b.clone(), false)?),
    );
    let x = Var::from_tensor(&randn(&[m, k], 3, DType::F32)?)?;
    let want = ops::linear(x.as_tensor(), &w, Some(&b))?;
    for _ in 0..2 {
        let got = layer.forward(x.as_tensor())?;
        assert_eq!(max_abs_diff(&got, &want)?, 0.0);
        let g = loss(&got, 1)?.backward()?;
        let gw = loss(&want, 1)?.backward()?;
        assert_eq!(max_abs_diff(g.get(&x).expect("dx"), gw.get(&x).expect("dx"))?, 0.0);
    }
    let w2 = randn(&[n, k], 4, DType::F32)?;
    layer.weight = fpt_nn::Param::new(w2.clone(), false)?;
    let got = layer.forward(x.as_tensor())?;
    assert_eq!(max_abs_diff(&got, &ops::linear(x.as_tensor(), &w2, Some(&b))?)?, 0.0);
    let trainable = fpt_nn::Linear::new(fpt_nn::Param::new(w.clone(), true)?, None);
    let got = trainable.forward(x.as_tensor())?;
    assert!(max_abs_diff(&got, &ops::linear(x.as_tensor(), &w, None)?)? < 1e-4);
    Ok(())
}

/// Attention as one recomputing node (the GPU's path, run here on the CPU) against the
/// composed ops it replaces: the same forward values bit for bit, gradients within rounding
/// in f32 and f64, with each mask, with and without dropout, for the split and packed forms,
/// and with only some of Q, K, V tracked (the others get no gradient); then against finite
/// differences in f64.
#[test]
fn recomputed_attention_matches_the_composed_ops() -> Result<()> {
    let (b, t, heads, d) = (2, 9, 3, 4);
    let c = heads * d;
    for dtype in [DType::F32, DType::F64] {
        let tol = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
        for mask in [ops::Mask::None, ops::Mask::Causal, ops::Mask::Band(2)] {
            for dropout in [None, Some((0.3, 42u64))] {
                let spec = ops::AttentionSpec {
                    heads,
                    scale: 0.4,
                    mask,
                    dropout,
                };
                let what = format!("{dtype:?} {mask:?} dropout {dropout:?}");
                let qkv = Var::from_tensor(&randn(&[b, t, 3 * c], 1, dtype)?)?;
                let x = qkv.as_tensor();
                let parts: Vec<Var> = (0..3)
                    .map(|i| Var::from_tensor(&x.narrow(2, i * c, c)?.contiguous()?))
                    .collect::<Result<_>>()?;
                let (q, k, v) = (parts[0].as_tensor(), parts[1].as_tensor(), parts[2].as_tensor());
                let reference = ops::attention_composed(q, k, v, spec)?;
                let split = ops::attention_recomputed(q, k, v, spec)?;
                let packed = ops::attention_packed_recomputed(x, spec)?;
                assert_eq!(max_abs_diff(&split, &reference)?, 0.0, "{what}: values");
                assert_eq!(max_abs_diff(&packed, &reference)?, 0.0, "{what}: packed values");
                let gr = loss(&reference, 3)?.backward()?;
                let gs = loss(&split, 3)?.backward()?;
                let gp = loss(&packed, 3)?.backward()?;
                let gpacked = gp.get(&qkv).expect("packed gradient");
                for (i, p) in parts.iter().enumerate() {
                    let want = gr.get(p).expect("reference gradient");
                    let got = gs.get(p).expect("recomputed gradient");
                    assert!(max_abs_diff(got, want)? < tol, "{what}: gradient {i}");
                    let got = gpacked.narrow(2, i * c, c)?;
                    assert!(max_abs_diff(&got, want)? < tol, "{what}: packed gradient {i}");
                }
                // Only V tracked, then only Q and K: the others get no gradient.
                let frozen = |i: usize| parts[i].as_tensor().detach();
                let gv = loss(&ops::attention_recomputed(&frozen(0), &frozen(1), v, spec)?, 3)?.backward()?;
                assert!(max_abs_diff(gv.get(v).expect("v's gradient"), gr.get(v).expect("ref"))? < tol);
                let gqk = loss(&ops::attention_recomputed(q, k, &frozen(2), spec)?, 3)?.backward()?;
                assert!(gqk.get(v).is_none(), "{what}: an untracked V got a gradient");
                for p in [q, k] {
                    assert!(max_abs_diff(gqk.get(p).expect("q/k gradient"), gr.get(p).expect("ref"))? < tol);
                }
                if dtype == DType::F64 {
                    // Central differences on the packed op.
                    let g = gpacked.flatten_all()?.to_vec1::<f64>()?;
                    let base = x.flatten_all()?.to_vec1::<f64>()?;
                    let h = 1e-6;
                    for j in (0..base.len()).step_by(13) {
                        let eval = |delta: f64| -> Result<f64> {
                            let mut p = base.clone();
                            p[j] += delta;
                            let xi = Tensor::from_vec(p, x.shape(), &Device::Cpu)?;
                            loss(&ops::attention_packed_recomputed(&xi, spec)?, 3)?.to_scalar::<f64>()
                        };
                        let num = (eval(h)? - eval(-h)?) / (2.0 * h);
                        let err = (num - g[j]).abs() / (1.0 + num.abs());
                        assert!(err < 1e-6, "{what}: elem {j}: analytic {} numeric {num}", g[j]);
                    }
                }
            }
        }
    }
    Ok(())
}

/// The recomputing node's passes draw their dropout masks as a replayed step needs (the
/// one-pass softmax forward and backward, and the scores' gradient, on the CPU here; a GPU's
/// kernels read the seed from its slot): bound to a slot holding the spec's seed, a forward
/// and backward read it and draw no other; bound to another seed, the step is refused.
#[test]
fn recomputed_attention_draws_its_masks_from_the_seed_slots() -> Result<()> {
    let (b, t, heads, d) = (2, 7, 2, 4);
    let spec = ops::AttentionSpec {
        heads,
        scale: 0.5,
        mask: ops::Mask::Causal,
        dropout: Some((0.25, 1234)),
    };
    let qkv = Var::from_tensor(&randn(&[b, t, 3 * heads * d], 5, DType::F32)?)?;
    let step = || -> Result<Tensor> {
        let y = ops::attention_packed_recomputed(qkv.as_tensor(), spec)?;
        let g = loss(&y, 2)?.backward()?;
        Ok(g.get(qkv.as_tensor()).expect("a gradient").clone())
    };
    let want = step()?;
    let slots = fpt_nn::replay::SeedSlots::new(1, &Device::Cpu)?;
    let got = slots.bind(&[1234], step)??;
    assert_eq!(max_abs_diff(&got, &want)?, 0.0, "the bound step's gradient");
    let e = slots.bind(&[99], step).expect_err("a seed outside the slots");
    assert!(e.to_string().contains("not given"), "{e}");
    Ok(())
}

/// So do the tiled attention's kernels, both families (their forward and two backward
/// passes, on the CPU here over the host grid; a GPU's read the seed from its slot).
#[test]
fn tiled_attention_draws_its_masks_from_the_seed_slots() -> Result<()> {
    let (b, t, heads, d) = (2, 9, 2, 8);
    let spec = ops::AttentionSpec {
        heads,
        scale: 0.4,
        mask: ops::Mask::None,
        dropout: Some((0.3, 77)),
    };
    let qkv = Var::from_tensor(&randn(&[b, t, 3 * heads * d], 6, DType::F32)?)?;
    for kernels in [
        ops::TiledKernels::Simt,
        ops::TiledKernels::Mma,
        ops::TiledKernels::MmaTf32,
    ] {
        let step = || -> Result<Tensor> {
            let y = ops::attention_tiled_packed_with(qkv.as_tensor(), spec, None, kernels)?;
            let g = loss(&y, 2)?.backward()?;
            Ok(g.get(qkv.as_tensor()).expect("a gradient").clone())
        };
        let want = step()?;
        let slots = fpt_nn::replay::SeedSlots::new(1, &Device::Cpu)?;
        let got = slots.bind(&[77], step)??;
        assert_eq!(
            max_abs_diff(&got, &want)?,
            0.0,
            "{kernels:?}: the bound step's gradient"
        );
        let e = slots.bind(&[5], step).expect_err("a seed outside the slots");
        assert!(e.to_string().contains("not given"), "{kernels:?}: {e}");
    }
    Ok(())
}

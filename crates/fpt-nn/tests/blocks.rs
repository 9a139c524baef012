//! The fused block ops against their composed references and finite differences: a
//! transformer block half over frozen layers (`ResidualBranch`) and the layer-norm LSTM's
//! recurrence (`ln_lstm`).

mod common;
#[allow(unused_imports)]
use candle_core::{backprop::GradStore, DType, Device, Result, Tensor, Var};
use common::*;
#[allow(unused_imports)]
use fpt_nn::{ops, Rng};

/// A pre-norm branch over frozen layers of widths `c -> mid_in`, `mid_out -> c`, with a
/// trainable norm.
fn branch_layers(
    c: usize,
    mid_in: usize,
    mid_out: usize,
    seed: u64,
) -> Result<(fpt_nn::LayerNorm, fpt_nn::Linear, fpt_nn::Linear)> {
    let frozen = |shape: &[usize], s: u64| -> Result<fpt_nn::Param> {
        Ok(fpt_nn::Param::Frozen((randn(shape, s, DType::F32)? * 0.3)?))
    };
    let norm = fpt_nn::LayerNorm {
        weight: fpt_nn::Param::new(((randn(&[c], seed, DType::F32)? * 0.2)? + 1.0)?, true)?,
        bias: fpt_nn::Param::new((randn(&[c], seed + 1, DType::F32)? * 0.1)?, true)?,
        eps: 1e-5,
    };
    let input = fpt_nn::Linear::new(frozen(&[mid_in, c], seed + 2)?, Some(frozen(&[mid_in], seed + 3)?));
    let output = fpt_nn::Linear::new(frozen(&[c, mid_out], seed + 4)?, Some(frozen(&[c], seed + 5)?));
    Ok((norm, input, output))
}

/// A branch's middle and its layers' widths: GPT-2's (pre-norm: `gelu_new`, causal
/// attention) or BERT's (post-norm: exact GELU, unmasked attention), attention dropout
/// seeded beside the residual's.
fn branch_mid(
    norm_at: fpt_nn::NormAt,
    attention: bool,
    dropout: Option<(f64, u64)>,
    heads: usize,
    c: usize,
) -> (fpt_nn::BranchMid, usize, usize) {
    use fpt_nn::NormAt;
    match (attention, norm_at) {
        (true, _) => {
            let mask = match norm_at {
                NormAt::Input => ops::Mask::Causal,
                NormAt::Output => ops::Mask::None,
            };
            let spec = ops::AttentionSpec {
                heads,
                scale: 0.35,
                mask,
                dropout: dropout.map(|(p, s)| (p, s + 1)),
            };
            (fpt_nn::BranchMid::Attention(spec), 3 * c, c)
        }
        (false, NormAt::Input) => (fpt_nn::BranchMid::GeluNew, 4 * c, 4 * c),
        (false, NormAt::Output) => (fpt_nn::BranchMid::GeluErf, 4 * c, 4 * c),
    }
}

/// The fused residual branch, pre-norm (GPT-2: `gelu_new` and causal packed-attention
/// middles) and post-norm (BERT: exact GELU and unmasked packed attention), with and without
/// residual and attention dropout, against the same branch composed of the separate ops: values and
/// the gradients of x and the norm's parameters, on the first call and on a repeated one
/// (the packed weights reused); its x gradient against finite differences (f32); a trained
/// weight turns fusion off and gets its gradient.
#[test]
fn fused_residual_branch_matches_composed_and_finite_differences() -> Result<()> {
    every_path(fused_residual_branch_matches_composed_and_finite_differences_on_one_path)
}

fn fused_residual_branch_matches_composed_and_finite_differences_on_one_path() -> Result<()> {
    use fpt_nn::NormAt;
    let (b, t, heads, d) = (2, 5, 2, 8);
    let c = heads * d;
    for (norm_at, attention, dropout) in [NormAt::Input, NormAt::Output]
        .into_iter()
        .flat_map(|n| [false, true].map(|a| (n, a)))
        .flat_map(|(n, a)| [None, Some((0.2, 17u64))].map(|d| (n, a, d)))
    {
        {
            let (mid, mid_in, mid_out) = branch_mid(norm_at, attention, dropout, heads, c);
            let (norm, input, output) = branch_layers(c, mid_in, mid_out, 30)?;
            let branch = fpt_nn::ResidualBranch {
                norm: &norm,
                norm_at,
                input: &input,
                mid,
                output: &output,
            };
            let what = format!("norm at {norm_at:?}, attention {attention}, dropout {dropout:?}");
            let x = Var::from_tensor(&randn(&[b, t, c], 3, DType::F32)?)?;
            assert!(branch.is_fused(x.as_tensor()), "{what}: fused on every CPU kernel path");
            let reference = branch.forward_composed(x.as_tensor(), dropout)?;
            let gr = loss(&reference, 8)?.backward()?;
            let vars = [&x, norm.weight.var().unwrap(), norm.bias.var().unwrap()];
            for round in 0..2 {
                let fused = branch.forward(x.as_tensor(), dropout)?;
                let dv = max_abs_diff(&fused, &reference)?;
                assert!(dv < 1e-5, "{what} (call {round}): values differ by {dv}");
                let gf = loss(&fused, 8)?.backward()?;
                for (i, v) in vars.iter().enumerate() {
                    let got = gf.get(v).unwrap_or_else(|| panic!("{what}: no gradient for input {i}"));
                    let d = max_abs_diff(got, gr.get(v).expect("reference gradient"))?;
                    assert!(d < 1e-4, "{what} (call {round}): gradient {i} differs by {d}");
                }
            }
            // Finite differences on x through the fused op (f32: step 1e-2, loose tolerance).
            let gf = loss(&branch.forward(x.as_tensor(), dropout)?, 8)?.backward()?;
            let g = gf.get(&x).expect("gradient").flatten_all()?.to_vec1::<f32>()?;
            let base = x.as_tensor().flatten_all()?.to_vec1::<f32>()?;
            let h = 1e-2f32;
            for j in (0..base.len()).step_by(13) {
                let eval = |delta: f32| -> Result<f64> {
                    let mut p = base.clone();
                    p[j] += delta;
                    let xi = Tensor::from_vec(p, (b, t, c), &Device::Cpu)?;
                    loss(&branch.forward(&xi, dropout)?, 8)?
                        .to_dtype(DType::F64)?
                        .to_scalar::<f64>()
                };
                let num = (eval(h)? - eval(-h)?) / (2.0 * h as f64);
                let err = (num - g[j] as f64).abs() / (1.0 + num.abs());
                assert!(err < 3e-3, "{what}: elem {j}: analytic {} numeric {num}", g[j]);
            }
        }
    }
    // A trained weight: composed, and the weight gets its gradient.
    let (norm, input, _) = branch_layers(c, 4 * c, 4 * c, 40)?;
    let w = Var::from_tensor(&randn(&[c, 4 * c], 41, DType::F32)?)?;
    let output = fpt_nn::Linear::new(fpt_nn::Param::Trainable(w.clone()), None);
    let branch = fpt_nn::ResidualBranch {
        norm: &norm,
        norm_at: fpt_nn::NormAt::Input,
        input: &input,
        mid: fpt_nn::BranchMid::GeluNew,
        output: &output,
    };
    let x = randn(&[b, t, c], 4, DType::F32)?;
    assert!(!branch.is_fused(&x));
    let g = loss(&branch.forward(&x, None)?, 9)?.backward()?;
    assert!(g.get(&w).is_some(), "the trained weight gets its gradient");
    Ok(())
}

/// The residual branch as one node of the graph (`forward_node`, what a GPU runs: the
/// composed ops' forward on detached operands, their backward passes chained by hand)
/// against the same branch composed of the separate ops, on the CPU on every kernel path:
/// values and the gradients of x and the norm's parameters equal to the last bit (f32 `==`,
/// which takes +0 and -0 as equal: candle starts every gradient from +0), for both norms,
/// GELU and attention middles, with and without dropout, f32 and bf16 frozen weights. And
/// candle's backward has four nodes fewer per branch to start from zero and add into.
#[test]
fn branch_node_equals_the_composed_branch_bit_for_bit() -> Result<()> {
    every_path(branch_node_equals_the_composed_branch_bit_for_bit_on_one_path)
}

fn branch_node_equals_the_composed_branch_bit_for_bit_on_one_path() -> Result<()> {
    use fpt_nn::NormAt;
    let (b, t, heads, d) = (2, 7, 2, 8);
    let c = heads * d;
    // The nodes whose gradients candle's backward starts from zero and adds into.
    let walked = |y: &Tensor| -> Result<usize> {
        let l = loss(y, 8)?;
        Ok(l.sorted_nodes().iter().filter(|n| !n.is_variable()).count())
    };
    for norm_at in [NormAt::Input, NormAt::Output] {
        for attention in [false, true] {
            for dropout in [None, Some((0.2, 17u64))] {
                for bf16 in [false, true] {
                    let (mid, mid_in, mid_out) = branch_mid(norm_at, attention, dropout, heads, c);
                    let (norm, mut input, mut output) = branch_layers(c, mid_in, mid_out, 50)?;
                    if bf16 {
                        for l in [&mut input, &mut output] {
                            let w = l.weight.tensor().to_dtype(DType::BF16)?;
                            *l = fpt_nn::Linear::new(fpt_nn::Param::Frozen(w), l.bias.clone());
                        }
                    }
                    let branch = fpt_nn::ResidualBranch {
                        norm: &norm,
                        norm_at,
                        input: &input,
                        mid,
                        output: &output,
                    };
                    let what = format!("norm at {norm_at:?}, attention {attention}, dropout {dropout:?}, bf16 {bf16}");
                    let x = Var::from_tensor(&randn(&[b, t, c], 5, DType::F32)?)?;
                    let composed = branch.forward_composed(x.as_tensor(), dropout)?;
                    let node = branch.forward_node(x.as_tensor(), dropout)?;
                    let same = |a: &Tensor, b: &Tensor| -> Result<bool> {
                        Ok(a.flatten_all()?.to_vec1::<f32>()? == b.flatten_all()?.to_vec1::<f32>()?)
                    };
                    assert!(same(&node, &composed)?, "{what}: values differ");
                    let (gc, gn) = (loss(&composed, 8)?.backward()?, loss(&node, 8)?.backward()?);
                    let vars = [&x, norm.weight.var().unwrap(), norm.bias.var().unwrap()];
                    for (i, v) in vars.iter().enumerate() {
                        let got = gn
                            .get(v)
                            .unwrap_or_else(|| panic!("{what}: no gradient for operand {i}"));
                        let want = gc.get(v).expect("the composed branch's gradient");
                        assert!(
                            same(got, want)?,
                            "{what}: gradient {i} differs by {}",
                            max_abs_diff(got, want)?
                        );
                    }
                    let (nc, nn) = (walked(&composed)?, walked(&node)?);
                    assert_eq!(
                        nc,
                        nn + 4,
                        "{what}: nodes candle's backward walks, composed {nc}, node {nn}"
                    );
                }
            }
        }
    }
    Ok(())
}

/// The branch node where only the norm trains (x is data): no gradient for x, the norm's
/// equal to the composed branch's; and a trained linear layer is refused by name.
#[test]
fn branch_node_with_data_input_and_trained_layer() -> Result<()> {
    let c = 8;
    let (norm, input, output) = branch_layers(c, 4 * c, 4 * c, 60)?;
    let branch = fpt_nn::ResidualBranch {
        norm: &norm,
        norm_at: fpt_nn::NormAt::Output,
        input: &input,
        mid: fpt_nn::BranchMid::GeluErf,
        output: &output,
    };
    let x = randn(&[3, c], 6, DType::F32)?;
    let (gc, gn) = (
        loss(&branch.forward_composed(&x, None)?, 2)?.backward()?,
        loss(&branch.forward_node(&x, None)?, 2)?.backward()?,
    );
    assert!(gn.get(&x).is_none(), "data gets no gradient");
    for v in [norm.weight.var().unwrap(), norm.bias.var().unwrap()] {
        assert_eq!(
            max_abs_diff(gn.get(v).expect("norm gradient"), gc.get(v).expect("reference"))?,
            0.0
        );
    }
    let w = Var::from_tensor(&randn(&[c, 4 * c], 61, DType::F32)?)?;
    let trained = fpt_nn::Linear::new(fpt_nn::Param::Trainable(w), None);
    let branch = fpt_nn::ResidualBranch {
        output: &trained,
        ..branch
    };
    let err = branch
        .forward_node(&x, None)
        .expect_err("a trained layer is refused")
        .to_string();
    assert!(err.contains("trains"), "{err}");
    Ok(())
}

#[test]
fn fused_ln_lstm_matches_the_composed_recurrence() -> Result<()> {
    every_path(fused_ln_lstm_matches_the_composed_recurrence_on_one_path)
}

/// The layer-norm LSTM's fused recurrence against the same recurrence in candle ops: values
/// and the gradients of everything that trains, with dropout, with the recurrent weight
/// trained (`--train all`) and frozen (the FPT setting, where neither `W_hh` nor `b_hh` may
/// get a gradient), and with a mixed pack (which runs the composed twin).
fn fused_ln_lstm_matches_the_composed_recurrence_on_one_path() -> Result<()> {
    let (b, t, h) = (3, 5, 6);
    let masks = Tensor::from_vec(ops::dropout_mask_values(t * b * h, 0.3, 42), (t, b, h), &Device::Cpu)?;
    let (h0, c0) = (randn(&[b, h], 1, DType::F32)?, randn(&[b, h], 2, DType::F32)?);
    let shapes: [&[usize]; 7] = [&[b, t, 4 * h], &[4 * h, h], &[4 * h], &[4 * h], &[4 * h], &[h], &[h]];
    let tensors: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| randn(s, 30 + i as u64, DType::F32))
        .collect::<Result<_>>()?;
    // Which inputs train: all; the FPT setting (W_hh, b_hh frozen); a mixed recurrent pack.
    for (case, trains) in [
        ("all", [true; 7]),
        ("fpt", [true, false, false, true, true, true, true]),
        ("mixed", [true, true, false, true, true, true, true]),
    ] {
        let (vars, ts) = training(&tensors, &trains)?;
        let p = ops::LnLstmParams {
            b_hh: &ts[2],
            ln_h2h: (&ts[3], &ts[4]),
            ln_cell: (&ts[5], &ts[6]),
            eps: 1e-6,
        };
        let yf = ops::ln_lstm(&ts[0], &ts[1], &p, &h0, &c0, Some(&masks))?;
        let yc = ops::ln_lstm_composed(&ts[0], &ts[1], &p, &h0, &c0, Some(&masks))?;
        assert_eq!(yf.dims(), &[b, t, h]);
        let dv = max_abs_diff(&yf, &yc)?;
        assert!(dv < 1e-5, "{case}: values differ by {dv}");
        let gf = loss(&yf, 99)?.backward()?;
        let gc = loss(&yc, 99)?.backward()?;
        for (i, v) in vars.iter().enumerate() {
            match v {
                Some(v) => {
                    let a = gf
                        .get(v)
                        .unwrap_or_else(|| panic!("{case}: fused, no gradient for input {i}"));
                    let c = gc
                        .get(v)
                        .unwrap_or_else(|| panic!("{case}: composed, no gradient for input {i}"));
                    let d = max_abs_diff(a, c)?;
                    let scale = c.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()? as f64;
                    assert!(d < 1e-4 * (1.0 + scale), "{case}: gradient of input {i} differs by {d}");
                }
                None if case == "fpt" => {
                    assert!(gf.get(&ts[i]).is_none(), "{case}: frozen input {i} got a gradient");
                }
                None => {}
            }
        }
    }
    // Without dropout the masks are ones: the same as no masks.
    let p = ops::LnLstmParams {
        b_hh: &tensors[2],
        ln_h2h: (&tensors[3], &tensors[4]),
        ln_cell: (&tensors[5], &tensors[6]),
        eps: 1e-6,
    };
    let ones = Tensor::ones((t, b, h), DType::F32, &Device::Cpu)?;
    let a = ops::ln_lstm(&tensors[0], &tensors[1], &p, &h0, &c0, None)?;
    let c = ops::ln_lstm(&tensors[0], &tensors[1], &p, &h0, &c0, Some(&ones))?;
    assert_eq!(max_abs_diff(&a, &c)?, 0.0);
    // Shapes that do not fit are refused with the operand's name.
    let e = ops::ln_lstm(&tensors[0], &tensors[2], &p, &h0, &c0, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("W_hh"), "{e}");
    Ok(())
}

#[test]
fn fused_ln_lstm_through_a_long_sequence_zeroes_only_what_is_below_2_pow_minus_100() -> Result<()> {
    every_path(fused_ln_lstm_through_a_long_sequence_on_one_path)
}

/// The gradient read out at the last of many steps shrinks on its way back through time and
/// passes below 2^-100 (and through the subnormal range) before it reaches the first steps.
/// The fused backward sets what it hands on below 2^-100 to zero (so that no instruction
/// meets a subnormal: on Intel CPUs each one costs a microcode assist), the composed
/// recurrence keeps IEEE arithmetic: their gradients agree to far below f32's rounding of the
/// large ones, and the fused one holds no magnitude in (0, 2^-100).
fn fused_ln_lstm_through_a_long_sequence_on_one_path() -> Result<()> {
    let (b, t, h) = (2, 400, 8);
    let tiny = 0.5f64.powi(100);
    let (h0, c0) = (randn(&[b, h], 5, DType::F32)?, randn(&[b, h], 6, DType::F32)?);
    let shapes: [&[usize]; 7] = [&[b, t, 4 * h], &[4 * h, h], &[4 * h], &[4 * h], &[4 * h], &[h], &[h]];
    let tensors: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| randn(s, 50 + i as u64, DType::F32))
        .collect::<Result<_>>()?;
    let xi = Var::from_tensor(&tensors[0])?;
    let p = ops::LnLstmParams {
        b_hh: &tensors[2],
        ln_h2h: (&tensors[3], &tensors[4]),
        ln_cell: (&tensors[5], &tensors[6]),
        eps: 1e-6,
    };
    let last = |y: Tensor| loss(&y.narrow(1, t - 1, 1)?, 7);
    let gf = last(ops::ln_lstm(xi.as_tensor(), &tensors[1], &p, &h0, &c0, None)?)?.backward()?;
    let gc = last(ops::ln_lstm_composed(xi.as_tensor(), &tensors[1], &p, &h0, &c0, None)?)?.backward()?;
    let values = |g: &GradStore| -> Result<Vec<f64>> {
        g.get(&xi)
            .expect("xi gets a gradient")
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()
    };
    let (f, c) = (values(&gf)?, values(&gc)?);
    let in_tiny = |v: &[f64]| v.iter().filter(|x| **x != 0.0 && x.abs() < tiny).count();
    assert!(
        in_tiny(&c) > 0,
        "the composed gradient has no value in (0, 2^-100): the sequence is too short to test the flush"
    );
    assert_eq!(in_tiny(&f), 0, "the fused gradient holds values in (0, 2^-100)");
    let scale = c.iter().fold(0f64, |m, x| m.max(x.abs()));
    let diff = f.iter().zip(&c).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff < 1e-5 * scale, "gradients differ by {diff} (largest {scale})");
    // The last steps, where the gradient is large, see the same values.
    let tail = 4 * h * 8;
    let row_end = |v: &[f64], r: usize| v[(r + 1) * t * 4 * h - tail..(r + 1) * t * 4 * h].to_vec();
    for r in 0..b {
        let (a, z) = (row_end(&f, r), row_end(&c, r));
        let d = a.iter().zip(&z).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
        assert!(d < 1e-5 * scale, "row {r}: the last steps' gradients differ by {d}");
    }
    Ok(())
}

/// Backprop through an unfused recurrence (the LSTM's composed twin, which a GPU runs: three
/// layers of 512 steps, about 20 ops a step) walks and drops a graph tens of thousands of
/// nodes deep, recursively; a training step runs on rayon's pool, whose threads get a stack
/// large enough for it (an H200 run overflowed 2 MiB ones at `lstm-listops`, 2026-11-26).
#[test]
fn a_deep_unfused_recurrence_backprops_on_the_pool() -> Result<()> {
    let (b, t, h, layers) = (2, 512, 4, 3);
    let (h0, c0) = (randn(&[b, h], 5, DType::F32)?, randn(&[b, h], 6, DType::F32)?);
    let shapes: [&[usize]; 7] = [&[b, t, 4 * h], &[4 * h, h], &[4 * h], &[4 * h], &[4 * h], &[h], &[h]];
    let tensors: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| randn(s, 80 + i as u64, DType::F32))
        .collect::<Result<_>>()?;
    let w_ih = randn(&[4 * h, h], 90, DType::F32)?;
    let xi = Var::from_tensor(&tensors[0])?;
    let p = ops::LnLstmParams {
        b_hh: &tensors[2],
        ln_h2h: (&tensors[3], &tensors[4]),
        ln_cell: (&tensors[5], &tensors[6]),
        eps: 1e-6,
    };
    let grad = fpt_nn::on_pool(|| -> Result<Tensor> {
        let mut x = xi.as_tensor().clone();
        for _ in 0..layers {
            let y = ops::ln_lstm_composed(&x, &tensors[1], &p, &h0, &c0, None)?;
            x = y.broadcast_matmul(&w_ih.t()?)?;
        }
        let g = loss(&x, 7)?.backward()?;
        Ok(g.get(&xi).expect("xi gets a gradient").clone())
    })?;
    let first = grad.narrow(1, 0, 1)?.abs()?.sum_all()?.to_scalar::<f32>()?;
    assert!(first.is_finite(), "the first step's gradient is {first}");
    Ok(())
}

/// The embedding's read-back check (`FPT_CHECK_DEVICE=1` on a GPU) names an id outside the
/// table before any lookup, and passes ids inside it to the same lookup as unchecked.
#[test]
fn a_checked_embedding_names_an_id_outside_its_table() -> Result<()> {
    let dev = Device::Cpu;
    let table = Tensor::arange(0f32, 12.0, &dev)?.reshape((4, 3))?;
    let e = fpt_nn::layers::Embedding {
        weight: fpt_nn::Param::new(table, true)?,
    };
    let good = Tensor::new(&[[0u32, 3], [2, 1]], &dev)?;
    let plain = e.forward(&good)?.flatten_all()?.to_vec1::<f32>()?;
    assert_eq!(e.forward_checked(&good, true)?.flatten_all()?.to_vec1::<f32>()?, plain);
    assert_eq!(plain[3..6], [9.0, 10.0, 11.0]);
    let bad = Tensor::new(&[[0u32, 3], [7, 1]], &dev)?;
    let msg = e.forward_checked(&bad, true).unwrap_err().to_string();
    assert!(
        msg.contains("id 7 at position 2 of a [2, 2] batch is outside the table's 4 rows"),
        "{msg}"
    );
    Ok(())
}

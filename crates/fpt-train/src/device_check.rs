//! Two parts of `fpt gpu-check` that need no reference outside fpt: fpt's kernels on the
//! device against its CPU ops (the same dropout masks bit for bit, the softmax each way
//! and Adam within rounding), and every trained tensor of each backbone family getting a
//! finite, nonzero gradient on the device (candle's own fast CUDA ops have no backward and
//! would cut it silently; fpt never uses them, and this shows it).

use crate::Result;
use candle_core::{DType, Device, Tensor, Var};
use fpt_nn::ops::bf16_choice::{self, Bf16Product};
use fpt_nn::ops::{self, AttentionSpec, Mask, TiledKernels};
use fpt_nn::Rng;
use serde::Serialize;

mod replay;
pub use replay::replay_agreement;

/// One kernel's agreement with the CPU.
#[derive(Debug, Serialize)]
pub struct KernelCheck {
    /// The op and its shape.
    pub name: String,
    /// The largest relative difference from the CPU.
    pub max_diff: f64,
    /// The largest allowed.
    pub allowed: f64,
    /// Whether it is within.
    pub passed: bool,
}

fn randn(shape: &[usize], seed: u64, device: &Device) -> Result<Tensor> {
    let n = shape.iter().product();
    Ok(fpt_nn::transfer::upload(
        Rng::new(seed).normal_vec(n, 0.0, 1.0),
        shape,
        device,
    )?)
}

/// How a difference is measured.
#[derive(Clone, Copy, PartialEq)]
enum Metric {
    /// Each value's |a - b| / (1 + |b|): for ops whose every value is computed to rounding.
    Elementwise,
    /// |a - b| / (1 + max |b|) over the tensor: for products, whose rounding error is bounded
    /// by the sums of |terms| and not by each result (a value near zero from a long sum
    /// cancelling carries the sum's error; cuBLAS and the CPU add in other orders). TF32's
    /// rounding (1e-3 of the terms) still fails it by far.
    Normwise,
}

/// The largest difference under `metric`; infinite when a value is not finite (NaN never
/// passes).
fn max_diff(a: &Tensor, b: &Tensor, metric: Metric) -> Result<f64> {
    let a = fpt_nn::transfer::download_vec::<f32>(a)?;
    let b = fpt_nn::transfer::download_vec::<f32>(b)?;
    if a.len() != b.len() {
        return Err(candle_core::Error::Msg(format!("{} values against {}", a.len(), b.len())).into());
    }
    let scale = b.iter().fold(0f32, |m, &y| m.max(y.abs()));
    Ok(a.iter().zip(&b).fold(0f64, |m, (&x, &y)| {
        if !x.is_finite() || !y.is_finite() {
            f64::INFINITY
        } else {
            let by = if metric == Metric::Normwise { scale } else { y.abs() };
            m.max(((x - y).abs() / (1.0 + by)) as f64)
        }
    }))
}

fn check(out: &mut Vec<KernelCheck>, name: String, dev: &Tensor, cpu: &Tensor, allowed: f64) -> Result<()> {
    check_with(out, name, dev, cpu, allowed, Metric::Elementwise)
}

fn check_with(
    out: &mut Vec<KernelCheck>,
    name: String,
    dev: &Tensor,
    cpu: &Tensor,
    allowed: f64,
    metric: Metric,
) -> Result<()> {
    let d = max_diff(dev, cpu, metric)?;
    out.push(KernelCheck {
        passed: d <= allowed,
        name,
        max_diff: d,
        allowed,
    });
    Ok(())
}

/// `f` of fresh random inputs of `shapes` on `device` and on the CPU: the outputs, and every
/// input's gradient under a random upstream gradient, within 1e-5 (relative).
fn op_check(
    out: &mut Vec<KernelCheck>,
    device: &Device,
    name: &str,
    shapes: &[&[usize]],
    f: impl Fn(&[&Tensor]) -> candle_core::Result<Tensor>,
) -> Result<()> {
    op_check_within(out, device, name, shapes, f, Metric::Elementwise, 1e-5)
}

/// [`op_check`] with differences measured by `metric`, allowing `allowed` (relative).
fn op_check_within(
    out: &mut Vec<KernelCheck>,
    device: &Device,
    name: &str,
    shapes: &[&[usize]],
    f: impl Fn(&[&Tensor]) -> candle_core::Result<Tensor>,
    metric: Metric,
    allowed: f64,
) -> Result<()> {
    let cpu = Device::Cpu;
    let xs: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| randn(s, 100 + i as u64, &cpu))
        .collect::<Result<_>>()?;
    let run = |d: &Device| -> Result<(Tensor, Vec<Option<Tensor>>)> {
        let vars: Vec<Var> = xs
            .iter()
            .map(|x| Var::from_tensor(&fpt_nn::transfer::to_device(x, d)?))
            .collect::<candle_core::Result<_>>()?;
        let ts: Vec<&Tensor> = vars.iter().map(|v| v.as_tensor()).collect();
        let y = f(&ts)?;
        let up = fpt_nn::transfer::to_device(&randn(y.dims(), 99, &cpu)?, d)?;
        let grads = (&y * up)?.sum_all()?.backward()?;
        let gs = vars.iter().map(|v| grads.get(v.as_tensor()).cloned()).collect();
        Ok((y, gs))
    };
    let (yd, gd) = run(device)?;
    let (yc, gc) = run(&cpu)?;
    check_with(out, name.to_string(), &yd, &yc, allowed, metric)?;
    for (i, (d, c)) in gd.iter().zip(&gc).enumerate() {
        match (d, c) {
            (Some(d), Some(c)) => check_with(out, format!("{name} gradient of input {i}"), d, c, allowed, metric)?,
            _ => out.push(KernelCheck {
                name: format!("{name} gradient of input {i}: missing"),
                max_diff: f64::INFINITY,
                allowed,
                passed: false,
            }),
        }
    }
    Ok(())
}

/// Each of fpt's device kernels (reached through the public ops) on `device` against the
/// same op on the CPU, on fresh random inputs.
pub fn agreement(device: &Device) -> Result<Vec<KernelCheck>> {
    let cpu = Device::Cpu;
    let mut out = Vec::new();
    // Dropout: the mask must be the CPU's, so the results equal exactly.
    for (n, p, seed) in [(100_003usize, 0.1f64, 1u64), (4096, 0.5, 2)] {
        let x = randn(&[n], seed, &cpu)?;
        let xd = fpt_nn::transfer::to_device(&x, device)?;
        let (mut r1, mut r2) = (Rng::new(seed), Rng::new(seed));
        let y_dev = ops::dropout(&xd, p, &mut r1)?;
        let y_cpu = ops::dropout(&x, p, &mut r2)?;
        check(&mut out, format!("dropout n={n} p={p}"), &y_dev, &y_cpu, 0.0)?;
        let a = randn(&[n], seed + 7, &cpu)?;
        let ad = fpt_nn::transfer::to_device(&a, device)?;
        check(
            &mut out,
            format!("dropout_add n={n} p={p}"),
            &ops::dropout_add(&ad, &xd, p, seed)?,
            &ops::dropout_add(&a, &x, p, seed)?,
            0.0,
        )?;
    }
    // Masked softmax, forward and backward, each mask kind.
    for (tq, tk, mask) in [
        (64usize, 64usize, Mask::None),
        (64, 64, Mask::Causal),
        (1, 200, Mask::Causal),
        (100, 100, Mask::Band(7)),
    ] {
        op_check(
            &mut out,
            device,
            &format!("masked_softmax {tq}x{tk} {mask:?}"),
            &[&[2, 3, tq, tk]],
            |x| ops::masked_softmax(x[0], 0.125, mask),
        )?;
    }
    // The norms and the GELUs, forward and backward.
    for (rows, d) in [(64usize, 768usize), (10, 37)] {
        op_check(
            &mut out,
            device,
            &format!("layer_norm {rows}x{d}"),
            &[&[rows, d], &[d], &[d]],
            |x| ops::layer_norm(x[0], x[1], x[2], 1e-5),
        )?;
        op_check(
            &mut out,
            device,
            &format!("rms_norm {rows}x{d}"),
            &[&[rows, d], &[d]],
            |x| ops::rms_norm(x[0], x[1], 1e-6),
        )?;
    }
    op_check(&mut out, device, "gelu_new", &[&[4096]], |x| ops::gelu_new(x[0]))?;
    op_check(&mut out, device, "gelu_erf", &[&[4096]], |x| ops::gelu_erf(x[0]))?;
    // Llama's pieces: SwiGLU, rotary positions (constant tables: no gradient), and the loss.
    op_check(&mut out, device, "swiglu", &[&[64, 256], &[64, 256]], |x| {
        ops::swiglu(x[0], x[1])
    })?;
    // The layer-norm LSTM's recurrence (on a GPU one block per batch row, `fpt_lstm.h`; on
    // the CPU the fused op), with dropout, every input training: 24 steps of rounding
    // carried through the state, so normwise.
    let (b, t, h) = (3usize, 24usize, 64usize);
    let (h0, c0) = (randn(&[b, h], 60, &cpu)?, randn(&[b, h], 61, &cpu)?);
    let masks = fpt_nn::transfer::upload(ops::dropout_mask_values(t * b * h, 0.1, 62), (t, b, h), &cpu)?;
    op_check_within(
        &mut out,
        device,
        &format!("ln_lstm {b}x{t}x{h} with dropout"),
        &[&[b, t, 4 * h], &[4 * h, h], &[4 * h], &[4 * h], &[4 * h], &[h], &[h]],
        |x| {
            let on = |tab: &Tensor| fpt_nn::transfer::to_device(tab, x[0].device());
            let p = ops::LnLstmParams {
                b_hh: x[2],
                ln_h2h: (x[3], x[4]),
                ln_cell: (x[5], x[6]),
                eps: 1e-6,
            };
            // W_hh at 1 / sqrt(H) = 0.125, the scale its initialisation gives it (unit
            // normals would saturate the gates and hide the recurrence's arithmetic).
            ops::ln_lstm(x[0], &(x[1] * 0.125)?, &p, &on(&h0)?, &on(&c0)?, Some(&on(&masks)?))
        },
        Metric::Normwise,
        1e-5,
    )?;
    let (t, heads, d) = (17usize, 3usize, 16usize);
    let cos = randn(&[t, d], 40, &cpu)?.cos()?;
    let sin = randn(&[t, d], 41, &cpu)?.sin()?;
    op_check(&mut out, device, "rotary", &[&[2, t, heads * d]], |x| {
        let on = |tab: &Tensor| fpt_nn::transfer::to_device(tab, x[0].device());
        ops::rotary(x[0], &on(&cos)?, &on(&sin)?, heads)
    })?;
    for (rows, c) in [(48usize, 10usize), (7, 1000)] {
        let logits = randn(&[rows, c], 50 + c as u64, &cpu)?;
        let targets: Vec<u32> = (0..rows).map(|r| ((r * 7 + 3) % c) as u32).collect();
        let run = |dev: &Device| -> Result<(Tensor, Tensor)> {
            let x = Var::from_tensor(&fpt_nn::transfer::to_device(&logits, dev)?)?;
            let t = fpt_nn::transfer::upload_slice(&targets, rows, dev)?;
            let loss = ops::cross_entropy(x.as_tensor(), &t)?;
            let g = loss.backward()?.get(x.as_tensor()).cloned();
            let g = g.ok_or_else(|| candle_core::Error::Msg("cross_entropy: no gradient".into()))?;
            Ok((loss, g))
        };
        let ((ld, gd), (lc, gc)) = (run(device)?, run(&cpu)?);
        check(&mut out, format!("cross_entropy {rows}x{c}"), &ld, &lc, 1e-5)?;
        check(&mut out, format!("cross_entropy {rows}x{c} gradient"), &gd, &gc, 1e-5)?;
    }
    // Attention with dropout (the device's composed op against the CPU's fused one): the
    // same mask, so the outputs agree to rounding.
    // Attention (on a GPU one recomputing node, on the CPU the fused op), split and packed,
    // with dropout: values and every input's gradient.
    for (t, mask) in [(33usize, Mask::Causal), (64, Mask::None)] {
        let spec = AttentionSpec {
            heads: 4,
            scale: 0.25,
            mask,
            dropout: Some((0.1, 9)),
        };
        let c = 32;
        op_check(
            &mut out,
            device,
            &format!("attention t={t} {mask:?} with dropout"),
            &[&[2, t, c], &[2, t, c], &[2, t, c]],
            |x| ops::attention(x[0], x[1], x[2], spec),
        )?;
        op_check(
            &mut out,
            device,
            &format!("attention_packed t={t} {mask:?} with dropout"),
            &[&[2, t, 3 * c]],
            |x| ops::attention_packed(x[0], spec),
        )?;
    }
    // Attention tiled in blocks (its CUDA kernels on a GPU; on the CPU the same bodies over
    // the host grid), with dropout and padding: values and the packed gradient. Heads of 8,
    // 32 (MiniLM's tiles) and 64 (GPT-2's), over several tiles of rows and keys; the
    // tensor-core kernels (`attention_mma`, heads up to 64; `attention_mma-tf32` their one-term
    // products, the same TF32 operands on both sides) on the same cases.
    for (t, c, heads, mask, lens) in [
        (33usize, 32usize, 4usize, Mask::Causal, None),
        (64, 32, 4, Mask::None, Some([64u32, 40])),
        (100, 32, 4, Mask::Band(7), Some([100, 97])),
        (64, 768, 12, Mask::Causal, None),
        (150, 64, 2, Mask::None, Some([150, 131])),
        (200, 128, 2, Mask::Causal, None),
    ] {
        let spec = AttentionSpec {
            heads,
            scale: 1.0 / ((c / heads) as f64).sqrt(),
            mask,
            dropout: Some((0.1, 11)),
        };
        for (what, kernels) in [
            ("tiled", TiledKernels::Simt),
            ("mma", TiledKernels::Mma),
            ("mma-tf32", TiledKernels::MmaTf32),
        ] {
            if kernels != TiledKernels::Simt && c / heads > 64 {
                continue;
            }
            // The tensor cores sum each product's terms in the hardware's order and precision
            // (the host grid sums them in order, in f32): normwise, as products are.
            let metric = match kernels {
                TiledKernels::Simt => Metric::Elementwise,
                _ => Metric::Normwise,
            };
            op_check_within(
                &mut out,
                device,
                &format!("attention_{what} t={t} c={c} {mask:?} lengths {lens:?} with dropout"),
                &[&[2, t, 3 * c]],
                |x| {
                    let keylen = lens
                        .map(|l| fpt_nn::transfer::upload_slice(&l, 2, x[0].device()))
                        .transpose()?;
                    ops::attention_tiled_packed_with(x[0], spec, keylen.as_ref(), kernels)
                },
                metric,
                1e-5,
            )?;
        }
    }
    // The linear layer with its bias added in cuBLASLt's product (the default on a
    // GPU), against the CPU's product; the input, weight and bias all take gradients. Products
    // are measured normwise (on an H100 the f32 epilogue's worst value was 2.0e-5 off
    // elementwise, candle's own product's input gradient 5.4e-5; TF32's, 1.8e-2).
    for (rows, inn, width) in [(64usize, 384usize, 1536usize), (7, 33, 10)] {
        op_check_within(
            &mut out,
            device,
            &format!("linear_epilogue {rows}x{inn} -> {width}"),
            &[&[rows, inn], &[width, inn], &[width]],
            |x| ops::linear_epilogue(x[0], x[1], x[2]),
            Metric::Normwise,
            1e-5,
        )?;
    }
    // The two products of a frozen bf16 weight (`ops/bf16_choice.rs`; a GPU keeps the faster
    // per shape) against the same on the CPU: the widened one is an f32 product (normwise
    // 1e-5); autocast's rounds its operands and result to bf16 on both sides, so a last-bit
    // difference in a sum can move a result by one bf16 step (2^-8 relative): 1e-2.
    // The weight is frozen (no gradient): made inside, the same values on both devices.
    for (p, allowed) in [(Bf16Product::Widened, 1e-5), (Bf16Product::Autocast, 1e-2)] {
        let (rows, inn, width) = (64usize, 384usize, 1536usize);
        op_check_within(
            &mut out,
            device,
            &format!("bf16 product {p:?} {rows}x{inn} -> {width}"),
            &[&[rows, inn], &[width]],
            |x| {
                let w = Rng::new(7).normal_vec(width * inn, 0.0, 0.05);
                let w = fpt_nn::transfer::upload(w, &[width, inn], x[0].device())?.to_dtype(DType::BF16)?;
                bf16_choice::product(p, x[0], &w, Some(x[1]))
            },
            Metric::Normwise,
            allowed,
        )?;
    }
    // A residual branch as one node (what a GPU runs for the frozen blocks' halves: the
    // composed ops forward, their backward passes chained by hand), BERT's post-norm
    // attention half with dropout and GPT-2's pre-norm feed-forward half: the output and the
    // gradients of x and the norm's scale and shift.
    let (t, c, heads) = (17usize, 64usize, 4usize);
    let attention = fpt_nn::BranchMid::Attention(AttentionSpec {
        heads,
        scale: 0.25,
        mask: Mask::None,
        dropout: Some((0.1, 13)),
    });
    for (what, norm_at, mid, widths) in [
        ("post-norm attention", fpt_nn::NormAt::Output, attention, (3 * c, c)),
        (
            "pre-norm gelu_new",
            fpt_nn::NormAt::Input,
            fpt_nn::BranchMid::GeluNew,
            (4 * c, 4 * c),
        ),
    ] {
        let weights = [
            randn(&[widths.0, c], 60, &cpu)?,
            randn(&[widths.0], 61, &cpu)?,
            randn(&[c, widths.1], 62, &cpu)?,
            randn(&[c], 63, &cpu)?,
        ];
        op_check(
            &mut out,
            device,
            &format!("residual branch node, {what}"),
            &[&[2, t, c], &[c], &[c]],
            |x| {
                let on = |w: &Tensor| -> candle_core::Result<fpt_nn::Param> {
                    Ok(fpt_nn::Param::Frozen(
                        (fpt_nn::transfer::to_device(w, x[0].device())? * 0.1)?,
                    ))
                };
                let norm = fpt_nn::LayerNorm {
                    weight: fpt_nn::Param::Trainable(Var::from_tensor(x[1])?),
                    bias: fpt_nn::Param::Trainable(Var::from_tensor(x[2])?),
                    eps: 1e-5,
                };
                let input = fpt_nn::Linear::new(on(&weights[0])?, Some(on(&weights[1])?));
                let output = fpt_nn::Linear::new(on(&weights[2])?, Some(on(&weights[3])?));
                let branch = fpt_nn::ResidualBranch {
                    norm: &norm,
                    norm_at,
                    input: &input,
                    mid,
                    output: &output,
                };
                branch.forward_node(x[0], Some((0.1, 14)))
            },
        )?;
    }
    // Adam: in place, the CPU's roundings.
    let n = 10_000;
    let coefs = ops::AdamCoefs {
        beta1: 0.9,
        beta2: 0.999,
        step_size: 1e-3,
        inv_sqrt_bc2: 1.5,
        eps: 1e-8,
    };
    let run = |d: &Device| -> Result<Tensor> {
        let p = Var::from_tensor(&fpt_nn::transfer::to_device(&randn(&[n], 30, &cpu)?, d)?)?;
        let mut m = fpt_nn::transfer::to_device(&randn(&[n], 31, &cpu)?, d)?;
        let mut v = fpt_nn::transfer::to_device(&randn(&[n], 32, &cpu)?.sqr()?, d)?;
        let g = fpt_nn::transfer::to_device(&randn(&[n], 33, &cpu)?, d)?;
        ops::adam_update(&p, &mut m, &mut v, &g, &coefs)?;
        Ok(Tensor::cat(&[p.as_tensor(), &m, &v], 0)?)
    };
    check(&mut out, "adam_update".into(), &run(device)?, &run(&cpu)?, 1e-6)?;
    // Adam through a replayed step's gate: the same updates, the non-finite step skipped
    // on the device, the ring and step count as the CPU's.
    let run = |d: &Device| -> Result<Tensor> {
        let gate = ops::AdamGate::new(
            0,
            3,
            4,
            |t| ops::AdamCoefs {
                step_size: 1e-3 * t as f64,
                ..coefs
            },
            d,
        )?;
        let p = Var::from_tensor(&fpt_nn::transfer::to_device(&randn(&[n], 30, &cpu)?, d)?)?;
        let (m, v) = (
            Tensor::zeros(n, candle_core::DType::F32, d)?,
            Tensor::zeros(n, candle_core::DType::F32, d)?,
        );
        for (k, loss) in [1.5f64, f64::NAN, 0.5, 0.25].into_iter().enumerate() {
            let g = fpt_nn::transfer::to_device(&randn(&[n], 40 + k as u64, &cpu)?, d)?;
            let one = |x: f64| fpt_nn::transfer::upload(vec![x], 1, d);
            gate.record(&one(loss)?, &one(1.0 + k as f64)?)?;
            gate.update(&p, &m, &v, &g)?;
        }
        let s = gate.read()?;
        let mut book = vec![s.t as f32, s.recorded as f32];
        // The NaN loss as -1 (both sides must hold NaN there; the comparison takes numbers).
        let loss = |r: &ops::GateRecord| if r.loss.is_nan() { -1.0 } else { r.loss as f32 };
        book.extend(
            s.records
                .iter()
                .flat_map(|r| [loss(r), r.grad_norm as f32, f32::from(u8::from(r.applied))]),
        );
        let book = fpt_nn::transfer::upload(book.clone(), book.len(), &cpu)?;
        Ok(Tensor::cat(
            &[
                &fpt_nn::transfer::to_device(p.as_tensor(), &cpu)?,
                &fpt_nn::transfer::to_device(&m, &cpu)?,
                &fpt_nn::transfer::to_device(&v, &cpu)?,
                &book,
            ],
            0,
        )?)
    };
    check(
        &mut out,
        "adam_gate (4 steps, one not finite)".into(),
        &run(device)?,
        &run(&cpu)?,
        1e-6,
    )?;
    Ok(out)
}

/// One backbone family's gradients on the device.
#[derive(Debug, Serialize)]
pub struct GradientCheck {
    /// The backbone (a small random one of its family).
    pub backbone: String,
    /// How many tensors train.
    pub trained: usize,
    /// Those without a finite, nonzero gradient.
    pub missing: Vec<String>,
    /// Whether none is missing.
    pub passed: bool,
}

/// One micro-batch through a small random model of each backbone family on `device`:
/// every trainable tensor must get a finite gradient that is not all zeros.
pub fn gradients_flow(device: &Device) -> Result<Vec<GradientCheck>> {
    use fpt_spec::{BackboneSpec, Init, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainSpec};
    let small = |layers, hidden, heads| ShapeOverrides {
        layers: Some(layers),
        hidden: Some(hidden),
        heads: Some(heads),
        ..Default::default()
    };
    let mut out = Vec::new();
    for (source, shape) in [
        ("gpt2", small(2, 64, 4)),
        ("minilm", small(2, 64, 4)),
        ("t5-base", small(2, 64, 4)),
        (
            "smollm2",
            ShapeOverrides {
                layers: Some(2),
                ..Default::default()
            },
        ),
        (
            "lstm",
            ShapeOverrides {
                layers: Some(2),
                hidden: Some(64),
                ..Default::default()
            },
        ),
    ] {
        let mut task = TaskSpec::new(TaskName::BitXor);
        task.eval_examples = 32;
        let spec = RunSpec {
            train: TrainSpec {
                steps: 1,
                batch_size: 8,
                micro_batch_size: 8,
                seed: 0,
                ..TrainSpec::default()
            },
            ..RunSpec::new(
                task,
                BackboneSpec {
                    shape,
                    ..BackboneSpec::new(source, Init::Random)
                },
            )
        };
        let mut tr = crate::Trainer::new(&spec, device)?;
        let (_, grads) = tr.micro_batch_grads()?;
        let mut missing = Vec::new();
        let trained = tr.model().trainable();
        for (name, var) in &trained {
            let ok = match grads.get(var.as_tensor()) {
                Some(g) => {
                    let v = fpt_nn::transfer::download_vec::<f32>(&g.to_dtype(candle_core::DType::F32)?)?;
                    v.iter().all(|x| x.is_finite()) && v.iter().any(|&x| x != 0.0)
                }
                None => false,
            };
            if !ok {
                missing.push(name.clone());
            }
        }
        out.push(GradientCheck {
            backbone: source.to_string(),
            trained: trained.len(),
            passed: missing.is_empty(),
            missing,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agreement checks' own code runs, each op and gradient named once (on the CPU both
    /// sides are the CPU's ops: what this guards is the checks, for the device run `fpt
    /// gpu-check` makes).
    #[test]
    fn every_agreement_check_runs_on_the_cpu() {
        let checks = agreement(&Device::Cpu).unwrap();
        let names: Vec<&str> = checks.iter().map(|c| c.name.as_str()).collect();
        for want in [
            "swiglu",
            "swiglu gradient of input 1",
            "ln_lstm 3x24x64 with dropout gradient of input 1",
            "ln_lstm 3x24x64 with dropout gradient of input 6",
            "rotary gradient of input 0",
            "cross_entropy 7x1000 gradient",
            "attention_tiled t=64 c=32 None lengths Some([64, 40]) with dropout gradient of input 0",
            "attention_mma t=150 c=64 None lengths Some([150, 131]) with dropout gradient of input 0",
            "linear_epilogue 7x33 -> 10 gradient of input 2",
            "bf16 product Widened 64x384 -> 1536 gradient of input 0",
            "bf16 product Autocast 64x384 -> 1536 gradient of input 1",
            "residual branch node, post-norm attention gradient of input 2",
            "residual branch node, pre-norm gelu_new gradient of input 0",
        ] {
            assert!(names.contains(&want), "{want} not in {names:?}");
        }
        let failed: Vec<&KernelCheck> = checks.iter().filter(|c| !c.passed).collect();
        assert!(failed.is_empty(), "{failed:?}");
    }

    /// The replay check runs on the CPU (eagerly through the replay's buffers, batches of
    /// several shapes each in its own) and agrees exactly there.
    #[test]
    fn the_replay_check_runs_on_the_cpu() {
        let checks = replay_agreement(&Device::Cpu).unwrap();
        assert_eq!(checks.len(), 16, "{checks:?}");
        let shapes = checks
            .iter()
            .filter(|c| c.name.ends_with("gpt2, batches of many shapes"));
        assert_eq!(shapes.count(), 4, "{checks:?}");
        for c in &checks {
            assert!(c.passed && c.max_diff == 0.0, "{c:?}");
        }
    }

    /// The normwise metric the products are checked with passes a product added in another
    /// order (f64, then rounded) and fails one whose inputs were rounded to TF32's 10-bit
    /// mantissa, as cudarc's cuBLASLt f32 product computed before fpt asked for f32.
    #[test]
    fn products_are_measured_normwise_and_tf32_fails() {
        let (m, k, n) = (64usize, 384usize, 96usize);
        let a = Rng::new(1).normal_vec(m * k, 0.0, 1.0);
        let b = Rng::new(2).normal_vec(k * n, 0.0, 1.0);
        let tf32 = |v: f32| f32::from_bits(v.to_bits() & !((1 << 13) - 1));
        let product = |round: &dyn Fn(f32) -> f32, wide: bool| -> Tensor {
            let mut y = vec![0f32; m * n];
            for i in 0..m {
                for j in 0..n {
                    y[i * n + j] = if wide {
                        (0..k).map(|p| a[i * k + p] as f64 * b[p * n + j] as f64).sum::<f64>() as f32
                    } else {
                        (0..k).fold(0f32, |s, p| s + round(a[i * k + p]) * round(b[p * n + j]))
                    };
                }
            }
            Tensor::from_vec(y, (m, n), &Device::Cpu).unwrap()
        };
        let f32_sum = product(&|v| v, false);
        let other_order = product(&|v| v, true);
        let tf32_sum = product(&tf32, false);
        let ok = max_diff(&other_order, &f32_sum, Metric::Normwise).unwrap();
        let bad = max_diff(&tf32_sum, &f32_sum, Metric::Normwise).unwrap();
        assert!(ok <= 1e-5, "another order of an f32 sum: {ok:e}");
        assert!(bad > 1e-4, "TF32's rounding: {bad:e}");
        assert!(max_diff(&other_order, &f32_sum, Metric::Elementwise).unwrap() >= ok);
    }
}

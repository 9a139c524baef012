//! The FPT forward pass: read-out layout, token inputs through the Embedding, and a
//! finite-difference check of the whole model's gradients.

use candle_core::{Device, Tensor};
use fpt_backbones::gpt2::{Gpt2, Gpt2Config};
use fpt_model::{Fpt, HeadConfig};
use fpt_nn::{ops, Ctx, Rng};
use fpt_spec::{ResidualInit, ShapeOverrides, TrainGroups};
use fpt_tasks::{InputKind, Inputs, TaskDims};

fn tiny_backbone(groups: &TrainGroups, rng: &mut Rng) -> Gpt2 {
    let cfg = Gpt2Config::builtin("gpt2")
        .unwrap()
        .with_overrides(&ShapeOverrides {
            layers: Some(2),
            hidden: Some(16),
            heads: Some(2),
            positions: Some(12),
            ..Default::default()
        })
        .unwrap();
    Gpt2::random(&cfg, ResidualInit::Scaled, groups, &Device::Cpu, rng).unwrap()
}

#[test]
fn token_inputs_go_through_the_embedding_and_train_it() {
    let mut rng = Rng::new(1);
    let groups = TrainGroups::fpt();
    let dims = TaskDims {
        input: InputKind::Tokens { vocab: 15 },
        seq_len: 10,
        readout_tokens: 1,
        labels_per_example: 1,
        classes: 10,
    };
    let m = Fpt::new(
        Box::new(tiny_backbone(&groups, &mut rng)),
        dims,
        groups,
        HeadConfig::default(),
        &Device::Cpu,
        &mut rng,
    )
    .unwrap();
    let ids = Tensor::new(
        &[[1u32, 2, 3, 4, 5, 6, 7, 8, 9, 0], [14, 13, 12, 11, 10, 9, 8, 7, 6, 5]],
        &Device::Cpu,
    )
    .unwrap();
    let logits = m.forward(&Inputs::Tokens(ids.clone()), &mut Ctx::eval()).unwrap();
    assert_eq!(logits.dims(), &[2, 1, 10]);
    let loss = ops::cross_entropy(
        &logits.reshape((2, 10)).unwrap(),
        &Tensor::new(&[3u32, 7], &Device::Cpu).unwrap(),
    )
    .unwrap();
    let grads = loss.backward().unwrap();
    let emb = m.trainable().into_iter().find(|(n, _)| n == "input.weight").unwrap().1;
    let g = grads
        .get(emb.as_tensor())
        .expect("embedding gradient")
        .to_vec2::<f32>()
        .unwrap();
    // Only the rows of ids that occur get a gradient (all of 0..15 occur here but row 0 once).
    assert!(g.iter().all(|r| r.iter().all(|v| v.is_finite())));
    assert!(g[1].iter().any(|&v| v != 0.0));
    // Vectors into a token model are refused.
    let e = m.forward(
        &Inputs::Vectors(Tensor::zeros((1, 10, 3), candle_core::DType::F32, &Device::Cpu).unwrap()),
        &mut Ctx::eval(),
    );
    assert!(e.is_err());
}

/// d loss / d theta by central differences (f32, h = 1e-2) against backprop, for a few
/// LayerNorm and position entries of a tiny frozen GPT-2 inside the FPT.
#[test]
fn whole_model_gradients_match_finite_differences() {
    let mut rng = Rng::new(2);
    let groups = TrainGroups::fpt();
    let dims = TaskDims {
        input: InputKind::Vectors { width: 3 },
        seq_len: 8,
        readout_tokens: 2,
        labels_per_example: 2,
        classes: 2,
    };
    let m = Fpt::new(
        Box::new(tiny_backbone(&groups, &mut rng)),
        dims,
        groups,
        HeadConfig::default(),
        &Device::Cpu,
        &mut rng,
    )
    .unwrap();
    let x = fpt_nn::init::normal(&[4, 8, 3], 0.0, 1.0, &mut rng, &Device::Cpu).unwrap();
    let y = Tensor::new(&[0u32, 1, 1, 0, 1, 1, 0, 0], &Device::Cpu).unwrap();
    let inputs = Inputs::Vectors(x);
    let loss = |m: &Fpt| -> f64 {
        let l = m.forward(&inputs, &mut Ctx::eval()).unwrap().reshape((8, 2)).unwrap();
        ops::cross_entropy(&l, &y).unwrap().to_scalar::<f32>().unwrap() as f64
    };
    let l = m.forward(&inputs, &mut Ctx::eval()).unwrap().reshape((8, 2)).unwrap();
    let grads = ops::cross_entropy(&l, &y).unwrap().backward().unwrap();
    let mut checked = 0;
    for (name, var) in m.trainable() {
        if !(name.contains("ln_1") || name == "wpe.weight" || name == "ln_f.bias" || name == "input.weight") {
            continue;
        }
        let g = grads
            .get(var.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let base = var.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for j in [0, base.len() / 2, base.len() - 1] {
            let h = 1e-2f32;
            let eval = |delta: f32| {
                let mut p = base.clone();
                p[j] += delta;
                var.set(&Tensor::from_vec(p, var.shape(), &Device::Cpu).unwrap())
                    .unwrap();
                loss(&m)
            };
            let num = (eval(h) - eval(-h)) / (2.0 * h as f64);
            var.set(&Tensor::from_vec(base.clone(), var.shape(), &Device::Cpu).unwrap())
                .unwrap();
            let err = (num - g[j] as f64).abs();
            assert!(
                err < 2e-3 + 2e-2 * num.abs(),
                "{name}[{j}]: backprop {} vs numeric {num}",
                g[j]
            );
            checked += 1;
        }
    }
    assert!(checked >= 12, "{checked}");
}

/// Depth 0 (the critics' "w/o LLM"): no block, the input layer into the backbone's
/// embedding stage (GPT-2: + positions, then `ln_f`) and on to the output layer; the
/// features are that stage's last token, composed here by hand, and the model has no block
/// parameter left.
#[test]
fn a_model_without_blocks_reads_out_the_embedding_stage() {
    use fpt_backbones::Backbone;
    let mut rng = Rng::new(5);
    let groups = TrainGroups::fpt();
    let mut backbone = tiny_backbone(&groups, &mut rng);
    backbone.truncate(0).unwrap();
    assert_eq!(backbone.num_layers(), 0);
    let dims = TaskDims {
        input: InputKind::Vectors { width: 3 },
        seq_len: 6,
        readout_tokens: 1,
        labels_per_example: 1,
        classes: 4,
    };
    let m = Fpt::new(
        Box::new(backbone),
        dims,
        groups,
        HeadConfig::default(),
        &Device::Cpu,
        &mut rng,
    )
    .unwrap();
    let names: Vec<String> = m.params().into_iter().map(|(n, _, _)| n).collect();
    assert!(!names.iter().any(|n| n.starts_with("h.")), "{names:?}");
    let x = Tensor::new(Rng::new(9).normal_vec(2 * 6 * 3, 0.0, 1.0), &Device::Cpu)
        .unwrap()
        .reshape((2, 6, 3))
        .unwrap();
    let feats = m.features(&Inputs::Vectors(x.clone()), &mut Ctx::eval()).unwrap();
    assert_eq!(feats.dims(), &[2, 1, 16]);
    let get = |n: &str| {
        m.params()
            .into_iter()
            .find(|(name, _, _)| name == n)
            .unwrap_or_else(|| panic!("{n} in {names:?}"))
            .2
            .get()
    };
    let h = x
        .broadcast_matmul(&get("input.weight").t().unwrap())
        .unwrap()
        .broadcast_add(&get("input.bias"))
        .unwrap()
        .broadcast_add(&get("wpe.weight").narrow(0, 0, 6).unwrap())
        .unwrap();
    let want = ops::layer_norm_composed(&h, &get("ln_f.weight"), &get("ln_f.bias"), 1e-5)
        .unwrap()
        .narrow(1, 5, 1)
        .unwrap();
    let diff = (feats - want)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(diff < 1e-5, "{diff}");
}

/// A linear input layer's init: orthogonal rows scaled by the gain with a zero bias (the
/// default), or nn.Linear's U(-1/sqrt(width), 1/sqrt(width)) for weight and bias.
#[test]
fn the_input_layer_is_orthogonal_or_nn_linears_uniform() {
    let groups = TrainGroups::fpt();
    let width = 4;
    let dims = TaskDims {
        input: InputKind::Vectors { width },
        seq_len: 10,
        readout_tokens: 1,
        labels_per_example: 1,
        classes: 2,
    };
    let input = |init: fpt_spec::InputInit| {
        let mut rng = Rng::new(3);
        let head = HeadConfig {
            input_init: init,
            ..HeadConfig::default()
        };
        let bb = Box::new(tiny_backbone(&groups, &mut rng));
        let m = Fpt::new(bb, dims, groups, head, &Device::Cpu, &mut rng).unwrap();
        let get = |name: &str| {
            let v = m.trainable().into_iter().find(|(n, _)| n == name).unwrap().1;
            v.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap()
        };
        (get("input.weight"), get("input.bias"))
    };
    // Orthogonal: [16, 4] with orthonormal columns times the gain, so W^T W = gain^2 I.
    let (w, b) = input(fpt_spec::InputInit::Orthogonal);
    let gain2 = (fpt_spec::DEFAULT_ORTH_GAIN * fpt_spec::DEFAULT_ORTH_GAIN) as f32;
    for i in 0..width {
        for j in 0..width {
            let dot: f32 = (0..16).map(|r| w[r * width + i] * w[r * width + j]).sum();
            let want = if i == j { gain2 } else { 0.0 };
            assert!((dot - want).abs() < 1e-4, "({i}, {j}): {dot}");
        }
    }
    assert!(b.iter().all(|&x| x == 0.0));
    // Uniform: every value within 1/sqrt(4) = 0.5, spread across it, the bias too.
    let (w, b) = input(fpt_spec::InputInit::Uniform);
    assert!(w.iter().chain(&b).all(|x| x.abs() <= 0.5), "{w:?}");
    assert!(w.iter().any(|&x| x > 0.3) && w.iter().any(|&x| x < -0.3), "{w:?}");
    assert!(b.iter().any(|&x| x != 0.0));
}

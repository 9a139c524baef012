//! The layer-norm LSTM baseline against a plain f64 re-implementation of the reference
//! cell (`models/lstm.py`), its init quirks, its parameter roles, and save/load.

use candle_core::{Device, Tensor};
use fpt_backbones::lstm::{InitialState, LnInit, Lstm, LstmConfig};
use fpt_backbones::Backbone;
use fpt_nn::{Ctx, Rng};
use fpt_spec::{Role, TrainGroups};
use std::collections::HashMap;

fn config(layers: usize, hidden: usize, residual: bool, positions: bool) -> LstmConfig {
    let mut c = LstmConfig::builtin("lstm").unwrap();
    c.num_layers = layers;
    c.hidden_size = hidden;
    c.residual = residual;
    c.positions = positions;
    c.max_positions = 16;
    c.initial_state = InitialState::Zeros;
    c
}

fn vec_of(t: &Tensor) -> Vec<f64> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect()
}

/// The reference LayerNorm: unbiased variance, eps inside the root.
fn ln(x: &[f64], w: &[f64], b: &[f64], eps: f64) -> Vec<f64> {
    let n = x.len() as f64;
    let m = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (n - 1.0);
    x.iter()
        .enumerate()
        .map(|(i, v)| w[i] * (v - m) / (var + eps).sqrt() + b[i])
        .collect()
}

fn affine(w: &[f64], b: &[f64], x: &[f64]) -> Vec<f64> {
    let n_in = x.len();
    (0..b.len())
        .map(|o| b[o] + (0..n_in).map(|i| w[o * n_in + i] * x[i]).sum::<f64>())
        .collect()
}

/// One sequence through the stack, in f64, from the model's own parameters.
fn reference(model: &Lstm, p: &HashMap<String, Vec<f64>>, xs: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let c = model.config();
    let h = c.hidden_size;
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let mut seq: Vec<Vec<f64>> = xs
        .iter()
        .enumerate()
        .map(|(t, x)| match p.get("wpe.weight") {
            Some(wpe) => x.iter().enumerate().map(|(i, v)| v + wpe[t * h + i]).collect(),
            None => x.clone(),
        })
        .collect();
    for l in 0..c.num_layers {
        let g = |n: &str| &p[&format!("layers.{l}.{n}")];
        let (mut hs, mut cs) = (vec![0.0; h], vec![0.0; h]);
        let mut out = Vec::new();
        for x in &seq {
            let i2h = ln(
                &affine(g("i2h.weight"), g("i2h.bias"), x),
                g("ln_i2h.weight"),
                g("ln_i2h.bias"),
                1e-6,
            );
            let h2h = ln(
                &affine(g("h2h.weight"), g("h2h.bias"), &hs),
                g("ln_h2h.weight"),
                g("ln_h2h.bias"),
                1e-6,
            );
            let pre: Vec<f64> = i2h.iter().zip(&h2h).map(|(a, b)| a + b).collect();
            let c_new: Vec<f64> = (0..h)
                .map(|k| sig(pre[h + k]) * cs[k] + sig(pre[k]) * pre[3 * h + k].tanh())
                .collect();
            cs = ln(&c_new, g("ln_cell.weight"), g("ln_cell.bias"), 1e-6);
            hs = (0..h).map(|k| sig(pre[2 * h + k]) * cs[k].tanh()).collect();
            out.push(hs.clone());
        }
        seq = if c.residual {
            seq.iter()
                .zip(&out)
                .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x + y).collect())
                .collect()
        } else {
            out
        };
    }
    seq
}

#[test]
fn matches_a_plain_reimplementation_of_the_reference_cell() {
    fpt_nn::kernels::on_every_path(|_| matches_a_plain_reimplementation_of_the_reference_cell_on_one_path());
}

fn matches_a_plain_reimplementation_of_the_reference_cell_on_one_path() {
    for (residual, positions) in [(false, false), (true, true)] {
        let cfg = config(2, 6, residual, positions);
        let mut model = Lstm::random(&cfg, &TrainGroups::fpt(), &Device::Cpu, &mut Rng::new(1)).unwrap();
        model.set_dropout(false);
        let p: HashMap<String, Vec<f64>> = model
            .params()
            .into_iter()
            .map(|(n, _, t)| {
                // Positions start at zero; give them values so the test sees them added.
                let v = if n == "wpe.weight" {
                    (0..t.elem_count()).map(|i| (i as f64 * 0.37).sin()).collect()
                } else {
                    vec_of(t.tensor())
                };
                (n, v)
            })
            .collect();
        let model = if positions {
            let mut tensors: HashMap<String, Tensor> = HashMap::new();
            for (n, v) in &p {
                let shape = model
                    .params()
                    .iter()
                    .find(|(m, _, _)| m == n)
                    .unwrap()
                    .2
                    .tensor()
                    .dims()
                    .to_vec();
                tensors.insert(
                    n.clone(),
                    Tensor::from_vec(v.iter().map(|&x| x as f32).collect::<Vec<_>>(), shape, &Device::Cpu).unwrap(),
                );
            }
            let tmp = tempfile::tempdir().unwrap();
            candle_core::safetensors::save(&tensors, tmp.path().join("model.safetensors")).unwrap();
            let mut m = Lstm::load(
                &cfg,
                tmp.path().join("model.safetensors").as_path(),
                &TrainGroups::fpt(),
                &Device::Cpu,
            )
            .unwrap();
            m.set_dropout(false);
            m
        } else {
            model
        };
        let (b, t) = (2, 5);
        let x = Tensor::randn(0f32, 1.0, (b, t, 6), &Device::Cpu).unwrap();
        let y = model.forward(&x, &mut Ctx::eval()).unwrap();
        assert_eq!(y.dims(), &[b, t, 6]);
        let xv = vec_of(&x);
        let yv = vec_of(&y);
        for e in 0..b {
            let xs: Vec<Vec<f64>> = (0..t)
                .map(|s| xv[(e * t + s) * 6..(e * t + s + 1) * 6].to_vec())
                .collect();
            let want = reference(&model, &p, &xs);
            for s in 0..t {
                for k in 0..6 {
                    let got = yv[(e * t + s) * 6 + k];
                    assert!(
                        (got - want[s][k]).abs() < 1e-4,
                        "residual={residual} positions={positions} example {e} step {s} unit {k}: {got} vs {}",
                        want[s][k]
                    );
                }
            }
        }
    }
}

#[test]
fn init_quirks_and_roles_follow_the_reference() {
    let cfg = config(1, 64, false, true);
    let m = Lstm::random(&cfg, &TrainGroups::fpt(), &Device::Cpu, &mut Rng::new(2)).unwrap();
    for (name, role, p) in m.params() {
        let v = vec_of(p.tensor());
        let max = v.iter().fold(0f64, |a, x| a.max(x.abs()));
        match role {
            // U(-1/sqrt(n), 1/sqrt(n)) for LayerNorm scales *and* biases, n = 256 or 64.
            Role::LayerNorm => {
                let bound = 1.0 / (v.len() as f64).sqrt();
                assert!(max <= bound && max > 0.5 * bound, "{name}: max {max}, bound {bound}");
                assert!(p.is_trainable(), "{name} trains in the FPT setting");
            }
            Role::Positions => {
                assert_eq!(max, 0.0, "{name} starts at zero");
                assert!(p.is_trainable());
            }
            Role::Recurrent => {
                let bound = 1.0 / 8.0;
                assert!(max <= bound && max > 0.9 * bound, "{name}: max {max}");
                assert!(!p.is_trainable(), "{name} is frozen in the FPT setting");
            }
            other => panic!("{name} has role {other}"),
        }
    }
    let all = Lstm::random(&cfg, &TrainGroups::all(), &Device::Cpu, &mut Rng::new(2)).unwrap();
    assert!(
        all.params().iter().all(|(_, _, p)| p.is_trainable()),
        "`all` trains the cell weights too"
    );
    let mut unit = cfg.clone();
    unit.ln_init = LnInit::Unit;
    let u = Lstm::random(&unit, &TrainGroups::fpt(), &Device::Cpu, &mut Rng::new(2)).unwrap();
    let (_, _, w) = u
        .params()
        .into_iter()
        .find(|(n, _, _)| n == "layers.0.ln_cell.weight")
        .unwrap();
    assert!(vec_of(w.tensor()).iter().all(|&x| x == 1.0));
}

#[test]
fn random_initial_state_comes_from_the_call_stream() {
    let mut cfg = config(1, 8, false, false);
    cfg.initial_state = InitialState::Random;
    let mut m = Lstm::random(&cfg, &TrainGroups::fpt(), &Device::Cpu, &mut Rng::new(3)).unwrap();
    m.set_dropout(false);
    let x = Tensor::randn(0f32, 1.0, (1, 3, 8), &Device::Cpu).unwrap();
    let run = |ctx: &mut Ctx| vec_of(&m.forward(&x, ctx).unwrap());
    assert_eq!(
        run(&mut Ctx::eval()),
        run(&mut Ctx::eval()),
        "evaluation is reproducible"
    );
    assert_ne!(
        run(&mut Ctx::train(1)),
        run(&mut Ctx::train(2)),
        "the state is drawn per call"
    );
}

#[test]
fn saves_and_loads_through_the_generic_loader() {
    let cfg = config(2, 8, true, true);
    let a = Lstm::random(&cfg, &TrainGroups::fpt(), &Device::Cpu, &mut Rng::new(4)).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    fpt_backbones::save_pretrained(&a, tmp.path(), Default::default(), &mut Rng::new(0)).unwrap();
    let spec = fpt_spec::BackboneSpec {
        source: tmp.path().display().to_string(),
        init: fpt_spec::Init::Pretrained,
        shape: Default::default(),
        residual_init: Default::default(),
        depth: None,
        final_norm: true,
        bit_pretrain: None,
        precision: Default::default(),
    };
    let b = fpt_backbones::load(&spec, &TrainGroups::fpt(), &Device::Cpu, &mut Rng::new(0)).unwrap();
    assert_eq!(b.architecture(), "lstm");
    let x = Tensor::randn(0f32, 1.0, (2, 4, 8), &Device::Cpu).unwrap();
    let (ya, yb) = (
        vec_of(&a.forward(&x, &mut Ctx::eval()).unwrap()),
        vec_of(&b.forward(&x, &mut Ctx::eval()).unwrap()),
    );
    assert_eq!(ya, yb);
}

#[test]
fn the_builtin_lstm_is_the_papers_standard_one_and_refuses_heads() {
    let spec = fpt_spec::BackboneSpec {
        source: "lstm".into(),
        init: fpt_spec::Init::Random,
        shape: fpt_spec::ShapeOverrides {
            heads: Some(4),
            ..Default::default()
        },
        residual_init: Default::default(),
        depth: None,
        final_norm: true,
        bit_pretrain: None,
        precision: Default::default(),
    };
    let e = fpt_backbones::param_specs(&spec)
        .expect_err("heads do not apply")
        .to_string();
    assert!(e.contains("no attention heads"), "{e}");
    let (cfg, specs) = fpt_backbones::param_specs(&fpt_spec::BackboneSpec {
        shape: Default::default(),
        ..spec
    })
    .unwrap();
    assert_eq!((cfg.layers(), cfg.hidden_size()), (3, 768));
    // Per layer: two 4H x H maps with biases, LayerNorms over 4H, 4H and H.
    let per_layer = 2 * (4 * 768 * 768 + 4 * 768) + 2 * (2 * 4 * 768) + 2 * 768;
    assert_eq!(specs.iter().map(|s| s.numel()).sum::<usize>(), 3 * per_layer);
}

/// The built-in LSTM with an init that needs a checkpoint is refused with an error that
/// says there is none and how to train it, not a failed Hub lookup of a model `lstm`.
#[test]
fn the_builtin_lstm_with_pretrained_init_says_it_has_no_weights() {
    for init in [fpt_spec::Init::Pretrained, fpt_spec::Init::StatsOnly] {
        let spec = fpt_spec::BackboneSpec {
            init,
            shape: fpt_spec::ShapeOverrides {
                layers: Some(1),
                hidden: Some(8),
                ..Default::default()
            },
            ..fpt_spec::BackboneSpec::new("lstm", fpt_spec::Init::Random)
        };
        let e = match fpt_backbones::load(&spec, &TrainGroups::fpt(), &Device::Cpu, &mut Rng::new(0)) {
            Ok(_) => panic!("{init}: loaded weights that do not exist"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("no pretrained weights") && e.contains("--init random"),
            "{init}: {e}"
        );
        assert!(!e.contains("Hugging Face"), "{init}: {e}");
    }
}

#[test]
fn gradients_reach_the_trained_groups_only() {
    fpt_nn::kernels::on_every_path(|_| gradients_reach_the_trained_groups_only_on_one_path());
}

fn gradients_reach_the_trained_groups_only_on_one_path() {
    let cfg = config(2, 8, true, true);
    let mut m = Lstm::random(&cfg, &TrainGroups::fpt(), &Device::Cpu, &mut Rng::new(5)).unwrap();
    m.set_dropout(false);
    let x = Tensor::randn(0f32, 1.0, (2, 4, 8), &Device::Cpu).unwrap();
    let loss = m
        .forward(&x, &mut Ctx::eval())
        .unwrap()
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap();
    let grads = loss.backward().unwrap();
    for (name, _, p) in m.params() {
        match p.var() {
            Some(v) => {
                let g = grads
                    .get(v.as_tensor())
                    .unwrap_or_else(|| panic!("{name} got no gradient"));
                let norm = vec_of(g).iter().map(|x| x * x).sum::<f64>();
                assert!(norm > 0.0, "{name}: zero gradient");
            }
            None => assert!(grads.get(p.tensor()).is_none(), "{name} is frozen but got a gradient"),
        }
    }
}

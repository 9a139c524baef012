//! Helpers the backbone tests share (not every test binary uses each).
#![allow(dead_code)]

use candle_core::Tensor;

/// The largest absolute difference between two tensors of one shape.
pub fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// `model.forward_last(x, last)` equals the full forward's last `last` positions, in values,
/// against the transformers golden (`g`: `inputs_embeds`, `last_hidden_state`,
/// `loss_weights`) and in every gradient (the input's and each trainable parameter's); a
/// frozen parameter gets none. Returns how many parameter gradients were compared.
pub fn check_forward_last(
    model: &dyn fpt_backbones::Backbone,
    g: &std::collections::HashMap<String, Tensor>,
    last: usize,
) -> usize {
    use fpt_nn::Ctx;
    let x = candle_core::Var::from_tensor(&g["inputs_embeds"]).unwrap();
    let t = x.as_tensor().dim(1).unwrap();
    let part = model.forward_last(x.as_tensor(), &mut Ctx::eval(), last).unwrap();
    let full = model
        .forward(x.as_tensor(), &mut Ctx::eval())
        .unwrap()
        .narrow(1, t - last, last)
        .unwrap();
    assert_eq!(part.dims(), full.dims());
    assert!(max_diff(&part, &full) <= 1e-5, "last {last}: values");
    let golden_last = g["last_hidden_state"].narrow(1, t - last, last).unwrap();
    assert!(max_diff(&part, &golden_last) <= 1e-4, "last {last}: vs transformers");
    let w = g["loss_weights"].narrow(1, t - last, last).unwrap();
    let gp = (part * &w).unwrap().sum_all().unwrap().backward().unwrap();
    let gf = (full * &w).unwrap().sum_all().unwrap().backward().unwrap();
    let d = max_diff(gp.get(&x).unwrap(), gf.get(&x).unwrap());
    assert!(d <= 1e-5, "last {last}: input gradient differs by {d}");
    let mut compared = 0;
    for (name, _, p) in model.params() {
        match p.var() {
            Some(v) => {
                let (a, b) = (gp.get(v.as_tensor()), gf.get(v.as_tensor()));
                assert_eq!(a.is_some(), b.is_some(), "{name}");
                if let (Some(a), Some(b)) = (a, b) {
                    let d = max_diff(a, b);
                    assert!(d <= 1e-5, "last {last}: gradient of {name} differs by {d}");
                    compared += 1;
                }
            }
            None => assert!(gp.get(p.tensor()).is_none(), "{name} is frozen but got a gradient"),
        }
    }
    compared
}

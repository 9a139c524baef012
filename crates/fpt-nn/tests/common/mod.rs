//! Helpers the op tests share: every kernel path, seeded inputs, differences, a seeded loss,
//! and the fused-against-composed-and-finite-differences check.
#![allow(dead_code)]

use candle_core::{backprop::GradStore, DType, Device, Result, Tensor, Var};
use fpt_nn::Rng;

/// Runs `f` on every kernel path this CPU runs (and `FPT_KERNELS` allows), naming the path
/// in a failure.
pub fn every_path(f: fn() -> Result<()>) -> Result<()> {
    fpt_nn::kernels::on_every_path(|path| f().map_err(|e| e.context(format!("on the {path} kernel path"))))
        .into_iter()
        .collect()
}

pub fn randn(shape: &[usize], seed: u64, dtype: DType) -> Result<Tensor> {
    fpt_nn::init::normal(shape, 0.0, 1.0, &mut Rng::new(seed), &Device::Cpu)?.to_dtype(dtype)
}

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    (a - b)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()
}

/// The inputs that `trains` marks as `Var`s (the others `None`), and every input as the
/// tensor an op takes (the `Var`'s where it trains).
pub fn training(tensors: &[Tensor], trains: &[bool]) -> Result<(Vec<Option<Var>>, Vec<Tensor>)> {
    let vars: Vec<Option<Var>> = tensors
        .iter()
        .zip(trains)
        .map(|(x, tr)| tr.then(|| Var::from_tensor(x)).transpose())
        .collect::<Result<_>>()?;
    let ts = vars
        .iter()
        .zip(tensors)
        .map(|(v, x)| v.as_ref().map_or_else(|| x.clone(), |v| v.as_tensor().clone()))
        .collect();
    Ok((vars, ts))
}

/// loss = sum(f(inputs) * r) for a fixed random r.
pub fn loss(out: &Tensor, seed: u64) -> Result<Tensor> {
    let r = randn(out.dims(), seed, out.dtype())?;
    (out * r)?.sum_all()
}

/// Checks values and gradients of `fused` against `composed` (f32), then the gradients of
/// `fused` against central finite differences (f64), for every input.
pub fn check<F, G>(shapes: &[&[usize]], fused: F, composed: G, tol: f64) -> Result<()>
where
    F: Fn(&[Tensor]) -> Result<Tensor>,
    G: Fn(&[Tensor]) -> Result<Tensor>,
{
    // f32: fused vs composed, values and grads.
    let vars: Vec<Var> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| Var::from_tensor(&randn(s, 10 + i as u64, DType::F32)?))
        .collect::<Result<_>>()?;
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let yf = fused(&ts)?;
    let yc = composed(&ts)?;
    let dv = max_abs_diff(&yf, &yc)?;
    assert!(dv < tol, "values differ by {dv}");
    let gf = loss(&yf, 99)?.backward()?;
    let gc = loss(&yc, 99)?.backward()?;
    for (i, v) in vars.iter().enumerate() {
        let a = gf.get(v).unwrap_or_else(|| panic!("fused: no gradient for input {i}"));
        let b = gc
            .get(v)
            .unwrap_or_else(|| panic!("composed: no gradient for input {i}"));
        let d = max_abs_diff(a, b)?;
        assert!(d < tol * 10.0, "gradient of input {i} differs by {d}");
    }
    // f64: fused gradient vs finite differences.
    let xs: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| randn(s, 20 + i as u64, DType::F64))
        .collect::<Result<_>>()?;
    let vars: Vec<Var> = xs.iter().map(Var::from_tensor).collect::<Result<_>>()?;
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let grads: GradStore = loss(&fused(&ts)?, 7)?.backward()?;
    let h = 1e-5;
    for (i, v) in vars.iter().enumerate() {
        let g = grads.get(v).expect("gradient").flatten_all()?.to_vec1::<f64>()?;
        let base = xs[i].flatten_all()?.to_vec1::<f64>()?;
        for j in (0..base.len()).step_by((base.len() / 7).max(1)) {
            let eval = |delta: f64| -> Result<f64> {
                let mut p = base.clone();
                p[j] += delta;
                let mut inputs = xs.clone();
                inputs[i] = Tensor::from_vec(p, xs[i].shape(), &Device::Cpu)?;
                loss(&fused(&inputs)?, 7)?.to_scalar::<f64>()
            };
            let num = (eval(h)? - eval(-h)?) / (2.0 * h);
            let err = (num - g[j]).abs() / (1.0 + num.abs());
            assert!(err < 1e-6, "input {i} elem {j}: analytic {} numeric {num}", g[j]);
        }
    }
    Ok(())
}

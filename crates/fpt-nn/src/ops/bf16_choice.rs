//! Which product a frozen bf16 weight takes off the CPU, chosen per shape from measurement
//! (issue 56 item 7: bf16 never slower than f32).
//!
//! On a GPU a bf16 weight `W` (`precision: bf16`) can be multiplied two ways, both with the
//! weight's bf16 values and f32 sums:
//! - [`Bf16Product::Autocast`]: `x` cast to bf16, cuBLAS's bf16 product, the result cast back
//!   to f32 and the bias added (PyTorch's autocast; tensor cores; four launches);
//! - [`Bf16Product::Widened`]: `W` widened to f32 (exactly) for the one product, `x` kept in
//!   f32, and the f32 product with its bias in the epilogue (two launches; more accurate:
//!   neither `x` nor the result is rounded to bf16).
//!
//! On an H200 (2026-11-26) MiniLM's small products made the bf16 step slower than the f32 one
//! (minilm-mnist 16.0 against 13.6 ms): the casts' launches cost more than the tensor cores
//! saved. So, under `FPT_BF16_PRODUCT=auto`, the first product of each shape
//! (device, rows, in, out) times both (forward and input gradient, 2 warm-up and 5 timed
//! rounds, alternating, each synchronised) and keeps the faster: `Widened` only when its
//! median is at least 3% below `Autocast`'s. Later products of that shape, and the input
//! gradient of every one of them (the branch node's by hand too), take the kept choice, so a
//! forward and its backward never disagree. Each choice is logged with both medians and
//! listed by [`chosen`] (`fpt bench` prints them). `FPT_BF16_PRODUCT=autocast` or `widened`
//! pins one everywhere (a rerun that must repeat a run's numbers pins what it logged).
//!
//! Autocast is the default. On an H200 (2026-11-28, `bench/gpu/2026-11-28T1625Z-h200-*`)
//! the per-shape choice made the minilm-mnist step slower, not faster: 10.1 ms against
//! autocast's 7.2 ms (f32: 7.3 ms). Each product timed alone, synchronised, is launch-bound
//! (60-150 us a side) and favoured the widened one for the small shapes, whose widening cast
//! then cost more inside the step than the timing alone showed.
//! The CPU keeps its own bf16 product (`ops/bf16.rs`), which this module never replaces.

use candle_core::{DType, DeviceLocation, Result, Shape, Tensor};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// A bf16 weight's product off the CPU; see the module's documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bf16Product {
    /// `x` rounded to bf16, the bf16 product, the result rounded to bf16 then widened.
    Autocast,
    /// `W` widened to f32 for an f32 product.
    Widened,
}

/// One product shape on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProductShape {
    /// Where the product runs.
    pub device: DeviceLocation,
    /// Rows of the input (every leading dimension together).
    pub rows: usize,
    /// The weight's inputs (the product's depth).
    pub inputs: usize,
    /// The weight's outputs.
    pub outputs: usize,
}

/// A kept choice and the medians (seconds) that made it; both 0 when pinned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Chosen {
    /// The product kept for the shape.
    pub product: Bf16Product,
    /// The median seconds of autocast's forward and input gradient.
    pub autocast_s: f64,
    /// The median seconds of the widened product's.
    pub widened_s: f64,
}

/// Rounds before timing, and timed rounds, of each variant.
const WARM: usize = 2;
const TIMED: usize = 5;
/// `Widened` must be this much faster than `Autocast` to be kept.
const MARGIN: f64 = 0.97;

fn table() -> &'static Mutex<HashMap<ProductShape, Chosen>> {
    static T: OnceLock<Mutex<HashMap<ProductShape, Chosen>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

/// Every choice kept so far, by shape (sorted: device, rows, inputs, outputs).
pub fn chosen() -> Vec<(ProductShape, Chosen)> {
    let t = table().lock().unwrap_or_else(|e| e.into_inner());
    let mut v: Vec<_> = t.iter().map(|(k, c)| (*k, *c)).collect();
    v.sort_by_key(|(k, _)| (format!("{:?}", k.device), k.rows, k.inputs, k.outputs));
    v
}

/// `FPT_BF16_PRODUCT` read once: `None` for `auto` (measure), else the pinned product.
pub fn requested() -> Result<Option<Bf16Product>> {
    static CHOICE: OnceLock<std::result::Result<Option<Bf16Product>, String>> = OnceLock::new();
    CHOICE
        .get_or_init(|| parse(std::env::var("FPT_BF16_PRODUCT").ok().as_deref()))
        .clone()
        .map_err(candle_core::Error::Msg)
}

/// `FPT_BF16_PRODUCT`'s value: `auto` measures; unset, empty or `autocast` pin autocast's
/// product (the default; see the module's documentation), `widened` the widened one.
pub(crate) fn parse(v: Option<&str>) -> std::result::Result<Option<Bf16Product>, String> {
    match v.map(str::trim) {
        Some("auto") => Ok(None),
        None | Some("") | Some("autocast") => Ok(Some(Bf16Product::Autocast)),
        Some("widened") => Ok(Some(Bf16Product::Widened)),
        Some(other) => Err(format!(
            "FPT_BF16_PRODUCT=`{other}`: the choices are `autocast` (the default: bf16 operands, cuBLAS's bf16 \
             product), `widened` (the weight widened to f32) and `auto` (the faster per shape, measured)"
        )),
    }
}

/// `x W^T (+ b)` with a bf16 `w` by the product `p`, on any device (what a GPU layer runs
/// once its shape's choice is made; `fpt gpu-check` compares each with the CPU's).
pub fn product(p: Bf16Product, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    super::linear::bf16_product(p, x, w, b)
}

/// The shape of `x W^T` for an input of `x_shape` and a weight `[outputs, inputs]`.
fn shape_of(x_shape: &Shape, w: &Tensor, device: DeviceLocation) -> Result<ProductShape> {
    let (outputs, inputs) = w.dims2()?;
    let n = x_shape.elem_count();
    if inputs == 0 || !n.is_multiple_of(inputs) {
        candle_core::bail!("linear: an input of shape {x_shape:?} does not end in the weight's {inputs} inputs")
    }
    Ok(ProductShape {
        device,
        rows: n / inputs,
        inputs,
        outputs,
    })
}

/// The product for `x W^T (+ b)` with a bf16 `w`: the pinned one, the kept one for this
/// shape, or (first use of the shape under `auto`) the faster of the two, measured here on
/// `x`'s device with `x`, `w` and `b` themselves (detached).
pub(crate) fn choose(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Bf16Product> {
    choose_with(requested()?, x, w, b)
}

pub(crate) fn choose_with(
    pinned: Option<Bf16Product>,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
) -> Result<Bf16Product> {
    if let Some(p) = pinned {
        return Ok(p);
    }
    let key = shape_of(x.shape(), w, x.device().location())?;
    if let Some(c) = table().lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(c.product);
    }
    let c = measure(x, w, b)?;
    tracing::info!(
        "bf16 product of {}x{} by {}x{} on {:?}: {:?} (autocast {:.1} us, widened {:.1} us, forward and input gradient)",
        key.rows,
        key.inputs,
        key.outputs,
        key.inputs,
        key.device,
        c.product,
        c.autocast_s * 1e6,
        c.widened_s * 1e6
    );
    // Two threads measuring the same shape at once keep the first one's choice.
    let mut t = table().lock().unwrap_or_else(|e| e.into_inner());
    Ok(t.entry(key).or_insert(c).product)
}

/// The kept choice for the input gradient of a product with an input of `x_shape` (its
/// forward chose it); a shape never seen forward is measured as the forward would.
pub(crate) fn choice_for_grad(dy: &Tensor, w: &Tensor, x_shape: &Shape) -> Result<Bf16Product> {
    choice_for_grad_with(requested()?, dy, w, x_shape)
}

/// [`choice_for_grad`] under the switch's value `requested` (`None`: measure).
fn choice_for_grad_with(
    requested: Option<Bf16Product>,
    dy: &Tensor,
    w: &Tensor,
    x_shape: &Shape,
) -> Result<Bf16Product> {
    if let Some(p) = requested {
        return Ok(p);
    }
    let key = shape_of(x_shape, w, dy.device().location())?;
    if let Some(c) = table().lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(c.product);
    }
    let x = Tensor::zeros(x_shape, DType::F32, dy.device())?;
    choose_with(None, &x, w, None)
}

/// Both variants timed on `x`'s device: forward then input gradient, alternating rounds.
fn measure(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Chosen> {
    let (x, w, b) = (x.detach(), w.detach(), b.map(Tensor::detach));
    let dev = x.device().clone();
    let one = |p: Bf16Product| -> Result<f64> {
        dev.synchronize()?;
        let t0 = Instant::now();
        let y = super::linear::bf16_product(p, &x, &w, b.as_ref())?;
        let dx = super::linear::bf16_input_grad(p, &y, &w, x.shape())?;
        dev.synchronize()?;
        drop(dx);
        Ok(t0.elapsed().as_secs_f64())
    };
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..WARM + TIMED {
        for (i, p) in [Bf16Product::Autocast, Bf16Product::Widened].into_iter().enumerate() {
            let s = one(p)?;
            if round >= WARM {
                times[i].push(s);
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (a, wd) = (median(&mut times[0]), median(&mut times[1]));
    Ok(Chosen {
        product: decide(a, wd),
        autocast_s: a,
        widened_s: wd,
    })
}

/// `Widened` when its median is at least 3% below `Autocast`'s.
fn decide(autocast_s: f64, widened_s: f64) -> Bf16Product {
    if widened_s < autocast_s * MARGIN {
        Bf16Product::Widened
    } else {
        Bf16Product::Autocast
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;
    use candle_core::{Device, Var};

    #[test]
    fn the_switch_is_read_and_refused_by_name() {
        assert_eq!(parse(None), Ok(Some(Bf16Product::Autocast)));
        assert_eq!(parse(Some("")), Ok(Some(Bf16Product::Autocast)));
        assert_eq!(parse(Some(" auto ")), Ok(None));
        assert_eq!(parse(Some("autocast")), Ok(Some(Bf16Product::Autocast)));
        assert_eq!(parse(Some("widened")), Ok(Some(Bf16Product::Widened)));
        let e = parse(Some("fast")).unwrap_err();
        assert!(
            e.contains("FPT_BF16_PRODUCT") && e.contains("`fast`") && e.contains("widened"),
            "{e}"
        );
        assert_eq!(decide(1.0, 0.98), Bf16Product::Autocast);
        assert_eq!(decide(1.0, 0.96), Bf16Product::Widened);
        assert_eq!(decide(1.0, 2.0), Bf16Product::Autocast);
    }

    /// Measured on the CPU (the GPU's two products run on any device): the first product of
    /// a shape times both and keeps a choice with both medians; the next takes it without
    /// measuring again, and the input gradient takes the forward's choice. Both variants
    /// are the bf16-valued weight's product: within bf16's rounding of each other and of the
    /// f32 product of the widened weight, and the widened one equal to that f32 product.
    #[test]
    fn a_shape_is_measured_once_and_both_products_agree() -> Result<()> {
        let dev = Device::Cpu;
        let (m, k, n) = (7, 24, 13);
        let x = Var::from_vec(Rng::new(1).normal_vec(m * k, 0.0, 1.0), (m, k), &dev)?;
        let w = Tensor::from_vec(Rng::new(2).normal_vec(n * k, 0.0, 0.2), (n, k), &dev)?.to_dtype(DType::BF16)?;
        let b = Tensor::from_vec(Rng::new(3).normal_vec(n, 0.0, 1.0), n, &dev)?;
        let p = choose_with(None, x.as_tensor(), &w, Some(&b))?;
        let key = shape_of(x.shape(), &w, dev.location())?;
        let kept = chosen()
            .into_iter()
            .find(|(s, _)| *s == key)
            .expect("the shape's choice is kept")
            .1;
        assert_eq!(kept.product, p);
        assert!(kept.autocast_s > 0.0 && kept.widened_s > 0.0, "{kept:?}");
        assert_eq!(choose_with(None, x.as_tensor(), &w, None)?, p);
        let dy = Tensor::ones((m, n), DType::F32, &dev)?;
        assert_eq!(choice_for_grad_with(None, &dy, &w, x.shape())?, p);
        // The default pins autocast's product, measuring nothing.
        if std::env::var_os("FPT_BF16_PRODUCT").is_none() {
            assert_eq!(choice_for_grad(&dy, &w, x.shape())?, Bf16Product::Autocast);
        }
        assert_eq!(chosen().into_iter().filter(|(s, _)| *s == key).count(), 1);

        let wf = w.to_dtype(DType::F32)?;
        let exact = x.as_tensor().matmul(&wf.t()?)?.broadcast_add(&b)?;
        let rel = |a: &Tensor, e: &Tensor| -> Result<f32> {
            let d = (a - e)?.abs()?.max_all()?.to_scalar::<f32>()?;
            Ok(d / e.abs()?.max_all()?.to_scalar::<f32>()?)
        };
        let wide = super::super::linear::bf16_product(Bf16Product::Widened, x.as_tensor(), &w, Some(&b))?;
        let auto = super::super::linear::bf16_product(Bf16Product::Autocast, x.as_tensor(), &w, Some(&b))?;
        assert!(rel(&wide, &exact)? < 1e-6, "widened vs f32: {}", rel(&wide, &exact)?);
        assert!(rel(&auto, &exact)? < 2e-2, "autocast vs f32: {}", rel(&auto, &exact)?);
        // The widened product's input gradient is the f32 one's, through autograd and by hand.
        let up = Tensor::from_vec(Rng::new(4).normal_vec(m * n, 0.0, 1.0), (m, n), &dev)?;
        let g = (wide * &up)?.sum_all()?.backward()?;
        let want = up.matmul(&wf)?;
        assert!(rel(g.get(x.as_tensor()).unwrap(), &want)? < 1e-6);
        let by_hand = super::super::linear::bf16_input_grad(Bf16Product::Widened, &up, &w, x.shape())?;
        assert!(rel(&by_hand, &want)? < 1e-6);
        Ok(())
    }
}

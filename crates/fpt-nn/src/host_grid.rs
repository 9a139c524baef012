//! The CUDA kernels' bodies (`kernels/fpt_ops.h`) run on the host over a simulated grid
//! (`kernels/host_grid.c`, built by `build.rs` on every machine), checked against fpt's
//! CPU ops: each kernel's indexing, masks, lane reductions and roundings are tested in
//! `cargo test`, without a GPU. The GPU check (`fpt gpu-check`) then compares the device's
//! results with the CPU's on the device itself.

use crate::ops::{self, Mask};
use crate::Rng;
use candle_core::{Device, Result, Tensor};

extern "C" {
    fn fpt_host_dropout_mul_f32(x: *const f32, y: *mut f32, n: u64, seed: u64, block: u64, thr: i32, keep: f32);
    fn fpt_host_dropout_add_f32(
        a: *const f32,
        b: *const f32,
        out: *mut f32,
        n: u64,
        seed: u64,
        block: u64,
        thr: i32,
        keep: f32,
    );
    fn fpt_host_softmax_bwd_f32(y: *const f32, dy: *const f32, ds: *mut f32, rows: u64, tk: i64, scale: f32);
    fn fpt_host_softmax_drop_f32(
        s: *const f32,
        y: *mut f32,
        lse: *mut f32,
        rows: u64,
        tq: i64,
        tk: i64,
        scale: f32,
        kind: i32,
        band: i64,
        seed: u64,
        block: u64,
        thr: i32,
        keep: f32,
    );
    fn fpt_host_attn_ds_f32(
        s: *const f32,
        dp: *const f32,
        lse: *const f32,
        dd: *const f32,
        ds: *mut f32,
        rows: u64,
        tq: i64,
        tk: i64,
        scale: f32,
        kind: i32,
        band: i64,
        seed: u64,
        block: u64,
        thr: i32,
        keep: f32,
    );
    fn fpt_host_moment_f32(x: *mut f32, g: *const f32, n: u64, decay: f32, rest: f32, square: i32);
    fn fpt_host_adam_step_f32(
        p: *mut f32,
        m: *const f32,
        v: *const f32,
        n: u64,
        inv_sqrt_bc2: f32,
        eps: f32,
        step: f32,
    );
    fn fpt_host_norm_fwd_f32(
        x: *const f32,
        w: *const f32,
        b: *const f32,
        y: *mut f32,
        rows: u64,
        d: i64,
        eps: f32,
        centered: i32,
    );
    fn fpt_host_norm_bwd_f32(
        x: *const f32,
        w: *const f32,
        dy: *const f32,
        dx: *mut f32,
        dyxhat: *mut f32,
        rows: u64,
        d: i64,
        eps: f32,
        centered: i32,
    );
    fn fpt_host_gelu_f32(x: *const f32, y: *mut f32, dydx: *mut f32, n: u64, kind: i32);
    fn fpt_host_rotary_f32(
        x: *const f32,
        cs: *const f32,
        sn: *const f32,
        y: *mut f32,
        n: u64,
        t: i64,
        w: i64,
        d: i64,
        transpose: i32,
    );
    fn fpt_host_ce_f32(x: *const f32, t: *const u32, g: *const f32, loss: *mut f32, dx: *mut f32, rows: u64, c: i64);
    fn fpt_host_swiglu_f32(g: *const f32, u: *const f32, dy: *const f32, y: *mut f32, d: *mut f32, n: u64);
    fn fpt_host_block_key(seed: u64, index: u64) -> u32;
    fn fpt_host_splitmix_mix(state: u64) -> u64;
}

fn randn(n: usize, seed: u64) -> Vec<f32> {
    Rng::new(seed).normal_vec(n, 0.0, 1.0)
}

/// A poisoned output buffer: NaN everywhere, so an element the kernel leaves unwritten
/// fails the comparison.
fn poisoned(n: usize) -> Vec<f32> {
    vec![f32::NAN; n]
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            assert!(x.is_finite() && y.is_finite(), "{x} vs {y}");
            (x - y).abs() / (1.0 + y.abs())
        })
        .fold(0.0, f32::max)
}

/// SplitMix64's published outputs (Vigna's reference `splitmix64.c`, seed 1234567: the
/// sequence quoted with it and in every port): the seeding under the mask, checked against
/// outside values. Then the kernel's block key (its xoshiro256++ shortcut, words 0 and 3
/// only) against fpt's `Rng` (the full generator) over seeds and block indices; the
/// xoshiro256++ step itself has no outside known answer here.
#[test]
fn mask_generator_known_answers() {
    let mut state = 1_234_567u64;
    let want = [
        6_457_827_717_110_365_317u64,
        3_203_168_211_198_807_973,
        9_817_491_932_198_370_423,
        4_593_380_528_125_082_431,
        16_408_922_859_458_223_821,
    ];
    for w in want {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        // SAFETY: a pure function of its argument.
        assert_eq!(unsafe { fpt_host_splitmix_mix(state) }, w);
    }
    for seed in [0u64, 1, 42, u64::MAX, 0x0123_4567_89ab_cdef] {
        for index in [0u64, 1, 2, 1000, 1 << 40] {
            let want = (Rng::stream(seed, index).next_u64() >> 32) as u32;
            // SAFETY: a pure function of its arguments.
            assert_eq!(
                unsafe { fpt_host_block_key(seed, index) },
                want,
                "seed {seed} block {index}"
            );
        }
    }
}

/// The dropout kernels give exactly the CPU op's mask (blocks of 16,384 and attention's
/// t x t blocks, sizes that end mid-block).
#[test]
fn dropout_kernels_equal_the_cpu_mask() -> Result<()> {
    for (n, block, p, seed) in [
        (40_000usize, 16_384usize, 0.1f64, 7u64),
        (3 * 4 * 33 * 33, 33 * 33, 0.25, 99),
        (1000, 16_384, 0.5, 0),
    ] {
        let x = randn(n, seed + 1);
        let (thr, keep) = ((p * (1u32 << 24) as f64).round() as i32, (1.0 / (1.0 - p)) as f32);
        let mut y = poisoned(n);
        // SAFETY: x and y hold n elements.
        unsafe { fpt_host_dropout_mul_f32(x.as_ptr(), y.as_mut_ptr(), n as u64, seed, block as u64, thr, keep) };
        let mask = ops::dropout::mask_values(n, block, p, seed);
        let want: Vec<f32> = x.iter().zip(&mask).map(|(a, m)| a * m).collect();
        assert_eq!(y, want, "n {n} block {block}");
        let dropped = mask.iter().filter(|&&m| m == 0.0).count() as f64 / n as f64;
        assert!((dropped - p).abs() < 0.03, "dropped {dropped} for p {p}");
        if block == 16_384 {
            let a = randn(n, seed + 2);
            let mut out = poisoned(n);
            // SAFETY: a, x and out hold n elements.
            unsafe {
                fpt_host_dropout_add_f32(
                    a.as_ptr(),
                    x.as_ptr(),
                    out.as_mut_ptr(),
                    n as u64,
                    seed,
                    block as u64,
                    thr,
                    keep,
                )
            };
            let dev = Device::Cpu;
            let at = Tensor::from_vec(a, n, &dev)?;
            let xt = Tensor::from_vec(x, n, &dev)?;
            let cpu = ops::dropout_add(&at, &xt, p, seed)?.to_vec1::<f32>()?;
            assert_eq!(out, cpu);
        }
    }
    // Attention's mask is the same function with one block per (example, head).
    let (b, h, t) = (2, 3, 17);
    let m = ops::attention_dropout_mask(b, h, t, 0.2, 5, &Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let ones = vec![1f32; m.len()];
    let mut y = poisoned(m.len());
    let (thr, keep) = ((0.2f64 * (1u32 << 24) as f64).round() as i32, (1.0 / 0.8f64) as f32);
    // SAFETY: both buffers hold m.len() elements.
    unsafe {
        fpt_host_dropout_mul_f32(
            ones.as_ptr(),
            y.as_mut_ptr(),
            m.len() as u64,
            5,
            (t * t) as u64,
            thr,
            keep,
        )
    };
    assert_eq!(y, m);
    Ok(())
}

/// The softmax kernels (one warp of 32 lanes per row) against the CPU op and its
/// gradient, for each mask kind and rows shorter and longer than a warp.
#[test]
fn softmax_kernels_equal_the_cpu_op() -> Result<()> {
    let dev = Device::Cpu;
    for (tq, tk, mask) in [
        (5usize, 5usize, Mask::None),
        (7, 7, Mask::Causal),
        (3, 70, Mask::Causal),
        (40, 40, Mask::Band(3)),
        (2, 1, Mask::None),
    ] {
        let batch = 3;
        let n = batch * tq * tk;
        let s = randn(n, 11);
        let scale = 0.37f64;
        let (kind, band) = mask.kernel_kind();
        let band = band as i64;
        let mut y = poisoned(n);
        let rows = (batch * tq) as u64;
        // The one-pass kernel without dropout (thr 0) and without the rows' log-sum-exps.
        // SAFETY: s and y hold rows * tk elements; a null lse is never written.
        unsafe {
            fpt_host_softmax_drop_f32(
                s.as_ptr(),
                y.as_mut_ptr(),
                std::ptr::null_mut(),
                rows,
                tq as i64,
                tk as i64,
                scale as f32,
                kind,
                band,
                0,
                1,
                0,
                1.0,
            )
        };
        let st = candle_core::Var::from_tensor(&Tensor::from_vec(s, (batch, tq, tk), &dev)?)?;
        let cpu = ops::masked_softmax(st.as_tensor(), scale, mask)?;
        let e = max_rel(&y, &cpu.flatten_all()?.to_vec1::<f32>()?);
        assert!(e < 2e-6, "forward {tq}x{tk} {mask:?}: {e}");
        // Backward from a random upstream gradient.
        let g = randn(n, 12);
        let mut ds = poisoned(n);
        // SAFETY: y, g and ds hold rows * tk elements.
        unsafe { fpt_host_softmax_bwd_f32(y.as_ptr(), g.as_ptr(), ds.as_mut_ptr(), rows, tk as i64, scale as f32) };
        let gt = Tensor::from_vec(g, (batch, tq, tk), &dev)?;
        let grads = (cpu * gt)?.sum_all()?.backward()?;
        let want = grads
            .get(st.as_tensor())
            .expect("a gradient")
            .flatten_all()?
            .to_vec1::<f32>()?;
        let e = max_rel(&ds, &want);
        assert!(e < 2e-5, "backward {tq}x{tk} {mask:?}: {e}");
    }
    Ok(())
}

/// Attention's one-pass softmax with dropout and the scores' gradient (one warp per row)
/// against their CPU twins (`ops/attention_rows.rs`): the same dropped elements, the
/// probabilities, the rows' log-sum-exps and the gradients within rounding; every mask
/// kind, rows shorter and longer than a warp, with and without dropout.
#[test]
fn attention_row_kernels_equal_the_cpu_ops() -> Result<()> {
    use ops::attention_rows::{scores_grad, softmax_dropout, RowSoftmax};
    let dev = Device::Cpu;
    for (t, mask) in [
        (5usize, Mask::None),
        (33, Mask::Causal),
        (70, Mask::Band(4)),
        (40, Mask::None),
    ] {
        for dropout in [None, Some((0.2, 77u64))] {
            let m = 3;
            let (n, rows) = (m * t * t, m * t);
            let rs = RowSoftmax {
                scale: 0.41,
                mask,
                dropout,
                block: t * t,
            };
            let ((kind, band), (thr, keep)) = (rs.kind_band(), rs.thr_keep());
            let what = format!("t {t} {mask:?} dropout {dropout:?}");
            let s = randn(n, 21 + t as u64);
            let (mut y, mut lse) = (poisoned(n), poisoned(rows));
            // SAFETY: s and y hold rows * t elements, lse rows.
            unsafe {
                fpt_host_softmax_drop_f32(
                    s.as_ptr(),
                    y.as_mut_ptr(),
                    lse.as_mut_ptr(),
                    rows as u64,
                    t as i64,
                    t as i64,
                    rs.scale as f32,
                    kind,
                    band as i64,
                    rs.seed(),
                    rs.block as u64,
                    thr,
                    keep,
                )
            };
            let st = Tensor::from_vec(s.clone(), (m, t, t), &dev)?;
            let (probs, cpu_lse) = softmax_dropout(&st, rs, true)?;
            let (probs, cpu_lse) = (
                probs.flatten_all()?.to_vec1::<f32>()?,
                cpu_lse.expect("asked for").to_vec1::<f32>()?,
            );
            let zeros = |v: &[f32]| v.iter().map(|&x| x == 0.0).collect::<Vec<_>>();
            assert_eq!(zeros(&y), zeros(&probs), "{what}: the dropped and hidden elements");
            if dropout.is_some() {
                let dropped = zeros(&y).iter().filter(|&&z| z).count();
                assert!(dropped > 0, "{what}: nothing dropped");
            }
            assert!(max_rel(&y, &probs) < 2e-6, "{what}: probabilities");
            assert!(max_rel(&lse, &cpu_lse) < 2e-6, "{what}: log-sum-exps");
            let (dp, dd) = (randn(n, 31), randn(rows, 32));
            let mut ds = poisoned(n);
            // SAFETY: s, dp and ds hold rows * t elements, lse and dd rows.
            unsafe {
                fpt_host_attn_ds_f32(
                    s.as_ptr(),
                    dp.as_ptr(),
                    lse.as_ptr(),
                    dd.as_ptr(),
                    ds.as_mut_ptr(),
                    rows as u64,
                    t as i64,
                    t as i64,
                    rs.scale as f32,
                    kind,
                    band as i64,
                    rs.seed(),
                    rs.block as u64,
                    thr,
                    keep,
                )
            };
            let dpt = Tensor::from_vec(dp, (m, t, t), &dev)?;
            let (lt, ddt) = (
                Tensor::from_vec(cpu_lse, rows, &dev)?,
                Tensor::from_vec(dd, rows, &dev)?,
            );
            let want = scores_grad(&st, &dpt, &lt, &ddt, rs)?.flatten_all()?.to_vec1::<f32>()?;
            assert!(max_rel(&ds, &want) < 2e-5, "{what}: scores' gradient");
        }
    }
    Ok(())
}

/// Adam's kernels round as the CPU's in-place update does: bit for bit.
#[test]
fn adam_kernels_equal_the_cpu_update() -> Result<()> {
    let n = 1000;
    let dev = Device::Cpu;
    let (p0, g) = (randn(n, 21), randn(n, 22));
    let (m0, v0): (Vec<f32>, Vec<f32>) = (randn(n, 23), randn(n, 24).iter().map(|x| x * x).collect());
    let c = ops::AdamCoefs {
        beta1: 0.9,
        beta2: 0.999,
        step_size: 1e-3 / (1.0 - 0.9f64.powi(3)),
        inv_sqrt_bc2: 1.0 / (1.0 - 0.999f64.powi(3)).sqrt(),
        eps: 1e-8,
    };
    let (mut p, mut m, mut v) = (p0.clone(), m0.clone(), v0.clone());
    // SAFETY: every buffer holds n elements.
    unsafe {
        fpt_host_moment_f32(m.as_mut_ptr(), g.as_ptr(), n as u64, 0.9, (1.0 - 0.9f64) as f32, 0);
        fpt_host_moment_f32(v.as_mut_ptr(), g.as_ptr(), n as u64, 0.999, (1.0 - 0.999f64) as f32, 1);
        fpt_host_adam_step_f32(
            p.as_mut_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            n as u64,
            c.inv_sqrt_bc2 as f32,
            c.eps as f32,
            c.step_size as f32,
        );
    }
    let pv = candle_core::Var::from_tensor(&Tensor::from_vec(p0, n, &dev)?)?;
    let (mut mt, mut vt) = (Tensor::from_vec(m0, n, &dev)?, Tensor::from_vec(v0, n, &dev)?);
    ops::adam_update(&pv, &mut mt, &mut vt, &Tensor::from_vec(g, n, &dev)?, &c)?;
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&m), bits(&mt.to_vec1::<f32>()?));
    assert_eq!(bits(&v), bits(&vt.to_vec1::<f32>()?));
    assert_eq!(bits(&p), bits(&pv.as_tensor().to_vec1::<f32>()?));
    Ok(())
}

/// The norm kernels (LayerNorm and RMSNorm, one warp per row) against the CPU ops: the
/// output and the gradients of x, the scale and (LayerNorm) the shift, the scale's summed
/// over rows from the kernel's `dy * xhat` as the GPU path sums it.
#[test]
fn norm_kernels_equal_the_cpu_ops() -> Result<()> {
    let dev = Device::Cpu;
    for (rows, d) in [(6usize, 48usize), (3, 7), (4, 385)] {
        for centered in [true, false] {
            let n = rows * d;
            let (x, g, w, b) = (randn(n, 41), randn(n, 42), randn(d, 43), randn(d, 44));
            let eps = 1e-5f64;
            let mut y = poisoned(n);
            let bp = if centered { b.as_ptr() } else { std::ptr::null() };
            // SAFETY: x and y hold rows * d elements, w and b d; b may be null (RMSNorm).
            unsafe {
                fpt_host_norm_fwd_f32(
                    x.as_ptr(),
                    w.as_ptr(),
                    bp,
                    y.as_mut_ptr(),
                    rows as u64,
                    d as i64,
                    eps as f32,
                    i32::from(centered),
                )
            };
            let (mut dx, mut dyxhat) = (poisoned(n), poisoned(n));
            // SAFETY: as above, dx and dyxhat hold rows * d elements.
            unsafe {
                fpt_host_norm_bwd_f32(
                    x.as_ptr(),
                    w.as_ptr(),
                    g.as_ptr(),
                    dx.as_mut_ptr(),
                    dyxhat.as_mut_ptr(),
                    rows as u64,
                    d as i64,
                    eps as f32,
                    i32::from(centered),
                )
            };
            let xv = candle_core::Var::from_tensor(&Tensor::from_vec(x, (rows, d), &dev)?)?;
            let wv = candle_core::Var::from_tensor(&Tensor::from_vec(w, d, &dev)?)?;
            let bv = candle_core::Var::from_tensor(&Tensor::from_vec(b, d, &dev)?)?;
            let cpu = if centered {
                ops::layer_norm(xv.as_tensor(), wv.as_tensor(), bv.as_tensor(), eps)?
            } else {
                ops::rms_norm(xv.as_tensor(), wv.as_tensor(), eps)?
            };
            let what = if centered { "layer_norm" } else { "rms_norm" };
            let e = max_rel(&y, &cpu.flatten_all()?.to_vec1::<f32>()?);
            assert!(e < 2e-5, "{what} forward {rows}x{d}: {e}");
            let grads = (cpu * Tensor::from_vec(g.clone(), (rows, d), &dev)?)?
                .sum_all()?
                .backward()?;
            let want = |v: &candle_core::Var| {
                grads
                    .get(v.as_tensor())
                    .expect("a gradient")
                    .flatten_all()?
                    .to_vec1::<f32>()
            };
            let e = max_rel(&dx, &want(&xv)?);
            assert!(e < 5e-5, "{what} dx {rows}x{d}: {e}");
            let dw: Vec<f32> = (0..d).map(|j| (0..rows).map(|r| dyxhat[r * d + j]).sum()).collect();
            let e = max_rel(&dw, &want(&wv)?);
            assert!(e < 5e-5, "{what} dgamma {rows}x{d}: {e}");
            if centered {
                let db: Vec<f32> = (0..d).map(|j| (0..rows).map(|r| g[r * d + j]).sum()).collect();
                let e = max_rel(&db, &want(&bv)?);
                assert!(e < 5e-5, "{what} dbeta {rows}x{d}: {e}");
            }
        }
    }
    Ok(())
}

/// The GELU kernels (both forms) against the CPU ops and their gradients.
#[test]
fn gelu_kernels_equal_the_cpu_ops() -> Result<()> {
    let dev = Device::Cpu;
    let n = 2001;
    let x: Vec<f32> = randn(n, 51).iter().map(|v| v * 4.0).collect();
    for kind in [0, 1] {
        let (mut y, mut d) = (poisoned(n), poisoned(n));
        // SAFETY: the buffers hold n elements.
        unsafe { fpt_host_gelu_f32(x.as_ptr(), y.as_mut_ptr(), d.as_mut_ptr(), n as u64, kind) };
        let xv = candle_core::Var::from_tensor(&Tensor::from_vec(x.clone(), n, &dev)?)?;
        let cpu = if kind == 0 {
            ops::gelu_new(xv.as_tensor())?
        } else {
            ops::gelu_erf(xv.as_tensor())?
        };
        let e = max_rel(&y, &cpu.to_vec1::<f32>()?);
        assert!(e < 1e-5, "gelu kind {kind} forward: {e}");
        let grads = cpu.sum_all()?.backward()?;
        let want = grads.get(xv.as_tensor()).expect("a gradient").to_vec1::<f32>()?;
        let e = max_rel(&d, &want);
        assert!(e < 1e-5, "gelu kind {kind} derivative: {e}");
    }
    Ok(())
}

/// The SwiGLU kernels against the CPU op and its gradients (`dg` then `du`, as the backward
/// kernel lays them out in one buffer).
#[test]
fn swiglu_kernels_equal_the_cpu_op() -> Result<()> {
    let dev = Device::Cpu;
    let n = 2001;
    let g: Vec<f32> = randn(n, 61).iter().map(|v| v * 4.0).collect();
    let u = randn(n, 62);
    let dy = randn(n, 63);
    let (mut y, mut d) = (poisoned(n), poisoned(2 * n));
    // SAFETY: g, u, dy and y hold n elements, d 2n.
    unsafe {
        fpt_host_swiglu_f32(
            g.as_ptr(),
            u.as_ptr(),
            dy.as_ptr(),
            y.as_mut_ptr(),
            d.as_mut_ptr(),
            n as u64,
        )
    };
    let gv = candle_core::Var::from_tensor(&Tensor::from_vec(g, n, &dev)?)?;
    let uv = candle_core::Var::from_tensor(&Tensor::from_vec(u, n, &dev)?)?;
    let cpu = ops::swiglu(gv.as_tensor(), uv.as_tensor())?;
    let e = max_rel(&y, &cpu.to_vec1::<f32>()?);
    assert!(e < 1e-5, "swiglu forward: {e}");
    let grads = (cpu * Tensor::from_vec(dy, n, &dev)?)?.sum_all()?.backward()?;
    for (what, v, part) in [("dg", &gv, &d[..n]), ("du", &uv, &d[n..])] {
        let want = grads.get(v.as_tensor()).expect("a gradient").to_vec1::<f32>()?;
        let e = max_rel(part, &want);
        assert!(e < 1e-5, "swiglu {what}: {e}");
    }
    Ok(())
}

/// The rotary kernel both ways (forward, and its transpose as the backward) against the CPU
/// op and its gradient, on a batch of rows at every position.
#[test]
fn rotary_kernel_equals_the_cpu_op() -> Result<()> {
    let dev = Device::Cpu;
    let (b, t, heads, d) = (3, 7, 2, 8);
    let (w, n) = (heads * d, b * t * heads * d);
    let x = randn(n, 71);
    let dy = randn(n, 72);
    let cos: Vec<f32> = randn(t * d, 73).iter().map(|v| v.cos()).collect();
    let sin: Vec<f32> = randn(t * d, 74).iter().map(|v| v.sin()).collect();
    let (mut y, mut dx) = (poisoned(n), poisoned(n));
    let geom = (t as i64, w as i64, d as i64);
    // SAFETY: x, dy, y and dx hold n elements, a multiple of w; the tables t * d.
    unsafe {
        fpt_host_rotary_f32(
            x.as_ptr(),
            cos.as_ptr(),
            sin.as_ptr(),
            y.as_mut_ptr(),
            n as u64,
            geom.0,
            geom.1,
            geom.2,
            0,
        );
        fpt_host_rotary_f32(
            dy.as_ptr(),
            cos.as_ptr(),
            sin.as_ptr(),
            dx.as_mut_ptr(),
            n as u64,
            geom.0,
            geom.1,
            geom.2,
            1,
        );
    }
    let xv = candle_core::Var::from_tensor(&Tensor::from_vec(x, (b, t, w), &dev)?)?;
    let (ct, st) = (
        Tensor::from_vec(cos, (t, d), &dev)?,
        Tensor::from_vec(sin, (t, d), &dev)?,
    );
    let cpu = ops::rotary(xv.as_tensor(), &ct, &st, heads)?;
    let e = max_rel(&y, &cpu.flatten_all()?.to_vec1::<f32>()?);
    assert!(e < 1e-5, "rotary forward: {e}");
    let grads = (cpu * Tensor::from_vec(dy, (b, t, w), &dev)?)?.sum_all()?.backward()?;
    let want = grads
        .get(xv.as_tensor())
        .expect("a gradient")
        .flatten_all()?
        .to_vec1::<f32>()?;
    let e = max_rel(&dx, &want);
    assert!(e < 1e-5, "rotary backward: {e}");
    Ok(())
}

/// The cross-entropy kernels (per-row losses, then their mean; the gradient for each row's
/// share of the mean) against the CPU op and its gradient, over class counts below, at and
/// above a warp's 32 lanes.
#[test]
fn cross_entropy_kernels_equal_the_cpu_op() -> Result<()> {
    let dev = Device::Cpu;
    for (rows, c) in [(5, 2), (9, 32), (7, 100)] {
        let x: Vec<f32> = randn(rows * c, 81 + c as u64).iter().map(|v| v * 3.0).collect();
        let t: Vec<u32> = (0..rows).map(|r| ((r * 7 + 3) % c) as u32).collect();
        let g = vec![1.0 / rows as f32; rows];
        let (mut loss, mut dx) = (poisoned(rows), poisoned(rows * c));
        // SAFETY: x and dx hold rows * c elements, t, g and loss rows.
        unsafe {
            fpt_host_ce_f32(
                x.as_ptr(),
                t.as_ptr(),
                g.as_ptr(),
                loss.as_mut_ptr(),
                dx.as_mut_ptr(),
                rows as u64,
                c as i64,
            )
        };
        let xv = candle_core::Var::from_tensor(&Tensor::from_vec(x, (rows, c), &dev)?)?;
        let cpu = ops::cross_entropy(xv.as_tensor(), &Tensor::from_vec(t, rows, &dev)?)?;
        let mean = loss.iter().sum::<f32>() / rows as f32;
        let e = max_rel(&[mean], &[cpu.to_scalar::<f32>()?]);
        assert!(e < 1e-5, "cross_entropy {rows}x{c} loss: {e}");
        let want = cpu
            .backward()?
            .get(xv.as_tensor())
            .expect("a gradient")
            .flatten_all()?
            .to_vec1::<f32>()?;
        let e = max_rel(&dx, &want);
        assert!(e < 1e-5, "cross_entropy {rows}x{c} gradient: {e}");
    }
    // A target outside the classes gives NaN, which the trainer's non-finite check stops on.
    let (mut loss, mut dx) = (poisoned(1), poisoned(3));
    let (x, t, g) = ([0.5f32, 1.0, -1.0], [3u32], [1.0f32]);
    // SAFETY: x and dx hold 3 elements, t, g and loss 1.
    unsafe {
        fpt_host_ce_f32(
            x.as_ptr(),
            t.as_ptr(),
            g.as_ptr(),
            loss.as_mut_ptr(),
            dx.as_mut_ptr(),
            1,
            3,
        )
    };
    assert!(loss[0].is_nan());
    Ok(())
}

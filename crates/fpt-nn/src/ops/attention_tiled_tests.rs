//! The tiled attention's tests (both families of kernels, over the host grid) against the
//! attention written out with stock candle ops and against the composed ops.

use super::*;
use crate::ops::Mask;
use crate::Rng;
use candle_core::{Device, Var, D};

/// The probabilities written out with stock candle ops, every mask an explicit additive
/// `-inf`: the mask kind's and the padding's (keys at or past an example's length).
fn reference(qkv: &Tensor, spec: AttentionSpec, keylen: Option<&[u32]>) -> Result<Tensor> {
    let (b, t, w) = qkv.dims3()?;
    let (c, h) = (w / 3, spec.heads);
    let split = |x: Tensor| x.reshape((b, t, h, c / h))?.transpose(1, 2)?.contiguous();
    let (q, k, v) = (
        split(qkv.narrow(2, 0, c)?)?,
        split(qkv.narrow(2, c, c)?)?,
        split(qkv.narrow(2, 2 * c, c)?)?,
    );
    let mut add = vec![0f32; b * t * t];
    for e in 0..b {
        for i in 0..t {
            for j in 0..t {
                let (lo, hi) = spec.mask.range(i, t, t);
                let len = keylen.map_or(t, |l| l[e] as usize);
                if j < lo || j >= hi || j >= len {
                    add[(e * t + i) * t + j] = f32::NEG_INFINITY;
                }
            }
        }
    }
    let add = Tensor::from_vec(add, (b, 1, t, t), qkv.device())?;
    let scores = (q.matmul(&k.t()?)? * spec.scale)?.broadcast_add(&add)?;
    // The shift is a constant to the softmax: detached, so no gradient goes through max.
    let e = scores.broadcast_sub(&scores.max_keepdim(D::Minus1)?.detach())?.exp()?;
    let mut p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    if let Some((pr, seed)) = spec.dropout {
        p = (p * super::super::attention_dropout_mask(b, h, t, pr, seed, qkv.device())?)?;
    }
    p.matmul(&v)?.transpose(1, 2)?.reshape((b, t, c))
}

fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
    let (a, b) = (
        a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
    );
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| {
            assert!(x.is_finite() && y.is_finite(), "{x} vs {y}");
            (x - y).abs() / (1.0 + y.abs())
        })
        .fold(0.0, f32::max)
}

/// Forward and gradient of the tiled op on both families of kernels against the
/// written-out reference, over the mask kinds, padding, dropout, heads narrower and wider
/// than a warp and sequences of one to three tiles; and without padding against the
/// composed op the GPU path runs. The tensor-core kernels refuse the head of 128.
#[test]
fn tiled_attention_equals_the_composed_ops_forward_and_backward() -> Result<()> {
    let dev = Device::Cpu;
    // (batch, t, heads, mask, dropout, key lengths)
    type Case = (usize, usize, usize, Mask, Option<(f64, u64)>, Option<Vec<u32>>);
    let cases: [Case; 10] = [
        (2, 37, 3, Mask::None, None, None),
        (2, 37, 3, Mask::Causal, Some((0.1, 7)), None),
        // (Band 5 with 33 valid keys: the last query still sees two; with fewer it would
        // see none, which the reference cannot take: tested apart below.)
        (2, 37, 3, Mask::Band(5), None, Some(vec![37, 33])),
        (3, 33, 2, Mask::Causal, Some((0.2, 9)), Some(vec![10, 33, 1])),
        (2, 70, 2, Mask::None, None, Some(vec![64, 70])),
        (1, 5, 4, Mask::None, Some((0.5, 3)), None),
        (2, 9, 1, Mask::Band(2), Some((0.1, 4)), Some(vec![9, 7])),
        // MiniLM's heads (64-row tiles of 64 keys) over three query tiles, the last part
        // padding; the widest head (16-row tiles); a head of 30 (a part-filled chunk).
        (1, 150, 2, Mask::Causal, Some((0.1, 11)), Some(vec![131])),
        (1, 40, 1, Mask::None, None, None),
        (2, 19, 2, Mask::Band(3), Some((0.3, 5)), None),
    ];
    for (case, (b, t, h, mask, dropout, lens)) in cases.into_iter().enumerate() {
        for kernels in [TiledKernels::Simt, TiledKernels::Mma, TiledKernels::MmaTf32] {
            // One TF32 term a product: operands to 2^-11, so the bounds are wider.
            let (fwd, grad) = match kernels {
                TiledKernels::MmaTf32 => (4e-3, 1e-2),
                _ => (2e-5, 1e-4),
            };
            // Head widths: 40 (tiles of 32 rows), GPT-2's 64, 24, 16, 8, MiniLM's 32, 128, 30.
            let d = [40, 40, 40, 64, 24, 16, 8, 32, 128, 30][case];
            let seed = case as u64;
            let case = format!("{case} ({kernels:?})");
            let c = h * d;
            let spec = AttentionSpec {
                heads: h,
                scale: 1.0 / (d as f64).sqrt(),
                mask,
                dropout,
            };
            let qkv = Var::from_vec(Rng::new(seed).normal_vec(b * t * 3 * c, 0.0, 1.0), (b, t, 3 * c), &dev)?;
            let up = Tensor::from_vec(Rng::new(100 + seed).normal_vec(b * t * c, 0.0, 1.0), (b, t, c), &dev)?;
            let keylen = lens.as_ref().map(|l| Tensor::new(l.as_slice(), &dev)).transpose()?;
            if kernels != TiledKernels::Simt && d > MMA_MAX_HEAD_DIM {
                let e = attention_tiled_packed_with(qkv.as_tensor(), spec, keylen.as_ref(), kernels).unwrap_err();
                assert!(
                    e.to_string().contains("FPT_ATTENTION=mma") && e.to_string().contains("128 dims"),
                    "{e}"
                );
                continue;
            }
            let ours = attention_tiled_packed_with(qkv.as_tensor(), spec, keylen.as_ref(), kernels)?;
            let want = reference(qkv.as_tensor(), spec, lens.as_deref())?;
            let e = max_rel(&ours, &want);
            assert!(e < fwd, "case {case}: forward {e}");
            let g_ours = (ours * &up)?
                .sum_all()?
                .backward()?
                .get(qkv.as_tensor())
                .unwrap()
                .clone();
            let g_want = (want * &up)?
                .sum_all()?
                .backward()?
                .get(qkv.as_tensor())
                .unwrap()
                .clone();
            let e = max_rel(&g_ours, &g_want);
            assert!(e < grad, "case {case}: gradient {e}");
            if lens.is_none() {
                let third = |i: usize| qkv.as_tensor().narrow(2, i * c, c);
                let composed = super::super::attention_composed(&third(0)?, &third(1)?, &third(2)?, spec)?;
                let e = max_rel(
                    &attention_tiled_packed_with(qkv.as_tensor(), spec, None, kernels)?,
                    &composed,
                );
                assert!(e < fwd, "case {case}: against attention_composed {e}");
            }
        }
    }
    Ok(())
}

/// Separate Q, K, V get their gradients through the concatenation; an example with no
/// valid key gives zeros and zero gradients; bad inputs are named.
#[test]
fn tiled_attention_splits_pads_and_refuses() -> Result<()> {
    let dev = Device::Cpu;
    let (b, t, h, d) = (2, 6, 2, 8);
    let c = h * d;
    let spec = AttentionSpec {
        heads: h,
        scale: 0.3,
        mask: Mask::Causal,
        dropout: None,
    };
    let var = |s: u64| Var::from_vec(Rng::new(s).normal_vec(b * t * c, 0.0, 1.0), (b, t, c), &dev);
    let (q, k, v) = (var(1)?, var(2)?, var(3)?);
    let out = attention_tiled(q.as_tensor(), k.as_tensor(), v.as_tensor(), spec, None)?;
    let composed = super::super::attention_composed(q.as_tensor(), k.as_tensor(), v.as_tensor(), spec)?;
    assert!(max_rel(&out, &composed) < 2e-5);
    let grads = out.sum_all()?.backward()?;
    let want = composed.sum_all()?.backward()?;
    for x in [&q, &k, &v] {
        assert!(max_rel(grads.get(x.as_tensor()).unwrap(), want.get(x.as_tensor()).unwrap()) < 1e-4);
    }
    // Example 1 has no valid key: its output is 0, and nothing flows back from it.
    let qkv = Var::from_vec(Rng::new(4).normal_vec(b * t * 3 * c, 0.0, 1.0), (b, t, 3 * c), &dev)?;
    let lens = Tensor::new(&[6u32, 0], &dev)?;
    let out = attention_tiled_packed(qkv.as_tensor(), spec, Some(&lens))?;
    let second = out.narrow(0, 1, 1)?.abs()?.sum_all()?.to_scalar::<f32>()?;
    assert_eq!(second, 0.0);
    let g = out.sum_all()?.backward()?;
    let g = g.get(qkv.as_tensor()).unwrap().narrow(0, 1, 1)?;
    assert_eq!(g.abs()?.sum_all()?.to_scalar::<f32>()?, 0.0);
    // Refusals, each naming what is wrong.
    let bad = |r: Result<Tensor>, what: &str| {
        let e = r.unwrap_err().to_string();
        assert!(e.contains("attention_tiled") && e.contains(what), "{e}");
    };
    bad(
        attention_tiled_packed(&Tensor::zeros((1, 4, 10), DType::F32, &dev)?, spec, None),
        "three",
    );
    bad(
        attention_tiled_packed(&Tensor::zeros((1, 4, 12), DType::F64, &dev)?, spec, None),
        "f32",
    );
    let lens3 = Tensor::new(&[1u32, 2, 3], &dev)?;
    bad(
        attention_tiled_packed(qkv.as_tensor(), spec, Some(&lens3)),
        "key lengths",
    );
    let wide = AttentionSpec { heads: 1, ..spec };
    bad(
        attention_tiled_packed(&Tensor::zeros((1, 2, 3 * 300), DType::F32, &dev)?, wide, None),
        "128",
    );
    Ok(())
}

/// Every head width up to the widest plans tiles for all three kernels within the
/// 48 KiB a block may use and with its chunks spread over the row's lanes; the models'
/// heads get the large tiles (MiniLM's 32 dims: 64 query rows over key tiles of 64;
/// GPT-2's 64: 64 over 32 forward, 32 over 32 backward); wider heads are refused.
#[test]
fn every_head_width_plans_tiles_that_fit() -> Result<()> {
    use AttnKernel::*;
    for d in 1..=MAX_HEAD_DIM {
        for k in [Forward, BackwardQ, BackwardKv] {
            let (rows, cols, bytes) = plan(k, d)?;
            let tpr = 256 / rows as usize;
            assert!(bytes <= 48 * 1024 && bytes > 0, "{k:?} d {d}: {bytes} bytes");
            assert!(
                d.div_ceil(4) <= 4 * tpr && cols as usize >= tpr,
                "{k:?} d {d}: ({rows}, {cols})"
            );
        }
    }
    let tiles = |d| [Forward, BackwardQ, BackwardKv].map(|k| plan(k, d).map(|(r, c, _)| (r, c)).unwrap());
    assert_eq!(tiles(32), [(64, 64), (64, 32), (64, 32)]);
    assert_eq!(tiles(64), [(64, 32), (32, 32), (32, 32)]);
    assert_eq!(tiles(128), [(32, 16), (16, 16), (16, 16)]);
    let e = plan(BackwardQ, 200).unwrap_err().to_string();
    assert!(e.contains("200 dims") && e.contains("BackwardQ"), "{e}");
    // Each plan a head width takes has its kernels compiled (`src/cuda/attn.rs` names
    // them `fpt_attn_*_f32_{rows}x{cols}`; fpt_kernels.cu makes them per plan).
    let cu = include_str!("../../kernels/fpt_kernels.cu");
    for d in 1..=MAX_HEAD_DIM {
        for k in [Forward, BackwardQ, BackwardKv] {
            let (r, c, _) = plan(k, d)?;
            assert!(
                cu.contains(&format!("\nFPT_ATTN_KERNELS({r}, {c})\n")),
                "no kernels for {r}x{c}"
            );
        }
    }
    Ok(())
}

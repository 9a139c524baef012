//! A linear layer whose backward computes only the gradients that are needed.
//!
//! `y = x W^T + b` with `W: [out, in]` (PyTorch `nn.Linear` layout) and optional `b: [out]`.
//! candle's own matmul backward always computes the gradient of both operands, and stores
//! one even for plain tensors (a frozen weight, or the data fed to the input layer). This
//! op's backward computes the gradient of an argument only when that argument takes part
//! in backprop (a `Var` or derived from one): for a frozen weight no gradient is computed
//! and none is stored. On CPU the forward and backward call `gemm` directly (the bias is
//! written first and accumulated into); on other devices the forward uses the backend's
//! matmul and the backward candle ops.

use super::bf16_choice::Bf16Product;
use super::{cpu_slice, tracks, unsupported, with_cpu_slice};
use crate::kernels::KernelPath;
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaStorage, CustomOp2, DType, Layout, Result, Shape, Tensor, WithDType};

struct LinearOp {
    /// Leading dims of x, i.e. of y without its last dim.
    lead: Vec<usize>,
    /// The weight packed for the forward product, when the caller keeps one (frozen
    /// weights in [`crate::Linear`]).
    packed: Option<std::sync::Arc<super::sgemm::PackedB>>,
    /// A bf16 weight packed for the input gradient's product (`W`), when the caller keeps
    /// one.
    packed_t: Option<std::sync::Arc<super::sgemm::PackedB>>,
    /// On a GPU, with a bias and f32 operands: the bias added in the product (cuBLASLt's
    /// epilogue) instead of a second pass ([`linear_epilogue`], `FPT_LINEAR=epilogue`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    epilogue: bool,
}

/// Whether `p` (packed for a `k x n` product) runs on `path` for a weight of dtype `w`: f32
/// panels on the AVX2 and AVX-512 paths, bf16 panels on the `avx512bf16` path.
fn pack_runs(p: &super::sgemm::PackedB, k: usize, n: usize, w: DType, path: KernelPath) -> bool {
    p.dims() == (k, n)
        && k > 0
        && (p.is_bf16() == (w == DType::BF16))
        && if p.is_bf16() { path.bf16() } else { path.own_gemm() }
}

/// Threads for a product of `m x n x k`: every thread from ~2M multiply-adds up, one
/// below (a few tens of microseconds of work, where handing it to other threads costs more
/// than it saves).
pub(crate) fn product_threads(m: usize, n: usize, k: usize) -> usize {
    if m * n * k >= 1 << 21 {
        crate::num_threads()
    } else {
        1
    }
}

/// `dst[m, n] (+)= lhs @ rhs` for `lhs: [m, k]` and `rhs: [k, n]` given by (row, column)
/// strides; `dst` is row-major.
#[allow(clippy::too_many_arguments)]
fn gemm_into<T: WithDType>(
    dst: &mut [T],
    accumulate: bool,
    m: usize,
    n: usize,
    k: usize,
    lhs: &[T],
    lhs_rs: usize,
    lhs_cs: usize,
    rhs: &[T],
    rhs_rs: usize,
    rhs_cs: usize,
) {
    debug_assert!(dst.len() >= m * n && lhs.len() >= m * k && rhs.len() >= k * n);
    if T::DTYPE == candle_core::DType::F32 {
        // SAFETY: T is f32 (checked by its dtype); the views cover the slices as above.
        unsafe {
            sgemm_as_f32(
                m,
                n,
                k,
                (lhs, lhs_rs, lhs_cs),
                (rhs, rhs_rs, rhs_cs),
                dst.as_mut_ptr(),
                accumulate,
                None,
            )
        };
        return;
    }
    let par = match product_threads(m, n, k) {
        1 => gemm::Parallelism::None,
        threads => gemm::Parallelism::Rayon(threads),
    };
    // SAFETY: the slices hold m*n, m*k and k*n elements at the given strides (checked by
    // the callers' shape checks); gemm reads and writes only inside them.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            T::one(),
            T::one(),
            false,
            false,
            false,
            par,
        )
    }
}

/// `dst[m, n] (+)= lhs @ rhs (+ bias)` (row-major `dst`; operands as (slice, row stride,
/// column stride)) through fpt's f32 product.
///
/// # Safety
/// `T` must be f32; `dst` must be valid for writes of `m * n` elements (the operands' and
/// the output's extents are checked by the product).
#[allow(clippy::too_many_arguments)]
unsafe fn sgemm_as_f32<T: WithDType>(
    m: usize,
    n: usize,
    k: usize,
    lhs: (&[T], usize, usize),
    rhs: (&[T], usize, usize),
    dst: *mut T,
    accumulate: bool,
    bias: Option<&[T]>,
) {
    debug_assert_eq!(T::DTYPE, candle_core::DType::F32);
    let view = |(s, rs, cs): (&[T], usize, usize)| super::sgemm::MatRef::new(s.as_ptr() as *const f32, rs, cs, s.len());
    // SAFETY: T is f32 (caller), so the casts are identities; extents per the caller.
    unsafe {
        super::sgemm::sgemm(
            KernelPath::active(),
            m,
            n,
            k,
            view(lhs),
            view(rhs),
            super::sgemm::MatMut::new(dst as *mut f32, n, m * n),
            accumulate,
            bias.map(|b| std::slice::from_raw_parts(b.as_ptr() as *const f32, b.len())),
            crate::num_threads(),
        )
    }
}

/// A fresh `[m, n]` = `lhs @ rhs (+ bias)`: f32 through fpt's product on the active kernel
/// path (written once, with no zero-fill first on the AVX2 and AVX-512 paths; filled with the bias
/// rows first and accumulated into on the others); f64 filled and accumulated into.
#[allow(clippy::too_many_arguments)]
fn gemm_alloc<T: WithDType>(
    m: usize,
    n: usize,
    k: usize,
    lhs: &[T],
    lhs_rs: usize,
    lhs_cs: usize,
    rhs: &[T],
    rhs_rs: usize,
    rhs_cs: usize,
    bias: Option<&[T]>,
) -> Vec<T> {
    if T::DTYPE == candle_core::DType::F32 {
        let mut y: Vec<T> = Vec::with_capacity(m * n);
        // SAFETY: T is f32; sgemm writes every element of the m x n output (accumulate is
        // off: the kernel's stores, or the bias / zero rows and then the product) through
        // the raw pointer before the length is set; the views cover the slices.
        unsafe {
            sgemm_as_f32(
                m,
                n,
                k,
                (lhs, lhs_rs, lhs_cs),
                (rhs, rhs_rs, rhs_cs),
                y.as_mut_ptr(),
                false,
                bias,
            );
            y.set_len(m * n);
        }
        return y;
    }
    let mut y = match bias {
        Some(b) => {
            let mut y = Vec::with_capacity(m * n);
            for _ in 0..m {
                y.extend_from_slice(b);
            }
            y
        }
        None => vec![T::zero(); m * n],
    };
    gemm_into(
        &mut y,
        bias.is_some(),
        m,
        n,
        k,
        lhs,
        lhs_rs,
        lhs_cs,
        rhs,
        rhs_rs,
        rhs_cs,
    );
    y
}

fn cpu_forward<T: WithDType>(x: &[T], w: &[T], b: Option<&[T]>, n: usize) -> Vec<T> {
    let k = w.len() / n;
    let m = x.len() / k;
    // rhs = W^T: element (kk, j) = w[j * k + kk] -> row stride 1, column stride k.
    gemm_alloc(m, n, k, x, k, 1, w, 1, k, b)
}

impl LinearOp {
    fn out_shape(&self, n: usize) -> Shape {
        let mut d = self.lead.clone();
        d.push(n);
        Shape::from(d)
    }

    fn check(&self, lx: &Layout, lw: &Layout) -> Result<(usize, usize)> {
        let (n, k) = lw.shape().dims2()?;
        if lx.dims().last() != Some(&k) {
            candle_core::bail!("linear: input {:?} does not match weight {:?}", lx.shape(), lw.shape())
        }
        Ok((n, k))
    }

    fn cpu(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        b: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, k) = self.check(l1, l2)?;
        let path = KernelPath::active();
        let out = match (s1.dtype(), s2.dtype()) {
            // bf16 by bf16 (the GPU's autocast product, run here in the tests): candle's.
            (DType::BF16, DType::BF16) => return self.generic(s1, l1, s2, l2, b),
            (DType::F32, w) if self.packed.as_ref().is_some_and(|p| pack_runs(p, k, n, w, path)) => {
                let p = self.packed.as_ref().expect("checked");
                let bias = b.map(|(s, l)| cpu_slice::<f32>(s, l, "linear")).transpose()?;
                CpuStorage::F32(super::sgemm::product(cpu_slice::<f32>(s1, l1, "linear")?, p, bias))
            }
            (DType::F32, DType::BF16) => {
                let bias = b.map(|(s, l)| cpu_slice::<f32>(s, l, "linear")).transpose()?;
                CpuStorage::F32(super::bf16::widened_product(
                    path,
                    cpu_slice::<f32>(s1, l1, "linear")?,
                    cpu_slice::<half::bf16>(s2, l2, "linear")?,
                    (n, k),
                    false,
                    bias,
                )?)
            }
            (DType::F32, DType::F32) => {
                let bias = b.map(|(s, l)| cpu_slice::<f32>(s, l, "linear")).transpose()?;
                CpuStorage::F32(cpu_forward(
                    cpu_slice::<f32>(s1, l1, "linear")?,
                    cpu_slice::<f32>(s2, l2, "linear")?,
                    bias,
                    n,
                ))
            }
            (DType::F64, DType::F64) => {
                let bias = b.map(|(s, l)| cpu_slice::<f64>(s, l, "linear")).transpose()?;
                CpuStorage::F64(cpu_forward(
                    cpu_slice::<f64>(s1, l1, "linear")?,
                    cpu_slice::<f64>(s2, l2, "linear")?,
                    bias,
                    n,
                ))
            }
            (DType::F32 | DType::F64, DType::F32 | DType::F64 | DType::BF16) => {
                candle_core::bail!(
                    "linear: an input of {:?} with a weight of {:?} (f32 and f64 weights take inputs of their dtype, bf16 weights f32 inputs)",
                    s1.dtype(),
                    s2.dtype()
                )
            }
            (dt, _) => return Err(unsupported("linear", dt)),
        };
        Ok((out, self.out_shape(n)))
    }

    /// Any backend: the backend's matmul (and broadcast add for the bias).
    fn generic<S: BackendStorage>(
        &self,
        s1: &S,
        l1: &Layout,
        s2: &S,
        l2: &Layout,
        b: Option<(&S, &Layout)>,
    ) -> Result<(S, Shape)> {
        let (n, k) = self.check(l1, l2)?;
        let m = l1.shape().elem_count() / k;
        let lx = Layout::new(Shape::from((m, k)), vec![k, 1], l1.start_offset());
        let lwt = l2.transpose(0, 1)?;
        let y = s1.matmul(s2, (1, m, n, k), &lx, &lwt)?;
        let y = match b {
            Some((sb, lb)) => {
                let ly = Layout::contiguous((m, n));
                y.binary_impl::<candle_core::op::Add>(sb, &ly, &lb.broadcast_as((m, n))?)?
            }
            None => y,
        };
        Ok((y, self.out_shape(n)))
    }

    /// dx = dy @ W, on CPU with gemm, elsewhere with a candle matmul. With a bf16 `W`, `dy`
    /// is rounded to bf16 too (bf16 operands, f32 sums; `ops/bf16.rs`).
    fn grad_input(&self, x_shape: &Shape, w: &Tensor, dy: &Tensor) -> Result<Tensor> {
        let (n, k) = w.dims2()?;
        if !dy.device().is_cpu() || dy.dtype() == DType::BF16 {
            return dy.reshape(((), n))?.matmul(w)?.reshape(x_shape);
        }
        if w.dtype() == DType::BF16 {
            let path = KernelPath::active();
            let dx = with_cpu_slice::<f32, _>(dy, "linear", |g| match &self.packed_t {
                Some(p) if pack_runs(p, n, k, DType::BF16, path) => Ok(super::sgemm::product(g, p, None)),
                _ => with_cpu_slice::<half::bf16, _>(w, "linear", |ws| {
                    super::bf16::widened_product(path, g, ws, (n, k), true, None)
                }),
            })?;
            return Tensor::from_vec(dx, x_shape, dy.device());
        }
        fn run<T: WithDType>(w: &Tensor, dy: &Tensor, n: usize, k: usize) -> Result<Vec<T>> {
            with_cpu_slice::<T, _>(w, "linear", |ws| {
                with_cpu_slice::<T, _>(dy, "linear", |g| {
                    let m = g.len() / n;
                    // rhs = W: [n, k] row-major -> row stride k, column stride 1.
                    Ok(gemm_alloc(m, k, n, g, n, 1, ws, k, 1, None))
                })
            })
        }
        match dy.dtype() {
            DType::F32 => Tensor::from_vec(run::<f32>(w, dy, n, k)?, x_shape, dy.device()),
            DType::F64 => Tensor::from_vec(run::<f64>(w, dy, n, k)?, x_shape, dy.device()),
            dt => Err(unsupported("linear", dt)),
        }
    }

    /// dW = dy^T @ x (`[n, k]`), on CPU with gemm, elsewhere with a candle matmul.
    fn grad_weight(&self, x: &Tensor, w: &Tensor, dy: &Tensor) -> Result<Tensor> {
        let (n, k) = w.dims2()?;
        if w.dtype() == DType::BF16 {
            candle_core::bail!("linear: a bf16 weight is frozen by construction and has no gradient (train it in f32)")
        }
        if !dy.device().is_cpu() {
            return dy.reshape(((), n))?.t()?.matmul(&x.reshape(((), k))?);
        }
        fn run<T: WithDType>(x: &Tensor, dy: &Tensor, n: usize, k: usize) -> Result<Vec<T>> {
            with_cpu_slice::<T, _>(x, "linear", |xs| {
                with_cpu_slice::<T, _>(dy, "linear", |g| {
                    let m = g.len() / n;
                    // lhs = dy^T: element (j, i) = g[i * n + j] -> row stride 1, column stride n.
                    Ok(gemm_alloc(n, k, m, g, 1, n, xs, k, 1, None))
                })
            })
        }
        match dy.dtype() {
            DType::F32 => Tensor::from_vec(run::<f32>(x, dy, n, k)?, (n, k), w.device()),
            DType::F64 => Tensor::from_vec(run::<f64>(x, dy, n, k)?, (n, k), w.device()),
            dt => Err(unsupported("linear", dt)),
        }
    }

    /// The gradients of whichever of (x, W, b) take part in backprop.
    fn grads(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: Option<&Tensor>,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dx = if tracks(x) {
            Some(self.grad_input(x.shape(), w, dy)?)
        } else {
            None
        };
        let dw = if tracks(w) {
            Some(self.grad_weight(x, w, dy)?)
        } else {
            None
        };
        let db = match b {
            Some(b) if tracks(b) => {
                let n = b.elem_count();
                Some(dy.reshape(((), n))?.sum(0)?)
            }
            _ => None,
        };
        Ok((dx, dw, db))
    }
}

impl CustomOp2 for LinearOp {
    fn name(&self) -> &'static str {
        "fpt-linear"
    }
    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        self.cpu(s1, l1, s2, l2, None)
    }
    fn cuda_fwd(&self, s1: &CudaStorage, l1: &Layout, s2: &CudaStorage, l2: &Layout) -> Result<(CudaStorage, Shape)> {
        self.generic(s1, l1, s2, l2, None)
    }
    fn bwd(&self, x: &Tensor, w: &Tensor, _res: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, _) = self.grads(x, w, None, dy)?;
        Ok((dx, dw))
    }
}

impl super::ThreeOperands for LinearOp {
    fn name(&self) -> &'static str {
        "fpt-linear-bias"
    }
    fn forward_cpu(&self, [(s1, l1), (s2, l2), (s3, l3)]: [(&CpuStorage, &Layout); 3]) -> Result<(CpuStorage, Shape)> {
        self.cpu(s1, l1, s2, l2, Some((s3, l3)))
    }
    fn forward_cuda(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [(&CudaStorage, &Layout); 3],
    ) -> Result<(CudaStorage, Shape)> {
        #[cfg(feature = "cuda")]
        if self.epilogue && [s1.dtype(), s2.dtype(), s3.dtype()] == [DType::F32; 3] {
            let (n, k) = self.check(l1, l2)?;
            let m = l1.shape().elem_count() / k;
            let y = crate::cuda::linear_bias_lt((s1, l1), (s2, l2), (s3, l3), (m, n, k))?;
            return Ok((y, self.out_shape(n)));
        }
        self.generic(s1, l1, s2, l2, Some((s3, l3)))
    }
    fn gradients(&self, [x, w, b]: [&Tensor; 3], _res: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 3]> {
        let (dx, dw, db) = self.grads(x, w, Some(b), dy)?;
        Ok([dx, dw, db])
    }
}

/// `x W^T (+ b)` for `x: [.., in]`, `W: [out, in]`, `b: [out]`. Backward computes the
/// gradient of an argument only if it takes part in backprop: with a frozen (plain) `W` and
/// `b`, only `x` gets one; with data `x`, only `W` and `b` do.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    linear_prepacked(x, w, b, None, None)
}

/// [`linear`] whose forward product reads `packed` (the weight packed beforehand) instead of
/// packing `w` again, and whose input gradient reads `packed_t` (a bf16 `W` packed) when
/// given; everything else as [`linear`].
///
/// A bf16 `w` (a frozen weight under `precision: bf16`) takes an f32 `x`: on the CPU the op
/// multiplies bf16 operands with f32 sums (`ops/bf16.rs`), the result in f32; on a GPU `x`
/// is cast to bf16 and the product is cuBLAS's bf16 one (f32 sums, the result rounded to
/// bf16, as PyTorch's autocast does), cast back to f32 before the bias is added, or, where
/// that was measured slower for the shape, the f32 product of `W` widened
/// (`ops/bf16_choice.rs`); its backward is the same product with `W` (no weight gradient: a
/// bf16 weight is frozen).
pub(crate) fn linear_prepacked(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    packed: Option<std::sync::Arc<super::sgemm::PackedB>>,
    packed_t: Option<std::sync::Arc<super::sgemm::PackedB>>,
) -> Result<Tensor> {
    if w.dtype() == DType::BF16 && !x.device().is_cpu() {
        return bf16_product(super::bf16_choice::choose(x, w, b)?, x, w, b);
    }
    apply_linear(x, w, b, packed, packed_t)
}

/// A bf16 `w`'s product off the CPU the way `p` says (`ops/bf16_choice.rs`): autocast's, or
/// the f32 product of `w` widened (exactly), `x` kept in f32. Any device (the CPU in tests).
pub(crate) fn bf16_product(p: Bf16Product, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    match p {
        Bf16Product::Autocast => linear_autocast_bf16(x, w, b),
        Bf16Product::Widened => {
            bf16_operands(x, w)?;
            apply_linear(x, &w.to_dtype(DType::F32)?, b, None, None)
        }
    }
}

/// [`bf16_product`]'s input gradient from the output's (f32), for an input of `x_shape`.
pub(crate) fn bf16_input_grad(p: Bf16Product, dy: &Tensor, w: &Tensor, x_shape: &Shape) -> Result<Tensor> {
    match p {
        Bf16Product::Autocast => autocast_input_grad(dy, w, x_shape),
        Bf16Product::Widened => frozen_input_grad(dy, &w.to_dtype(DType::F32)?, None, x_shape),
    }
}

/// An f32 input and a bf16 weight, or the error naming both dtypes.
fn bf16_operands(x: &Tensor, w: &Tensor) -> Result<()> {
    if x.dtype() != DType::F32 || w.dtype() != DType::BF16 {
        candle_core::bail!(
            "linear: the bf16 product takes an f32 input and a bf16 weight, not {:?} and {:?}",
            x.dtype(),
            w.dtype()
        )
    }
    Ok(())
}

/// The GPU's product for a bf16 `w`: `x` (f32) rounded to bf16, the backend's bf16 product
/// (cuBLAS: f32 sums, the result rounded to bf16, as PyTorch's autocast does), widened back
/// to f32 before the bias is added. Its backward is the same bf16 product with `W`; `x`'s
/// gradient comes back in f32 through the casts. Any device runs it (the CPU in the tests).
pub(crate) fn linear_autocast_bf16(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    bf16_operands(x, w)?;
    let y = apply_linear(&x.to_dtype(DType::BF16)?, w, None, None, None)?.to_dtype(DType::F32)?;
    match b {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

fn apply_linear(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    packed: Option<std::sync::Arc<super::sgemm::PackedB>>,
    packed_t: Option<std::sync::Arc<super::sgemm::PackedB>>,
) -> Result<Tensor> {
    let x = x.contiguous()?;
    let w = w.contiguous()?;
    let lead = x.dims()[..x.rank().saturating_sub(1)].to_vec();
    let op = LinearOp {
        lead,
        packed,
        packed_t,
        epilogue: epilogue_requested()?,
    };
    match b {
        Some(b) => x.apply_op3(&w, &b.contiguous()?, super::Three(op)),
        None => x.apply_op2(&w, op),
    }
}

/// The input's gradient `dy W` of a frozen linear layer applied by [`linear_prepacked`] to an
/// input of shape `x_shape`, computed as that op's backward computes it (the same products:
/// `packed_t` is the bf16 weight packed for it, when the layer keeps one; a bf16 weight on
/// a GPU goes back through the casts around its bf16 product).
pub(crate) fn frozen_input_grad(
    dy: &Tensor,
    w: &Tensor,
    packed_t: Option<std::sync::Arc<super::sgemm::PackedB>>,
    x_shape: &Shape,
) -> Result<Tensor> {
    if w.dtype() == DType::BF16 && !dy.device().is_cpu() && dy.dtype() == DType::F32 {
        let p = super::bf16_choice::choice_for_grad(dy, w, x_shape)?;
        return bf16_input_grad(p, dy, w, x_shape);
    }
    let op = LinearOp {
        lead: Vec::new(),
        packed: None,
        packed_t,
        epilogue: false,
    };
    op.grad_input(x_shape, &w.contiguous()?, dy)
}

/// [`linear_autocast_bf16`]'s input gradient from the output's (f32), as candle's backprop
/// through its casts computes it: `dy` rounded to bf16, the bf16 product with `W`, widened
/// back to f32. Any device.
fn autocast_input_grad(dy: &Tensor, w: &Tensor, x_shape: &Shape) -> Result<Tensor> {
    frozen_input_grad(&dy.to_dtype(DType::BF16)?, w, None, x_shape)?.to_dtype(DType::F32)
}

/// Whether a linear layer with a bias adds it in cuBLASLt's product on a GPU (f32): yes
/// unless `FPT_LINEAR=product` asks for cuBLAS's product then a second pass for the bias;
/// unset, empty, `auto` or `epilogue` keep the epilogue; anything else is refused, naming the
/// variable. The default since an H100 timed it (2026-11-27, bench/README.md: 5% off an lra
/// and a MiniLM ListOps step, computed in f32, not TF32). The CPU has its own fused bias.
pub fn epilogue_requested() -> Result<bool> {
    static CHOICE: std::sync::OnceLock<std::result::Result<bool, String>> = std::sync::OnceLock::new();
    CHOICE
        .get_or_init(|| parse_linear_choice(std::env::var("FPT_LINEAR").ok().as_deref()))
        .clone()
        .map_err(candle_core::Error::Msg)
}

/// `FPT_LINEAR`'s value read: whether the epilogue is on.
fn parse_linear_choice(v: Option<&str>) -> std::result::Result<bool, String> {
    match v.map(str::trim) {
        None | Some("") | Some("auto") | Some("epilogue") => Ok(true),
        Some("product") => Ok(false),
        Some(other) => Err(format!(
            "FPT_LINEAR=`{other}`: the choices are `epilogue` (the bias added in cuBLASLt's product on a GPU; \
             the default, also `auto`) and `product` (cuBLAS's product, then the bias in a second pass)"
        )),
    }
}

/// [`linear`] with the bias added in the product on a GPU (cuBLASLt's bias epilogue, f32),
/// whatever `FPT_LINEAR` says; on the CPU, [`linear`]. Its backward is [`linear`]'s.
pub fn linear_epilogue(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let op = LinearOp {
        lead: x.dims()[..x.rank().saturating_sub(1)].to_vec(),
        packed: None,
        packed_t: None,
        epilogue: true,
    };
    x.contiguous()?
        .apply_op3(&w.contiguous()?, &b.contiguous()?, super::Three(op))
}

/// `x W^T (+ b)` with stock candle ops: every operand gets a gradient (used for trainable
/// weights, and as the reference in tests).
pub fn linear_composed(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let y = x.broadcast_matmul(&w.t()?)?;
    match b {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_linear_switch_is_read_and_a_bad_value_named() {
        for on in [None, Some(""), Some(" auto"), Some("epilogue")] {
            assert_eq!(super::parse_linear_choice(on), Ok(true), "{on:?}");
        }
        assert_eq!(super::parse_linear_choice(Some("product ")), Ok(false));
        let e = super::parse_linear_choice(Some("fused")).unwrap_err();
        assert!(
            e.contains("FPT_LINEAR") && e.contains("fused") && e.contains("product"),
            "{e}"
        );
    }
    use candle_core::{Device, Var};

    /// The GPU's bf16 product's input gradient as the branch node computes it by hand
    /// equals candle's backprop through `linear_autocast_bf16`'s casts, to the last bit
    /// (both run here on the CPU, as any device runs them).
    #[test]
    fn autocast_input_grad_equals_backprop_through_the_casts() -> Result<()> {
        let dev = Device::Cpu;
        let (m, k, n) = (6, 40, 24);
        let x = Var::from_vec(values(m * k, 1), (2, 3, k), &dev)?;
        let w = Tensor::from_vec(values(n * k, 2), (n, k), &dev)?.to_dtype(DType::BF16)?;
        let b = Tensor::from_vec(values(n, 3), n, &dev)?;
        let dy = Tensor::from_vec(values(m * n, 4), (2, 3, n), &dev)?;
        let y = linear_autocast_bf16(x.as_tensor(), &w, Some(&b))?;
        let grads = (&y * &dy)?.sum_all()?.backward()?;
        let want = grads
            .get(x.as_tensor())
            .expect("x's gradient")
            .flatten_all()?
            .to_vec1::<f32>()?;
        let got = autocast_input_grad(&dy, &w, x.shape())?
            .flatten_all()?
            .to_vec1::<f32>()?;
        assert_eq!(got, want);
        Ok(())
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761).rotate_left(13);
                (h % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// The GPU's bf16 product (run here on the CPU): the forward is the bf16-rounded product of
    /// bf16-rounded operands plus the bias, and `x` gets an f32 gradient through the casts
    /// (the first GPU run of this path failed on a dtype check, 2026-11-26).
    #[test]
    fn autocast_bf16_product_and_its_input_gradient() -> Result<()> {
        let (m, n, k) = (5, 7, 24);
        let dev = Device::Cpu;
        let x = Var::from_vec(values(m * k, 1), (m, k), &dev)?;
        let w = Tensor::from_vec(values(n * k, 2), (n, k), &dev)?.to_dtype(DType::BF16)?;
        let b = Tensor::from_vec(values(n, 3), n, &dev)?;
        let g = Tensor::from_vec(values(m * n, 4), (m, n), &dev)?;
        let y = linear_autocast_bf16(x.as_tensor(), &w, Some(&b))?;
        assert_eq!(y.dtype(), DType::F32);
        let dx = (&y * &g)?.sum_all()?.backward()?.get(x.as_tensor()).cloned();
        let dx = dx.expect("x gets a gradient");
        assert_eq!(dx.dtype(), DType::F32);

        let r = |v: f32| half::bf16::from_f32(v).to_f32() as f64;
        let xs: Vec<f64> = x
            .as_tensor()
            .flatten_all()?
            .to_vec1::<f32>()?
            .into_iter()
            .map(r)
            .collect();
        let ws: Vec<f64> = w
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?
            .into_iter()
            .map(f64::from)
            .collect();
        let bs = b.to_vec1::<f32>()?;
        let gs: Vec<f64> = g.flatten_all()?.to_vec1::<f32>()?.into_iter().map(r).collect();
        let ys = y.flatten_all()?.to_vec1::<f32>()?;
        for i in 0..m {
            for j in 0..n {
                let p: f64 = (0..k).map(|t| xs[i * k + t] * ws[j * k + t]).sum();
                let want = r(p as f32) + bs[j] as f64;
                let got = ys[i * n + j] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 + 4e-3 * p.abs(),
                    "y[{i},{j}] {got} vs {want}"
                );
            }
        }
        let dxs = dx.flatten_all()?.to_vec1::<f32>()?;
        for i in 0..m {
            for t in 0..k {
                let want: f64 = (0..n).map(|j| gs[i * n + j] * ws[j * k + t]).sum();
                let got = dxs[i * k + t] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 + 8e-3 * want.abs().max(0.1),
                    "dx[{i},{t}] {got} vs {want}"
                );
            }
        }
        Ok(())
    }
}

// fpt's CUDA kernels: the bodies of fpt_ops.h driven over the GPU's grid. Compiled to PTX
// by crates/fpt-nn/build.rs (feature `cuda`, `nvcc -ptx -arch=sm_$CUDA_COMPUTE_CAP`) and
// loaded by src/cuda.rs; host_grid.c drives the same bodies over a simulated grid in
// `cargo test`. Every kernel takes contiguous f32 buffers.

#include "fpt_ops.h"

#define FPT_WARP 32

// Sum and maximum over the 32 lanes of a warp (every lane gets the result).
__device__ __forceinline__ float fpt_warp_sum(float v) {
    for (int o = FPT_WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float fpt_warp_max(float v) {
    for (int o = FPT_WARP / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// A grid-stride loop over n elements.
#define FPT_FOR_EACH(i, n)                                                                  \
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (uint64_t)(n); \
         i += (uint64_t)gridDim.x * blockDim.x)

// y = x * mask (mask: blocks of `block` elements, see fpt_dropout_mult).
// `seed_at`, when not null, holds the seed instead (a replayed step's slot, src/replay.rs).
extern "C" __global__ void fpt_dropout_mul_f32(const float *x, float *y, uint64_t n, uint64_t seed, uint64_t block,
                                               int32_t thr, float keep, const uint64_t *seed_at) {
    if (seed_at) seed = *seed_at;
    FPT_FOR_EACH(i, n) { y[i] = x[i] * fpt_dropout_mult(seed, block, i, thr, keep); }
}

// out = a + b * mask: the residual branch x + dropout(y).
extern "C" __global__ void fpt_dropout_add_f32(const float *a, const float *b, float *out, uint64_t n, uint64_t seed,
                                               uint64_t block, int32_t thr, float keep, const uint64_t *seed_at) {
    if (seed_at) seed = *seed_at;
    // Rounded as the CPU rounds (product, then sum): nvcc would otherwise fuse them into an FMA.
    FPT_FOR_EACH(i, n) { out[i] = __fadd_rn(a[i], __fmul_rn(b[i], fpt_dropout_mult(seed, block, i, thr, keep))); }
}

// ds = scale * y * (dy - sum(dy * y)), one warp per row.
extern "C" __global__ void fpt_softmax_bwd_f32(const float *y, const float *dy, float *ds, uint64_t rows, int64_t tk,
                                               float scale) {
    uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / FPT_WARP;
    uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) / FPT_WARP;
    int lane = threadIdx.x % FPT_WARP;
    for (uint64_t r = warp; r < rows; r += warps) {
        float dot = fpt_warp_sum(fpt_softmax_lane_dot(y + r * tk, dy + r * tk, tk, lane, FPT_WARP));
        fpt_softmax_lane_grad(y + r * tk, dy + r * tk, ds + r * tk, tk, scale, dot, lane, FPT_WARP);
    }
}

// The masked, scaled softmax over rows of tk keys (rows = batch * heads * tq), with
// attention's dropout in the same pass: y = softmax(scale * s) times the mask of blocks of
// `block` elements (thr 0: none, the plain softmax), and, when `lse` is not null, each
// row's log-sum-exp of scale * s (what fpt_attn_ds_f32 recomputes the probabilities from).
// One warp per row, the lanes' partial maxima and sums combined by shuffles; `seed_at` as
// fpt_dropout_mul_f32's.
extern "C" __global__ void fpt_softmax_drop_f32(const float *s, float *y, float *lse, uint64_t rows, int64_t tq,
                                                int64_t tk, float scale, int32_t kind, int64_t band, uint64_t seed,
                                                uint64_t block, int32_t thr, float keep, const uint64_t *seed_at) {
    if (seed_at) seed = *seed_at;
    uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / FPT_WARP;
    uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) / FPT_WARP;
    int lane = threadIdx.x % FPT_WARP;
    for (uint64_t r = warp; r < rows; r += warps) {
        const float *sr = s + r * tk;
        float *yr = y + r * tk;
        int64_t lo, hi;
        fpt_mask_range(kind, band, (int64_t)r, tq, tk, &lo, &hi);
        float m = fpt_warp_max(fpt_softmax_lane_max(sr, lo, hi, scale, lane, FPT_WARP));
        float sum = fpt_warp_sum(fpt_softmax_lane_exp(sr, yr, lo, hi, scale, m, lane, FPT_WARP));
        if (lse && lane == 0) lse[r] = m + logf(sum);
        uint64_t first = r * (uint64_t)tk;
        uint32_t key = thr > 0 ? fpt_block_key(seed, first / block) : 0u;
        __syncwarp();
        fpt_softmax_lane_finish_drop(yr, tk, lo, hi, 1.0f / sum, key, first % block, thr, keep, lane, FPT_WARP);
    }
}

// The scores' gradient of attention's softmax and dropout (fpt_attn_ds_lane), one warp per
// row; lse and dd hold one value per row.
extern "C" __global__ void fpt_attn_ds_f32(const float *s, const float *dp, const float *lse, const float *dd,
                                           float *ds, uint64_t rows, int64_t tq, int64_t tk, float scale, int32_t kind,
                                           int64_t band, uint64_t seed, uint64_t block, int32_t thr, float keep,
                                           const uint64_t *seed_at) {
    if (seed_at) seed = *seed_at;
    uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / FPT_WARP;
    uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) / FPT_WARP;
    int lane = threadIdx.x % FPT_WARP;
    for (uint64_t r = warp; r < rows; r += warps) {
        int64_t lo, hi;
        fpt_mask_range(kind, band, (int64_t)r, tq, tk, &lo, &hi);
        uint64_t first = r * (uint64_t)tk;
        uint32_t key = thr > 0 ? fpt_block_key(seed, first / block) : 0u;
        fpt_attn_ds_lane(s + first, dp + first, ds + first, tk, lo, hi, scale, lse[r], dd[r], key, first % block, thr,
                         keep, lane, FPT_WARP);
    }
}

// Adam's moment update in place: x = x decay + g rest (g^2 when `square`).
extern "C" __global__ void fpt_moment_f32(float *x, const float *g, uint64_t n, float decay, float rest, int32_t square) {
    FPT_FOR_EACH(i, n) { x[i] = fpt_moment_elem(x[i], g[i], decay, rest, square); }
}

// Adam's parameter update in place from the updated moments.
extern "C" __global__ void fpt_adam_step_f32(float *p, const float *m, const float *v, uint64_t n, float inv_sqrt_bc2,
                                             float eps, float step_size) {
    FPT_FOR_EACH(i, n) { p[i] = fpt_adam_step_elem(p[i], m[i], v[i], inv_sqrt_bc2, eps, step_size); }
}

// A replayed step's gate (src/ops/adam_gate.rs): records the step's loss and gradient norm
// and decides on the device whether Adam's update applies. One thread.
extern "C" __global__ void fpt_step_gate_f64(const double *loss, const double *norm, double *state) {
    if (blockIdx.x == 0 && threadIdx.x == 0) fpt_step_gate(*loss, *norm, state);
}

// Adam's moment update when the gate let the step through; nothing otherwise.
extern "C" __global__ void fpt_moment_gated_f32(float *x, const float *g, uint64_t n, float decay, float rest,
                                                int32_t square, const double *state) {
    if (!fpt_gate_open(state)) return;
    FPT_FOR_EACH(i, n) { x[i] = fpt_moment_elem(x[i], g[i], decay, rest, square); }
}

// Adam's parameter update with the coefficients of the gate's step from `table`.
extern "C" __global__ void fpt_adam_step_gated_f32(float *p, const float *m, const float *v, uint64_t n, float eps,
                                                   const double *state, const float *table) {
    float step_size, inv_sqrt_bc2;
    if (!fpt_gate_coefs(state, table, &step_size, &inv_sqrt_bc2)) return;
    FPT_FOR_EACH(i, n) { p[i] = fpt_adam_step_elem(p[i], m[i], v[i], inv_sqrt_bc2, eps, step_size); }
}

// LayerNorm (centered = 1, with b) or RMSNorm (centered = 0, b null) over rows of d: one
// warp per row.
extern "C" __global__ void fpt_norm_fwd_f32(const float *x, const float *w, const float *b, float *y, uint64_t rows,
                                            int64_t d, float eps, int32_t centered) {
    uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / FPT_WARP;
    uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) / FPT_WARP;
    int lane = threadIdx.x % FPT_WARP;
    float inv_d = 1.0f / (float)d;
    for (uint64_t r = warp; r < rows; r += warps) {
        const float *xr = x + r * d;
        float mean = centered ? fpt_warp_sum(fpt_norm_lane_sum(xr, d, lane, FPT_WARP)) * inv_d : 0.0f;
        float var = fpt_warp_sum(fpt_norm_lane_sqdev(xr, d, mean, lane, FPT_WARP)) * inv_d;
        float rstd = 1.0f / sqrtf(var + eps);
        fpt_norm_lane_write(xr, w, b, y + r * d, d, mean, rstd, lane, FPT_WARP);
    }
}

// The norms' backward: dx, and dy * xhat (summed over rows by the caller for the scale's
// gradient). The statistics are recomputed from x.
extern "C" __global__ void fpt_norm_bwd_f32(const float *x, const float *w, const float *dy, float *dx,
                                            float *dyxhat, uint64_t rows, int64_t d, float eps, int32_t centered) {
    uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / FPT_WARP;
    uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) / FPT_WARP;
    int lane = threadIdx.x % FPT_WARP;
    float inv_d = 1.0f / (float)d;
    for (uint64_t r = warp; r < rows; r += warps) {
        const float *xr = x + r * d;
        const float *gr = dy + r * d;
        float mean = centered ? fpt_warp_sum(fpt_norm_lane_sum(xr, d, lane, FPT_WARP)) * inv_d : 0.0f;
        float var = fpt_warp_sum(fpt_norm_lane_sqdev(xr, d, mean, lane, FPT_WARP)) * inv_d;
        float rstd = 1.0f / sqrtf(var + eps);
        float sg, sgx;
        fpt_norm_lane_dots(xr, w, gr, d, mean, rstd, lane, FPT_WARP, &sg, &sgx);
        float mg = centered ? fpt_warp_sum(sg) * inv_d : 0.0f;
        float mgx = fpt_warp_sum(sgx) * inv_d;
        fpt_norm_lane_grad(xr, w, gr, dx + r * d, dyxhat + r * d, d, mean, rstd, mg, mgx, lane, FPT_WARP);
    }
}

// GELU forward (kind: FPT_GELU_NEW or FPT_GELU_ERF).
extern "C" __global__ void fpt_gelu_fwd_f32(const float *x, float *y, uint64_t n, int32_t kind) {
    FPT_FOR_EACH(i, n) {
        float v, dv;
        fpt_gelu(kind, x[i], &v, &dv);
        y[i] = v;
    }
}

// GELU backward: dx = dy * gelu'(x).
extern "C" __global__ void fpt_gelu_bwd_f32(const float *x, const float *dy, float *dx, uint64_t n, int32_t kind) {
    FPT_FOR_EACH(i, n) {
        float v, dv;
        fpt_gelu(kind, x[i], &v, &dv);
        dx[i] = dy[i] * dv;
    }
}

// SwiGLU forward: y = silu(g) * u.
extern "C" __global__ void fpt_swiglu_fwd_f32(const float *g, const float *u, float *y, uint64_t n) {
    FPT_FOR_EACH(i, n) {
        float v, dg, du;
        fpt_swiglu(g[i], u[i], 0.0f, &v, &dg, &du);
        y[i] = v;
    }
}

// SwiGLU backward: both gradients into one buffer of 2n, dg first, then du.
extern "C" __global__ void fpt_swiglu_bwd_f32(const float *g, const float *u, const float *dy, float *d, uint64_t n) {
    FPT_FOR_EACH(i, n) {
        float v;
        fpt_swiglu(g[i], u[i], dy[i], &v, d + i, d + n + i);
    }
}

// Rotary positions (transpose 0) or their transpose, the backward (transpose 1).
extern "C" __global__ void fpt_rotary_f32(const float *x, const float *cs, const float *sn, float *y, uint64_t n,
                                          int64_t t, int64_t w, int64_t d, int32_t transpose) {
    FPT_FOR_EACH(i, n) { y[i] = fpt_rotary_at(x, cs, sn, i, t, w, d, transpose); }
}

// Cross-entropy per row of c logits against its target: loss[r] = logsumexp(x_r) - x_r[t_r],
// one warp per row.
extern "C" __global__ void fpt_ce_fwd_f32(const float *x, const uint32_t *t, float *loss, uint64_t rows, int64_t c) {
    uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / FPT_WARP;
    uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) / FPT_WARP;
    int lane = threadIdx.x % FPT_WARP;
    for (uint64_t r = warp; r < rows; r += warps) {
        const float *xr = x + r * c;
        float m = fpt_warp_max(fpt_softmax_lane_max(xr, 0, c, 1.0f, lane, FPT_WARP));
        float sum = fpt_warp_sum(fpt_ce_lane_sum(xr, c, m, lane, FPT_WARP));
        if (lane == 0) loss[r] = fpt_ce_row_loss(xr, c, t[r], m, sum);
    }
}

// Its backward: dx_r = g_r (softmax(x_r) - onehot(t_r)), one warp per row.
extern "C" __global__ void fpt_ce_bwd_f32(const float *x, const uint32_t *t, const float *g, float *dx, uint64_t rows,
                                          int64_t c) {
    uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / FPT_WARP;
    uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) / FPT_WARP;
    int lane = threadIdx.x % FPT_WARP;
    for (uint64_t r = warp; r < rows; r += warps) {
        const float *xr = x + r * c;
        float m = fpt_warp_max(fpt_softmax_lane_max(xr, 0, c, 1.0f, lane, FPT_WARP));
        float sum = fpt_warp_sum(fpt_ce_lane_sum(xr, c, m, lane, FPT_WARP));
        fpt_ce_lane_grad(xr, dx + r * c, c, t[r], m, 1.0f / sum, g[r], lane, FPT_WARP);
    }
}

// ---- attention tiled in blocks (fpt_attn.h) --------------------------------------------

#include "fpt_attn.h"

// The maximum / sum over a row's tpr lanes (consecutive lanes of one warp), in each of them:
// the butterfly of host_grid.c's ab_group_*. Every lane of the block calls these together.
__device__ __forceinline__ float fpt_ab_group_max(float v, int tpr) {
    for (int o = tpr / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float fpt_ab_group_sum(float v, int tpr) {
    for (int o = tpr / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The forward: block `blk` owns query rows i0 .. i0 + R of (b, h) and walks the keys they
// see a tile of C at a time with an online softmax. Shared: Q [R][ld], K and V [C][ld],
// the rows' weights [R][C + 1]. Writes O and each row's log-sum-exp.
template <int ROWS, int COLS>
__device__ void fpt_attn_fwd(const float *q, const float *k, const float *v, float *o, float *lse,
                             const uint32_t *keylen, const fpt_attn_geom &g) {
    extern __shared__ float fpt_ab_smem[];
    const fpt_ab_tiles t = fpt_ab_tiles_of(ROWS, COLS, g.d);
    float *sq = fpt_ab_smem, *sk = sq + t.rows * t.ld, *sv = sk + t.cols * t.ld, *sw = sv + t.cols * t.ld;
    const int lane = threadIdx.x, r = lane / (int)t.tpr, sub = lane % (int)t.tpr;
    const int64_t blocks = g.batch * g.heads * ((g.tq + t.rows - 1) / t.rows);
    for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
        int64_t b, h, i0, nv, lo = 0, hi = 0, blo, bhi, x;
        fpt_ab_locate(&g, blk, g.tq, t.rows, &b, &h, &i0, &nv);
        if (r < nv) fpt_attn_keys(&g, keylen, b, i0 + r, &lo, &hi);
        fpt_attn_keys(&g, keylen, b, i0, &blo, &x);
        fpt_attn_keys(&g, keylen, b, i0 + nv - 1, &x, &bhi);
        const uint32_t key = fpt_attn_bkey(&g, b, h);
        float *w = sw + r * (t.cols + 1);
        __syncthreads();  // the block before is done with shared memory
        fpt_ab_load(sq, q + b * g.tq * g.sq + h * g.d, g.sq, i0, nv, t.rows, g.d, t.ld, lane, FPT_AB_THREADS);
        float acc[4 * FPT_AB_MAXU], s[FPT_AB_MAXC], m = -INFINITY, l = 0.0f;
        for (int u = 0; u < 4 * FPT_AB_MAXU; u++) acc[u] = 0.0f;
        for (int64_t j0 = blo; j0 < bhi; j0 += t.cols) {
            int64_t nk = g.tk - j0 < t.cols ? g.tk - j0 : t.cols;
            __syncthreads();  // Q is loaded; the tile before is done with K and V
            fpt_ab_load(sk, k + b * g.tk * g.sk + h * g.d, g.sk, j0, nk, t.cols, g.d, t.ld, lane, FPT_AB_THREADS);
            fpt_ab_load(sv, v + b * g.tk * g.sv + h * g.d, g.sv, j0, nk, t.cols, g.d, t.ld, lane, FPT_AB_THREADS);
            __syncthreads();
            float mx = fpt_ab_fwd_scores(sq + r * t.ld, sk, t, sub, j0, lo, hi, (float)g.scale, s);
            float mn = fmaxf(m, fpt_ab_group_max(mx, (int)t.tpr));
            float alpha = mn == -INFINITY ? 1.0f : expf(m - mn);
            float ps = fpt_ab_fwd_probs(&g, key, s, mn, t, sub, i0 + r, j0, w);
            l = l * alpha + fpt_ab_group_sum(ps, (int)t.tpr);
            __syncwarp();  // the row's weights are written (its lanes share a warp)
            fpt_ab_acc(acc, alpha, w, sv, t, sub);
            m = mn;
        }
        if (r < nv) {
            int64_t i = i0 + r;
            fpt_ab_store(o + (b * g.tq + i) * g.so + h * g.d, acc, l > 0.0f ? 1.0f / l : 0.0f, t, g.d, sub);
            if (sub == 0) lse[(b * g.heads + h) * g.tq + i] = l > 0.0f ? m + logf(l) : -INFINITY;
        }
    }
}

// The backward's first pass, a tile of query rows: D = dO . O (kept in dd for the second)
// and dQ = sum_j dS_ij K_j (dq: the packed gradient, dQ at its offset 0). Shared: Q and dO
// [R][ld], K and V [C][ld], the rows' dS [R][C + 1].
template <int ROWS, int COLS>
__device__ void fpt_attn_bwd_q(const float *q, const float *k, const float *v, const float *o, const float *dout,
                               const float *lse, float *dd, float *dq, const uint32_t *keylen,
                               const fpt_attn_geom &g) {
    extern __shared__ float fpt_ab_smem[];
    const fpt_ab_tiles t = fpt_ab_tiles_of(ROWS, COLS, g.d);
    float *sq = fpt_ab_smem, *sg = sq + t.rows * t.ld, *sk = sg + t.rows * t.ld, *sv = sk + t.cols * t.ld;
    float *sw = sv + t.cols * t.ld;
    const int lane = threadIdx.x, r = lane / (int)t.tpr, sub = lane % (int)t.tpr;
    const int64_t blocks = g.batch * g.heads * ((g.tq + t.rows - 1) / t.rows);
    for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
        int64_t b, h, i0, nv, lo = 0, hi = 0, blo, bhi, x;
        fpt_ab_locate(&g, blk, g.tq, t.rows, &b, &h, &i0, &nv);
        const int64_t i = i0 + r, row = (b * g.heads + h) * g.tq + i;
        if (r < nv) fpt_attn_keys(&g, keylen, b, i, &lo, &hi);
        fpt_attn_keys(&g, keylen, b, i0, &blo, &x);
        fpt_attn_keys(&g, keylen, b, i0 + nv - 1, &x, &bhi);
        const uint32_t key = fpt_attn_bkey(&g, b, h);
        float *w = sw + r * (t.cols + 1);
        float part = 0.0f;
        if (r < nv) {
            const int64_t off = (b * g.tq + i) * g.so + h * g.d;
            part = fpt_ab_rowdot(dout + off, o + off, t, g.d, sub);
        }
        const float d = fpt_ab_group_sum(part, (int)t.tpr);
        const float rl = r < nv ? lse[row] : -INFINITY;
        __syncthreads();  // the block before is done with shared memory
        fpt_ab_load(sq, q + b * g.tq * g.sq + h * g.d, g.sq, i0, nv, t.rows, g.d, t.ld, lane, FPT_AB_THREADS);
        fpt_ab_load(sg, dout + b * g.tq * g.so + h * g.d, g.so, i0, nv, t.rows, g.d, t.ld, lane, FPT_AB_THREADS);
        float acc[4 * FPT_AB_MAXU], s[FPT_AB_MAXC], dp[FPT_AB_MAXC];
        for (int u = 0; u < 4 * FPT_AB_MAXU; u++) acc[u] = 0.0f;
        for (int64_t j0 = blo; j0 < bhi; j0 += t.cols) {
            int64_t nk = g.tk - j0 < t.cols ? g.tk - j0 : t.cols;
            __syncthreads();
            fpt_ab_load(sk, k + b * g.tk * g.sk + h * g.d, g.sk, j0, nk, t.cols, g.d, t.ld, lane, FPT_AB_THREADS);
            fpt_ab_load(sv, v + b * g.tk * g.sv + h * g.d, g.sv, j0, nk, t.cols, g.d, t.ld, lane, FPT_AB_THREADS);
            __syncthreads();
            fpt_ab_dots(sq + r * t.ld, sk, t, sub, s);
            fpt_ab_dots(sg + r * t.ld, sv, t, sub, dp);
            fpt_ab_q_weights(&g, key, s, dp, t, sub, i, j0, lo, hi, rl, d, w);
            __syncwarp();
            fpt_ab_acc(acc, 1.0f, w, sk, t, sub);
        }
        if (r < nv) {
            fpt_ab_store(dq + (b * g.tq + i) * g.sg + h * g.d, acc, 1.0f, t, g.d, sub);
            if (sub == 0) dd[row] = d;
        }
    }
}

// The backward's second pass, a tile of key rows: dK = sum_i dS_ij Q_i, dV = sum_i (P M)_ij
// dO_i, into the packed gradient dqkv ([b, t, 3c], stride sg): dK at c, dV at 2c. Shared:
// K and V [R][ld], Q and dO [C][ld], the rows' P M and dS [R][C + 1] each, and the query
// tile's lse, D and key ranges [C] each.
template <int ROWS, int COLS>
__device__ void fpt_attn_bwd_kv(const float *q, const float *k, const float *v, const float *dout, const float *lse,
                                const float *dd, float *dqkv, const uint32_t *keylen, const fpt_attn_geom &g) {
    extern __shared__ float fpt_ab_smem[];
    const fpt_ab_tiles t = fpt_ab_tiles_of(ROWS, COLS, g.d);
    float *sk = fpt_ab_smem, *sv = sk + t.rows * t.ld, *sq = sv + t.rows * t.ld, *sg = sq + t.cols * t.ld;
    float *sp = sg + t.cols * t.ld, *ss = sp + t.rows * (t.cols + 1), *sl = ss + t.rows * (t.cols + 1);
    float *sd = sl + t.cols;
    int32_t *ql = (int32_t *)(sd + t.cols), *qh = ql + t.cols;
    float *dk = dqkv + g.heads * g.d, *dv = dqkv + 2 * g.heads * g.d;
    const int lane = threadIdx.x, r = lane / (int)t.tpr, sub = lane % (int)t.tpr;
    const int64_t blocks = g.batch * g.heads * ((g.tk + t.rows - 1) / t.rows);
    for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
        int64_t b, h, j0, nv, blo, bhi, x;
        fpt_ab_locate(&g, blk, g.tk, t.rows, &b, &h, &j0, &nv);
        fpt_attn_queries(&g, j0, &blo, &x);
        fpt_attn_queries(&g, j0 + nv - 1, &x, &bhi);
        const int64_t j = j0 + r;
        const uint32_t key = fpt_attn_bkey(&g, b, h);
        float *wp = sp + r * (t.cols + 1), *ws = ss + r * (t.cols + 1);
        __syncthreads();  // the block before is done with shared memory
        fpt_ab_load(sk, k + b * g.tk * g.sk + h * g.d, g.sk, j0, nv, t.rows, g.d, t.ld, lane, FPT_AB_THREADS);
        fpt_ab_load(sv, v + b * g.tk * g.sv + h * g.d, g.sv, j0, nv, t.rows, g.d, t.ld, lane, FPT_AB_THREADS);
        float ak[4 * FPT_AB_MAXU], av[4 * FPT_AB_MAXU], s[FPT_AB_MAXC], dp[FPT_AB_MAXC];
        for (int u = 0; u < 4 * FPT_AB_MAXU; u++) ak[u] = av[u] = 0.0f;
        for (int64_t i0 = blo; i0 < bhi; i0 += t.cols) {
            int64_t nq = g.tq - i0 < t.cols ? g.tq - i0 : t.cols;
            __syncthreads();
            fpt_ab_load(sq, q + b * g.tq * g.sq + h * g.d, g.sq, i0, nq, t.cols, g.d, t.ld, lane, FPT_AB_THREADS);
            fpt_ab_load(sg, dout + b * g.tq * g.so + h * g.d, g.so, i0, nq, t.cols, g.d, t.ld, lane, FPT_AB_THREADS);
            fpt_ab_kv_columns(&g, keylen, lse, dd, b, h, i0, nq, t.cols, sl, sd, ql, qh, lane, FPT_AB_THREADS);
            __syncthreads();
            fpt_ab_dots(sk + r * t.ld, sq, t, sub, s);
            fpt_ab_dots(sv + r * t.ld, sg, t, sub, dp);
            fpt_ab_kv_weights(&g, key, s, dp, t, sub, r < nv ? j : -1, i0, nq, sl, sd, ql, qh, wp, ws);
            __syncwarp();
            fpt_ab_acc(av, 1.0f, wp, sg, t, sub);
            fpt_ab_acc(ak, 1.0f, ws, sq, t, sub);
        }
        if (r < nv) {
            fpt_ab_store(dk + (b * g.tk + j) * g.sg + h * g.d, ak, 1.0f, t, g.d, sub);
            fpt_ab_store(dv + (b * g.tk + j) * g.sg + h * g.d, av, 1.0f, t, g.d, sub);
        }
    }
}

// The kernels, one per tile plan of fpt_attn_plan (fpt_attn_fwd_f32_64x32, ...: src/cuda/attn.rs
// names them from the plan): with the tiles known when compiled, each lane's columns are a
// constant count, and the score registers of the columns it does not own are not kept.
#define FPT_ATTN_KERNELS(R, C)                                                                              \
    extern "C" __global__ void fpt_attn_fwd_f32_##R##x##C(const float *q, const float *k, const float *v,      \
                                                          float *o, float *lse, const uint32_t *keylen,       \
                                                          fpt_attn_geom g, const uint64_t *seed_at) {         \
        if (seed_at) g.seed = *seed_at;                                                                       \
        fpt_attn_fwd<R, C>(q, k, v, o, lse, keylen, g);                                                       \
    }                                                                                                         \
    extern "C" __global__ void fpt_attn_bwd_q_f32_##R##x##C(                                                  \
        const float *q, const float *k, const float *v, const float *o, const float *dout, const float *lse,  \
        float *dd, float *dq, const uint32_t *keylen, fpt_attn_geom g, const uint64_t *seed_at) {             \
        if (seed_at) g.seed = *seed_at;                                                                       \
        fpt_attn_bwd_q<R, C>(q, k, v, o, dout, lse, dd, dq, keylen, g);                                       \
    }                                                                                                         \
    extern "C" __global__ void fpt_attn_bwd_kv_f32_##R##x##C(const float *q, const float *k, const float *v,   \
                                                             const float *dout, const float *lse,             \
                                                             const float *dd, float *dqkv,                    \
                                                             const uint32_t *keylen, fpt_attn_geom g,         \
                                                             const uint64_t *seed_at) {                       \
        if (seed_at) g.seed = *seed_at;                                                                       \
        fpt_attn_bwd_kv<R, C>(q, k, v, dout, lse, dd, dqkv, keylen, g);                                       \
    }
FPT_ATTN_KERNELS(64, 64)
FPT_ATTN_KERNELS(64, 32)
FPT_ATTN_KERNELS(32, 32)
FPT_ATTN_KERNELS(32, 16)
FPT_ATTN_KERNELS(16, 16)

// ---- attention tiled in blocks on the tensor cores (fpt_attn_mma.h) ----------------------

#include "fpt_attn_mma.h"

// The three kernels for heads of up to DK dims in T TF32 terms a product (fpt_attn_mma3_fwd_f32_d64,
// ...: src/cuda/attn.rs names them from the head width and the family), 128 lanes a block, each block striding over the tiles of
// 64 rows; the arguments are the SIMT kernels' (the dK, dV pass finds its thirds of dqkv).
// Both families read their dropout seed from seed_at when it is not null (a replayed step's
// slot, src/replay.rs), from the geometry otherwise.
#define FPT_MB_KERNELS(DK, T)                                                                                    \
    extern "C" __global__ void __launch_bounds__(FPT_MB_THREADS)                                              \
        fpt_attn_mma##T##_fwd_f32_d##DK(const float *q, const float *k, const float *v, float *o, float *lse,      \
                                   const uint32_t *keylen, fpt_attn_geom g, const uint64_t *seed_at) {        \
        extern __shared__ float fpt_mb_smem[];                                                                \
        if (seed_at) g.seed = *seed_at;                                                                       \
        const int64_t blocks = g.batch * g.heads * ((g.tq + FPT_MB_ROWS - 1) / FPT_MB_ROWS);                  \
        for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x)                                        \
            fpt_mb_fwd_##DK##_x##T(q, k, v, o, lse, keylen, &g, fpt_mb_smem, blk);                                   \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(FPT_MB_THREADS) fpt_attn_mma##T##_bwd_q_f32_d##DK(                \
        const float *q, const float *k, const float *v, const float *o, const float *dout, const float *lse,  \
        float *dd, float *dq, const uint32_t *keylen, fpt_attn_geom g, const uint64_t *seed_at) {             \
        extern __shared__ float fpt_mb_smem[];                                                                \
        if (seed_at) g.seed = *seed_at;                                                                       \
        const int64_t blocks = g.batch * g.heads * ((g.tq + FPT_MB_ROWS - 1) / FPT_MB_ROWS);                  \
        for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x)                                        \
            fpt_mb_bwd_q_##DK##_x##T(q, k, v, o, dout, lse, dd, dq, keylen, &g, fpt_mb_smem, blk);                   \
    }                                                                                                         \
    extern "C" __global__ void __launch_bounds__(FPT_MB_THREADS) fpt_attn_mma##T##_bwd_kv_f32_d##DK(               \
        const float *q, const float *k, const float *v, const float *dout, const float *lse, const float *dd, \
        float *dqkv, const uint32_t *keylen, fpt_attn_geom g, const uint64_t *seed_at) {                      \
        extern __shared__ float fpt_mb_smem[];                                                                \
        if (seed_at) g.seed = *seed_at;                                                                       \
        float *dk = dqkv + g.heads * g.d, *dv = dqkv + 2 * g.heads * g.d;                                     \
        const int64_t blocks = g.batch * g.heads * ((g.tk + FPT_MB_ROWS - 1) / FPT_MB_ROWS);                  \
        for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x)                                        \
            fpt_mb_bwd_kv_##DK##_x##T(q, k, v, dout, lse, dd, dk, dv, keylen, &g, fpt_mb_smem, blk);                 \
    }

FPT_MB_KERNELS(32, 3)
FPT_MB_KERNELS(64, 3)
FPT_MB_KERNELS(32, 1)
FPT_MB_KERNELS(64, 1)

// ---- the layer-norm LSTM (fpt_lstm.h) ------------------------------------------------

#include "fpt_lstm.h"

// The sum of every lane's v over the block, in every lane: each warp's shuffles, then the
// warps' sums added in order (host_grid.c's lstm_block_sum). The first barrier also ends
// the phase before (every lane's writes to shared and global memory are seen after it).
// `red` holds a float per warp.
__device__ float fpt_block_sum(float v, float *red) {
    v = fpt_warp_sum(v);
    __syncthreads();
    if (threadIdx.x % FPT_WARP == 0) red[threadIdx.x / FPT_WARP] = v;
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < (int)(blockDim.x / FPT_WARP); w++) s += red[w];
    return s;
}

// The recurrence forward: block b runs row b's T steps (grid-stride over rows). Shared:
// h, c (H each), r (4H), cp (H), a float per warp. Inputs: xi [B, T, 4H], W_hh^T
// [H, 4H], [W_hh | b_hh] [4H, H + 1], the norms [w_h2h, b_h2h, w_cell, b_cell] [10H],
// h0, c0 [B, H]; the dropout on the outputs: masks [T, B, H], or else each step's seed in
// `seeds` [T] (the multipliers drawn here: fpt_lstm_mult), or neither. Writes y [B, T, H]
// and `saved` (fpt_lstm.h).
extern "C" __global__ void fpt_lstm_fwd_f32(const float *xi, const float *wt, const float *wb, const float *ln,
                                            const float *h0, const float *c0, const float *masks,
                                            const uint64_t *seeds, uint64_t block, int32_t thr, float keep, float *y,
                                            float *saved, int64_t batch, int64_t t, int64_t hs, float eps) {
    const fpt_lstm_drop drop = {masks, seeds, block, thr, keep, batch};
    extern __shared__ float fpt_smem[];
    const int64_t g4 = 4 * hs;
    float *h = fpt_smem, *c = h + hs, *r = c + hs, *cp = r + g4, *red = cp + hs;
    const int lane = threadIdx.x, nl = blockDim.x;
    for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
        __syncthreads();  // the row before is done with h and c
        fpt_lstm_lane_init(h0 + b * hs, c0 + b * hs, h, c, hs, lane, nl);
        for (int64_t s = 0; s < t; s++) {
            fpt_lstm_rows k = fpt_lstm_saved_at(saved, t, batch, hs, s, b);
            __syncthreads();  // the step before wrote h and c
            fpt_lstm_lane_save(h, c, k.hprev, k.cprev, hs, lane, nl);
            float mean = fpt_block_sum(fpt_lstm_lane_rec(h, wt, wb, r, hs, lane, nl), red) / (float)g4;
            float var = fpt_block_sum(fpt_norm_lane_sqdev(r, g4, mean, lane, nl), red) / (float)(g4 - 1);
            float rstd = 1.0f / sqrtf(var + eps);
            if (lane == 0) *k.rrstd = rstd;
            fpt_lstm_lane_gates(r, xi + (b * t + s) * g4, ln, ln + g4, k.rhat, k.gates, hs, mean, rstd, lane, nl);
            __syncthreads();  // every gate is written
            float cmean = fpt_block_sum(fpt_lstm_lane_cell(k.gates, c, cp, hs, lane, nl), red) / (float)hs;
            float cvar = fpt_block_sum(fpt_norm_lane_sqdev(cp, hs, cmean, lane, nl), red) / (float)(hs - 1);
            float crstd = 1.0f / sqrtf(cvar + eps);
            if (lane == 0) *k.crstd = crstd;
            fpt_lstm_lane_out(cp, k.gates, ln + 2 * g4, ln + 2 * g4 + hs, drop, s, b, k.chat, k.tc, c, h, y + (b * t + s) * hs,
                              hs, cmean, crstd, lane, nl);
        }
    }
}

// The recurrence backward through time: block b runs row b's steps from the last. Shared:
// dh, dc, d (H each), drr (4H), a float per warp. Writes dxi [B, T, 4H] (the
// pre-activations' gradient) and `part` [B, 14H]: row b's parts of the norms' gradients
// ([w_h2h, b_h2h, w_cell, b_cell], 10H) and of b_hh's (4H). When `dr` is not null (W_hh
// trains) also each step's dr [T, B, 4H] and the states it multiplied, `hout` [T, B, H].
// The dropout's multipliers as the forward's (drawn again from the seeds, not stored).
extern "C" __global__ void fpt_lstm_bwd_f32(const float *dy, const float *wb, const float *ln, const float *masks,
                                            const uint64_t *seeds, uint64_t block, int32_t thr, float keep,
                                            const float *saved, float *dxi, float *part, float *dr, float *hout,
                                            int64_t batch, int64_t t, int64_t hs) {
    const fpt_lstm_drop drop = {masks, seeds, block, thr, keep, batch};
    extern __shared__ float fpt_smem[];
    const int64_t g4 = 4 * hs;
    float *dh = fpt_smem, *dc = dh + hs, *d = dc + hs, *drr = d + hs, *red = drr + g4;
    const int lane = threadIdx.x, nl = blockDim.x;
    for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
        float *pr = part + b * 14 * hs;
        __syncthreads();  // the row before is done with dh and dc
        for (int64_t j = lane; j < hs; j += nl) dh[j] = dc[j] = 0.0f;
        for (int64_t j = lane; j < 14 * hs; j += nl) pr[j] = 0.0f;
        for (int64_t s = t - 1; s >= 0; s--) {
            fpt_lstm_rows k = fpt_lstm_saved_at((float *)saved, t, batch, hs, s, b);
            float *dpre = dxi + (b * t + s) * g4;
            __syncthreads();  // the step after wrote dh, dc and the parts
            float a, q;
            fpt_lstm_lane_bwd_out(dy + (b * t + s) * hs, dh, dc, drop, s, b, k.gates, k.tc, k.chat, ln + 2 * g4, dpre, d,
                                  pr + 2 * g4, pr + 2 * g4 + hs, hs, lane, nl, &a, &q);
            float mean_d = fpt_block_sum(a, red) / (float)hs;
            float dot = fpt_block_sum(q, red) / (float)(hs - 1);
            fpt_lstm_lane_bwd_cell(d, k.chat, *k.crstd, mean_d, dot, k.gates, k.cprev, dpre, dc, hs, lane, nl);
            __syncthreads();  // every gate's dpre is written
            fpt_lstm_lane_bwd_rec(dpre, k.rhat, ln, drr, pr, pr + g4, hs, lane, nl, &a, &q);
            float mr = fpt_block_sum(a, red) / (float)g4;
            float rdot = fpt_block_sum(q, red) / (float)(g4 - 1);
            fpt_lstm_lane_bwd_rnorm(drr, k.rhat, *k.rrstd, mr, rdot, dr ? dr + (s * batch + b) * g4 : 0,
                                    pr + 10 * hs, hs, lane, nl);
            if (dr)
                for (int64_t j = lane; j < hs; j += nl) hout[(s * batch + b) * hs + j] = k.hprev[j];
            __syncthreads();  // drr is whole
            fpt_lstm_lane_bwd_dh(drr, wb, dh, hs, lane, nl);
        }
    }
}

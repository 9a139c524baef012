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

// Masked, scaled softmax over rows of tk keys: one warp per row, the lanes' partial
// maxima and sums combined by shuffles. rows = batch * heads * tq.
extern "C" __global__ void fpt_softmax_fwd_f32(const float *s, float *y, uint64_t rows, int64_t tq, int64_t tk,
                                               float scale, int32_t kind, int64_t band) {
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
        __syncwarp();
        fpt_softmax_lane_finish(yr, tk, lo, hi, 1.0f / sum, lane, FPT_WARP);
    }
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

// ---- attention tiled over keys (fpt_ops.h, "attention tiled over keys") ----------------
// One warp per row; a tile of 32 keys (or queries) at a time, one per lane; each lane owns
// the head dims lane, lane + 32, ... of the row's accumulators. The tile's weights pass
// between the lanes through the warp's slice of shared memory.
#define FPT_ATTN_WARPS 8 // THREADS / 32 in src/cuda.rs

// O = softmax(scale Q K^T, masked) (dropout) V, and each row's log-sum-exp.
extern "C" __global__ void fpt_attn_fwd_f32(const float *q, const float *k, const float *v, float *o, float *lse,
                                            const uint32_t *keylen, fpt_attn_geom g) {
    __shared__ float tile[FPT_ATTN_WARPS][FPT_ATTN_TILE];
    uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / FPT_WARP;
    uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) / FPT_WARP;
    int lane = threadIdx.x % FPT_WARP;
    float *w = tile[threadIdx.x / FPT_WARP];
    uint64_t rows = (uint64_t)(g.batch * g.heads * g.tq);
    for (uint64_t r = warp; r < rows; r += warps) {
        int64_t b, h, i, lo, hi;
        fpt_attn_locate(&g, (int64_t)r, g.tq, &b, &h, &i);
        fpt_attn_keys(&g, keylen, b, i, &lo, &hi);
        const float *qrow = q + (b * g.tq + i) * g.sq + h * g.d;
        float acc[FPT_ATTN_MAXU];
        for (int u = 0; u < FPT_ATTN_MAXU; u++) acc[u] = 0.0f;
        float m = -INFINITY, l = 0.0f;
        for (int64_t j0 = lo; j0 < hi; j0 += FPT_ATTN_TILE) {
            int64_t j = j0 + lane;
            int n = hi - j0 < FPT_ATTN_TILE ? (int)(hi - j0) : FPT_ATTN_TILE;
            float s = fpt_attn_score(&g, qrow, k, b, h, j, hi);
            float mn = fmaxf(m, fpt_warp_max(s));
            float alpha = expf(m - mn);
            float p = j < hi ? expf(s - mn) : 0.0f;
            l = FPT_ADD(FPT_MUL(l, alpha), fpt_warp_sum(p));
            w[lane] = j < hi ? FPT_MUL(p, fpt_attn_mult(&g, b, h, i, j)) : 0.0f;
            __syncwarp();
            const float *vt = v + (b * g.tk + j0) * g.sv + h * g.d;
            for (int u = 0; u < FPT_ATTN_MAXU; u++) {
                int64_t e = lane + FPT_WARP * u;
                if (e < g.d) acc[u] = fpt_attn_acc(acc[u], alpha, w, n, vt + e, g.sv);
            }
            __syncwarp();
            m = mn;
        }
        float *orow = o + (b * g.tq + i) * g.so + h * g.d;
        for (int u = 0; u < FPT_ATTN_MAXU; u++) {
            int64_t e = lane + FPT_WARP * u;
            if (e < g.d) orow[e] = l > 0.0f ? acc[u] / l : 0.0f;
        }
        if (lane == 0) lse[r] = l > 0.0f ? m + logf(l) : -INFINITY;
    }
}

// The backward's first pass, per query row: D = dO . O (kept in dd for the second) and
// dQ = sum_j dS_ij K_j (dq: the packed gradient, dQ at its offset 0).
extern "C" __global__ void fpt_attn_bwd_q_f32(const float *q, const float *k, const float *v, const float *o,
                                              const float *dout, const float *lse, float *dd, float *dq,
                                              const uint32_t *keylen, fpt_attn_geom g) {
    __shared__ float tile[FPT_ATTN_WARPS][FPT_ATTN_TILE];
    uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / FPT_WARP;
    uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) / FPT_WARP;
    int lane = threadIdx.x % FPT_WARP;
    float *w = tile[threadIdx.x / FPT_WARP];
    uint64_t rows = (uint64_t)(g.batch * g.heads * g.tq);
    for (uint64_t r = warp; r < rows; r += warps) {
        int64_t b, h, i, lo, hi;
        fpt_attn_locate(&g, (int64_t)r, g.tq, &b, &h, &i);
        fpt_attn_keys(&g, keylen, b, i, &lo, &hi);
        const float *orow = o + (b * g.tq + i) * g.so + h * g.d;
        const float *grow = dout + (b * g.tq + i) * g.so + h * g.d;
        float part = 0.0f;
        for (int64_t e = lane; e < g.d; e += FPT_WARP) part = FPT_ADD(part, FPT_MUL(grow[e], orow[e]));
        float d = fpt_warp_sum(part);
        float acc[FPT_ATTN_MAXU];
        for (int u = 0; u < FPT_ATTN_MAXU; u++) acc[u] = 0.0f;
        for (int64_t j0 = lo; j0 < hi; j0 += FPT_ATTN_TILE) {
            int64_t j = j0 + lane;
            int n = hi - j0 < FPT_ATTN_TILE ? (int)(hi - j0) : FPT_ATTN_TILE;
            float pd = 0.0f, ds = 0.0f;
            if (j < hi) fpt_attn_pair(&g, q, k, v, dout, b, h, i, j, lse[r], d, &pd, &ds);
            w[lane] = ds;
            __syncwarp();
            const float *kt = k + (b * g.tk + j0) * g.sk + h * g.d;
            for (int u = 0; u < FPT_ATTN_MAXU; u++) {
                int64_t e = lane + FPT_WARP * u;
                if (e < g.d) acc[u] = fpt_attn_acc(acc[u], 1.0f, w, n, kt + e, g.sk);
            }
            __syncwarp();
        }
        float *qg = dq + (b * g.tq + i) * g.sg + h * g.d;
        for (int u = 0; u < FPT_ATTN_MAXU; u++) {
            int64_t e = lane + FPT_WARP * u;
            if (e < g.d) qg[e] = acc[u];
        }
        if (lane == 0) dd[r] = d;
    }
}

// The backward's second pass, per key row: dK = sum_i dS_ij Q_i, dV = sum_i (P M)_ij dO_i,
// into the packed gradient dqkv ([b, t, 3c], stride sg): dK at c, dV at 2c.
extern "C" __global__ void fpt_attn_bwd_kv_f32(const float *q, const float *k, const float *v, const float *dout,
                                               const float *lse, const float *dd, float *dqkv,
                                               const uint32_t *keylen, fpt_attn_geom g) {
    float *dk = dqkv + g.heads * g.d;
    float *dv = dqkv + 2 * g.heads * g.d;
    __shared__ float tile[FPT_ATTN_WARPS][2][FPT_ATTN_TILE];
    uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / FPT_WARP;
    uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) / FPT_WARP;
    int lane = threadIdx.x % FPT_WARP;
    float *wp = tile[threadIdx.x / FPT_WARP][0];
    float *ws = tile[threadIdx.x / FPT_WARP][1];
    uint64_t rows = (uint64_t)(g.batch * g.heads * g.tk);
    for (uint64_t r = warp; r < rows; r += warps) {
        int64_t b, h, j, lo, hi;
        fpt_attn_locate(&g, (int64_t)r, g.tk, &b, &h, &j);
        fpt_attn_queries(&g, j, &lo, &hi);
        float ak[FPT_ATTN_MAXU], av[FPT_ATTN_MAXU];
        for (int u = 0; u < FPT_ATTN_MAXU; u++) ak[u] = av[u] = 0.0f;
        for (int64_t i0 = lo; i0 < hi; i0 += FPT_ATTN_TILE) {
            int64_t i = i0 + lane;
            int n = hi - i0 < FPT_ATTN_TILE ? (int)(hi - i0) : FPT_ATTN_TILE;
            float pd = 0.0f, ds = 0.0f;
            if (i < hi) {
                int64_t klo, khi;
                fpt_attn_keys(&g, keylen, b, i, &klo, &khi);
                int64_t ri = (b * g.heads + h) * g.tq + i;
                if (j >= klo && j < khi) fpt_attn_pair(&g, q, k, v, dout, b, h, i, j, lse[ri], dd[ri], &pd, &ds);
            }
            wp[lane] = pd;
            ws[lane] = ds;
            __syncwarp();
            const float *gt = dout + (b * g.tq + i0) * g.so + h * g.d;
            const float *qt = q + (b * g.tq + i0) * g.sq + h * g.d;
            for (int u = 0; u < FPT_ATTN_MAXU; u++) {
                int64_t e = lane + FPT_WARP * u;
                if (e < g.d) {
                    av[u] = fpt_attn_acc(av[u], 1.0f, wp, n, gt + e, g.so);
                    ak[u] = fpt_attn_acc(ak[u], 1.0f, ws, n, qt + e, g.sq);
                }
            }
            __syncwarp();
        }
        float *kg = dk + (b * g.tk + j) * g.sg + h * g.d;
        float *vg = dv + (b * g.tk + j) * g.sg + h * g.d;
        for (int u = 0; u < FPT_ATTN_MAXU; u++) {
            int64_t e = lane + FPT_WARP * u;
            if (e < g.d) {
                kg[e] = ak[u];
                vg[e] = av[u];
            }
        }
    }
}

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

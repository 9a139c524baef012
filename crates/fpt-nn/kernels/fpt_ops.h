/* fpt's device kernels: the arithmetic and indexing of each, as plain C99 functions.
 *
 * Every function here is compiled twice: by nvcc into the CUDA kernels of fpt_kernels.cu
 * (where FPT_HD is `__host__ __device__`), and by the host C compiler into host_grid.c,
 * which runs the same bodies over a simulated grid (every block, every lane) so that
 * `cargo test` checks their numbers and indexing on a machine without a GPU. The CUDA
 * file adds only what a GPU needs around them: the grid-stride loops, the warp
 * reductions that combine the lanes' partial results, and the launches.
 *
 * The dropout multipliers are fpt's counter-based mask (crates/fpt-nn/src/ops/dropout.rs
 * and fastmath.rs): element j of block b of a mask seeded by `seed` is dropped when
 * lowbias32(key_b ^ j * 0x9E3779B9) >> 8 < round(p * 2^24), where key_b is the high half of
 * the first output of xoshiro256++ seeded (by SplitMix64) from the block's stream
 * (`Rng::stream(seed, b)`). A mask is thus a pure function of (seed, block size, index):
 * drawn on any device without copying, and drawn again in backward instead of stored.
 */
#ifndef FPT_OPS_H
#define FPT_OPS_H

#include <stdint.h>

#ifdef __CUDACC__
#define FPT_HD __host__ __device__ static inline
/* Products and sums rounded one by one (no contraction into fused multiply-adds), where
 * a kernel must round as the CPU ops do. */
#define FPT_MUL(a, b) __fmul_rn((a), (b))
#define FPT_ADD(a, b) __fadd_rn((a), (b))
#else
#define FPT_HD static inline
#include <math.h>
/* host_grid.c is compiled with -ffp-contract=off. */
#define FPT_MUL(a, b) ((a) * (b))
#define FPT_ADD(a, b) ((a) + (b))
#endif

/* ---- the dropout mask ------------------------------------------------------------- */

/* SplitMix64's output for state `x` (the state already advanced by the golden gamma). */
FPT_HD uint64_t fpt_splitmix_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

FPT_HD uint64_t fpt_rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* The first xoshiro256++ output of `Rng::new(seed)`: its state words are SplitMix64's
 * outputs 1..4 from `seed`; the first output needs words 0 and 3 only. */
FPT_HD uint64_t fpt_xoshiro_first(uint64_t seed) {
    const uint64_t gamma = 0x9E3779B97F4A7C15ULL;
    uint64_t s0 = fpt_splitmix_mix(seed + gamma);
    uint64_t s3 = fpt_splitmix_mix(seed + 4 * gamma);
    return fpt_rotl64(s0 + s3, 23) + s0;
}

/* The 32-bit key of block `index` of a mask seeded by `seed` (`Rng::stream`). */
FPT_HD uint32_t fpt_block_key(uint64_t seed, uint64_t index) {
    const uint64_t k = 0xD6E8FEB86659FD93ULL;
    uint64_t z = seed ^ ((index + 1) * k);
    z = (z ^ (z >> 32)) * k;
    return (uint32_t)(fpt_xoshiro_first(z ^ (z >> 29)) >> 32);
}

/* Chris Wellons' lowbias32 of the element's counter under the block's key. */
FPT_HD uint32_t fpt_mask_hash(uint32_t key, uint32_t j) {
    uint32_t x = key ^ (j * 0x9E3779B9u);
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* The multiplier of element `i` of a mask of blocks of `block` elements: 0 (dropped, when
 * the hash's top 24 bits fall below `thr`) or `keep` (1 / (1 - p)). */
FPT_HD float fpt_dropout_mult(uint64_t seed, uint64_t block, uint64_t i, int32_t thr, float keep) {
    uint64_t b = i / block;
    uint32_t j = (uint32_t)(i - b * block);
    uint32_t h = fpt_mask_hash(fpt_block_key(seed, b), j);
    return ((int32_t)(h >> 8) < thr) ? 0.0f : keep;
}

/* ---- masked softmax over rows ---------------------------------------------------- */

/* The mask kinds (fpt_nn::ops::Mask). */
#define FPT_MASK_NONE 0
#define FPT_MASK_CAUSAL 1
#define FPT_MASK_BAND 2

/* The visible keys lo..hi of row r of a [.., tq, tk] tensor (Mask::range). */
FPT_HD void fpt_mask_range(int kind, int64_t band, int64_t r, int64_t tq, int64_t tk, int64_t *lo, int64_t *hi) {
    int64_t i = r % tq;
    if (kind == FPT_MASK_CAUSAL) {
        int64_t extra = tk > tq ? tk - tq : 0;
        int64_t h = i + 1 + extra;
        *lo = 0;
        *hi = h < tk ? h : tk;
    } else if (kind == FPT_MASK_BAND) {
        int64_t h = i + band + 1;
        *lo = i > band ? i - band : 0;
        *hi = h < tk ? h : tk;
    } else {
        *lo = 0;
        *hi = tk;
    }
}

/* One lane's part of a row's softmax: the lanes 0..nl of a row share its keys lo..hi in
 * a stride of nl. Pass 1: the lane's maximum of scale * s. */
FPT_HD float fpt_softmax_lane_max(const float *s, int64_t lo, int64_t hi, float scale, int lane, int nl) {
    float m = -INFINITY;
    for (int64_t j = lo + lane; j < hi; j += nl) {
        float v = s[j] * scale;
        m = v > m ? v : m;
    }
    return m;
}

/* Pass 2: the lane's sum of exp(scale * s - max), each exponential written to y. */
FPT_HD float fpt_softmax_lane_exp(const float *s, float *y, int64_t lo, int64_t hi, float scale, float max, int lane, int nl) {
    float sum = 0.0f;
    for (int64_t j = lo + lane; j < hi; j += nl) {
        float e = expf(s[j] * scale - max);
        y[j] = e;
        sum += e;
    }
    return sum;
}

/* Backward, pass 1: the lane's part of sum(dy * y) (hidden keys have y = 0). */
FPT_HD float fpt_softmax_lane_dot(const float *y, const float *dy, int64_t tk, int lane, int nl) {
    float d = 0.0f;
    for (int64_t j = lane; j < tk; j += nl) {
        d += y[j] * dy[j];
    }
    return d;
}

/* Backward, pass 2: ds = scale * y * (dy - dot). */
FPT_HD void fpt_softmax_lane_grad(const float *y, const float *dy, float *ds, int64_t tk, float scale, float dot, int lane, int nl) {
    for (int64_t j = lane; j < tk; j += nl) {
        ds[j] = scale * y[j] * (dy[j] - dot);
    }
}

/* ---- attention's softmax with its dropout, and their backward -------------------- */

/* The multiplier of element jb of a mask block whose key is `key` (fpt_block_key): what
 * fpt_dropout_mult gives for that element, the key drawn once per row by the caller (a row
 * never straddles two blocks: attention's blocks are whole t x t matrices). */
FPT_HD float fpt_row_mult(uint32_t key, uint64_t jb, int32_t thr, float keep) {
    uint32_t h = fpt_mask_hash(key, (uint32_t)jb);
    return ((int32_t)(h >> 8) < thr) ? 0.0f : keep;
}

/* Pass 3 of the softmax, with the dropout after it: y = y / sum, 0 on the hidden keys, then
 * times the multiplier of the row's element j (the row's first element is element jb of its
 * block; thr 0: no dropout, the plain softmax). Rounded as a softmax then the dropout
 * kernel (fpt_dropout_mul_f32) round. */
FPT_HD void fpt_softmax_lane_finish_drop(float *y, int64_t tk, int64_t lo, int64_t hi, float inv, uint32_t key,
                                         uint64_t jb, int32_t thr, float keep, int lane, int nl) {
    for (int64_t j = lane; j < tk; j += nl) {
        float v = (j >= lo && j < hi) ? y[j] * inv : 0.0f;
        if (thr > 0) v = v * fpt_row_mult(key, jb + (uint64_t)j, thr, keep);
        y[j] = v;
    }
}

/* The scores' gradient through the softmax and its dropout for a row, from the scores s,
 * the dropped probabilities' gradient dp, the row's log-sum-exp of scale * s and
 * dd = sum_j P'_j dp_j (= dO . O, the output's row): ds = scale * P * (M dp - dd), the
 * probability P = exp(scale * s - lse) recomputed, 0 on the hidden keys. */
FPT_HD void fpt_attn_ds_lane(const float *s, const float *dp, float *ds, int64_t tk, int64_t lo, int64_t hi,
                             float scale, float lse, float dd, uint32_t key, uint64_t jb, int32_t thr, float keep,
                             int lane, int nl) {
    for (int64_t j = lane; j < tk; j += nl) {
        float g = dp[j];
        if (thr > 0) g = g * fpt_row_mult(key, jb + (uint64_t)j, thr, keep);
        ds[j] = (j >= lo && j < hi) ? scale * expf(s[j] * scale - lse) * (g - dd) : 0.0f;
    }
}

/* ---- Adam ------------------------------------------------------------------------ */

/* Adam's moment update with fpt_nn::ops::adam_update's f32 roundings, each product and
 * sum rounded on its own: x = x decay + g rest (g^2 for the second moment). */
FPT_HD float fpt_moment_elem(float x, float g, float decay, float rest, int square) {
    float gg = square ? FPT_MUL(g, g) : g;
    return FPT_ADD(FPT_MUL(x, decay), FPT_MUL(gg, rest));
}

/* Adam's parameter update: p - (m / (sqrt(v) inv_sqrt_bc2 + eps)) step_size. */
FPT_HD float fpt_adam_step_elem(float p, float m, float v, float inv_sqrt_bc2, float eps, float step_size) {
    float denom = FPT_ADD(FPT_MUL(sqrtf(v), inv_sqrt_bc2), eps);
    return p - FPT_MUL(m / denom, step_size);
}

/* ---- a replayed step's gate (src/ops/adam_gate.rs) --------------------------------- */

/* The gate's state, f64: [0] the last step's verdict (1 applied, 0 skipped: a non-finite
 * loss or norm, -1 skipped: past the coefficient table), [1] Adam's step count t (updates
 * applied), [2] steps recorded, [3] t before the table's first row, [4] the table's rows,
 * [5] the ring's length R, then R records of (loss, norm, verdict), step k at k % R. */
#define FPT_GATE_HEAD 6

/* Records one step and decides whether its update applies; t counts the applied ones. */
FPT_HD void fpt_step_gate(double loss, double norm, double *state) {
    double verdict = 1.0;
    if (!(isfinite(loss) && isfinite(norm))) verdict = 0.0;
    else if (state[1] - state[3] >= state[4]) verdict = -1.0;
    state[0] = verdict;
    if (verdict == 1.0) state[1] += 1.0;
    uint64_t ring = (uint64_t)state[5];
    double *rec = state + FPT_GATE_HEAD + 3 * ((uint64_t)state[2] % ring);
    rec[0] = loss;
    rec[1] = norm;
    rec[2] = verdict;
    state[2] += 1.0;
}

/* Whether the gate let the last step through. */
FPT_HD int fpt_gate_open(const double *state) { return state[0] == 1.0; }

/* The step size and 1 / sqrt(1 - b2^t) of the step the gate let through (table row t - 1
 * counted from the table's first step), or 0 when it did not. */
FPT_HD int fpt_gate_coefs(const double *state, const float *table, float *step_size, float *inv_sqrt_bc2) {
    if (!fpt_gate_open(state)) return 0;
    uint64_t row = (uint64_t)(state[1] - state[3]) - 1;
    *step_size = table[2 * row];
    *inv_sqrt_bc2 = table[2 * row + 1];
    return 1;
}

/* ---- LayerNorm and RMSNorm over rows of d ------------------------------------------- */

/* One lane's part of sum(x) over a row (LayerNorm's mean). */
FPT_HD float fpt_norm_lane_sum(const float *x, int64_t d, int lane, int nl) {
    float s = 0.0f;
    for (int64_t j = lane; j < d; j += nl) s += x[j];
    return s;
}

/* One lane's part of sum((x - mean)^2) (mean 0: RMSNorm's sum of squares). */
FPT_HD float fpt_norm_lane_sqdev(const float *x, int64_t d, float mean, int lane, int nl) {
    float s = 0.0f;
    for (int64_t j = lane; j < d; j += nl) {
        float c = x[j] - mean;
        s += c * c;
    }
    return s;
}

/* y = (x - mean) * rstd * w (+ b when b is not null). */
FPT_HD void fpt_norm_lane_write(const float *x, const float *w, const float *b, float *y, int64_t d, float mean,
                                float rstd, int lane, int nl) {
    for (int64_t j = lane; j < d; j += nl) {
        float v = (x[j] - mean) * rstd * w[j];
        y[j] = b ? v + b[j] : v;
    }
}

/* Backward, pass 1: the lane's parts of sum(g) and sum(g * xhat), g = dy * w,
 * xhat = (x - mean) * rstd. */
FPT_HD void fpt_norm_lane_dots(const float *x, const float *w, const float *dy, int64_t d, float mean, float rstd,
                               int lane, int nl, float *sum_g, float *sum_gx) {
    float a = 0.0f, c = 0.0f;
    for (int64_t j = lane; j < d; j += nl) {
        float g = dy[j] * w[j];
        a += g;
        c += g * ((x[j] - mean) * rstd);
    }
    *sum_g = a;
    *sum_gx = c;
}

/* Backward, pass 2: dx = rstd * (g - mg - xhat * mgx) (mg = 0 for RMSNorm), and
 * dy * xhat, the row's part of the scale's gradient. */
FPT_HD void fpt_norm_lane_grad(const float *x, const float *w, const float *dy, float *dx, float *dyxhat, int64_t d,
                               float mean, float rstd, float mg, float mgx, int lane, int nl) {
    for (int64_t j = lane; j < d; j += nl) {
        float xhat = (x[j] - mean) * rstd;
        float g = dy[j] * w[j];
        dx[j] = rstd * (g - mg - xhat * mgx);
        dyxhat[j] = dy[j] * xhat;
    }
}

/* ---- GELU ------------------------------------------------------------------------ */

#define FPT_GELU_NEW 0
#define FPT_GELU_ERF 1

/* GELU and its derivative at x: GPT-2's tanh form (FPT_GELU_NEW) or the exact erf form
 * (FPT_GELU_ERF, BERT's). */
FPT_HD void fpt_gelu(int kind, float x, float *y, float *dydx) {
    if (kind == FPT_GELU_NEW) {
        const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
        const float a = 0.044715f;
        float t = tanhf(c * (x + a * x * x * x));
        *y = 0.5f * x * (1.0f + t);
        *dydx = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * a * x * x);
    } else {
        const float inv_sqrt2 = 0.7071067811865476f;
        const float inv_sqrt_2pi = 0.3989422804014327f;
        float e = erff(x * inv_sqrt2);
        *y = 0.5f * x * (1.0f + e);
        *dydx = 0.5f * (1.0f + e) + x * expf(-0.5f * x * x) * inv_sqrt_2pi;
    }
}

/* SwiGLU at one element (Llama's gated activation, y = silu(g) u with silu(x) = x s,
 * s = 1 / (1 + e^-x)) and its two gradients for the output gradient dy:
 * dg = dy u silu'(g), silu'(x) = s (1 + x (1 - s)); du = dy silu(g). */
FPT_HD void fpt_swiglu(float g, float u, float dy, float *y, float *dg, float *du) {
    float s = 1.0f / (1.0f + expf(-g));
    float silu = g * s;
    *y = silu * u;
    *dg = dy * u * s * (1.0f + g * (1.0f - s));
    *du = dy * silu;
}

/* Rotary positions (Llama's "rotate half" layout) at element i of x, [rows, w = heads * d]
 * with row r at position r % t, and cs, sn the [t, d] cos and sin tables: on each head's
 * halves y1 = x1 cos1 - x2 sin1, y2 = x2 cos2 + x1 sin2; with transpose the rotation's
 * transpose (the backward): dx1 = dy1 cos1 + dy2 sin2, dx2 = dy2 cos2 - dy1 sin1. */
FPT_HD float fpt_rotary_at(const float *x, const float *cs, const float *sn, uint64_t i, int64_t t, int64_t w,
                           int64_t d, int transpose) {
    int64_t h = d / 2;
    uint64_t r = i / (uint64_t)w;
    int64_t k = (int64_t)(i % (uint64_t)w) % d;
    int64_t p = (int64_t)(r % (uint64_t)t);
    const float *c = cs + p * d, *s = sn + p * d;
    if (k < h) {
        float x1 = x[i], x2 = x[i + h];
        return transpose ? x1 * c[k] + x2 * s[h + k] : x1 * c[k] - x2 * s[k];
    }
    int64_t q = k - h;
    float x1 = x[i - h], x2 = x[i];
    return transpose ? x2 * c[h + q] - x1 * s[q] : x2 * c[h + q] + x1 * s[h + q];
}

/* Cross-entropy over a row of c logits (the row's max from fpt_softmax_lane_max with scale
 * 1 over [0, c)): a lane's share of sum(exp(x - max)). */
FPT_HD float fpt_ce_lane_sum(const float *x, int64_t c, float max, int lane, int nl) {
    float s = 0.0f;
    for (int64_t j = lane; j < c; j += nl) s += expf(x[j] - max);
    return s;
}

/* The row's loss, logsumexp(x) - x[k], from its max and sum; NaN for a target outside the
 * classes (the trainer's non-finite check stops on it; the CPU op names it). */
FPT_HD float fpt_ce_row_loss(const float *x, int64_t c, uint32_t k, float max, float sum) {
    return (int64_t)k < c ? logf(sum) + max - x[k] : NAN;
}

/* A lane's share of the row's gradient: dx_j = g (softmax_j - [j == k]). */
FPT_HD void fpt_ce_lane_grad(const float *x, float *dx, int64_t c, uint32_t k, float max, float inv_sum, float g,
                             int lane, int nl) {
    for (int64_t j = lane; j < c; j += nl) dx[j] = g * (expf(x[j] - max) * inv_sum - (j == (int64_t)k ? 1.0f : 0.0f));
}

/* ---- attention tiled in blocks: the geometry and masks (fpt_attn.h has the bodies) ---- */

/* Multi-head attention read in place from the [b, t, width] activations: element (b, i,
 * head, e) of Q at q[(b * tq + i) * sq + head * d + e] (K, V with tk and sk, sv; the
 * output, its gradient and the saved output with so; the gradients of Q, K, V with sg):
 * a packed [b, t, 3c] `qkv` is three views with stride 3c, no transposes. The dropout
 * multiplier of (b, head, i, j) is element ((b * heads + head) * tq + i) * tk + j of a
 * mask of blocks of tq * tk: the composed op's mask over [b, heads, tq, tk]. */

/* The launch's geometry; every field 8 bytes wide, so the C and Rust (#[repr(C)]) layouts
 * are one. */
typedef struct {
    int64_t batch, heads, tq, tk, d;
    int64_t sq, sk, sv, so, sg;
    int64_t kind, band;
    uint64_t seed;
    int64_t thr;     /* dropout's threshold (cuda.rs mask_params); 0: off */
    double keep;     /* the kept elements' multiplier */
    double scale;    /* multiplies q.k */
    int64_t has_len; /* keylen gives each example's valid keys (the rest are padding) */
} fpt_attn_geom;

/* The keys query i of example b sees: the mask's range, cut at the example's length. */
FPT_HD void fpt_attn_keys(const fpt_attn_geom *g, const uint32_t *keylen, int64_t b, int64_t i, int64_t *lo,
                          int64_t *hi) {
    fpt_mask_range((int)g->kind, g->band, i, g->tq, g->tk, lo, hi);
    if (g->has_len && (int64_t)keylen[b] < *hi) *hi = (int64_t)keylen[b];
    if (*lo > *hi) *lo = *hi;
}

/* The queries that can see key j (a superset; each is checked with fpt_attn_keys). */
FPT_HD void fpt_attn_queries(const fpt_attn_geom *g, int64_t j, int64_t *lo, int64_t *hi) {
    *lo = 0;
    *hi = g->tq;
    if (g->kind == FPT_MASK_CAUSAL) {
        int64_t extra = g->tk > g->tq ? g->tk - g->tq : 0;
        *lo = j - extra > 0 ? j - extra : 0;
    } else if (g->kind == FPT_MASK_BAND) {
        *lo = j - g->band > 0 ? j - g->band : 0;
        *hi = j + g->band + 1 < g->tq ? j + g->band + 1 : g->tq;
    }
    if (*lo > *hi) *lo = *hi;
}

#endif

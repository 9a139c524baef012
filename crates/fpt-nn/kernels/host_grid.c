/* The bodies of fpt's CUDA kernels (fpt_ops.h) driven on the host over the grid the
 * kernels in fpt_kernels.cu run on: each element, or each row with each of its 32 lanes,
 * the lanes' partial results combined as the warp reductions combine them (a butterfly of
 * pairwise sums over lane pairs 16, 8, 4, 2, 1 apart). Built into fpt-nn by build.rs on
 * every machine, and called only by its tests, which compare these results with fpt's
 * CPU ops: the kernels' indexing and numbers are checked without a GPU. */

#include "fpt_ops.h"
#include <stddef.h>
#include <stdlib.h>

#define LANES 32

/* The warp's butterfly: after it, every lane holds the combination of all 32. */
static void butterfly_sum(float v[LANES]) {
    for (int o = LANES / 2; o > 0; o /= 2) {
        float w[LANES];
        for (int l = 0; l < LANES; l++) w[l] = v[l] + v[l ^ o];
        for (int l = 0; l < LANES; l++) v[l] = w[l];
    }
}

static void butterfly_max(float v[LANES]) {
    for (int o = LANES / 2; o > 0; o /= 2) {
        float w[LANES];
        for (int l = 0; l < LANES; l++) w[l] = fmaxf(v[l], v[l ^ o]);
        for (int l = 0; l < LANES; l++) v[l] = w[l];
    }
}

void fpt_host_dropout_mul_f32(const float *x, float *y, uint64_t n, uint64_t seed, uint64_t block, int32_t thr,
                              float keep) {
    for (uint64_t i = 0; i < n; i++) y[i] = x[i] * fpt_dropout_mult(seed, block, i, thr, keep);
}

void fpt_host_dropout_add_f32(const float *a, const float *b, float *out, uint64_t n, uint64_t seed, uint64_t block,
                              int32_t thr, float keep) {
    for (uint64_t i = 0; i < n; i++) out[i] = a[i] + b[i] * fpt_dropout_mult(seed, block, i, thr, keep);
}

void fpt_host_softmax_bwd_f32(const float *y, const float *dy, float *ds, uint64_t rows, int64_t tk, float scale) {
    for (uint64_t r = 0; r < rows; r++) {
        float part[LANES];
        for (int l = 0; l < LANES; l++) part[l] = fpt_softmax_lane_dot(y + r * tk, dy + r * tk, tk, l, LANES);
        butterfly_sum(part);
        for (int l = 0; l < LANES; l++)
            fpt_softmax_lane_grad(y + r * tk, dy + r * tk, ds + r * tk, tk, scale, part[0], l, LANES);
    }
}

void fpt_host_softmax_drop_f32(const float *s, float *y, float *lse, uint64_t rows, int64_t tq, int64_t tk,
                               float scale, int32_t kind, int64_t band, uint64_t seed, uint64_t block, int32_t thr,
                               float keep) {
    for (uint64_t r = 0; r < rows; r++) {
        const float *sr = s + r * tk;
        float *yr = y + r * tk;
        int64_t lo, hi;
        fpt_mask_range(kind, band, (int64_t)r, tq, tk, &lo, &hi);
        float part[LANES];
        for (int l = 0; l < LANES; l++) part[l] = fpt_softmax_lane_max(sr, lo, hi, scale, l, LANES);
        butterfly_max(part);
        float m = part[0];
        for (int l = 0; l < LANES; l++) part[l] = fpt_softmax_lane_exp(sr, yr, lo, hi, scale, m, l, LANES);
        butterfly_sum(part);
        if (lse) lse[r] = m + logf(part[0]);
        uint64_t first = r * (uint64_t)tk;
        uint32_t key = thr > 0 ? fpt_block_key(seed, first / block) : 0u;
        float inv = 1.0f / part[0];
        for (int l = 0; l < LANES; l++)
            fpt_softmax_lane_finish_drop(yr, tk, lo, hi, inv, key, first % block, thr, keep, l, LANES);
    }
}

void fpt_host_attn_ds_f32(const float *s, const float *dp, const float *lse, const float *dd, float *ds,
                          uint64_t rows, int64_t tq, int64_t tk, float scale, int32_t kind, int64_t band,
                          uint64_t seed, uint64_t block, int32_t thr, float keep) {
    for (uint64_t r = 0; r < rows; r++) {
        int64_t lo, hi;
        fpt_mask_range(kind, band, (int64_t)r, tq, tk, &lo, &hi);
        uint64_t first = r * (uint64_t)tk;
        uint32_t key = thr > 0 ? fpt_block_key(seed, first / block) : 0u;
        for (int l = 0; l < LANES; l++)
            fpt_attn_ds_lane(s + first, dp + first, ds + first, tk, lo, hi, scale, lse[r], dd[r], key,
                             first % block, thr, keep, l, LANES);
    }
}

void fpt_host_moment_f32(float *x, const float *g, uint64_t n, float decay, float rest, int32_t square) {
    for (uint64_t i = 0; i < n; i++) x[i] = fpt_moment_elem(x[i], g[i], decay, rest, square);
}

void fpt_host_adam_step_f32(float *p, const float *m, const float *v, uint64_t n, float inv_sqrt_bc2, float eps,
                            float step_size) {
    for (uint64_t i = 0; i < n; i++) p[i] = fpt_adam_step_elem(p[i], m[i], v[i], inv_sqrt_bc2, eps, step_size);
}

void fpt_host_norm_fwd_f32(const float *x, const float *w, const float *b, float *y, uint64_t rows, int64_t d,
                           float eps, int32_t centered) {
    float inv_d = 1.0f / (float)d;
    for (uint64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        float part[LANES];
        float mean = 0.0f;
        if (centered) {
            for (int l = 0; l < LANES; l++) part[l] = fpt_norm_lane_sum(xr, d, l, LANES);
            butterfly_sum(part);
            mean = part[0] * inv_d;
        }
        for (int l = 0; l < LANES; l++) part[l] = fpt_norm_lane_sqdev(xr, d, mean, l, LANES);
        butterfly_sum(part);
        float rstd = 1.0f / sqrtf(part[0] * inv_d + eps);
        for (int l = 0; l < LANES; l++) fpt_norm_lane_write(xr, w, b, y + r * d, d, mean, rstd, l, LANES);
    }
}

void fpt_host_norm_bwd_f32(const float *x, const float *w, const float *dy, float *dx, float *dyxhat, uint64_t rows,
                           int64_t d, float eps, int32_t centered) {
    float inv_d = 1.0f / (float)d;
    for (uint64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;
        const float *gr = dy + r * d;
        float part[LANES], part2[LANES];
        float mean = 0.0f;
        if (centered) {
            for (int l = 0; l < LANES; l++) part[l] = fpt_norm_lane_sum(xr, d, l, LANES);
            butterfly_sum(part);
            mean = part[0] * inv_d;
        }
        for (int l = 0; l < LANES; l++) part[l] = fpt_norm_lane_sqdev(xr, d, mean, l, LANES);
        butterfly_sum(part);
        float rstd = 1.0f / sqrtf(part[0] * inv_d + eps);
        for (int l = 0; l < LANES; l++) fpt_norm_lane_dots(xr, w, gr, d, mean, rstd, l, LANES, &part[l], &part2[l]);
        butterfly_sum(part);
        butterfly_sum(part2);
        float mg = centered ? part[0] * inv_d : 0.0f;
        float mgx = part2[0] * inv_d;
        for (int l = 0; l < LANES; l++)
            fpt_norm_lane_grad(xr, w, gr, dx + r * d, dyxhat + r * d, d, mean, rstd, mg, mgx, l, LANES);
    }
}

void fpt_host_gelu_f32(const float *x, float *y, float *dydx, uint64_t n, int32_t kind) {
    for (uint64_t i = 0; i < n; i++) fpt_gelu(kind, x[i], &y[i], &dydx[i]);
}

/* The key of block `index` of a mask seeded by `seed`, for the known-answer tests. */
uint32_t fpt_host_block_key(uint64_t seed, uint64_t index) { return fpt_block_key(seed, index); }

/* SplitMix64's output for `state` (already advanced), for the known-answer tests. */
uint64_t fpt_host_splitmix_mix(uint64_t state) { return fpt_splitmix_mix(state); }

/* SwiGLU forward and both gradients, as the two kernels compute them per element; the
 * gradients into d (2n: dg, then du) as the backward kernel lays them out. */
void fpt_host_swiglu_f32(const float *g, const float *u, const float *dy, float *y, float *d, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        float unused_a, unused_b, unused_y;
        fpt_swiglu(g[i], u[i], 0.0f, &y[i], &unused_a, &unused_b);
        fpt_swiglu(g[i], u[i], dy[i], &unused_y, &d[i], &d[n + i]);
    }
}

void fpt_host_rotary_f32(const float *x, const float *cs, const float *sn, float *y, uint64_t n, int64_t t, int64_t w,
                         int64_t d, int32_t transpose) {
    for (uint64_t i = 0; i < n; i++) y[i] = fpt_rotary_at(x, cs, sn, i, t, w, d, transpose);
}

/* Cross-entropy per row and its gradient for the rows' upstream gradients g, as the two
 * kernels compute them with one warp per row. */
void fpt_host_ce_f32(const float *x, const uint32_t *t, const float *g, float *loss, float *dx, uint64_t rows,
                     int64_t c) {
    for (uint64_t r = 0; r < rows; r++) {
        const float *xr = x + r * c;
        float part[LANES];
        for (int l = 0; l < LANES; l++) part[l] = fpt_softmax_lane_max(xr, 0, c, 1.0f, l, LANES);
        butterfly_max(part);
        float m = part[0];
        for (int l = 0; l < LANES; l++) part[l] = fpt_ce_lane_sum(xr, c, m, l, LANES);
        butterfly_sum(part);
        float sum = part[0];
        loss[r] = fpt_ce_row_loss(xr, c, t[r], m, sum);
        for (int l = 0; l < LANES; l++) fpt_ce_lane_grad(xr, dx + r * c, c, t[r], m, 1.0f / sum, g[r], l, LANES);
    }
}

/* ---- attention tiled in blocks: fpt_kernels.cu's three kernels, block by block -------- */

#include "fpt_attn.h"

#define NT FPT_AB_THREADS

/* fpt_kernels.cu's fpt_ab_group_max/sum: a butterfly over each row's tpr lanes. */
static void ab_group(float v[NT], int tpr, int max) {
    for (int o = tpr / 2; o > 0; o /= 2) {
        float w[NT];
        for (int l = 0; l < NT; l++) w[l] = max ? fmaxf(v[l], v[l ^ o]) : v[l] + v[l ^ o];
        for (int l = 0; l < NT; l++) v[l] = w[l];
    }
}

/* The lanes' registers of one block. */
typedef struct {
    float acc[NT][4 * FPT_AB_MAXU], acc2[NT][4 * FPT_AB_MAXU];
    float s[NT][FPT_AB_MAXC], dp[NT][FPT_AB_MAXC];
    float m[NT], l[NT], part[NT];
    int64_t lo[NT], hi[NT];
} ab_lanes;

/* The shared memory and registers of kernel `kind` for heads of d dims, or 0 (too wide, or
 * out of memory; the caller reports it). */
static float *ab_setup(int kind, int64_t d, fpt_ab_tiles *t, ab_lanes **regs) {
    int64_t rows, cols;
    if (fpt_attn_plan(kind, d, &rows, &cols) == 0) return 0;
    *t = fpt_ab_tiles_of(rows, cols, d);
    *regs = (ab_lanes *)calloc(1, sizeof(ab_lanes));
    float *smem = (float *)calloc((size_t)fpt_ab_smem_floats(kind, *t), sizeof(float));
    if (!*regs || !smem) {
        free(*regs);
        free(smem);
        return 0;
    }
    return smem;
}

int64_t fpt_host_attn_plan(int32_t kind, int64_t d, int64_t *rows, int64_t *cols) {
    return fpt_attn_plan(kind, d, rows, cols);
}

/* fpt_attn_fwd_f32 over the host grid; returns 0, or 1 when the head is too wide or
 * scratch memory ran out. */
int fpt_host_attn_fwd_f32(const float *q, const float *k, const float *v, float *o, float *lse,
                          const uint32_t *keylen, const fpt_attn_geom *gp) {
    const fpt_attn_geom g = *gp;
    fpt_ab_tiles t;
    ab_lanes *x;
    float *smem = ab_setup(FPT_AB_FWD, g.d, &t, &x);
    if (!smem) return 1;
    float *sq = smem, *sk = sq + t.rows * t.ld, *sv = sk + t.cols * t.ld, *sw = sv + t.cols * t.ld;
    const int tpr = (int)t.tpr;
    const int64_t blocks = g.batch * g.heads * ((g.tq + t.rows - 1) / t.rows);
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t b, h, i0, nv, blo, bhi, y;
        fpt_ab_locate(&g, blk, g.tq, t.rows, &b, &h, &i0, &nv);
        for (int l = 0; l < NT; l++) {
            x->lo[l] = x->hi[l] = 0;
            if (l / tpr < nv) fpt_attn_keys(&g, keylen, b, i0 + l / tpr, &x->lo[l], &x->hi[l]);
            x->m[l] = -INFINITY;
            x->l[l] = 0.0f;
            for (int u = 0; u < 4 * FPT_AB_MAXU; u++) x->acc[l][u] = 0.0f;
        }
        fpt_attn_keys(&g, keylen, b, i0, &blo, &y);
        fpt_attn_keys(&g, keylen, b, i0 + nv - 1, &y, &bhi);
        const uint32_t key = fpt_attn_bkey(&g, b, h);
        for (int l = 0; l < NT; l++)
            fpt_ab_load(sq, q + b * g.tq * g.sq + h * g.d, g.sq, i0, nv, t.rows, g.d, t.ld, l, NT);
        for (int64_t j0 = blo; j0 < bhi; j0 += t.cols) {
            int64_t nk = g.tk - j0 < t.cols ? g.tk - j0 : t.cols;
            for (int l = 0; l < NT; l++) {
                fpt_ab_load(sk, k + b * g.tk * g.sk + h * g.d, g.sk, j0, nk, t.cols, g.d, t.ld, l, NT);
                fpt_ab_load(sv, v + b * g.tk * g.sv + h * g.d, g.sv, j0, nk, t.cols, g.d, t.ld, l, NT);
            }
            float mx[NT], ps[NT], alpha[NT];
            for (int l = 0; l < NT; l++)
                mx[l] = fpt_ab_fwd_scores(sq + (l / tpr) * t.ld, sk, t, l % tpr, j0, x->lo[l], x->hi[l],
                                          (float)g.scale, x->s[l]);
            ab_group(mx, tpr, 1);
            for (int l = 0; l < NT; l++) {
                float mn = fmaxf(x->m[l], mx[l]);
                alpha[l] = mn == -INFINITY ? 1.0f : expf(x->m[l] - mn);
                ps[l] = fpt_ab_fwd_probs(&g, key, x->s[l], mn, t, l % tpr, i0 + l / tpr, j0,
                                         sw + (l / tpr) * (t.cols + 1));
                x->m[l] = mn;
            }
            ab_group(ps, tpr, 0);
            for (int l = 0; l < NT; l++) {
                x->l[l] = x->l[l] * alpha[l] + ps[l];
                fpt_ab_acc(x->acc[l], alpha[l], sw + (l / tpr) * (t.cols + 1), sv, t, l % tpr);
            }
        }
        for (int l = 0; l < NT; l++) {
            int r = l / tpr;
            if (r >= nv) continue;
            int64_t i = i0 + r;
            float ll = x->l[l];
            fpt_ab_store(o + (b * g.tq + i) * g.so + h * g.d, x->acc[l], ll > 0.0f ? 1.0f / ll : 0.0f, t, g.d, l % tpr);
            if (l % tpr == 0) lse[(b * g.heads + h) * g.tq + i] = ll > 0.0f ? x->m[l] + logf(ll) : -INFINITY;
        }
    }
    free(smem);
    free(x);
    return 0;
}

/* fpt_attn_bwd_q_f32 then fpt_attn_bwd_kv_f32 over the host grid; returns 0, or 1 when
 * the head is too wide or scratch memory ran out. */
int fpt_host_attn_bwd_f32(const float *q, const float *k, const float *v, const float *o, const float *dout,
                          const float *lse, float *dd, float *dq, float *dk, float *dv, const uint32_t *keylen,
                          const fpt_attn_geom *gp) {
    const fpt_attn_geom g = *gp;
    fpt_ab_tiles t;
    ab_lanes *x;
    float *smem = ab_setup(FPT_AB_BWD_Q, g.d, &t, &x);
    if (!smem) return 1;
    float *sq = smem, *sg = sq + t.rows * t.ld, *sk = sg + t.rows * t.ld, *sv = sk + t.cols * t.ld;
    float *sw = sv + t.cols * t.ld;
    int tpr = (int)t.tpr;
    int64_t blocks = g.batch * g.heads * ((g.tq + t.rows - 1) / t.rows);
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t b, h, i0, nv, blo, bhi, y;
        fpt_ab_locate(&g, blk, g.tq, t.rows, &b, &h, &i0, &nv);
        float rl[NT];
        for (int l = 0; l < NT; l++) {
            int r = l / tpr;
            int64_t i = i0 + r;
            x->lo[l] = x->hi[l] = 0;
            x->part[l] = 0.0f;
            if (r < nv) {
                fpt_attn_keys(&g, keylen, b, i, &x->lo[l], &x->hi[l]);
                int64_t off = (b * g.tq + i) * g.so + h * g.d;
                x->part[l] = fpt_ab_rowdot(dout + off, o + off, t, g.d, l % tpr);
            }
            rl[l] = r < nv ? lse[(b * g.heads + h) * g.tq + i] : -INFINITY;
            for (int u = 0; u < 4 * FPT_AB_MAXU; u++) x->acc[l][u] = 0.0f;
        }
        ab_group(x->part, tpr, 0);
        fpt_attn_keys(&g, keylen, b, i0, &blo, &y);
        fpt_attn_keys(&g, keylen, b, i0 + nv - 1, &y, &bhi);
        const uint32_t key = fpt_attn_bkey(&g, b, h);
        for (int l = 0; l < NT; l++) {
            fpt_ab_load(sq, q + b * g.tq * g.sq + h * g.d, g.sq, i0, nv, t.rows, g.d, t.ld, l, NT);
            fpt_ab_load(sg, dout + b * g.tq * g.so + h * g.d, g.so, i0, nv, t.rows, g.d, t.ld, l, NT);
        }
        for (int64_t j0 = blo; j0 < bhi; j0 += t.cols) {
            int64_t nk = g.tk - j0 < t.cols ? g.tk - j0 : t.cols;
            for (int l = 0; l < NT; l++) {
                fpt_ab_load(sk, k + b * g.tk * g.sk + h * g.d, g.sk, j0, nk, t.cols, g.d, t.ld, l, NT);
                fpt_ab_load(sv, v + b * g.tk * g.sv + h * g.d, g.sv, j0, nk, t.cols, g.d, t.ld, l, NT);
            }
            for (int l = 0; l < NT; l++) {
                int r = l / tpr, sub = l % tpr;
                fpt_ab_dots(sq + r * t.ld, sk, t, sub, x->s[l]);
                fpt_ab_dots(sg + r * t.ld, sv, t, sub, x->dp[l]);
                fpt_ab_q_weights(&g, key, x->s[l], x->dp[l], t, sub, i0 + r, j0, x->lo[l], x->hi[l], rl[l], x->part[l],
                                 sw + r * (t.cols + 1));
            }
            for (int l = 0; l < NT; l++) fpt_ab_acc(x->acc[l], 1.0f, sw + (l / tpr) * (t.cols + 1), sk, t, l % tpr);
        }
        for (int l = 0; l < NT; l++) {
            int r = l / tpr;
            if (r >= nv) continue;
            int64_t i = i0 + r;
            fpt_ab_store(dq + (b * g.tq + i) * g.sg + h * g.d, x->acc[l], 1.0f, t, g.d, l % tpr);
            if (l % tpr == 0) dd[(b * g.heads + h) * g.tq + i] = x->part[l];
        }
    }
    free(smem);
    free(x);

    smem = ab_setup(FPT_AB_BWD_KV, g.d, &t, &x);
    if (!smem) return 1;
    float *skk = smem, *svv = skk + t.rows * t.ld;
    sq = svv + t.rows * t.ld;
    sg = sq + t.cols * t.ld;
    float *sp = sg + t.cols * t.ld, *ss = sp + t.rows * (t.cols + 1), *sl = ss + t.rows * (t.cols + 1);
    float *sd = sl + t.cols;
    int32_t *ql = (int32_t *)(sd + t.cols), *qh = ql + t.cols;
    tpr = (int)t.tpr;
    blocks = g.batch * g.heads * ((g.tk + t.rows - 1) / t.rows);
    for (int64_t blk = 0; blk < blocks; blk++) {
        int64_t b, h, j0, nv, blo, bhi, y;
        fpt_ab_locate(&g, blk, g.tk, t.rows, &b, &h, &j0, &nv);
        fpt_attn_queries(&g, j0, &blo, &y);
        fpt_attn_queries(&g, j0 + nv - 1, &y, &bhi);
        const uint32_t key = fpt_attn_bkey(&g, b, h);
        for (int l = 0; l < NT; l++) {
            fpt_ab_load(skk, k + b * g.tk * g.sk + h * g.d, g.sk, j0, nv, t.rows, g.d, t.ld, l, NT);
            fpt_ab_load(svv, v + b * g.tk * g.sv + h * g.d, g.sv, j0, nv, t.rows, g.d, t.ld, l, NT);
            for (int u = 0; u < 4 * FPT_AB_MAXU; u++) x->acc[l][u] = x->acc2[l][u] = 0.0f;
        }
        for (int64_t i0 = blo; i0 < bhi; i0 += t.cols) {
            int64_t nq = g.tq - i0 < t.cols ? g.tq - i0 : t.cols;
            for (int l = 0; l < NT; l++) {
                fpt_ab_load(sq, q + b * g.tq * g.sq + h * g.d, g.sq, i0, nq, t.cols, g.d, t.ld, l, NT);
                fpt_ab_load(sg, dout + b * g.tq * g.so + h * g.d, g.so, i0, nq, t.cols, g.d, t.ld, l, NT);
                fpt_ab_kv_columns(&g, keylen, lse, dd, b, h, i0, nq, t.cols, sl, sd, ql, qh, l, NT);
            }
            for (int l = 0; l < NT; l++) {
                int r = l / tpr, sub = l % tpr;
                fpt_ab_dots(skk + r * t.ld, sq, t, sub, x->s[l]);
                fpt_ab_dots(svv + r * t.ld, sg, t, sub, x->dp[l]);
                fpt_ab_kv_weights(&g, key, x->s[l], x->dp[l], t, sub, r < nv ? j0 + r : -1, i0, nq, sl, sd, ql, qh,
                                  sp + r * (t.cols + 1), ss + r * (t.cols + 1));
            }
            for (int l = 0; l < NT; l++) {
                int r = l / tpr, sub = l % tpr;
                fpt_ab_acc(x->acc2[l], 1.0f, sp + r * (t.cols + 1), sg, t, sub);
                fpt_ab_acc(x->acc[l], 1.0f, ss + r * (t.cols + 1), sq, t, sub);
            }
        }
        for (int l = 0; l < NT; l++) {
            int r = l / tpr;
            if (r >= nv) continue;
            int64_t j = j0 + r;
            fpt_ab_store(dk + (b * g.tk + j) * g.sg + h * g.d, x->acc[l], 1.0f, t, g.d, l % tpr);
            fpt_ab_store(dv + (b * g.tk + j) * g.sg + h * g.d, x->acc2[l], 1.0f, t, g.d, l % tpr);
        }
    }
    free(smem);
    free(x);
    return 0;
}

#undef NT

void fpt_host_step_gate(const double *loss, const double *norm, double *state) { fpt_step_gate(*loss, *norm, state); }

int fpt_host_gate_coefs(const double *state, const float *table, float *step_size, float *inv_sqrt_bc2) {
    return fpt_gate_coefs(state, table, step_size, inv_sqrt_bc2);
}

/* ---- the layer-norm LSTM (fpt_lstm.h): one block of FPT_LSTM_THREADS lanes per row ---- */

#include "fpt_lstm.h"

#define NT FPT_LSTM_THREADS

/* fpt_kernels.cu's fpt_block_sum: each warp's butterfly, then the warps' sums in order. */
static float lstm_block_sum(float v[NT]) {
    float s = 0.0f;
    for (int w = 0; w < NT / LANES; w++) {
        butterfly_sum(v + w * LANES);
        s += v[w * LANES];
    }
    return s;
}

/* A scratch block of n floats, or 0 (the caller reports it). */
static float *lstm_scratch(int64_t n) { return (float *)calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

/* fpt_lstm_fwd_f32 over the host grid; returns 0, or 1 when scratch memory ran out. */
int fpt_host_lstm_fwd_f32(const float *xi, const float *wt, const float *wb, const float *ln, const float *h0,
                          const float *c0, const float *masks, const uint64_t *seeds, uint64_t block, int32_t thr,
                          float keep, float *y, float *saved, int64_t batch, int64_t t, int64_t hs, float eps) {
    const fpt_lstm_drop drop = {masks, seeds, block, thr, keep, batch};
    const int64_t g4 = 4 * hs;
    float *mem = lstm_scratch(7 * hs);
    if (!mem) return 1;
    float *h = mem, *c = h + hs, *r = c + hs, *cp = r + g4;
    float part[NT];
    for (int64_t b = 0; b < batch; b++) {
        for (int l = 0; l < NT; l++) fpt_lstm_lane_init(h0 + b * hs, c0 + b * hs, h, c, hs, l, NT);
        for (int64_t s = 0; s < t; s++) {
            fpt_lstm_rows k = fpt_lstm_saved_at(saved, t, batch, hs, s, b);
            for (int l = 0; l < NT; l++) fpt_lstm_lane_save(h, c, k.hprev, k.cprev, hs, l, NT);
            for (int l = 0; l < NT; l++) part[l] = fpt_lstm_lane_rec(h, wt, wb, r, hs, l, NT);
            float mean = lstm_block_sum(part) / (float)g4;
            for (int l = 0; l < NT; l++) part[l] = fpt_norm_lane_sqdev(r, g4, mean, l, NT);
            float rstd = 1.0f / sqrtf(lstm_block_sum(part) / (float)(g4 - 1) + eps);
            *k.rrstd = rstd;
            for (int l = 0; l < NT; l++)
                fpt_lstm_lane_gates(r, xi + (b * t + s) * g4, ln, ln + g4, k.rhat, k.gates, hs, mean, rstd, l, NT);
            for (int l = 0; l < NT; l++) part[l] = fpt_lstm_lane_cell(k.gates, c, cp, hs, l, NT);
            float cmean = lstm_block_sum(part) / (float)hs;
            for (int l = 0; l < NT; l++) part[l] = fpt_norm_lane_sqdev(cp, hs, cmean, l, NT);
            float crstd = 1.0f / sqrtf(lstm_block_sum(part) / (float)(hs - 1) + eps);
            *k.crstd = crstd;
            for (int l = 0; l < NT; l++)
                fpt_lstm_lane_out(cp, k.gates, ln + 2 * g4, ln + 2 * g4 + hs, drop, s, b, k.chat, k.tc, c, h,
                                  y + (b * t + s) * hs, hs, cmean, crstd, l, NT);
        }
    }
    free(mem);
    return 0;
}

/* fpt_lstm_bwd_f32 over the host grid; returns 0, or 1 when scratch memory ran out. */
int fpt_host_lstm_bwd_f32(const float *dy, const float *wb, const float *ln, const float *masks,
                          const uint64_t *seeds, uint64_t block, int32_t thr, float keep, const float *saved,
                          float *dxi, float *part, float *dr, float *hout, int64_t batch, int64_t t, int64_t hs) {
    const fpt_lstm_drop drop = {masks, seeds, block, thr, keep, batch};
    const int64_t g4 = 4 * hs;
    float *mem = lstm_scratch(7 * hs);
    if (!mem) return 1;
    float *dh = mem, *dc = dh + hs, *d = dc + hs, *drr = d + hs;
    float pa[NT], pq[NT];
    for (int64_t b = 0; b < batch; b++) {
        float *pr = part + b * 14 * hs;
        for (int64_t j = 0; j < hs; j++) dh[j] = dc[j] = 0.0f;
        for (int64_t j = 0; j < 14 * hs; j++) pr[j] = 0.0f;
        for (int64_t s = t - 1; s >= 0; s--) {
            fpt_lstm_rows k = fpt_lstm_saved_at((float *)saved, t, batch, hs, s, b);
            float *dpre = dxi + (b * t + s) * g4;
            for (int l = 0; l < NT; l++)
                fpt_lstm_lane_bwd_out(dy + (b * t + s) * hs, dh, dc, drop, s, b, k.gates, k.tc, k.chat, ln + 2 * g4, dpre, d,
                                      pr + 2 * g4, pr + 2 * g4 + hs, hs, l, NT, &pa[l], &pq[l]);
            float mean_d = lstm_block_sum(pa) / (float)hs;
            float dot = lstm_block_sum(pq) / (float)(hs - 1);
            for (int l = 0; l < NT; l++)
                fpt_lstm_lane_bwd_cell(d, k.chat, *k.crstd, mean_d, dot, k.gates, k.cprev, dpre, dc, hs, l, NT);
            for (int l = 0; l < NT; l++)
                fpt_lstm_lane_bwd_rec(dpre, k.rhat, ln, drr, pr, pr + g4, hs, l, NT, &pa[l], &pq[l]);
            float mr = lstm_block_sum(pa) / (float)g4;
            float rdot = lstm_block_sum(pq) / (float)(g4 - 1);
            for (int l = 0; l < NT; l++)
                fpt_lstm_lane_bwd_rnorm(drr, k.rhat, *k.rrstd, mr, rdot, dr ? dr + (s * batch + b) * g4 : 0,
                                        pr + 10 * hs, hs, l, NT);
            if (dr)
                for (int64_t j = 0; j < hs; j++) hout[(s * batch + b) * hs + j] = k.hprev[j];
            for (int l = 0; l < NT; l++) fpt_lstm_lane_bwd_dh(drr, wb, dh, hs, l, NT);
        }
    }
    free(mem);
    return 0;
}

/* Attention tiled in blocks (src/ops/attention_tiled.rs has the op around these bodies), as
 * plain C99 compiled twice like fpt_ops.h: by nvcc into fpt_kernels.cu's three kernels and
 * by the host C compiler into host_grid.c, which drives them over the same block of lanes.
 *
 * One block of FPT_AB_THREADS lanes owns a tile of R rows of one (example, head): R query
 * rows (forward, and the backward's dQ pass) or R key rows (the dK, dV pass). It keeps
 * them in shared memory and walks the other side a tile of C rows at a time, each tile
 * loaded once into shared memory and used by all R rows: the reuse that a warp per row
 * (the first version, 5.5x slower than cuBLAS's products on an H100) never had. The lanes
 * of a row are tpr = FPT_AB_THREADS / R consecutive lanes of one warp; each owns the
 * columns sub, sub + tpr, ... of the inner tile (nc = C / tpr of them) and the head's
 * 4-float chunks sub, sub + tpr, ... of the row's accumulators. A row's lanes meet in
 * shuffles within their group (host_grid.c: the same butterfly), so a row's phases need no
 * block barrier; the tiles' loads do.
 *
 * Shared rows hold ld = 4 * ceil(d / 4) + 4 floats: the head's chunks read as float4, zeros
 * past d, and 4 more so that rows c and c + 1 start 16 bytes apart in the banks.
 *
 * Geometry (fpt_attn_geom), masks, padding and dropout are fpt_ops.h's: the forward keeps
 * each query row's log-sum-exp; the backward recomputes P = exp(scale q.k - lse), a first
 * pass per query tile (D = dO . O and dQ), a second per key tile (dK and dV), so nothing is
 * accumulated across blocks (no atomics; the gradients are deterministic). */
#ifndef FPT_ATTN_H
#define FPT_ATTN_H

#include "fpt_ops.h"

/* Lanes per block (the host grid simulates exactly this many). */
#define FPT_AB_THREADS 256
/* Inner-tile columns per lane, and 4-float head chunks per lane, at most. */
#define FPT_AB_MAXC 16
#define FPT_AB_MAXU 4
/* The static shared memory a block may use without opting in. */
#define FPT_AB_SMEM 49152

/* The three kernels, for fpt_attn_plan. */
#define FPT_AB_FWD 0
#define FPT_AB_BWD_Q 1
#define FPT_AB_BWD_KV 2

#ifdef __CUDACC__
typedef float4 fpt_f4;
#else
typedef struct {
    float x, y, z, w;
} fpt_f4;
#endif

/* A kernel's tiles: R own rows, inner tiles of C, lanes per row, columns per lane, the
 * shared row's floats and 4-float chunks of the head. */
typedef struct {
    int64_t rows, cols, tpr, nc, ld, d4;
} fpt_ab_tiles;

FPT_HD fpt_ab_tiles fpt_ab_tiles_of(int64_t rows, int64_t cols, int64_t d) {
    fpt_ab_tiles t;
    t.rows = rows;
    t.cols = cols;
    t.tpr = FPT_AB_THREADS / rows;
    t.nc = cols / t.tpr;
    t.d4 = (d + 3) / 4;
    t.ld = 4 * t.d4 + 4;
    return t;
}

/* The floats of shared memory `kind` takes with tiles t (the layouts the kernels cut). */
FPT_HD int64_t fpt_ab_smem_floats(int kind, fpt_ab_tiles t) {
    int64_t own = t.rows * t.ld, inner = t.cols * t.ld, w = t.rows * (t.cols + 1);
    if (kind == FPT_AB_FWD) return own + 2 * inner + w;
    if (kind == FPT_AB_BWD_Q) return 2 * own + 2 * inner + w;
    return 2 * own + 2 * inner + 2 * w + 4 * t.cols;
}

/* The tiles of `kind` for heads of d dims: the largest of (64, 64), (64, 32), (32, 32),
 * (32, 16), (16, 16) whose lanes can hold the head and whose shared memory fits. Returns
 * the bytes of shared memory, or 0 when none fits (d too wide). */
FPT_HD int64_t fpt_attn_plan(int kind, int64_t d, int64_t *rows, int64_t *cols) {
    const int64_t cand[5][2] = {{64, 64}, {64, 32}, {32, 32}, {32, 16}, {16, 16}};
    for (int c = 0; c < 5; c++) {
        fpt_ab_tiles t = fpt_ab_tiles_of(cand[c][0], cand[c][1], d);
        int64_t bytes = 4 * fpt_ab_smem_floats(kind, t);
        if (d >= 1 && t.d4 <= FPT_AB_MAXU * t.tpr && t.nc <= FPT_AB_MAXC && bytes <= FPT_AB_SMEM) {
            *rows = t.rows;
            *cols = t.cols;
            return bytes;
        }
    }
    return 0;
}

/* The 32-bit key of (example b, head h)'s block of the dropout mask: every element of a
 * block's tile shares it, so it is drawn once a tile, not once an element. */
FPT_HD uint32_t fpt_attn_bkey(const fpt_attn_geom *g, int64_t b, int64_t h) {
    return g->thr > 0 ? fpt_block_key(g->seed, (uint64_t)(b * g->heads + h)) : 0u;
}

/* The dropout multiplier of element `idx` (i * tk + j, modulo 2^32) of the block keyed
 * `key`: fpt_dropout_mult with the key drawn; 1 when off. */
FPT_HD float fpt_attn_mult_at(const fpt_attn_geom *g, uint32_t key, uint32_t idx) {
    if (g->thr <= 0) return 1.0f;
    uint32_t x = fpt_mask_hash(key, idx);
    return ((int32_t)(x >> 8) < (int32_t)g->thr) ? 0.0f : (float)g->keep;
}

/* The dropout multiplier of (query i, key j) in the tile of the block keyed `key`: element
 * i * tk + j of its block of the mask. */
FPT_HD float fpt_attn_mult_k(const fpt_attn_geom *g, uint32_t key, int64_t i, int64_t j) {
    return fpt_attn_mult_at(g, key, (uint32_t)(i * g->tk + j));
}

/* Lane's share of loading rows row0 .. row0 + n (of which `valid` exist) of an operand's
 * head into shared rows of ld floats: element e of row x at src[x * stride + e], zeros
 * past the valid rows and past d. A warp a row (its 32 lanes along the row, coalesced), no
 * division per element; nl is a multiple of 32. */
FPT_HD void fpt_ab_load(float *dst, const float *src, int64_t stride, int64_t row0, int64_t valid, int64_t n, int64_t d,
                        int64_t ld, int lane, int nl) {
    const int w = lane / 32, nw = nl / 32, l = lane % 32;
    for (int64_t rr = w; rr < n; rr += nw) {
        float *o = dst + rr * ld;
        if (rr < valid) {
            const float *r = src + (row0 + rr) * stride;
            for (int64_t e = l; e < ld; e += 32) o[e] = e < d ? r[e] : 0.0f;
        } else {
            for (int64_t e = l; e < ld; e += 32) o[e] = 0.0f;
        }
    }
}

/* s[k] = a . rows[sub + tpr k] over the head (a, rows: shared rows of t.ld) for the lane's
 * t.nc columns. */
FPT_HD void fpt_ab_dots(const float *a, const float *rows, fpt_ab_tiles t, int sub, float *s) {
    const fpt_f4 *a4 = (const fpt_f4 *)a;
    for (int k = 0; k < FPT_AB_MAXC; k++) s[k] = 0.0f;
    for (int64_t c = 0; c < t.d4; c++) {
        fpt_f4 p = a4[c];
        for (int k = 0; k < FPT_AB_MAXC; k++) {
            if (k < t.nc) {
                fpt_f4 q = ((const fpt_f4 *)(rows + (sub + t.tpr * k) * t.ld))[c];
                s[k] += p.x * q.x + p.y * q.y + p.z * q.z + p.w * q.w;
            }
        }
    }
}

/* acc (the lane's chunks of one row's accumulator) = acc * alpha + sum over the inner
 * tile's t.cols rows c of w[c] * rows[c]. */
FPT_HD void fpt_ab_acc(float *acc, float alpha, const float *w, const float *rows, fpt_ab_tiles t, int sub) {
    for (int u = 0; u < FPT_AB_MAXU; u++) {
        int64_t u4 = sub + t.tpr * u;
        if (u4 >= t.d4) continue;
        fpt_f4 a = {acc[4 * u] * alpha, acc[4 * u + 1] * alpha, acc[4 * u + 2] * alpha, acc[4 * u + 3] * alpha};
        for (int64_t c = 0; c < t.cols; c++) {
            fpt_f4 x = ((const fpt_f4 *)(rows + c * t.ld))[u4];
            float wc = w[c];
            a.x += wc * x.x;
            a.y += wc * x.y;
            a.z += wc * x.z;
            a.w += wc * x.w;
        }
        acc[4 * u] = a.x;
        acc[4 * u + 1] = a.y;
        acc[4 * u + 2] = a.z;
        acc[4 * u + 3] = a.w;
    }
}

/* Writes the lane's chunks of a row's accumulator times `mul` to dst (d values). */
FPT_HD void fpt_ab_store(float *dst, const float *acc, float mul, fpt_ab_tiles t, int64_t d, int sub) {
    for (int u = 0; u < FPT_AB_MAXU; u++) {
        int64_t u4 = sub + t.tpr * u;
        for (int x = 0; x < 4; x++)
            if (u4 < t.d4 && 4 * u4 + x < d) dst[4 * u4 + x] = acc[4 * u + x] * mul;
    }
}

/* The lane's part of D = dO . O for one row (global memory, d values each). */
FPT_HD float fpt_ab_rowdot(const float *a, const float *b, fpt_ab_tiles t, int64_t d, int sub) {
    float s = 0.0f;
    for (int64_t e = sub; e < d; e += t.tpr) s += a[e] * b[e];
    return s;
}

/* Where block `blk` of a kernel over R-row tiles of `n` rows lies: example, head, first row
 * and its valid rows. */
FPT_HD void fpt_ab_locate(const fpt_attn_geom *g, int64_t blk, int64_t n, int64_t rows, int64_t *b, int64_t *h,
                          int64_t *r0, int64_t *valid) {
    int64_t tiles = (n + rows - 1) / rows;
    int64_t bh = blk / tiles;
    *r0 = (blk - bh * tiles) * rows;
    *b = bh / g->heads;
    *h = bh - *b * g->heads;
    *valid = n - *r0 < rows ? n - *r0 : rows;
}

/* ---- the forward: a tile of query rows ------------------------------------------------ */

/* The lane's scores of query i against key tile j0 (-inf where i does not see key j, i
 * outside [lo, hi)); returns their maximum. */
FPT_HD float fpt_ab_fwd_scores(const float *qrow, const float *keys, fpt_ab_tiles t, int sub, int64_t j0, int64_t lo,
                               int64_t hi, float scale, float *s) {
    fpt_ab_dots(qrow, keys, t, sub, s);
    float m = -INFINITY;
    for (int k = 0; k < FPT_AB_MAXC; k++) {
        int64_t j = j0 + sub + t.tpr * k;
        s[k] = (k < t.nc && j >= lo && j < hi) ? s[k] * scale : -INFINITY;
        m = fmaxf(m, s[k]);
    }
    return m;
}

/* The lane's probabilities exp(s - mn) (0 where masked): their dropped-out values to the
 * row's weights w, their sum (before dropout: the softmax's denominator) returned. */
FPT_HD float fpt_ab_fwd_probs(const fpt_attn_geom *g, uint32_t key, const float *s, float mn, fpt_ab_tiles t, int sub,
                              int64_t i, int64_t j0, float *w) {
    float sum = 0.0f;
    for (int k = 0; k < FPT_AB_MAXC; k++) {
        if (k >= t.nc) continue;
        int64_t c = sub + t.tpr * k;
        float p = s[k] == -INFINITY ? 0.0f : expf(s[k] - mn);
        sum += p;
        w[c] = p == 0.0f ? 0.0f : p * fpt_attn_mult_k(g, key, i, j0 + c);
    }
    return sum;
}

/* ---- the backward ---------------------------------------------------------------------- */

/* The pair (query i, key j)'s P M (what multiplies dO into dV) in *pd and dS = scale P (dP
 * M - D) in *ds, from the score s = q.k (unscaled), dp = dO.V, the row's lse and D; _m with
 * the pair's dropout multiplier m already drawn. */
FPT_HD void fpt_ab_pair_m(const fpt_attn_geom *g, float m, float s, float dp, float lse, float dd, float *pd,
                          float *ds) {
    float p = expf(s * (float)g->scale - lse);
    *pd = p * m;
    *ds = p * (dp * m - dd) * (float)g->scale;
}

FPT_HD void fpt_ab_pair(const fpt_attn_geom *g, uint32_t key, float s, float dp, float lse, float dd, int64_t i,
                        int64_t j, float *pd, float *ds) {
    fpt_ab_pair_m(g, fpt_attn_mult_k(g, key, i, j), s, dp, lse, dd, pd, ds);
}

/* dQ pass: the lane's dS of query i (range lo..hi, lse, D) against key tile j0 into w. */
FPT_HD void fpt_ab_q_weights(const fpt_attn_geom *g, uint32_t key, const float *s, const float *dp, fpt_ab_tiles t,
                             int sub, int64_t i, int64_t j0, int64_t lo, int64_t hi, float lse, float dd, float *w) {
    for (int k = 0; k < FPT_AB_MAXC; k++) {
        if (k >= t.nc) continue;
        int64_t c = sub + t.tpr * k, j = j0 + c;
        float pd = 0.0f, ds = 0.0f;
        if (j >= lo && j < hi && lse != -INFINITY) fpt_ab_pair(g, key, s[k], dp[k], lse, dd, i, j, &pd, &ds);
        w[c] = ds;
    }
}

/* dK, dV pass: key j against query tile i0 (per column: lse, D, the query's key range in
 * ql, qh; nq valid queries): the lane's P M into wp, dS into ws. */
FPT_HD void fpt_ab_kv_weights(const fpt_attn_geom *g, uint32_t key, const float *s, const float *dp, fpt_ab_tiles t,
                              int sub, int64_t j, int64_t i0, int64_t nq, const float *lse, const float *dd,
                              const int32_t *ql, const int32_t *qh, float *wp, float *ws) {
    for (int k = 0; k < FPT_AB_MAXC; k++) {
        if (k >= t.nc) continue;
        int64_t c = sub + t.tpr * k;
        float pd = 0.0f, ds = 0.0f;
        if (c < nq && j >= ql[c] && j < qh[c] && lse[c] != -INFINITY)
            fpt_ab_pair(g, key, s[k], dp[k], lse[c], dd[c], i0 + c, j, &pd, &ds);
        wp[c] = pd;
        ws[c] = ds;
    }
}

/* dK, dV pass: the query tile's per-column values (lse, D, key range; -inf past the
 * valid queries), lane's share. */
FPT_HD void fpt_ab_kv_columns(const fpt_attn_geom *g, const uint32_t *keylen, const float *lse, const float *dd,
                              int64_t b, int64_t h, int64_t i0, int64_t nq, int64_t cols, float *sl, float *sd,
                              int32_t *ql, int32_t *qh, int lane, int nl) {
    for (int64_t c = lane; c < cols; c += nl) {
        int64_t lo = 0, hi = 0;
        if (c < nq) fpt_attn_keys(g, keylen, b, i0 + c, &lo, &hi);
        int64_t r = (b * g->heads + h) * g->tq + i0 + c;
        sl[c] = c < nq ? lse[r] : -INFINITY;
        sd[c] = c < nq ? dd[r] : 0.0f;
        ql[c] = (int32_t)lo;
        qh[c] = (int32_t)hi;
    }
}

#endif

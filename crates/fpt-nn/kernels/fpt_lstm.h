/* The layer-norm LSTM's recurrence (src/ops/lstm.rs has the arithmetic and the CPU's fused
 * kernel; src/ops/lstm_grid.rs the op around these bodies), as plain C99 compiled twice
 * like fpt_ops.h: by nvcc into fpt_kernels.cu's two kernels and by the host C compiler
 * into host_grid.c, which drives them over the same block of lanes.
 *
 * A batch row's steps depend on that row only, so one block of FPT_LSTM_THREADS lanes runs
 * one row's whole recurrence, step after step, in one launch (forward) and one more
 * (backward): no launch per step. Each phase below is one lane's share: the lanes own
 * columns j = lane, lane + nl, ... of the phase's row (4H wide or H wide). Phases meet at
 * block-wide sums (fpt_kernels.cu: warp shuffles, then the warps' sums in order;
 * host_grid.c: the same order) and barriers.
 *
 * What forward keeps for backward lies in one buffer of T * B * (12 H + 2) floats, for
 * step s and row b at k = s * B + b (fpt_lstm_saved_at). */
#ifndef FPT_LSTM_H
#define FPT_LSTM_H

#include "fpt_ops.h"

/* Lanes per block (the host grid simulates exactly this many). */
#define FPT_LSTM_THREADS 256

/* One (step, row)'s kept values. */
typedef struct {
    float *hprev; /* H: the state fed to the recurrent product */
    float *cprev; /* H: the cell before the step */
    float *rhat;  /* 4H: LN_h2h's normalised input */
    float *gates; /* 4H: i, f, o (sigmoid), g (tanh) */
    float *chat;  /* H: LN_cell's normalised input */
    float *tc;    /* H: tanh(c') */
    float *rrstd; /* 1: LN_h2h's 1 / sqrt(var + eps) */
    float *crstd; /* 1: LN_cell's */
} fpt_lstm_rows;

FPT_HD fpt_lstm_rows fpt_lstm_saved_at(float *saved, int64_t t, int64_t batch, int64_t hs, int64_t s, int64_t b) {
    int64_t n = t * batch, k = s * batch + b;
    fpt_lstm_rows r;
    r.hprev = saved + k * hs;
    r.cprev = saved + n * hs + k * hs;
    r.rhat = saved + 2 * n * hs + k * 4 * hs;
    r.gates = saved + 6 * n * hs + k * 4 * hs;
    r.chat = saved + 10 * n * hs + k * hs;
    r.tc = saved + 11 * n * hs + k * hs;
    r.rrstd = saved + 12 * n * hs + k;
    r.crstd = saved + 12 * n * hs + n + k;
    return r;
}

/* src/ops/lstm.rs's flush_tiny for one value: below 2^-100 in magnitude, a zero of its sign. */
FPT_HD float fpt_lstm_flush(float x) {
    union {
        float f;
        uint32_t u;
    } v;
    v.f = x;
    if ((v.u & 0x7fffffffu) < (27u << 23)) v.u &= 0x80000000u;
    return v.f;
}

FPT_HD float fpt_lstm_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Where a step's dropout multipliers come from: `mask` ([T, B, H] multipliers) when it is
 * not null, else each step's seed (`seeds[s]`: the step's B H multipliers drawn as
 * src/ops/dropout.rs's dropout_mask_values draws them, in blocks of `block`), else none. */
typedef struct {
    const float *mask;
    const uint64_t *seeds;
    uint64_t block;
    int32_t thr;
    float keep;
    int64_t batch;
} fpt_lstm_drop;

/* The multiplier of column j of row b at step s. */
FPT_HD float fpt_lstm_mult(fpt_lstm_drop d, int64_t hs, int64_t s, int64_t b, int64_t j) {
    if (d.mask) return d.mask[(s * d.batch + b) * hs + j];
    if (d.seeds) return fpt_dropout_mult(d.seeds[s], d.block, (uint64_t)(b * hs + j), d.thr, d.keep);
    return 1.0f;
}

/* Whether any multiplier is applied. */
FPT_HD int fpt_lstm_drops(fpt_lstm_drop d) { return d.mask != 0 || d.seeds != 0; }

/* ---- forward ---------------------------------------------------------------------- */

/* The row's starting state into the block's h and c. */
FPT_HD void fpt_lstm_lane_init(const float *h0, const float *c0, float *h, float *c, int64_t hs, int lane, int nl) {
    for (int64_t j = lane; j < hs; j += nl) {
        h[j] = h0[j];
        c[j] = c0[j];
    }
}

/* Keeps the state the step starts from. */
FPT_HD void fpt_lstm_lane_save(const float *h, const float *c, float *hprev, float *cprev, int64_t hs, int lane,
                               int nl) {
    for (int64_t j = lane; j < hs; j += nl) {
        hprev[j] = h[j];
        cprev[j] = c[j];
    }
}

/* r[j] = sum_p h[p] W_hh[j, p] + b_hh[j] over the lane's columns, with W_hh^T in `wt`
 * ([H, 4H]: a warp's lanes read neighbouring words) and b_hh the last column of `wb`
 * ([4H, H + 1]); returns the sum of the lane's r (LN_h2h's mean). Four of the lane's
 * columns at a time (j, j + nl, j + 2 nl, j + 3 nl: at hidden 256 all four of them), so four
 * independent loads are in flight where one column's chain would wait on each; each column
 * still adds its products in p's order. */
FPT_HD float fpt_lstm_lane_rec(const float *h, const float *wt, const float *wb, float *r, int64_t hs, int lane,
                               int nl) {
    int64_t g4 = 4 * hs;
    float s = 0.0f;
    for (int64_t j = lane; j < g4; j += 4 * (int64_t)nl) {
        int64_t j1 = j + nl, j2 = j + 2 * (int64_t)nl, j3 = j + 3 * (int64_t)nl;
        /* A column past the row reads column j again (in bounds) and is never written. */
        int64_t k1 = j1 < g4 ? j1 : j, k2 = j2 < g4 ? j2 : j, k3 = j3 < g4 ? j3 : j;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        for (int64_t p = 0; p < hs; p++) {
            const float hp = h[p];
            const float *w = wt + p * g4;
            a0 += hp * w[j];
            a1 += hp * w[k1];
            a2 += hp * w[k2];
            a3 += hp * w[k3];
        }
        float acc[4] = {a0, a1, a2, a3};
        int64_t col[4] = {j, j1, j2, j3};
        for (int u = 0; u < 4; u++) {
            if (col[u] >= g4) break;
            float v = acc[u] + wb[col[u] * (hs + 1) + hs];
            r[col[u]] = v;
            s += v;
        }
    }
    return s;
}

/* LN_h2h, the input map's part and the gates: rhat = (r - mean) rstd, pre = x + rhat w + b;
 * sigmoid for i, f, o (the first 3H), tanh for g. */
FPT_HD void fpt_lstm_lane_gates(const float *r, const float *x, const float *lnw, const float *lnb, float *rhat,
                                float *gates, int64_t hs, float mean, float rstd, int lane, int nl) {
    for (int64_t j = lane; j < 4 * hs; j += nl) {
        float rh = (r[j] - mean) * rstd;
        rhat[j] = rh;
        float pre = x[j] + rh * lnw[j] + lnb[j];
        gates[j] = j < 3 * hs ? fpt_lstm_sigmoid(pre) : tanhf(pre);
    }
}

/* The cell before its norm, cp = f c + i g; returns the sum of the lane's values. */
FPT_HD float fpt_lstm_lane_cell(const float *gates, const float *c, float *cp, int64_t hs, int lane, int nl) {
    float s = 0.0f;
    for (int64_t j = lane; j < hs; j += nl) {
        float v = gates[hs + j] * c[j] + gates[j] * gates[3 * hs + j];
        cp[j] = v;
        s += v;
    }
    return s;
}

/* LN_cell and the output: c' = chat w + b, h' = o tanh(c') m (m: step s's dropout
 * multipliers of row b, or none), which is also the next state. */
FPT_HD void fpt_lstm_lane_out(const float *cp, const float *gates, const float *lncw, const float *lncb,
                              fpt_lstm_drop drop, int64_t s, int64_t b, float *chat, float *tc, float *c, float *h,
                              float *y, int64_t hs, float mean, float rstd, int lane, int nl) {
    int drops = fpt_lstm_drops(drop);
    for (int64_t j = lane; j < hs; j += nl) {
        float ch = (cp[j] - mean) * rstd;
        chat[j] = ch;
        float cn = ch * lncw[j] + lncb[j];
        c[j] = cn;
        float th = tanhf(cn);
        tc[j] = th;
        float v = gates[2 * hs + j] * th;
        if (drops) v = v * fpt_lstm_mult(drop, hs, s, b, j);
        h[j] = v;
        y[j] = v;
    }
}

/* ---- backward --------------------------------------------------------------------- */

/* Through h' = o tanh(c') m into c' (the next step's dc added): the output gate's dpre, the
 * row's parts of LN_cell's weight and bias gradients (`dw`, `db`: accumulated over steps),
 * d = dc' w_cell; the lane's sums of d and d * chat (LN_cell's backward). */
FPT_HD void fpt_lstm_lane_bwd_out(const float *dy, const float *dh, const float *dc, fpt_lstm_drop drop, int64_t s,
                                  int64_t row, const float *gates, const float *tc, const float *chat,
                                  const float *lncw, float *dpre, float *d, float *dw, float *db, int64_t hs,
                                  int lane, int nl, float *sum_d, float *sum_dx) {
    int drops = fpt_lstm_drops(drop);
    float a = 0.0f, b = 0.0f;
    for (int64_t j = lane; j < hs; j += nl) {
        float dhraw = dy[j] + dh[j];
        if (drops) dhraw = dhraw * fpt_lstm_mult(drop, hs, s, row, j);
        float o = gates[2 * hs + j];
        dpre[2 * hs + j] = dhraw * tc[j] * o * (1.0f - o);
        float dcn = dc[j] + dhraw * o * (1.0f - tc[j] * tc[j]);
        dw[j] += dcn * chat[j];
        db[j] += dcn;
        float v = dcn * lncw[j];
        d[j] = v;
        a += v;
        b += v * chat[j];
    }
    *sum_d = a;
    *sum_dx = b;
}

/* LN_cell's backward (d becomes d(f c + i g)), then into the gates i, f, g and the cell
 * before the step; every value handed on is flushed below 2^-100. */
FPT_HD void fpt_lstm_lane_bwd_cell(const float *d, const float *chat, float rstd, float mean_d, float dot,
                                   const float *gates, const float *cprev, float *dpre, float *dc, int64_t hs,
                                   int lane, int nl) {
    for (int64_t j = lane; j < hs; j += nl) {
        float dcp = rstd * (d[j] - mean_d - chat[j] * dot);
        float i = gates[j], f = gates[hs + j], g = gates[3 * hs + j];
        dpre[j] = fpt_lstm_flush(dcp * g * i * (1.0f - i));
        dpre[hs + j] = fpt_lstm_flush(dcp * cprev[j] * f * (1.0f - f));
        dpre[2 * hs + j] = fpt_lstm_flush(dpre[2 * hs + j]);
        dpre[3 * hs + j] = fpt_lstm_flush(dcp * i * (1.0f - g * g));
        dc[j] = fpt_lstm_flush(dcp * f);
    }
}

/* Into LN_h2h: the row's parts of its weight and bias gradients, drr = dpre w_h2h; the
 * lane's sums of drr and drr * rhat. */
FPT_HD void fpt_lstm_lane_bwd_rec(const float *dpre, const float *rhat, const float *lnhw, float *drr, float *dw,
                                  float *db, int64_t hs, int lane, int nl, float *sum_d, float *sum_dx) {
    float a = 0.0f, b = 0.0f;
    for (int64_t j = lane; j < 4 * hs; j += nl) {
        dw[j] += dpre[j] * rhat[j];
        db[j] += dpre[j];
        float v = dpre[j] * lnhw[j];
        drr[j] = v;
        a += v;
        b += v * rhat[j];
    }
    *sum_d = a;
    *sum_dx = b;
}

/* LN_h2h's backward: dr = rstd (drr - mean - rhat dot), flushed; kept in `dr` (null: not
 * kept) for W_hh's gradient, and added into the row's part of b_hh's (`dbhh`). */
FPT_HD void fpt_lstm_lane_bwd_rnorm(float *drr, const float *rhat, float rstd, float mean_d, float dot, float *dr,
                                    float *dbhh, int64_t hs, int lane, int nl) {
    for (int64_t j = lane; j < 4 * hs; j += nl) {
        float v = fpt_lstm_flush(rstd * (drr[j] - mean_d - rhat[j] * dot));
        drr[j] = v;
        if (dr) dr[j] = v;
        dbhh[j] += v;
    }
}

/* The state's gradient for the step before: dh[p] = sum_j dr[j] W_hh[j, p] (`wb` is
 * [W_hh | b_hh], rows H + 1 apart: a warp's lanes read neighbouring words), flushed. The
 * sum runs as four interleaved partial sums (j = 0, 1, 2, 3 mod 4, then added in that
 * order), four loads in flight at a time. */
FPT_HD void fpt_lstm_lane_bwd_dh(const float *drr, const float *wb, float *dh, int64_t hs, int lane, int nl) {
    const int64_t g4 = 4 * hs, ld = hs + 1;
    for (int64_t p = lane; p < hs; p += nl) {
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        for (int64_t j = 0; j < g4; j += 4) {
            a0 += drr[j] * wb[j * ld + p];
            a1 += drr[j + 1] * wb[(j + 1) * ld + p];
            a2 += drr[j + 2] * wb[(j + 2) * ld + p];
            a3 += drr[j + 3] * wb[(j + 3) * ld + p];
        }
        dh[p] = fpt_lstm_flush(((a0 + a1) + a2) + a3);
    }
}

#endif

/* The three bodies of fpt_attn_mma.h for heads of up to FPT_MB_DK dims, each product in
 * FPT_MB_TERMS TF32 terms (FPT_MB_MMA; included once per width and count). Each runs one
 * block's tile: `blk` as fpt_ab_locate reads it, `smem` its shared memory
 * (fpt_mb_smem_bytes). Semantics as fpt_attn.h's kernels: the same masks, dropout
 * multipliers, log-sum-exp and D, so the op around them (src/ops/attention_tiled.rs) takes
 * either family. Within a warp, lane l's rows are g = l / 4 and g + 8 of the warp's 16
 * (r = 0, 1 below) and its columns of each 8-wide tile 2t and 2t + 1 (t = l % 4). */

/* The forward: O and each query row's log-sum-exp, online softmax over key tiles of 32. The
 * warp's Q fragments stay in registers (split once, passed through shared memory). */
FPT_MB_FN void FPT_MB_NAME(fwd)(const float *q, const float *k, const float *v, float *o, float *lse,
                                const uint32_t *keylen, const fpt_attn_geom *gp, float *smem, int64_t blk) {
    enum { LD = FPT_MB_DK + 4, NC = FPT_MB_FWD_COLS, ND = FPT_MB_DK / 8, NS = FPT_MB_FWD_COLS / 8 };
    const fpt_attn_geom g = *gp;
    int64_t b, h, i0, nv, blo, bhi, x;
    fpt_ab_locate(&g, blk, g.tq, FPT_MB_ROWS, &b, &h, &i0, &nv);
    fpt_attn_keys(&g, keylen, b, i0, &blo, &x);
    fpt_attn_keys(&g, keylen, b, i0 + nv - 1, &x, &bhi);
    const uint32_t key = fpt_attn_bkey(&g, b, h);
    const float scale = (float)g.scale;
    uint32_t *kh = (uint32_t *)smem, *kl = kh + NC * LD, *vh = kl + NC * LD, *vl = vh + NC * LD;
    uint32_t *qh_s = kh, *ql_s = kh + FPT_MB_ROWS * LD; /* Q's staging: the same words */
    FPT_MB_TV(int64_t, lo, [2]);
    FPT_MB_TV(int64_t, hi, [2]);
    FPT_MB_TV(float, m, [2]);
    FPT_MB_TV(float, l, [2]);
    FPT_MB_TV(float, red, [2]);
    FPT_MB_TV(float, acc, [ND][4]);
    FPT_MB_TV(float, s, [NS][4]);
    FPT_MB_TV(uint32_t, qh, [ND][4]);
    FPT_MB_TV(uint32_t, ql, [ND][4]);
    FPT_MB_TV(uint32_t, ah, [4]);
    FPT_MB_TV(uint32_t, al, [4]);
    FPT_MB_TV(uint32_t, bh, [2]);
    FPT_MB_TV(uint32_t, bl, [2]);
    FPT_SYNC(); /* the block before is done with shared memory */
    FPT_EACH
    FPT_UNROLL for (int r = 0; r < 2; r++) {
        const int64_t i = i0 + 16 * fpt_w + (fpt_l >> 2) + 8 * r;
        int64_t a = 0, z = 0;
        if (i < i0 + nv) fpt_attn_keys(&g, keylen, b, i, &a, &z);
        FPT_T(lo)[r] = a;
        FPT_T(hi)[r] = z;
        FPT_T(m)[r] = -INFINITY;
        FPT_T(l)[r] = 0.0f;
    }
    FPT_UNROLL for (int n = 0; n < ND; n++) for (int e = 0; e < 4; e++) FPT_T(acc)[n][e] = 0.0f;
    fpt_mb_load_split(qh_s, ql_s, q + b * g.tq * g.sq + h * g.d, g.sq, i0, nv, FPT_MB_ROWS, g.d, LD, fpt_tid,
                      FPT_MB_THREADS, FPT_MB_TERMS);
    FPT_END
    FPT_SYNC();
    FPT_EACH
    FPT_UNROLL for (int kk = 0; kk < ND; kk++)
        fpt_mb_a(qh_s + 16 * fpt_w * LD, ql_s + 16 * fpt_w * LD, LD, 8 * kk, fpt_l, FPT_T(qh)[kk], FPT_T(ql)[kk]);
    FPT_END
    for (int64_t j0 = blo; j0 < bhi; j0 += NC) {
        const int64_t nk = g.tk - j0 < NC ? g.tk - j0 : NC;
        FPT_SYNC(); /* Q's fragments are read; the tile before is done with K and V */
        FPT_EACH
        fpt_mb_load_split(kh, kl, k + b * g.tk * g.sk + h * g.d, g.sk, j0, nk, NC, g.d, LD, fpt_tid,
                          FPT_MB_THREADS, FPT_MB_TERMS);
        fpt_mb_load_split(vh, vl, v + b * g.tk * g.sv + h * g.d, g.sv, j0, nk, NC, g.d, LD, fpt_tid,
                          FPT_MB_THREADS, FPT_MB_TERMS);
        FPT_UNROLL for (int n = 0; n < NS; n++) for (int e = 0; e < 4; e++) FPT_T(s)[n][e] = 0.0f;
        FPT_END
        FPT_SYNC();
        /* S = Q K^T, the warp's 16 rows against the tile's 32 keys. */
        FPT_UNROLL for (int kk = 0; kk < ND; kk++) {
            FPT_UNROLL for (int n = 0; n < NS; n++) {
                FPT_EACH
                fpt_mb_b_rows(kh, kl, LD, 8 * n, 8 * kk, fpt_l, FPT_T(bh), FPT_T(bl));
                FPT_END
                FPT_MB_MMA(FPT_T(s)[n], FPT_T(qh)[kk], FPT_T(ql)[kk], FPT_T(bh), FPT_T(bl));
            }
        }
        /* The rows' maxima over this tile (masked scores -inf), then the probabilities. */
        FPT_EACH
        const int t = fpt_l & 3;
        FPT_UNROLL for (int r = 0; r < 2; r++) {
            /* The row's visible keys as columns of this tile (32-bit from here on). */
            const int clo = fpt_mb_col(FPT_T(lo)[r] - j0), chi = fpt_mb_col(FPT_T(hi)[r] - j0);
            float mx = -INFINITY;
            FPT_UNROLL for (int n = 0; n < NS; n++) for (int e = 0; e < 2; e++) {
                const int c = 8 * n + 2 * t + e;
                float y = FPT_T(s)[n][2 * r + e];
                y = (c >= clo && c < chi) ? y * scale : -INFINITY;
                FPT_T(s)[n][2 * r + e] = y;
                mx = fmaxf(mx, y);
            }
            FPT_T(red)[r] = mx;
        }
        FPT_END
        FPT_QUAD(fmaxf, FPT_T(red)[0]);
        FPT_QUAD(fmaxf, FPT_T(red)[1]);
        FPT_EACH
        const int t = fpt_l & 3;
        FPT_UNROLL for (int r = 0; r < 2; r++) {
            const int64_t i = i0 + 16 * fpt_w + (fpt_l >> 2) + 8 * r;
            const uint32_t base = (uint32_t)(i * g.tk + j0); /* the mask's index of column 0 */
            const float mn = fmaxf(FPT_T(m)[r], FPT_T(red)[r]);
            const float alpha = mn == -INFINITY ? 1.0f : expf(FPT_T(m)[r] - mn);
            float sum = 0.0f;
            FPT_UNROLL for (int n = 0; n < NS; n++) for (int e = 0; e < 2; e++) {
                const int c = 8 * n + 2 * t + e;
                const float y = FPT_T(s)[n][2 * r + e];
                const float p = y == -INFINITY ? 0.0f : expf(y - mn);
                sum += p;
                FPT_T(s)[n][2 * r + e] = p == 0.0f ? 0.0f : p * fpt_attn_mult_at(&g, key, base + (uint32_t)c);
            }
            FPT_T(m)[r] = mn;
            FPT_T(l)[r] *= alpha;
            FPT_T(red)[r] = sum;
            FPT_UNROLL for (int n = 0; n < ND; n++) {
                FPT_T(acc)[n][2 * r] *= alpha;
                FPT_T(acc)[n][2 * r + 1] *= alpha;
            }
        }
        FPT_END
        FPT_QUAD(FPT_MB_ADD, FPT_T(red)[0]);
        FPT_QUAD(FPT_MB_ADD, FPT_T(red)[1]);
        FPT_EACH
        FPT_T(l)[0] += FPT_T(red)[0];
        FPT_T(l)[1] += FPT_T(red)[1];
        FPT_END
        /* O += P V, the probabilities (dropped out) straight from S's accumulators. */
        FPT_MB_ACCUM(acc, s, vh, vl, ah, al);
    }
    FPT_EACH
    const int t = fpt_l & 3;
    FPT_UNROLL for (int r = 0; r < 2; r++) {
        const int64_t i = i0 + 16 * fpt_w + (fpt_l >> 2) + 8 * r;
        if (i >= i0 + nv) continue;
        const float ll = FPT_T(l)[r], mul = ll > 0.0f ? 1.0f / ll : 0.0f;
        float *orow = o + (b * g.tq + i) * g.so + h * g.d;
        FPT_UNROLL for (int n = 0; n < ND; n++) for (int e = 0; e < 2; e++) {
            const int64_t c = 8 * n + 2 * t + e;
            if (c < g.d) orow[c] = FPT_T(acc)[n][2 * r + e] * mul;
        }
        if (t == 0) lse[(b * g.heads + h) * g.tq + i] = ll > 0.0f ? FPT_T(m)[r] + logf(ll) : -INFINITY;
    }
    FPT_END
}

/* The backward's first pass, a tile of 64 query rows: D = dO . O (kept in dd for the second
 * pass) and dQ = sum_j dS_ij K_j into dq (stride sg), over key tiles of 32. */
FPT_MB_FN void FPT_MB_NAME(bwd_q)(const float *q, const float *k, const float *v, const float *o, const float *dout,
                                  const float *lse, float *dd, float *dq, const uint32_t *keylen,
                                  const fpt_attn_geom *gp, float *smem, int64_t blk) {
    enum { LD = FPT_MB_DK + 4, NC = FPT_MB_BWD_COLS, ND = FPT_MB_DK / 8, NS = FPT_MB_BWD_COLS / 8 };
    const fpt_attn_geom g = *gp;
    int64_t b, h, i0, nv, blo, bhi, x;
    fpt_ab_locate(&g, blk, g.tq, FPT_MB_ROWS, &b, &h, &i0, &nv);
    fpt_attn_keys(&g, keylen, b, i0, &blo, &x);
    fpt_attn_keys(&g, keylen, b, i0 + nv - 1, &x, &bhi);
    const uint32_t key = fpt_attn_bkey(&g, b, h);
    uint32_t *qh = (uint32_t *)smem, *ql = qh + FPT_MB_ROWS * LD, *oh = ql + FPT_MB_ROWS * LD;
    uint32_t *ol = oh + FPT_MB_ROWS * LD, *kh = ol + FPT_MB_ROWS * LD, *kl = kh + NC * LD, *vh = kl + NC * LD;
    uint32_t *vl = vh + NC * LD;
    FPT_MB_TV(int64_t, lo, [2]);
    FPT_MB_TV(int64_t, hi, [2]);
    FPT_MB_TV(float, rl, [2]);
    FPT_MB_TV(float, dsum, [2]);
    FPT_MB_TV(float, acc, [ND][4]);
    FPT_MB_TV(float, s, [NS][4]);
    FPT_MB_TV(float, dp, [NS][4]);
    FPT_MB_TV(uint32_t, ah, [4]);
    FPT_MB_TV(uint32_t, al, [4]);
    FPT_MB_TV(uint32_t, gh, [4]);
    FPT_MB_TV(uint32_t, gl, [4]);
    FPT_MB_TV(uint32_t, bh, [2]);
    FPT_MB_TV(uint32_t, bl, [2]);
    FPT_SYNC(); /* the block before is done with shared memory */
    FPT_EACH
    const int t = fpt_l & 3;
    FPT_UNROLL for (int r = 0; r < 2; r++) {
        const int64_t i = i0 + 16 * fpt_w + (fpt_l >> 2) + 8 * r;
        int64_t a = 0, z = 0;
        float part = 0.0f;
        if (i < i0 + nv) {
            fpt_attn_keys(&g, keylen, b, i, &a, &z);
            const int64_t off = (b * g.tq + i) * g.so + h * g.d;
            for (int64_t e = t; e < g.d; e += 4) part += dout[off + e] * o[off + e];
        }
        FPT_T(lo)[r] = a;
        FPT_T(hi)[r] = z;
        FPT_T(rl)[r] = i < i0 + nv ? lse[(b * g.heads + h) * g.tq + i] : -INFINITY;
        FPT_T(dsum)[r] = part;
    }
    FPT_UNROLL for (int n = 0; n < ND; n++) for (int e = 0; e < 4; e++) FPT_T(acc)[n][e] = 0.0f;
    fpt_mb_load_split(qh, ql, q + b * g.tq * g.sq + h * g.d, g.sq, i0, nv, FPT_MB_ROWS, g.d, LD, fpt_tid,
                      FPT_MB_THREADS, FPT_MB_TERMS);
    fpt_mb_load_split(oh, ol, dout + b * g.tq * g.so + h * g.d, g.so, i0, nv, FPT_MB_ROWS, g.d, LD, fpt_tid,
                      FPT_MB_THREADS, FPT_MB_TERMS);
    FPT_END
    FPT_QUAD(FPT_MB_ADD, FPT_T(dsum)[0]);
    FPT_QUAD(FPT_MB_ADD, FPT_T(dsum)[1]);
    for (int64_t j0 = blo; j0 < bhi; j0 += NC) {
        const int64_t nk = g.tk - j0 < NC ? g.tk - j0 : NC;
        FPT_SYNC();
        FPT_EACH
        fpt_mb_load_split(kh, kl, k + b * g.tk * g.sk + h * g.d, g.sk, j0, nk, NC, g.d, LD, fpt_tid,
                          FPT_MB_THREADS, FPT_MB_TERMS);
        fpt_mb_load_split(vh, vl, v + b * g.tk * g.sv + h * g.d, g.sv, j0, nk, NC, g.d, LD, fpt_tid,
                          FPT_MB_THREADS, FPT_MB_TERMS);
        FPT_UNROLL for (int n = 0; n < NS; n++) for (int e = 0; e < 4; e++) FPT_T(s)[n][e] = FPT_T(dp)[n][e] = 0.0f;
        FPT_END
        FPT_SYNC();
        /* S = Q K^T and dP = dO V^T. */
        FPT_MB_SCORES(s, dp, qh, ql, oh, ol, kh, kl, vh, vl, ah, al, gh, gl);
        /* dS = scale P (dP M - D), in place of S. */
        FPT_EACH
        const int t = fpt_l & 3;
        FPT_UNROLL for (int r = 0; r < 2; r++) {
            const int64_t i = i0 + 16 * fpt_w + (fpt_l >> 2) + 8 * r;
            const int clo = fpt_mb_col(FPT_T(lo)[r] - j0), chi = fpt_mb_col(FPT_T(hi)[r] - j0);
            const uint32_t base = (uint32_t)(i * g.tk + j0);
            FPT_UNROLL for (int n = 0; n < NS; n++) for (int e = 0; e < 2; e++) {
                const int c = 8 * n + 2 * t + e;
                float pd = 0.0f, ds = 0.0f;
                if (c >= clo && c < chi && FPT_T(rl)[r] != -INFINITY)
                    fpt_ab_pair_m(&g, fpt_attn_mult_at(&g, key, base + (uint32_t)c), FPT_T(s)[n][2 * r + e],
                                  FPT_T(dp)[n][2 * r + e], FPT_T(rl)[r], FPT_T(dsum)[r], &pd, &ds);
                FPT_T(s)[n][2 * r + e] = ds;
            }
        }
        FPT_END
        /* dQ += dS K. */
        FPT_MB_ACCUM(acc, s, kh, kl, ah, al);
    }
    FPT_EACH
    const int t = fpt_l & 3;
    FPT_UNROLL for (int r = 0; r < 2; r++) {
        const int64_t i = i0 + 16 * fpt_w + (fpt_l >> 2) + 8 * r;
        if (i >= i0 + nv) continue;
        float *row = dq + (b * g.tq + i) * g.sg + h * g.d;
        FPT_UNROLL for (int n = 0; n < ND; n++) for (int e = 0; e < 2; e++) {
            const int64_t c = 8 * n + 2 * t + e;
            if (c < g.d) row[c] = FPT_T(acc)[n][2 * r + e];
        }
        if (t == 0) dd[(b * g.heads + h) * g.tq + i] = FPT_T(dsum)[r];
    }
    FPT_END
}

/* The backward's second pass, a tile of 64 key rows: dK = sum_i dS_ij Q_i and dV = sum_i
 * (P M)_ij dO_i into dk and dv (rows of stride sg: the packed gradient's thirds), over query
 * tiles of 32 (their lse, D and key ranges beside them in shared memory). */
FPT_MB_FN void FPT_MB_NAME(bwd_kv)(const float *q, const float *k, const float *v, const float *dout,
                                   const float *lse, const float *dd, float *dk, float *dv, const uint32_t *keylen,
                                   const fpt_attn_geom *gp, float *smem, int64_t blk) {
    enum { LD = FPT_MB_DK + 4, NC = FPT_MB_BWD_COLS, ND = FPT_MB_DK / 8, NS = FPT_MB_BWD_COLS / 8 };
    const fpt_attn_geom g = *gp;
    int64_t b, h, j0, nv, blo, bhi, x;
    fpt_ab_locate(&g, blk, g.tk, FPT_MB_ROWS, &b, &h, &j0, &nv);
    fpt_attn_queries(&g, j0, &blo, &x);
    fpt_attn_queries(&g, j0 + nv - 1, &x, &bhi);
    const uint32_t key = fpt_attn_bkey(&g, b, h);
    uint32_t *kh_s = (uint32_t *)smem, *kl_s = kh_s + FPT_MB_ROWS * LD, *vh_s = kl_s + FPT_MB_ROWS * LD;
    uint32_t *vl_s = vh_s + FPT_MB_ROWS * LD, *qh_s = vl_s + FPT_MB_ROWS * LD, *ql_s = qh_s + NC * LD;
    uint32_t *oh_s = ql_s + NC * LD, *ol_s = oh_s + NC * LD;
    float *sl = (float *)(ol_s + NC * LD), *sd = sl + NC;
    int32_t *ql = (int32_t *)(sd + NC), *qh = ql + NC;
    FPT_MB_TV(float, ak, [ND][4]);
    FPT_MB_TV(float, av, [ND][4]);
    FPT_MB_TV(float, s, [NS][4]);
    FPT_MB_TV(float, dp, [NS][4]);
    FPT_MB_TV(uint32_t, kh, [4]);
    FPT_MB_TV(uint32_t, kl, [4]);
    FPT_MB_TV(uint32_t, vh, [4]);
    FPT_MB_TV(uint32_t, vl, [4]);
    FPT_MB_TV(uint32_t, bh, [2]);
    FPT_MB_TV(uint32_t, bl, [2]);
    FPT_SYNC(); /* the block before is done with shared memory */
    FPT_EACH
    fpt_mb_load_split(kh_s, kl_s, k + b * g.tk * g.sk + h * g.d, g.sk, j0, nv, FPT_MB_ROWS, g.d, LD, fpt_tid,
                      FPT_MB_THREADS, FPT_MB_TERMS);
    fpt_mb_load_split(vh_s, vl_s, v + b * g.tk * g.sv + h * g.d, g.sv, j0, nv, FPT_MB_ROWS, g.d, LD, fpt_tid,
                      FPT_MB_THREADS, FPT_MB_TERMS);
    FPT_UNROLL for (int n = 0; n < ND; n++) for (int e = 0; e < 4; e++) FPT_T(ak)[n][e] = FPT_T(av)[n][e] = 0.0f;
    FPT_END
    for (int64_t i0 = blo; i0 < bhi; i0 += NC) {
        const int64_t nq = g.tq - i0 < NC ? g.tq - i0 : NC;
        FPT_SYNC();
        FPT_EACH
        fpt_mb_load_split(qh_s, ql_s, q + b * g.tq * g.sq + h * g.d, g.sq, i0, nq, NC, g.d, LD, fpt_tid,
                          FPT_MB_THREADS, FPT_MB_TERMS);
        fpt_mb_load_split(oh_s, ol_s, dout + b * g.tq * g.so + h * g.d, g.so, i0, nq, NC, g.d, LD, fpt_tid,
                          FPT_MB_THREADS, FPT_MB_TERMS);
        fpt_ab_kv_columns(&g, keylen, lse, dd, b, h, i0, nq, NC, sl, sd, ql, qh, fpt_tid, FPT_MB_THREADS);
        FPT_UNROLL for (int n = 0; n < NS; n++) for (int e = 0; e < 4; e++) FPT_T(s)[n][e] = FPT_T(dp)[n][e] = 0.0f;
        FPT_END
        FPT_SYNC();
        /* S^T = K Q^T and dP^T = V dO^T: the warp's 16 keys against the tile's queries. */
        FPT_MB_SCORES(s, dp, kh_s, kl_s, vh_s, vl_s, qh_s, ql_s, oh_s, ol_s, kh, kl, vh, vl);
        /* P M in place of S^T, dS in place of dP^T (0 where the query does not see the key). */
        FPT_EACH
        const int t = fpt_l & 3;
        FPT_UNROLL for (int r = 0; r < 2; r++) {
            const int64_t j = j0 + 16 * fpt_w + (fpt_l >> 2) + 8 * r;
            const uint32_t base = (uint32_t)(i0 * g.tk + j); /* the mask's index of query column 0 */
            FPT_UNROLL for (int n = 0; n < NS; n++) for (int e = 0; e < 2; e++) {
                const int c = 8 * n + 2 * t + e;
                float pd = 0.0f, ds = 0.0f;
                if (j < j0 + nv && c < nq && j >= ql[c] && j < qh[c] && sl[c] != -INFINITY)
                    fpt_ab_pair_m(&g, fpt_attn_mult_at(&g, key, base + (uint32_t)c * (uint32_t)g.tk),
                                  FPT_T(s)[n][2 * r + e], FPT_T(dp)[n][2 * r + e], sl[c], sd[c], &pd, &ds);
                FPT_T(s)[n][2 * r + e] = pd;
                FPT_T(dp)[n][2 * r + e] = ds;
            }
        }
        FPT_END
        /* dV += (P M)^T dO and dK += dS^T Q. */
        FPT_MB_ACCUM(av, s, oh_s, ol_s, kh, kl);
        FPT_MB_ACCUM(ak, dp, qh_s, ql_s, vh, vl);
    }
    FPT_EACH
    const int t = fpt_l & 3;
    FPT_UNROLL for (int r = 0; r < 2; r++) {
        const int64_t j = j0 + 16 * fpt_w + (fpt_l >> 2) + 8 * r;
        if (j >= j0 + nv) continue;
        float *rk = dk + (b * g.tk + j) * g.sg + h * g.d, *rv = dv + (b * g.tk + j) * g.sg + h * g.d;
        FPT_UNROLL for (int n = 0; n < ND; n++) for (int e = 0; e < 2; e++) {
            const int64_t c = 8 * n + 2 * t + e;
            if (c < g.d) {
                rk[c] = FPT_T(ak)[n][2 * r + e];
                rv[c] = FPT_T(av)[n][2 * r + e];
            }
        }
    }
    FPT_END
}

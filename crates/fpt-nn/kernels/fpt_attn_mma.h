/* Attention tiled in blocks on the tensor cores (FPT_ATTENTION=mma): fpt_attn.h's three
 * kernels (forward; backward per query tile for D and dQ; backward per key tile for dK and
 * dV), their products done by warps with mma.sync m16n8k8 on TF32 operands, each product
 * split in three (3xTF32: a = a_hi + a_lo, both TF32, and a b ~ a_hi b_hi + a_hi b_lo +
 * a_lo b_hi), which keeps f32's accuracy (the terms dropped are ~2^-22 relative) at three
 * tensor-core products where the SIMT kernels spend one FMA per element.
 *
 * A block is 4 warps; each warp owns 16 rows of the block's 64 (queries; keys in the dK, dV
 * pass) and walks the other side a tile at a time from shared memory. The lanes hold the
 * products' fragments as the PTX ISA lays them out for m16n8k8 .tf32 (lane = 4 g + t):
 *   A (16 x 8, row):  a0 (g, t)   a1 (g + 8, t)   a2 (g, t + 4)   a3 (g + 8, t + 4)
 *   B (8 x 8, col):   b0 (t, g)   b1 (t + 4, g)
 *   C (16 x 8):       c0 (g, 2t)  c1 (g, 2t + 1)  c2 (g + 8, 2t)  c3 (g + 8, 2t + 1)
 * A product's accumulator C becomes the next product's A without moving between lanes:
 * the inner index of that second product is permuted within each 8 (slot t is column 2t
 * of the C tile, slot t + 4 column 2t + 1), so A = (c0, c2, c1, c3) and its B reads rows
 * 2t and 2t + 1 (fpt_mb_b_perm). The operands in shared memory are split when loaded (hi
 * and lo words, once for all warps: the split costs more than the products otherwise);
 * rows are d rounded up to 32 (DK) plus 4 words: both B patterns and the A loads then hit
 * 32 distinct banks. The forward keeps its Q fragments in registers.
 *
 * The bodies are written once, for a block of SIMT lanes, and compiled twice, as every
 * kernel here: by nvcc (each lane runs them) and by the host C compiler into host_mma.c,
 * which runs them over the block in lockstep: FPT_EACH runs a phase for each of the 128
 * lanes in turn, per-lane values are arrays over the lanes (FPT_MB_TV, read through
 * FPT_T), and the warp-wide steps (the products, the quad reductions) combine all 32
 * lanes' values as the hardware does (fpt_mb_host_mma: the fragments above gathered into
 * 16 x 8 x 8 products). So `cargo test` checks the fragments' indexing, the masks, the
 * online softmax and the gradients of the code the GPU runs, on a machine without one.
 * What it cannot check: the hardware's own summation order inside an mma (the host sums
 * k = 0..7 in order, in f32) and speed. */
#ifndef FPT_ATTN_MMA_H
#define FPT_ATTN_MMA_H

#include "fpt_attn.h"

#define FPT_MB_THREADS 128
#define FPT_MB_WARPS 4
/* A block's own rows (16 a warp), and the other side's tile: 32 rows each way. */
#define FPT_MB_ROWS 64
#define FPT_MB_FWD_COLS 32
#define FPT_MB_BWD_COLS 32
/* The widest head: DK = 64 (d rounded up to 32). */
#define FPT_MB_MAX_D 64

#ifdef __CUDACC__
#define FPT_MB_FN __device__ __forceinline__ static
#define FPT_MB_TV(type, name, dims) type name dims
#define FPT_T(x) x
#define FPT_EACH                                                  \
    {                                                             \
        const int fpt_tid = (int)threadIdx.x;                     \
        const int fpt_w = fpt_tid >> 5, fpt_l = fpt_tid & 31;     \
        (void)fpt_w;                                              \
        (void)fpt_l;
#define FPT_END }
#define FPT_SYNC() __syncthreads()
#define FPT_UNROLL _Pragma("unroll")
#else
#define FPT_MB_FN static
#define FPT_MB_TV(type, name, dims) type name[FPT_MB_THREADS] dims
#define FPT_T(x) x[fpt_tid]
#define FPT_EACH                                                  \
    for (int fpt_tid = 0; fpt_tid < FPT_MB_THREADS; fpt_tid++) {  \
        const int fpt_w = fpt_tid >> 5, fpt_l = fpt_tid & 31;     \
        (void)fpt_w;                                              \
        (void)fpt_l;
#define FPT_END }
#define FPT_SYNC() ((void)0)
#define FPT_UNROLL
#endif

/* ---- TF32 ------------------------------------------------------------------------- */

FPT_HD uint32_t fpt_mb_bits(float x) {
#ifdef __CUDACC__
    return __float_as_uint(x);
#else
    union {
        float f;
        uint32_t u;
    } c;
    c.f = x;
    return c.u;
#endif
}

FPT_HD float fpt_mb_float(uint32_t u) {
#ifdef __CUDACC__
    return __uint_as_float(u);
#else
    union {
        float f;
        uint32_t u;
    } c;
    c.u = u;
    return c.f;
#endif
}

/* x rounded to TF32 (10 bits of mantissa), to nearest with ties away from zero, as the bits
 * of an f32 whose low 13 bits are 0: cvt.rna.tf32.f32 on a GPU (one instruction); on the
 * host the same rounding on the bits (half an ulp added to the magnitude, the low bits
 * cut), infinities and NaNs kept. The two agree on every finite value. */
FPT_HD uint32_t fpt_tf32(float x) {
#ifdef __CUDACC__
    uint32_t u;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
    return u;
#else
    uint32_t u = fpt_mb_bits(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return u;
    return (u + 0x1000u) & 0xffffe000u;
#endif
}

/* x = hi + lo (to ~2^-22 relative), both TF32: hi rounded as above, lo the remainder
 * (exact in f32) rounded on its bits the same way, which for a finite x needs no guard (the
 * remainder is finite and far below overflow): three integer and float operations. */
FPT_HD void fpt_tf32_split(float x, uint32_t *hi, uint32_t *lo) {
    *hi = fpt_tf32(x);
    *lo = (fpt_mb_bits(x - fpt_mb_float(*hi)) + 0x1000u) & 0xffffe000u;
}

/* Lane's share of loading rows row0 .. row0 + n (of which `valid` exist) of an operand's
 * head into shared memory split: hi and lo words of rows of ld, zeros past the valid rows
 * and past d. A warp a row, its lanes along it (coalesced); nl is a multiple of 32. Each
 * value is split once here for every warp and fragment that reads it (with one term, only
 * its hi word is written). */
FPT_HD void fpt_mb_load_split(uint32_t *hi, uint32_t *lo, const float *src, int64_t stride, int64_t row0,
                              int64_t valid, int n, int64_t d, int ld, int lane, int nl, int terms) {
    const int w = lane / 32, nw = nl / 32, l = lane % 32;
    for (int rr = w; rr < n; rr += nw) {
        const float *r = rr < valid ? src + (row0 + rr) * stride : 0;
        for (int e = l; e < ld; e += 32) {
            const float x = (r && e < d) ? r[e] : 0.0f;
            if (terms == 1)
                hi[rr * ld + e] = fpt_tf32(x);
            else
                fpt_tf32_split(x, &hi[rr * ld + e], &lo[rr * ld + e]);
        }
    }
}

/* A key offset from a tile's first key as a column of the tile, clamped to [-1, 1 << 20]
 * so that it fits 32 bits and compares as the offset does against columns 0..31. */
FPT_HD int fpt_mb_col(int64_t x) { return x < -1 ? -1 : (x > (1 << 20) ? (1 << 20) : (int)x); }

/* ---- fragments (lane l of a warp: g = l / 4, t = l % 4), from split shared rows ------- */

/* A of rows 0..15 and columns k0..k0+7 of a row-major tile (ld words a row). */
FPT_HD void fpt_mb_a(const uint32_t *sh, const uint32_t *sl, int ld, int k0, int l, uint32_t hi[4], uint32_t lo[4]) {
    const int g = l >> 2, t = l & 3;
    const int o[4] = {g * ld + k0 + t, (g + 8) * ld + k0 + t, g * ld + k0 + t + 4, (g + 8) * ld + k0 + t + 4};
    for (int i = 0; i < 4; i++) {
        hi[i] = sh[o[i]];
        lo[i] = sl[o[i]];
    }
}

/* B (k, n) = tile row n0 + n, column k0 + k: the product with the tile's rows (S = Q K^T). */
FPT_HD void fpt_mb_b_rows(const uint32_t *sh, const uint32_t *sl, int ld, int n0, int k0, int l, uint32_t hi[2],
                          uint32_t lo[2]) {
    const int g = l >> 2, t = l & 3, o = (n0 + g) * ld + k0 + t;
    hi[0] = sh[o];
    lo[0] = sl[o];
    hi[1] = sh[o + 4];
    lo[1] = sl[o + 4];
}

/* B (k, n) = tile row k0 + k, column n0 + n, k in the permuted order (slot t: row 2t, slot
 * t + 4: row 2t + 1): the product with an A made from an accumulator (O += P V). */
FPT_HD void fpt_mb_b_perm(const uint32_t *sh, const uint32_t *sl, int ld, int k0, int n0, int l, uint32_t hi[2],
                          uint32_t lo[2]) {
    const int g = l >> 2, t = l & 3, o = (k0 + 2 * t) * ld + n0 + g;
    hi[0] = sh[o];
    lo[0] = sl[o];
    hi[1] = sh[o + ld];
    lo[1] = sl[o + ld];
}

/* A from an accumulator tile c (16 x 8) in the permuted order, split (hi only with one
 * term; lo then holds zeros). */
FPT_HD void fpt_mb_a_of_c(const float c[4], uint32_t hi[4], uint32_t lo[4], int terms) {
    const float x[4] = {c[0], c[2], c[1], c[3]};
    for (int i = 0; i < 4; i++) {
        if (terms == 1) {
            hi[i] = fpt_tf32(x[i]);
            lo[i] = 0u;
        } else {
            fpt_tf32_split(x[i], &hi[i], &lo[i]);
        }
    }
}

/* ---- the warp-wide steps ------------------------------------------------------------ */

#define FPT_MB_ADD(a, b) ((a) + (b))

#ifdef __CUDACC__
/* c += a b on the tensor cores: one m16n8k8 TF32 product. */
__device__ __forceinline__ void fpt_mb_mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* c += a b in 3xTF32: the small terms first. */
__device__ __forceinline__ void fpt_mb_mma3(float c[4], const uint32_t ah[4], const uint32_t al[4],
                                            const uint32_t bh[2], const uint32_t bl[2]) {
    fpt_mb_mma(c, ah, bl);
    fpt_mb_mma(c, al, bh);
    fpt_mb_mma(c, ah, bh);
}

#define FPT_MMA3(C, AH, AL, BH, BL) fpt_mb_mma3(C, AH, AL, BH, BL)
#define FPT_MMA1(C, AH, AL, BH, BL) fpt_mb_mma(C, AH, BH)
/* x (a lane's value) combined over the lane's quad (the 4 lanes of one row), butterfly. */
#define FPT_QUAD(OP, X)                                           \
    do {                                                          \
        X = OP(X, __shfl_xor_sync(0xffffffffu, X, 1));            \
        X = OP(X, __shfl_xor_sync(0xffffffffu, X, 2));            \
    } while (0)
#else
/* One m16n8k8 product of a warp: each lane's fragments gathered into the 16 x 8 x 8
 * matrices by the layout above, c += a b summed over k in order, scattered back. */
static void fpt_mb_host_mma(float *c[32], const uint32_t *a[32], const uint32_t *b[32]) {
    float am[16][8], bm[8][8], cm[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        am[g][t] = fpt_mb_float(a[l][0]);
        am[g + 8][t] = fpt_mb_float(a[l][1]);
        am[g][t + 4] = fpt_mb_float(a[l][2]);
        am[g + 8][t + 4] = fpt_mb_float(a[l][3]);
        bm[t][g] = fpt_mb_float(b[l][0]);
        bm[t + 4][g] = fpt_mb_float(b[l][1]);
        cm[g][2 * t] = c[l][0];
        cm[g][2 * t + 1] = c[l][1];
        cm[g + 8][2 * t] = c[l][2];
        cm[g + 8][2 * t + 1] = c[l][3];
    }
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            float acc = cm[r][n];
            for (int k = 0; k < 8; k++) acc += am[r][k] * bm[k][n];
            cm[r][n] = acc;
        }
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        c[l][0] = cm[g][2 * t];
        c[l][1] = cm[g][2 * t + 1];
        c[l][2] = cm[g + 8][2 * t];
        c[l][3] = cm[g + 8][2 * t + 1];
    }
}

static void fpt_mb_host_mma3(float *c[32], const uint32_t *ah[32], const uint32_t *al[32], const uint32_t *bh[32],
                             const uint32_t *bl[32]) {
    fpt_mb_host_mma(c, ah, bl);
    fpt_mb_host_mma(c, al, bh);
    fpt_mb_host_mma(c, ah, bh);
}

/* One warp-wide product a warp, its 32 lanes' fragments gathered: TERMS 3 (hi x lo, lo x hi,
 * hi x hi) or 1 (hi x hi; the lo operands are not read). */
#define FPT_MB_HOST_MMA(TERMS, C, AH, AL, BH, BL)                                           \
    for (int fpt_wm = 0; fpt_wm < FPT_MB_WARPS; fpt_wm++) {                                 \
        float *fpt_c[32];                                                                   \
        const uint32_t *fpt_ah[32], *fpt_al[32], *fpt_bh[32], *fpt_bl[32];                  \
        for (int fpt_lm = 0; fpt_lm < 32; fpt_lm++) {                                       \
            const int fpt_tid = fpt_wm * 32 + fpt_lm;                                       \
            fpt_c[fpt_lm] = C;                                                              \
            fpt_ah[fpt_lm] = AH;                                                            \
            fpt_bh[fpt_lm] = BH;                                                            \
            fpt_al[fpt_lm] = (TERMS) == 3 ? (AL) : 0;                                       \
            fpt_bl[fpt_lm] = (TERMS) == 3 ? (BL) : 0;                                       \
        }                                                                                   \
        if ((TERMS) == 3)                                                                   \
            fpt_mb_host_mma3(fpt_c, fpt_ah, fpt_al, fpt_bh, fpt_bl);                        \
        else                                                                                \
            fpt_mb_host_mma(fpt_c, fpt_ah, fpt_bh);                                         \
    }
#define FPT_MMA3(C, AH, AL, BH, BL) FPT_MB_HOST_MMA(3, C, AH, AL, BH, BL)
#define FPT_MMA1(C, AH, AL, BH, BL) FPT_MB_HOST_MMA(1, C, AH, AL, BH, BL)
#define FPT_QUAD(OP, X)                                                                     \
    for (int fpt_q = 0; fpt_q < FPT_MB_THREADS; fpt_q += 4) {                               \
        float fpt_v[4], fpt_u[4];                                                           \
        for (int fpt_lq = 0; fpt_lq < 4; fpt_lq++) {                                        \
            const int fpt_tid = fpt_q + fpt_lq;                                             \
            fpt_v[fpt_lq] = X;                                                              \
        }                                                                                   \
        for (int fpt_lq = 0; fpt_lq < 4; fpt_lq++) fpt_u[fpt_lq] = OP(fpt_v[fpt_lq], fpt_v[fpt_lq ^ 1]); \
        for (int fpt_lq = 0; fpt_lq < 4; fpt_lq++) fpt_v[fpt_lq] = OP(fpt_u[fpt_lq], fpt_u[fpt_lq ^ 2]); \
        for (int fpt_lq = 0; fpt_lq < 4; fpt_lq++) {                                        \
            const int fpt_tid = fpt_q + fpt_lq;                                             \
            X = fpt_v[fpt_lq];                                                              \
        }                                                                                   \
    }
#endif

/* ---- plans ------------------------------------------------------------------------- */

/* The head width the kernels are compiled for (d rounded up to 32), or 0 past the widest. */
FPT_HD int64_t fpt_mb_dk(int64_t d) {
    if (d < 1 || d > FPT_MB_MAX_D) return 0;
    return d <= 32 ? 32 : 64;
}

/* The bytes of shared memory kernel `kind` (FPT_AB_FWD, ...) takes for heads of d dims, or
 * 0 when the head is too wide: rows of DK + 4 words, each operand twice (hi and lo). The
 * forward's K and V tiles (32 keys; Q passes through them into registers first) fit in the
 * 48 KiB any block may take; the backward's passes keep both own operands (64 rows) and two
 * inner tiles of 32, ~104 KiB at 64 dims, which the launch opts in to (an H100 or H200 gives
 * a block up to 227 KiB); the dK, dV pass adds the query tile's lse, D and key ranges. */
FPT_HD int64_t fpt_mb_smem_bytes(int kind, int64_t d) {
    const int64_t dk = fpt_mb_dk(d), ld = dk + 4;
    if (dk == 0) return 0;
    if (kind == FPT_AB_FWD) return 4 * (4 * FPT_MB_FWD_COLS * ld);
    if (kind == FPT_AB_BWD_Q) return 4 * (4 * FPT_MB_ROWS * ld + 4 * FPT_MB_BWD_COLS * ld);
    return 4 * (4 * FPT_MB_ROWS * ld + 4 * FPT_MB_BWD_COLS * ld + 4 * FPT_MB_BWD_COLS);
}

/* The bodies' two product loops, expanded inside a body (they use its ND, NS and LD, its
 * FPT_MB_MMA and FPT_MB_TERMS, and its per-lane B fragments bh, bl):
 * FPT_MB_SCORES: the backward's two score products of the warp's 16 own rows against the
 * inner tile's rows, S += X Z^T and DP += Y W^T (X, Y: split words of the own operands, whose
 * A fragments go to AX.., AY..; Z, W: the tile's); FPT_MB_ACCUM: ACC += A(C) T over the
 * tile's rows, the A fragments made from the accumulators C (permuted order) in AH, AL and
 * the B from the tile's split rows T (fpt_mb_b_perm). */
#define FPT_MB_SCORES(S, DP, XH, XL, YH, YL, ZH, ZL, WH, WL, AXH, AXL, AYH, AYL)                        \
    FPT_UNROLL for (int kk = 0; kk < ND; kk++) {                                                        \
        FPT_EACH                                                                                        \
        fpt_mb_a(XH + 16 * fpt_w * LD, XL + 16 * fpt_w * LD, LD, 8 * kk, fpt_l, FPT_T(AXH), FPT_T(AXL)); \
        fpt_mb_a(YH + 16 * fpt_w * LD, YL + 16 * fpt_w * LD, LD, 8 * kk, fpt_l, FPT_T(AYH), FPT_T(AYL)); \
        FPT_END                                                                                         \
        FPT_UNROLL for (int n = 0; n < NS; n++) {                                                       \
            FPT_EACH                                                                                    \
            fpt_mb_b_rows(ZH, ZL, LD, 8 * n, 8 * kk, fpt_l, FPT_T(bh), FPT_T(bl));                      \
            FPT_END                                                                                     \
            FPT_MB_MMA(FPT_T(S)[n], FPT_T(AXH), FPT_T(AXL), FPT_T(bh), FPT_T(bl));                      \
            FPT_EACH                                                                                    \
            fpt_mb_b_rows(WH, WL, LD, 8 * n, 8 * kk, fpt_l, FPT_T(bh), FPT_T(bl));                      \
            FPT_END                                                                                     \
            FPT_MB_MMA(FPT_T(DP)[n], FPT_T(AYH), FPT_T(AYL), FPT_T(bh), FPT_T(bl));                     \
        }                                                                                               \
    }
#define FPT_MB_ACCUM(ACC, C, TH, TL, AH, AL)                                                            \
    FPT_UNROLL for (int kc = 0; kc < NS; kc++) {                                                        \
        FPT_EACH                                                                                        \
        fpt_mb_a_of_c(FPT_T(C)[kc], FPT_T(AH), FPT_T(AL), FPT_MB_TERMS);                                \
        FPT_END                                                                                         \
        FPT_UNROLL for (int n = 0; n < ND; n++) {                                                       \
            FPT_EACH                                                                                    \
            fpt_mb_b_perm(TH, TL, LD, 8 * kc, 8 * n, fpt_l, FPT_T(bh), FPT_T(bl));                      \
            FPT_END                                                                                     \
            FPT_MB_MMA(FPT_T(ACC)[n], FPT_T(AH), FPT_T(AL), FPT_T(bh), FPT_T(bl));                      \
        }                                                                                               \
    }

/* Names of the bodies for the head width FPT_MB_DK and FPT_MB_TERMS TF32 terms a product:
 * fpt_mb_fwd_64_x3, ... */
#define FPT_MB_CAT2(a, b) a##b
#define FPT_MB_CAT(a, b) FPT_MB_CAT2(a, b)
#define FPT_MB_NAME(x) FPT_MB_CAT(FPT_MB_CAT(FPT_MB_CAT(fpt_mb_##x##_, FPT_MB_DK), _x), FPT_MB_TERMS)

/* The bodies, once for each head width and each count of terms: 3 (hi and lo, f32's
 * accuracy: FPT_ATTENTION=mma) and 1 (one TF32 product, 2^-11 relative: FPT_ATTENTION=
 * mma-tf32, for runs whose products are bf16's anyway). */
#define FPT_MB_TERMS 3
#define FPT_MB_MMA FPT_MMA3
#define FPT_MB_DK 32
#include "fpt_attn_mma_body.h"
#undef FPT_MB_DK
#define FPT_MB_DK 64
#include "fpt_attn_mma_body.h"
#undef FPT_MB_DK
#undef FPT_MB_MMA
#undef FPT_MB_TERMS
#define FPT_MB_TERMS 1
#define FPT_MB_MMA FPT_MMA1
#define FPT_MB_DK 32
#include "fpt_attn_mma_body.h"
#undef FPT_MB_DK
#define FPT_MB_DK 64
#include "fpt_attn_mma_body.h"
#undef FPT_MB_DK
#undef FPT_MB_MMA
#undef FPT_MB_TERMS

#endif

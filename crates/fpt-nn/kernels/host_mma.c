/* fpt_attn_mma.h's kernels over the host grid: each block's body run with its 128 lanes in
 * lockstep (the header's host macros), block after block. Built into fpt-nn by build.rs on
 * every machine and called by src/ops/attention_tiled.rs for FPT_ATTENTION=mma on the CPU
 * (a reference, one thread) and by its tests, which compare the results with the composed
 * ops: the tensor-core kernels' fragments, masks and numbers checked without a GPU. */

#include "fpt_attn_mma.h"
#include <stdlib.h>

/* The bytes of shared memory kernel `kind` takes for heads of d dims; 0 past the widest. */
int64_t fpt_host_attn_mma_smem(int32_t kind, int64_t d) { return fpt_mb_smem_bytes(kind, d); }

static int64_t mb_blocks(const fpt_attn_geom *g, int64_t n) {
    return g->batch * g->heads * ((n + FPT_MB_ROWS - 1) / FPT_MB_ROWS);
}

static float *mb_smem(int kind, int64_t d) {
    int64_t bytes = fpt_mb_smem_bytes(kind, d);
    return bytes > 0 ? (float *)calloc((size_t)bytes / 4, sizeof(float)) : 0;
}

/* Each body's instances, indexed [head width is 64][three TF32 terms]. */
typedef void (*mb_fwd_fn)(const float *, const float *, const float *, float *, float *, const uint32_t *,
                          const fpt_attn_geom *, float *, int64_t);
typedef void (*mb_bwd_q_fn)(const float *, const float *, const float *, const float *, const float *, const float *,
                            float *, float *, const uint32_t *, const fpt_attn_geom *, float *, int64_t);
typedef void (*mb_bwd_kv_fn)(const float *, const float *, const float *, const float *, const float *,
                             const float *, float *, float *, const uint32_t *, const fpt_attn_geom *, float *, int64_t);
static const mb_fwd_fn MB_FWD[2][2] = {{fpt_mb_fwd_32_x1, fpt_mb_fwd_32_x3}, {fpt_mb_fwd_64_x1, fpt_mb_fwd_64_x3}};
static const mb_bwd_q_fn MB_BWD_Q[2][2] = {{fpt_mb_bwd_q_32_x1, fpt_mb_bwd_q_32_x3},
                                           {fpt_mb_bwd_q_64_x1, fpt_mb_bwd_q_64_x3}};
static const mb_bwd_kv_fn MB_BWD_KV[2][2] = {{fpt_mb_bwd_kv_32_x1, fpt_mb_bwd_kv_32_x3},
                                             {fpt_mb_bwd_kv_64_x1, fpt_mb_bwd_kv_64_x3}};

/* The forward over the host grid, products in `terms` TF32 terms (3 or 1); returns 0, or 1
 * when the head is too wide or scratch memory ran out. */
static int mb_fwd(const float *q, const float *k, const float *v, float *o, float *lse, const uint32_t *keylen,
                  const fpt_attn_geom *g, int terms) {
    const mb_fwd_fn body = MB_FWD[fpt_mb_dk(g->d) == 64][terms == 3];
    float *smem = mb_smem(FPT_AB_FWD, g->d);
    if (!smem) return 1;
    for (int64_t blk = 0; blk < mb_blocks(g, g->tq); blk++) body(q, k, v, o, lse, keylen, g, smem, blk);
    free(smem);
    return 0;
}

/* The two backward passes over the host grid (dq, dk, dv: the packed gradient's thirds,
 * rows of stride g->sg); returns 0, or 1 when the head is too wide or memory ran out. */
static int mb_bwd(const float *q, const float *k, const float *v, const float *o, const float *dout, const float *lse,
                  float *dd, float *dq, float *dk, float *dv, const uint32_t *keylen, const fpt_attn_geom *g,
                  int terms) {
    const int wide = fpt_mb_dk(g->d) == 64, three = terms == 3;
    float *smem = mb_smem(FPT_AB_BWD_Q, g->d);
    if (!smem) return 1;
    for (int64_t blk = 0; blk < mb_blocks(g, g->tq); blk++)
        MB_BWD_Q[wide][three](q, k, v, o, dout, lse, dd, dq, keylen, g, smem, blk);
    free(smem);
    smem = mb_smem(FPT_AB_BWD_KV, g->d);
    if (!smem) return 1;
    for (int64_t blk = 0; blk < mb_blocks(g, g->tk); blk++)
        MB_BWD_KV[wide][three](q, k, v, dout, lse, dd, dk, dv, keylen, g, smem, blk);
    free(smem);
    return 0;
}

/* The entry points src/ops/attention_tiled.rs calls: three TF32 terms (FPT_ATTENTION=mma)
 * and one (FPT_ATTENTION=mma-tf32). */
int fpt_host_attn_mma_fwd_f32(const float *q, const float *k, const float *v, float *o, float *lse,
                              const uint32_t *keylen, const fpt_attn_geom *g) {
    return mb_fwd(q, k, v, o, lse, keylen, g, 3);
}

int fpt_host_attn_mma1_fwd_f32(const float *q, const float *k, const float *v, float *o, float *lse,
                               const uint32_t *keylen, const fpt_attn_geom *g) {
    return mb_fwd(q, k, v, o, lse, keylen, g, 1);
}

int fpt_host_attn_mma_bwd_f32(const float *q, const float *k, const float *v, const float *o, const float *dout,
                              const float *lse, float *dd, float *dq, float *dk, float *dv, const uint32_t *keylen,
                              const fpt_attn_geom *g) {
    return mb_bwd(q, k, v, o, dout, lse, dd, dq, dk, dv, keylen, g, 3);
}

int fpt_host_attn_mma1_bwd_f32(const float *q, const float *k, const float *v, const float *o, const float *dout,
                               const float *lse, float *dd, float *dq, float *dk, float *dv, const uint32_t *keylen,
                               const fpt_attn_geom *g) {
    return mb_bwd(q, k, v, o, dout, lse, dd, dq, dk, dv, keylen, g, 1);
}

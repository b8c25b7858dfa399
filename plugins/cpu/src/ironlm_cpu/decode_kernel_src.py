"""The C source of the paged decode attention kernel and KV write (``decode_kernel`` builds and
calls it): per (sequence, KV-head range) work item, scores block by block from the paged cache,
a vectorised softmax, and the weighted values; float32 and bf16 caches."""

from ironlm_cpu.decode_512_src import AVX512_ATTEND_SOURCE
from ironlm_cpu.decode_bf16_src import BF16_ATTEND_SOURCE
from ironlm_cpu.decode_split_src import SPLIT_SOURCE
from ironlm_cpu.prefill_bf16_src import PREFILL_BF16_SOURCE
from ironlm_cpu.prefill_f32_src import PREFILL_F32_SOURCE
from ironlm_cpu.vexp_src import VEXP_SOURCE

SOURCE = VEXP_SOURCE + r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <pthread.h>

/* 8 floats; alignment 4 so loads from cache rows need not be 32-byte aligned */
typedef float v8 __attribute__((vector_size(32), aligned(4)));

typedef struct {
    const void *q;          /* (tokens, h, d) float32 or bf16 (uint16_t) */
    const void *kc, *vc;    /* (blocks, bs, h_kv, d) each, q's dtype */
    void *out;              /* (tokens, h, d) q's dtype */
    const int64_t *tokens;  /* (n,) row of q/out of each sequence */
    const int64_t *lens;    /* (n,) context length incl. the new token */
    const int32_t *tables;  /* (sequences, table_stride) physical block ids */
    int64_t table_stride;
    const int64_t *table_of; /* (n,) each row's table row; NULL: row s reads table row s */
    int n, h, h_kv, d, bs, window, max_len;
    float scale, cap;
    int64_t touch_item_bytes; /* K + V bytes of an item touched whole (touch_items):
                                 the caller's share of this core's L2 */
    float *stats; /* (h, 2) or NULL: per head the softmax's max score and sum of exp(score -
                     max), stored by the softmax (a piece of a split row: decode_split_src) */
} job_t;

static inline float hsum(v8 a) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* The 8 lane sums of a[0..7] as one vector (lane r: the sum of a[r]): three rounds of
   shuffle-and-add over pairs instead of eight scalar horizontal sums */
static inline v8 hsum8x8(const v8 *a) {
    v8 b[4], c0, c1;
    for (int i = 0; i < 4; i++) /* lanes: a[2i] folded to 4, then a[2i + 1] folded to 4 */
        b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
               __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    /* lanes: pairs of a[0], a[2], a[1], a[3] (c0) and of a[4], a[6], a[5], a[7] (c1) */
    c0 = __builtin_shufflevector(b[0], b[1], 0, 1, 8, 9, 4, 5, 12, 13) +
         __builtin_shufflevector(b[0], b[1], 2, 3, 10, 11, 6, 7, 14, 15);
    c1 = __builtin_shufflevector(b[2], b[3], 0, 1, 8, 9, 4, 5, 12, 13) +
         __builtin_shufflevector(b[2], b[3], 2, 3, 10, 11, 6, 7, 14, 15);
    /* sums of a[0], a[2], a[1], a[3], a[4], a[6], a[5], a[7], then into order */
    const v8 d = __builtin_shufflevector(c0, c1, 0, 2, 4, 6, 8, 10, 12, 14) +
                 __builtin_shufflevector(c0, c1, 1, 3, 5, 7, 9, 11, 13, 15);
    return __builtin_shufflevector(d, d, 0, 2, 1, 3, 4, 6, 5, 7);
}

typedef int32_t v8i __attribute__((vector_size(32), aligned(4)));
typedef uint32_t v8u __attribute__((vector_size(32), aligned(4)));
typedef uint16_t v8h __attribute__((vector_size(16), aligned(2)));  /* 8 bf16 */

/* 8 floats from 8 float32 or bf16 (widened by a 16-bit shift) values */
static inline v8 ld_f32(const float *p) { return *(const v8 *)p; }
static inline v8 ld_bf16(const uint16_t *p) {
    return (v8)(__builtin_convertvector(*(const v8h *)p, v8u) << 16);
}

/* float32 -> bf16 rounded to nearest even, as torch converts; NaN -> quiet NaN */
static inline uint16_t f32_bf16(float f) {
    union { float f; uint32_t u; } v = {f};
    if (f != f) return 0x7fc0;
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

static inline v8 vmax(v8 a, v8 b) {
    v8i m = a > b;  /* lanes: -1 where a > b */
    return (v8)((m & (v8i)a) | (~m & (v8i)b));
}

DEFINE_VEXP(vexp_neg, v8, v8i) /* exp of 8 lanes (vexp_src), for x <= 0 here */

/* exp(x) for x <= 0: 2^(x log2 e), degree-6 polynomial for the fraction (rel. error ~2e-7) */
static inline float exp_neg(float x) {
    x = x < -87.0f ? -87.0f : x;
    float t = x * 1.44269504088896341f, fi = floorf(t), f = t - fi;
    float p = 1.535336188319500e-4f;
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    union { float f; int32_t i; } u;
    u.f = p;
    u.i += (int32_t)fi << 23;
    return u.f;
}

/* Per block and query head: `cnt` keys/values at stride `row` elements of type T, read with LD.
   The NV-specialised versions (NV = head_dim / 8, a compile-time constant) keep q or the
   accumulator in registers; the generic ones serve other head sizes. */
#define BLOCK_FNS(NV, SFX, T, LD)                                                            \
static void dots_##NV##SFX(const v8 *q, const T *k, int64_t row, int64_t cnt, float scale,   \
                           float *out) {                                                     \
    v8 qr[NV];                                                                               \
    for (int i = 0; i < NV; i++) qr[i] = q[i];                                               \
    int64_t c = 0;                                                                           \
    for (; c + 8 <= cnt; c += 8) { /* 8 keys at once: their sums reduced together */         \
        v8 a[8];                                                                             \
        for (int r = 0; r < 8; r++) {                                                        \
            const T *kc = k + (c + r) * row;                                                 \
            v8 s = qr[0] * LD(kc);                                                           \
            for (int i = 1; i < NV; i++) s += qr[i] * LD(kc + 8 * i);                        \
            a[r] = s;                                                                        \
        }                                                                                    \
        *(v8 *)(out + c) = hsum8x8(a) * scale;                                               \
    }                                                                                        \
    for (; c < cnt; c++) {                                                                   \
        const T *kc = k + c * row;                                                           \
        v8 a0 = {0}, a1 = {0};                                                               \
        for (int i = 0; i + 1 < NV; i += 2) {                                                \
            a0 += qr[i] * LD(kc + 8 * i); a1 += qr[i + 1] * LD(kc + 8 * i + 8);              \
        }                                                                                    \
        if (NV % 2) a0 += qr[NV - 1] * LD(kc + 8 * (NV - 1));                                \
        out[c] = hsum(a0 + a1) * scale;                                                      \
    }                                                                                        \
}                                                                                            \
static void axpys_##NV##SFX(v8 *acc, const float *w, const T *v, int64_t row, int64_t cnt) { \
    v8 r[NV];                                                                                \
    for (int i = 0; i < NV; i++) r[i] = acc[i];                                              \
    for (int64_t c = 0; c < cnt; c++) {                                                      \
        const T *vc = v + c * row;                                                           \
        const float wc = w[c];                                                               \
        for (int i = 0; i < NV; i++) r[i] += wc * LD(vc + 8 * i);                            \
    }                                                                                        \
    for (int i = 0; i < NV; i++) acc[i] = r[i];                                              \
}

#define ANY_FNS(SFX, T, LD)                                                                  \
static void dots_any##SFX(const v8 *q, const T *k, int64_t row, int64_t cnt, float scale,    \
                          float *out, int nv) {                                              \
    for (int64_t c = 0; c < cnt; c++) {                                                      \
        const T *kc = k + c * row;                                                           \
        v8 a = {0};                                                                          \
        for (int i = 0; i < nv; i++) a += q[i] * LD(kc + 8 * i);                             \
        out[c] = hsum(a) * scale;                                                            \
    }                                                                                        \
}                                                                                            \
static void axpys_any##SFX(v8 *acc, const float *w, const T *v, int64_t row, int64_t cnt,    \
                           int nv) {                                                         \
    for (int64_t c = 0; c < cnt; c++) {                                                      \
        const T *vc = v + c * row;                                                           \
        for (int i = 0; i < nv; i++) acc[i] += w[c] * LD(vc + 8 * i);                        \
    }                                                                                        \
}

BLOCK_FNS(8, _f32, float, ld_f32)       /* head_dim 64 */
BLOCK_FNS(16, _f32, float, ld_f32)      /* head_dim 128 */
ANY_FNS(_f32, float, ld_f32)

/* A block's rows of one KV head as float32 for the dots above: float32 rows are read in
   place (*stride = row); bf16 rows are widened once into `buf` (cnt x d, *stride = d), so
   the query heads of a GQA group share one widening instead of each widening every key. */
static inline const float *stage_f32(const float *src, int64_t row, int64_t cnt, int d,
                                     float *buf, int64_t *stride) {
    (void)cnt, (void)d, (void)buf;
    *stride = row;
    return src;
}
static inline const float *stage_bf16(const uint16_t *src, int64_t row, int64_t cnt, int d,
                                      float *buf, int64_t *stride) {
    for (int64_t c = 0; c < cnt; c++)
        for (int i = 0; i < d; i += 8) *(v8 *)(buf + c * d + i) = ld_bf16(src + c * row + i);
    *stride = d;
    return buf;
}

/* Softmax of one query head's n scores in place (after the soft cap, when cap > 0); stats,
   when not NULL, gets the max score and the sum of exp(score - max). */
static void softmax(float *sg, int64_t n, float cap, float *stats) {
    float mx = -INFINITY, tot = 0;
    if (cap > 0)
        for (int64_t p = 0; p < n; p++) sg[p] = cap * tanhf(sg[p] / cap);
    int64_t p = 0;
    v8 m8 = mx - (v8){0}, t8 = {0};
    for (; p + 8 <= n; p += 8) m8 = vmax(m8, *(v8 *)(sg + p));
    for (int l = 0; l < 8; l++) mx = m8[l] > mx ? m8[l] : mx;
    for (; p < n; p++) mx = sg[p] > mx ? sg[p] : mx;
    for (p = 0; p + 8 <= n; p += 8) {
        v8 e = vexp_neg(*(v8 *)(sg + p) - mx);
        *(v8 *)(sg + p) = e;
        t8 += e;
    }
    for (; p < n; p++) { sg[p] = exp_neg(sg[p] - mx); tot += sg[p]; }
    tot += hsum(t8);
    if (stats) {
        stats[0] = mx;
        stats[1] = tot;
    }
    const float inv = 1.0f / tot;
    for (p = 0; p < n; p++) sg[p] *= inv;
}

/* Physical block id of block blk of row s (prefill rows share their sequence's table row) */
static inline int64_t block_id(const job_t *j, int s, int64_t blk) {
    const int64_t t = j->table_of ? j->table_of[s] : s;
    return j->tables[t * j->table_stride + blk];
}

/* Load one byte of every cache line of KV heads [hk0, hk1)'s rows in the sequence's blocks
   [blk0, blk0 + TOUCH_TOKENS / bs) before they are computed on: a sequence's blocks are
   scattered over the cache, the hardware prefetchers stop at each (4 KiB page) boundary, and
   the dot loops keep too few misses in flight; these independent loads keep many. 64 x 128
   tokens in 30 layers' caches (cold): float32 ~700 -> ~570, bf16 ~576 -> ~378 us per layer;
   software prefetch instructions for the next block gave nothing here. The chunk (128 tokens: 96 KiB for 3
   float32 heads of 64, K or V) stays in L2 until used. */
#define TOUCH_TOKENS 128
static inline int64_t touch_every(int bs) { return TOUCH_TOKENS / bs > 0 ? TOUCH_TOKENS / bs : 1; }
static inline void touch_blocks(const job_t *j, const void *cache, size_t esize, int s,
                                int64_t blk0, int hk0, int hk1) {
    const int64_t len = j->lens[s], row = (int64_t)j->h_kv * j->d;
    const int64_t span = (int64_t)(hk1 - hk0) * j->d * esize;
    unsigned sum = 0;
    for (int64_t blk = blk0; blk < blk0 + touch_every(j->bs) && blk * j->bs < len; blk++) {
        const int64_t cnt = len - blk * j->bs < j->bs ? len - blk * j->bs : j->bs;
        const char *base = (const char *)cache +
            (block_id(j, s, blk) * j->bs * row + hk0 * j->d) * esize;
        for (int64_t c = 0; c < cnt; c++)
            for (int64_t b = 0; b < span; b += 64) sum += (unsigned char)base[c * row * esize + b];
    }
    __asm__ volatile("" : : "r"(sum)); /* the loads are the point: keep them */
}

/* First row an item attends to (a sliding window's start, else 0) */
static inline int64_t item_start(const job_t *j, int s) {
    const int64_t len = j->lens[s];
    return (j->window > 0 && len > j->window) ? len - j->window : 0;
}

/* Whether item (s, [hk0, hk1)) reads few enough K and V bytes to be touched whole before its
   first pass (touch_items, by the caller) instead of a chunk at a time (block_rows) */
static inline int item_touched_whole(const job_t *j, size_t esize, int s, int hk0, int hk1) {
    const int64_t bytes = (j->lens[s] - item_start(j, s)) * (hk1 - hk0) * j->d * (int64_t)esize;
    return 2 * bytes <= j->touch_item_bytes;
}

/* Touch every K and V line of up to two items (sequence s[i], KV heads [hk0[i], hk1[i]))
   that item_touched_whole takes, token by token across them: K and V of a row together, and
   the two items' rows in turn, so four streams run at once where a chunk of touch_blocks runs
   one; each block's values are in cache before pass 2. 64 sequences of SmolLM2, 30 layers'
   bf16 caches, 2 threads on the Zen 5, us per layer, a chunk at a time -> pairs: 70 tokens
   142-157 -> 118-130, 100: 179-185 -> 149-154, 150: 262-271 -> 229-243, 190: 328-331 ->
   292-307 (one item's K and V alone: about half the gain; three or more items: slower). */
static void touch_items(const job_t *j, size_t esize, int count, const int *s, const int *hk0,
                        const int *hk1) {
    const int64_t bs = j->bs, row = (int64_t)j->h_kv * j->d * esize;
    int64_t first[2], blocks[2], most = 0;
    int m = 0, take[2];
    for (int i = 0; i < count && i < 2; i++) {
        if (!item_touched_whole(j, esize, s[i], hk0[i], hk1[i])) continue;
        take[m] = i;
        first[m] = item_start(j, s[i]) / bs;
        blocks[m] = (j->lens[s[i]] + bs - 1) / bs - first[m];
        most = blocks[m] > most ? blocks[m] : most;
        m++;
    }
    unsigned sum = 0;
    for (int64_t r = 0; r < most; r++) { /* the items' r-th blocks together */
        const char *k[2], *v[2];
        int64_t rows[2], span[2];
        for (int u = 0; u < m; u++) {
            const int i = take[u];
            const int64_t blk = first[u] + r, len = j->lens[s[i]], st = item_start(j, s[i]);
            const int64_t c0 = blk * bs > st ? blk * bs : st;
            const int64_t c1 = (blk + 1) * bs < len ? (blk + 1) * bs : len;
            rows[u] = r < blocks[u] ? c1 - c0 : 0;
            span[u] = (int64_t)(hk1[i] - hk0[i]) * j->d * esize;
            const int64_t off = rows[u] == 0 ? 0 : (block_id(j, s[i], blk) * bs + (c0 - blk * bs)) *
                                row + hk0[i] * j->d * (int64_t)esize; /* same place in K and V */
            k[u] = (const char *)j->kc + off;
            v[u] = (const char *)j->vc + off;
        }
        for (int64_t c = 0; c < bs; c++)
            for (int u = 0; u < m; u++) {
                if (c >= rows[u]) continue;
                for (int64_t b = 0; b < span[u]; b += 64)
                    sum += (unsigned char)k[u][c * row + b] + (unsigned char)v[u][c * row + b];
            }
    }
    __asm__ volatile("" : : "r"(sum)); /* the loads are the point: keep them */
}

/* Block blk of sequence s in `cache` (elements of esize bytes): its rows [*p0, *p1) clipped to
   [start, len), returned as a pointer to row *p0; the next TOUCH_TOKENS are touched first when
   blk starts a chunk, unless the item is one its caller touches whole (item_touched_whole).
   Both passes of both kernels walk the blocks through this. */
static inline const void *block_rows(const job_t *j, const void *cache, size_t esize, int s,
                                     int64_t blk, int64_t start, int hk0, int hk1, int64_t *p0,
                                     int64_t *p1) {
    const int64_t len = j->lens[s], bs = j->bs, row = (int64_t)j->h_kv * j->d;
    *p0 = blk * bs > start ? blk * bs : start;
    *p1 = (blk + 1) * bs < len ? (blk + 1) * bs : len;
    if (!item_touched_whole(j, esize, s, hk0, hk1) && (blk - start / bs) % touch_every(bs) == 0)
        touch_blocks(j, cache, esize, s, blk, hk0, hk1);
    const int64_t id = block_id(j, s, blk);
    return (const char *)cache + ((id * bs + (*p0 - blk * bs)) * row) * (int64_t)esize;
}

/* One sequence, KV heads [hk0, hk1), cache elements of type T: scores, softmax, weighted
   values into acc (float32). q is the sequence's (h, d) float32 query row; buf holds one
   block's rows of one KV head (bs x d floats) when T is bf16. */
#define ATTEND(SFX, T)                                                                       \
static void attend##SFX(const job_t *j, int s, int hk0, int hk1, const float *q,             \
                        float *scores, v8 *acc, float *buf) {                                \
    const int gq = j->h / j->h_kv, d = j->d, nv = d / 8, bs = j->bs, ml = j->max_len;        \
    const int g0 = hk0 * gq, g1 = hk1 * gq;                                                  \
    const int64_t len = j->lens[s], row = (int64_t)j->h_kv * d;                              \
    const int64_t start = item_start(j, s); /* a sliding window's first row */               \
    const T *kc = (const T *)j->kc, *vc = (const T *)j->vc;                                  \
    int64_t st;                                                                              \
    /* pass 1: scores[g][p - start] = scale * q_g . k_p, block by block */                   \
    for (int64_t blk = start / bs; blk * bs < len; blk++) {                                  \
        int64_t p0, p1;                                                                      \
        const T *k = block_rows(j, kc, sizeof(T), s, blk, start, hk0, hk1, &p0, &p1);        \
        for (int hk = hk0; hk < hk1; hk++) {                                                 \
            const float *kg = stage##SFX(k + hk * d, row, p1 - p0, d, buf, &st);             \
            for (int g = hk * gq; g < (hk + 1) * gq; g++) {                                  \
                const v8 *qg = (const v8 *)(q + g * d);                                      \
                float *out = scores + g * ml + (p0 - start);                                 \
                if (nv == 8) dots_8_f32(qg, kg, st, p1 - p0, j->scale, out);                 \
                else if (nv == 16) dots_16_f32(qg, kg, st, p1 - p0, j->scale, out);          \
                else dots_any_f32(qg, kg, st, p1 - p0, j->scale, out, nv);                   \
            }                                                                                \
        }                                                                                    \
    }                                                                                        \
    for (int g = g0; g < g1; g++)                                                            \
        softmax(scores + g * ml, len - start, j->cap, j->stats ? j->stats + 2 * g : NULL);   \
    /* pass 2: out_g = sum_p w[g][p] v_p, block by block */                                  \
    memset(acc + g0 * nv, 0, sizeof(float) * (size_t)(g1 - g0) * d);                         \
    for (int64_t blk = start / bs; blk * bs < len; blk++) {                                  \
        int64_t p0, p1;                                                                      \
        const T *v = block_rows(j, vc, sizeof(T), s, blk, start, hk0, hk1, &p0, &p1);        \
        for (int hk = hk0; hk < hk1; hk++) {                                                 \
            const float *vg = stage##SFX(v + hk * d, row, p1 - p0, d, buf, &st);             \
            for (int g = hk * gq; g < (hk + 1) * gq; g++) {                                  \
                const float *w = scores + g * ml + (p0 - start);                             \
                if (nv == 8) axpys_8_f32(acc + g * nv, w, vg, st, p1 - p0);                  \
                else if (nv == 16) axpys_16_f32(acc + g * nv, w, vg, st, p1 - p0);           \
                else axpys_any_f32(acc + g * nv, w, vg, st, p1 - p0, nv);                    \
            }                                                                                \
        }                                                                                    \
    }                                                                                        \
}
ATTEND(_f32, float)
ATTEND(_bf16, uint16_t)
""" + AVX512_ATTEND_SOURCE + BF16_ATTEND_SOURCE + PREFILL_BF16_SOURCE + PREFILL_F32_SOURCE + r"""

/* Attention of row s's query heads for KV heads [hk0, hk1) into acc, float32 (heads g0..g1 at
   g * d): the query row as float32 (a bf16 one widened into qbuf), the body this build has. */
static void attend_row(const job_t *j, int bf16, int s, int hk0, int hk1, float *scores,
                       v8 *acc, float *qbuf, float *buf) {
    const int d = j->d, gq = j->h / j->h_kv, g0 = hk0 * gq, g1 = hk1 * gq;
    const int64_t row0 = j->tokens[s] * j->h * d;  /* the sequence's first q/out element */
    float *a = (float *)acc;
    (void)a;
    if (!bf16) {
#ifdef HAVE_ATTEND_512_F32
        if (d % 64 == 0 && d / 16 <= ATTEND_512_MAX_NQ) /* 16-lane FMAs (decode_512_src) */
            attend_512_f32(j, s, hk0, hk1, (const float *)j->q + row0, scores, a);
        else
#endif
        attend_f32(j, s, hk0, hk1, (const float *)j->q + row0, scores, acc, NULL);
        return;
    }
    const uint16_t *q = (const uint16_t *)j->q + row0;
#ifdef HAVE_ATTEND_512
    if (d % 64 == 0 && d / 32 <= ATTEND_512_MAX_NQ) /* vdpbf16ps (decode_bf16_src) */
        attend_512_bf16(j, s, hk0, hk1, q, scores, a);
    else
#endif
    {
        for (int64_t e = (int64_t)g0 * d; e < (int64_t)g1 * d; e++) {
            union { uint32_t u; float f; } v = {(uint32_t)q[e] << 16};
            qbuf[e] = v.f;
        }
        attend_bf16(j, s, hk0, hk1, qbuf, scores, acc, buf);
    }
}

/* Heads [g0, g1) of row s's output from float32 values (bf16 rounded to nearest even) */
static void store_heads(const job_t *j, int bf16, int s, int g0, int g1, const float *a) {
    const int64_t row0 = j->tokens[s] * j->h * j->d, e0 = (int64_t)g0 * j->d;
    const int64_t e1 = (int64_t)g1 * j->d;
    if (!bf16) {
        memcpy((float *)j->out + row0 + e0, a + e0, sizeof(float) * (size_t)(e1 - e0));
        return;
    }
    uint16_t *o = (uint16_t *)j->out + row0;
    for (int64_t e = e0; e < e1; e++) o[e] = f32_bf16(a[e]);
}

/* One work item: attention of row s for KV heads [hk0, hk1), stored in the output's dtype */
static void item(const job_t *j, int bf16, int s, int hk0, int hk1, float *scores, v8 *acc,
                 float *qbuf, float *buf) {
    const int gq = j->h / j->h_kv;
    attend_row(j, bf16, s, hk0, hk1, scores, acc, qbuf, buf);
    store_heads(j, bf16, s, hk0 * gq, hk1 * gq, (const float *)acc);
}
""" + SPLIT_SOURCE + r"""

/* A thread's scratch, kept across calls and grown to the largest asked (it follows the
   longest context): no malloc per call in each thread of the team, which would all take one
   lock where the process's threads share glibc's main arena (the server, ``host_memory``).
   Freed when the thread ends. */
typedef struct { size_t bytes; char *mem; } scratch_t;
static pthread_key_t scratch_key;
static int scratch_key_ok;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static void scratch_free(void *p) {
    free(((scratch_t *)p)->mem);
    free(p);
}
static void scratch_key_init(void) {
    scratch_key_ok = pthread_key_create(&scratch_key, scratch_free) == 0;
}
static char *thread_scratch(size_t bytes) {
    pthread_once(&scratch_once, scratch_key_init);
    if (!scratch_key_ok) return NULL;
    scratch_t *s = pthread_getspecific(scratch_key);
    if (s == NULL) {
        s = calloc(1, sizeof *s);
        if (s == NULL || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (bytes > s->bytes) {
        free(s->mem);
        s->mem = aligned_alloc(64, bytes);
        s->bytes = s->mem != NULL ? bytes : 0;
    }
    return s->mem;
}
#define SCRATCH_ROUND(b) (((b) + 63) / 64 * 64)

/* Returns 0 on success, 1 when a thread could not allocate its scratch. Work items are
   (sequence, KV-head range), handed out dynamically (prefill rows: in contiguous runs, below;
   runs of 8+ prompt rows go to tiles first, ``prefill_bf16_src`` / ``prefill_f32_src``); the
   OpenMP team is torch's own (the library is linked against the libgomp torch has loaded), so
   torch's idle workers pick the items up instead of spinning beside extra threads of ours.
   bf16: q, cache and out bf16. */
#define ROW_COST 16 /* a row's fixed work (query, softmax, output) in keys' worth */
static int paged_decode(const job_t *j, int bf16, int threads) {
    const int n = j->n, h = j->h, h_kv = j->h_kv, d = j->d, max_len = j->max_len;
    /* few long rows: each row's keys in runs, every KV head of a run together (one dense
       stream), merged after (decode_split_src); else few rows: one work item per (row, KV
       head) so every thread has work */
    const int runs = split_runs(j, threads);
    const int heads_per_item = runs > 1 || n >= 4 * threads ? h_kv : 1;
    const int per_seq = h_kv / heads_per_item, items = n * per_seq;
    const size_t esize = bf16 ? sizeof(uint16_t) : sizeof(float);
    int failed = 0, tiles = 0, *starts = NULL, *ends = NULL;
    float *part = NULL, *stats = NULL; /* split rows: every piece's heads (decode_split_src) */
    if (runs > 1) {
        const size_t heads = (size_t)n * runs * h;
        part = malloc(sizeof(float) * heads * d);
        stats = malloc(sizeof(float) * heads * 2);
        if (part == NULL || stats == NULL) {
            free(part);
            free(stats);
            return 1;
        }
    }
    const int work = items * runs;
    unsigned char *tiled = NULL; /* rows a prefill tile attends (prefill_bf16/f32_src) */
#ifdef HAVE_PREFILL_TILES
    const int tile_fit = bf16 ? pf_fits(j, bf16) : pf32_fits(j);
#else
    const int tile_fit = !bf16 && pf32_fits(j);
#endif
    if (tile_fit) {
        starts = malloc(sizeof(int) * (size_t)n);
        ends = malloc(sizeof(int) * (size_t)n);
        tiled = calloc((size_t)n, 1);
        if (starts == NULL || ends == NULL || tiled == NULL) {
            free(starts);
            free(ends);
            free(tiled);
            return 1;
        }
        tiles = pf_tiles(j, starts, ends, tiled);
    }
    const int64_t pf_ml = ((int64_t)max_len + 15) / 16 * 16; /* a tile's score row stride */
    #pragma omp parallel num_threads(threads > work ? (work > 0 ? work : 1) : threads) \
        reduction(|: failed)
    {
        /* scores, acc; bf16: qbuf, buf; tiles: kt (a tile's transposed keys: d elements of
           the cache's dtype a key), sc; each piece 64-byte aligned in the thread's scratch */
        const size_t sizes[6] = {
            SCRATCH_ROUND(sizeof(float) * (size_t)h * max_len),
            SCRATCH_ROUND(sizeof(float) * (size_t)h * d),
            bf16 ? SCRATCH_ROUND(sizeof(float) * (size_t)h * d) : 0,
            bf16 ? SCRATCH_ROUND(sizeof(float) * (size_t)j->bs * d) : 0,
            tiles > 0 ? SCRATCH_ROUND((size_t)pf_ml * esize * d) : 0,
            tiles > 0 ? SCRATCH_ROUND(sizeof(float) * (size_t)PF_ROWS * (h / h_kv) * pf_ml) : 0,
        };
        char *piece[6];
        char *mem = thread_scratch(sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[4] +
                                   sizes[5]);
        size_t at = 0;
        for (int i = 0; i < 6; at += sizes[i], i++)
            piece[i] = mem != NULL && sizes[i] > 0 ? mem + at : NULL;
        float *scores = (float *)piece[0], *qbuf = (float *)piece[2], *buf = (float *)piece[3];
        v8 *acc = (v8 *)piece[1];
        void *kt = piece[4];
        float *sc = (float *)piece[5];
        const int ok = mem != NULL;
        #pragma omp for schedule(dynamic, 1) nowait
        for (int it = 0; it < tiles * h_kv; it++) {
            if (!ok) continue;
            const int r0 = starts[it / h_kv], r1 = ends[it / h_kv], hk = it % h_kv;
#ifdef HAVE_PREFILL_TILES
            if (bf16) pf_tile(j, r0, r1, hk, (uint32_t *)kt, sc, pf_ml);
            else
#endif
                pf32_tile(j, r0, r1, hk, (float *)kt, sc, pf_ml);
        }
        if (!ok) failed = 1;
        if (runs > 1) {
            if (split_rows(j, bf16, runs, part, stats, ok, scores, acc, qbuf, buf)) failed = 1;
        } else if (j->table_of != NULL && per_seq == 1) {
            /* prefill rows: each thread a contiguous run of rows with an equal share of the
               keys (a row costs its keys plus ROW_COST): the rows' queries come from, and
               their outputs go to, ops that split rows the same way, so they stay in this
               core's cache (the 32 x 64-token SmolLM2 prefill step on the 2-core Zen 5, 30
               layers: rows handed out one by one 33.5 ms, these runs 29.6 ms) */
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            int64_t total = 0;
            for (int s = 0; s < n; s++) total += tiled && tiled[s] ? 0 : j->lens[s] + ROW_COST;
            int64_t seen = 0;
            for (int s = 0; s < n && ok; s++) {
                if (tiled && tiled[s]) continue;
                const int64_t mid = seen + (j->lens[s] + ROW_COST) / 2; /* owner: the middle */
                seen += j->lens[s] + ROW_COST;
                if (mid * nt / total != t) continue;
                const int zero = 0;
                touch_items(j, esize, 1, &s, &zero, &h_kv);
                item(j, bf16, s, 0, h_kv, scores, acc, qbuf, buf);
            }
        } else {
            /* items in pairs touched together (touch_items) when every item is touched
               whole (the longest context, or the window, fits) and there are pairs enough
               for every thread; else one by one, each touching itself whole or in chunks */
            const int64_t span = j->window > 0 && j->window < max_len ? j->window : max_len;
            const int group = span * heads_per_item * d * (int64_t)esize * 2 <=
                              j->touch_item_bytes && (items + 1) / 2 >= threads ? 2 : 1;
            #pragma omp for schedule(dynamic, 1)
            for (int p = 0; p < (items + group - 1) / group; p++) {
                int m = 0, seq[2], hk0[2], hk1[2];
                for (int it = group * p; it < group * (p + 1) && it < items; it++) {
                    if (!ok || (tiled && tiled[it / per_seq])) continue;
                    seq[m] = it / per_seq;
                    hk0[m] = (it % per_seq) * heads_per_item;
                    hk1[m] = hk0[m] + heads_per_item;
                    m++;
                }
                touch_items(j, esize, m, seq, hk0, hk1);
                for (int i = 0; i < m; i++)
                    item(j, bf16, seq[i], hk0[i], hk1[i], scores, acc, qbuf, buf);
            }
        }
    }
    free(starts);
    free(ends);
    free(tiled);
    free(part);
    free(stats);
    return failed;
}

#define DECODE_ENTRY(SFX, T, BF16)                                                           \
int ironlm_paged_decode##SFX(const T *q, const T *kc, const T *vc, T *out,                   \
                             const int64_t *tokens, const int64_t *lens,                     \
                             const int32_t *tables, int64_t table_stride,                    \
                             const int64_t *table_of, int n, int h,                          \
                             int h_kv, int d, int bs, int window, int max_len, float scale,  \
                             float cap, int threads, int64_t touch_item_bytes) {             \
    const job_t j = {q, kc, vc, out, tokens, lens, tables, table_stride, table_of, n, h,     \
                     h_kv, d, bs, window, max_len, scale, cap, touch_item_bytes, NULL};      \
    return paged_decode(&j, BF16, threads);                                                  \
}
DECODE_ENTRY(_f32, float, 0)
DECODE_ENTRY(_bf16, uint16_t, 1)

/* Store t new tokens' K and V rows (row elements of esize bytes each; token r's rows start
   at element r * ks of k and r * vs of v) at their cache slots. A negative slot marks a padding
   row (skipped, as vLLM's pad slot -1); returns the number of slots >= num_slots, which are
   skipped too. */
static int write_kv(const char *k, int64_t ks, const char *v, int64_t vs, char *kc, char *vc,
                    const int64_t *slots, int t, int row, int64_t num_slots, size_t esize) {
    const size_t bytes = esize * (size_t)row;
    int bad = 0;
    /* a decode batch's rows land in cold cache lines (each a read for ownership): two threads
       keep twice the misses in flight (64 rows of SmolLM2's bf16 K and V: 13 -> ~8 us) */
    #pragma omp parallel for schedule(static) reduction(+: bad) if (t >= 16)
    for (int r = 0; r < t; r++) {
        const int64_t s = slots[r];
        if (s < 0 || s >= num_slots) {
            bad += s >= num_slots;
            continue;
        }
        memcpy(kc + s * bytes, k + (int64_t)r * ks * esize, bytes);
        memcpy(vc + s * bytes, v + (int64_t)r * vs * esize, bytes);
    }
    return bad;
}

int ironlm_write_kv_f32(const float *k, int64_t ks, const float *v, int64_t vs, float *kc,
                        float *vc, const int64_t *slots, int t, int row, int64_t num_slots) {
    return write_kv((const char *)k, ks, (const char *)v, vs, (char *)kc, (char *)vc, slots, t,
                    row, num_slots, sizeof(float));
}

int ironlm_write_kv_bf16(const uint16_t *k, int64_t ks, const uint16_t *v, int64_t vs,
                         uint16_t *kc, uint16_t *vc, const int64_t *slots, int t, int row,
                         int64_t num_slots) {
    return write_kv((const char *)k, ks, (const char *)v, vs, (char *)kc, (char *)vc, slots, t,
                    row, num_slots, sizeof(uint16_t));
}
"""

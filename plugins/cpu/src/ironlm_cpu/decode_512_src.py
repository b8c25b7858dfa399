"""C source of the AVX-512 paged decode attention (``decode_kernel_src`` places it before the
work-item code that calls it): the shared 16-lane helpers, the attention body written once as
macros over the cache element type, and its float32 instance. ``decode_bf16_src`` instantiates
the same macros for bf16 caches with ``vdpbf16ps`` scores.

Per work item (a sequence, a range of KV heads): pass 1 scores each block's keys, two query
heads of a GQA group per key load, 8 keys x 2 heads (or 16 keys x 1 head) reduced together by
one 16 x 16 transpose-add (``hsum16x16``); a 16-lane softmax per head; pass 2 loads each value
row once (widened to float32 in registers for bf16) and sums it into up to 3 heads' 64 outputs
with 16-lane FMAs (12 independent accumulators, so consecutive rows do not wait on each other).
The portable path (8 lanes) does one head per key and value load.

Measured (64 sequences x 176 cached tokens, SmolLM2's 9 / 3 heads of 64, 2 threads, Zen 5, one
layer's cache hot in L3): bf16 209 -> 141 us per layer, float32 293 -> 234 us; with 30 layers'
caches (cold, as a decode step reads them) bf16 368 -> ~315, float32 550 -> ~535 us: bound by
memory from there. Software prefetch of the item's values during pass 1 and of the next
item's keys during pass 2 (2026-11-26, with the calls really emitted: a prefetch-only helper
that is not inlined is deleted by gcc) gave mixed results, cold: contiguous blocks 305 -> 369
us, interleaved 394 -> 378, random 409 -> 374; not kept.
Head sizes: multiples of 64, up to 128 (float32) or 256 (bf16).
"""

AVX512_ATTEND_SOURCE = r"""
#if defined(__AVX512F__)
#include <immintrin.h>

typedef float v16 __attribute__((vector_size(64), aligned(4)));

/* The 16 lane sums of a[0..15] as one vector (lane r: the sum of a[r]): four rounds that
   halve the partial sums of two vectors into one, then a lane permutation into order. */
static inline __attribute__((always_inline)) __m512 hsum16x16(const __m512 *a) {
    v16 b[8], c[4], e[2];
    for (int i = 0; i < 8; i++) /* lanes 0-7: 8 partials of a[2i], 8-15: of a[2i + 1] */
        b[i] = __builtin_shufflevector((v16)a[2 * i], (v16)a[2 * i + 1],
                                       0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector((v16)a[2 * i], (v16)a[2 * i + 1],
                                       8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; i++) /* 4-lane groups: a[4i], a[4i + 2], a[4i + 1], a[4i + 3] */
        c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1],
                                       0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
               __builtin_shufflevector(b[2 * i], b[2 * i + 1],
                                       4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++) /* lane pairs: a[8i + 0, 4, 2, 6, 1, 5, 3, 7] */
        e[i] = __builtin_shufflevector(c[2 * i], c[2 * i + 1],
                                       0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
               __builtin_shufflevector(c[2 * i], c[2 * i + 1],
                                       2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    /* lanes: sums of a[0, 4, 2, 6, 1, 5, 3, 7], then a[8 + the same] */
    const v16 f = __builtin_shufflevector(e[0], e[1], 0, 2, 4, 6, 8, 10, 12, 14,
                                          16, 18, 20, 22, 24, 26, 28, 30) +
                  __builtin_shufflevector(e[0], e[1], 1, 3, 5, 7, 9, 11, 13, 15,
                                          17, 19, 21, 23, 25, 27, 29, 31);
    return (__m512)__builtin_shufflevector(f, f, 0, 4, 2, 6, 1, 5, 3, 7,
                                           8, 12, 10, 14, 9, 13, 11, 15);
}

/* softmax (decode_kernel_src) on 16 lanes, exp by vexp_src's vexp512; the soft cap, when
   set, by the portable one; stats as there */
static void softmax_512(float *sg, int64_t n, float cap, float *stats) {
    if (cap > 0) {
        softmax(sg, n, cap, stats);
        return;
    }
    __m512 m = _mm512_set1_ps(-INFINITY), t = _mm512_setzero_ps();
    int64_t p = 0;
    for (; p + 16 <= n; p += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(sg + p));
    float mx = _mm512_reduce_max_ps(m);
    for (; p < n; p++) mx = sg[p] > mx ? sg[p] : mx;
    const __m512 mv = _mm512_set1_ps(mx);
    for (p = 0; p + 16 <= n; p += 16) {
        const __m512 e = vexp512(_mm512_sub_ps(_mm512_loadu_ps(sg + p), mv));
        _mm512_storeu_ps(sg + p, e);
        t = _mm512_add_ps(t, e);
    }
    float tot = 0;
    for (; p < n; p++) { sg[p] = exp_neg(sg[p] - mx); tot += sg[p]; }
    tot += _mm512_reduce_add_ps(t);
    if (stats) {
        stats[0] = mx;
        stats[1] = tot;
    }
    const __m512 inv = _mm512_set1_ps(1.0f / tot);
    for (p = 0; p + 16 <= n; p += 16)
        _mm512_storeu_ps(sg + p, _mm512_mul_ps(_mm512_loadu_ps(sg + p), inv));
    for (; p < n; p++) sg[p] *= 1.0f / tot;
}

/* dots_512##SFX: scale * q . k for cnt keys at stride `row`, NQ vectors of STEP elements per
   row (at most 8): per key NQ multiply-adds (MAC) into one 16-lane partial, 16 keys reduced
   together. dots2_512##SFX: the same for two query heads of one KV head (NQ <= 4), each key
   row loaded once for both, 8 keys x 2 heads reduced together (lanes 0-7: head a, 8-15: b). */
#define DOT_FNS_512(SFX, T, QV, LDV, MAC, STEP)                                                \
static inline __attribute__((always_inline)) void dots_512##SFX(                               \
    const T *qh, int NQ, const T *k, int64_t row, int64_t cnt, float scale, float *out) {      \
    QV q[ATTEND_512_MAX_NQ];                                                                   \
    for (int i = 0; i < NQ; i++) q[i] = LDV(qh + STEP * i);                                    \
    int64_t c = 0;                                                                             \
    for (; c + 16 <= cnt; c += 16) {                                                           \
        __m512 a[16];                                                                          \
        for (int r = 0; r < 16; r++) {                                                         \
            const T *kc = k + (c + r) * row;                                                   \
            __m512 s = MAC(_mm512_setzero_ps(), q[0], LDV(kc));                                \
            for (int i = 1; i < NQ; i++) s = MAC(s, q[i], LDV(kc + STEP * i));                 \
            a[r] = s;                                                                          \
        }                                                                                      \
        _mm512_storeu_ps(out + c, _mm512_mul_ps(hsum16x16(a), _mm512_set1_ps(scale)));         \
    }                                                                                          \
    for (; c < cnt; c++) {                                                                     \
        const T *kc = k + c * row;                                                             \
        __m512 s = MAC(_mm512_setzero_ps(), q[0], LDV(kc));                                    \
        for (int i = 1; i < NQ; i++) s = MAC(s, q[i], LDV(kc + STEP * i));                     \
        out[c] = _mm512_reduce_add_ps(s) * scale;                                              \
    }                                                                                          \
}                                                                                              \
static inline __attribute__((always_inline)) void dots2_512##SFX(                              \
    const T *qa, const T *qb, int NQ, const T *k, int64_t row, int64_t cnt, float scale,       \
    float *oa, float *ob) {                                                                    \
    QV a[4], b[4];                                                                             \
    for (int i = 0; i < NQ; i++) a[i] = LDV(qa + STEP * i), b[i] = LDV(qb + STEP * i);         \
    int64_t c = 0;                                                                             \
    for (; c + 8 <= cnt; c += 8) {                                                             \
        __m512 t[16];                                                                          \
        for (int r = 0; r < 8; r++) {                                                          \
            const T *kc = k + (c + r) * row;                                                   \
            const QV k0 = LDV(kc);                                                             \
            __m512 sa = MAC(_mm512_setzero_ps(), a[0], k0);                                    \
            __m512 sb = MAC(_mm512_setzero_ps(), b[0], k0);                                    \
            for (int i = 1; i < NQ; i++) {                                                     \
                const QV ki = LDV(kc + STEP * i);                                              \
                sa = MAC(sa, a[i], ki);                                                        \
                sb = MAC(sb, b[i], ki);                                                        \
            }                                                                                  \
            t[r] = sa, t[8 + r] = sb;                                                          \
        }                                                                                      \
        const __m512 sum = _mm512_mul_ps(hsum16x16(t), _mm512_set1_ps(scale));                 \
        _mm256_storeu_ps(oa + c, _mm512_castps512_ps256(sum));                                 \
        _mm256_storeu_ps(ob + c, _mm256_castpd_ps(                                             \
                                     _mm512_extractf64x4_pd(_mm512_castps_pd(sum), 1)));       \
    }                                                                                          \
    if (c < cnt) {                                                                             \
        dots_512##SFX(qa, NQ, k + c * row, row, cnt - c, scale, oa + c);                       \
        dots_512##SFX(qb, NQ, k + c * row, row, cnt - c, scale, ob + c);                       \
    }                                                                                          \
}

/* pv_512##SFX: acc[g][0..64) += sum_c w[g][c] * v[c][0..64) for G (1..3) query heads of one
   KV head, each value row read once as 4 x 16 floats (LD16) for all G heads. w: G weight rows
   at stride ws; acc: G rows at stride d; v: cnt rows at stride `row`. */
#define PV_512(SFX, T, LD16)                                                                   \
static inline __attribute__((always_inline)) void pv_512##SFX(                                 \
    const int G, float *acc, int d, const float *w, int64_t ws, const T *v, int64_t row,       \
    int64_t cnt) {                                                                             \
    __m512 r[3][4];                                                                            \
    for (int g = 0; g < G; g++)                                                                \
        for (int i = 0; i < 4; i++) r[g][i] = _mm512_loadu_ps(acc + g * d + 16 * i);           \
    for (int64_t c = 0; c < cnt; c++) {                                                        \
        const T *vc = v + c * row;                                                             \
        const __m512 x0 = LD16(vc), x1 = LD16(vc + 16), x2 = LD16(vc + 32),                    \
                     x3 = LD16(vc + 48);                                                       \
        for (int g = 0; g < G; g++) {                                                          \
            const __m512 wc = _mm512_set1_ps(w[g * ws + c]);                                   \
            r[g][0] = _mm512_fmadd_ps(wc, x0, r[g][0]);                                        \
            r[g][1] = _mm512_fmadd_ps(wc, x1, r[g][1]);                                        \
            r[g][2] = _mm512_fmadd_ps(wc, x2, r[g][2]);                                        \
            r[g][3] = _mm512_fmadd_ps(wc, x3, r[g][3]);                                        \
        }                                                                                      \
    }                                                                                          \
    for (int g = 0; g < G; g++)                                                                \
        for (int i = 0; i < 4; i++) _mm512_storeu_ps(acc + g * d + 16 * i, r[g][i]);           \
}

/* attend_512##SFX: attend (decode_kernel_src) on 16 lanes for head_dim % 64 == 0 and
   head_dim / STEP <= ATTEND_512_MAX_NQ (the callers check both: dots_512 holds the query in
   that many registers, dots2_512 two queries of at most 4): q is the sequence's (h, d) row in
   the cache's type, acc receives the float32 outputs of heads [hk0 * gq, hk1 * gq). */
#define ATTEND_512_MAX_NQ 8
#define ATTEND_512(SFX, T, STEP)                                                               \
static void attend_512##SFX(const job_t *j, int s, int hk0, int hk1, const T *q,              \
                            float *scores, float *acc) {                                       \
    const int gq = j->h / j->h_kv, d = j->d, nq = d / STEP, bs = j->bs, ml = j->max_len;       \
    const int g0 = hk0 * gq, g1 = hk1 * gq;                                                    \
    const int64_t len = j->lens[s], row = (int64_t)j->h_kv * d;                                \
    const int64_t start = item_start(j, s); /* a sliding window's first row */                 \
    const T *kc = (const T *)j->kc, *vc = (const T *)j->vc;                                    \
    for (int64_t blk = start / bs; blk * bs < len; blk++) { /* pass 1: scores */               \
        int64_t p0, p1;                                                                        \
        const T *k = block_rows(j, kc, sizeof(T), s, blk, start, hk0, hk1, &p0, &p1);          \
        for (int hk = hk0; hk < hk1; hk++) { /* query heads in pairs: one key load for two */  \
            const T *kg = k + hk * d;                                                          \
            const int64_t cnt = p1 - p0;                                                       \
            for (int g = hk * gq; g < (hk + 1) * gq;) {                                        \
                float *out = scores + g * ml + (p0 - start);                                   \
                const T *qa = q + g * d;                                                       \
                if (g + 1 < (hk + 1) * gq && nq <= 4) {                                        \
                    if (nq == 2) dots2_512##SFX(qa, qa + d, 2, kg, row, cnt, j->scale, out,    \
                                                out + ml);                                     \
                    else dots2_512##SFX(qa, qa + d, nq, kg, row, cnt, j->scale, out, out + ml);\
                    g += 2;                                                                    \
                } else {                                                                       \
                    if (nq == 2) dots_512##SFX(qa, 2, kg, row, cnt, j->scale, out);            \
                    else dots_512##SFX(qa, nq, kg, row, cnt, j->scale, out);                   \
                    g += 1;                                                                    \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    for (int g = g0; g < g1; g++)                                                              \
        softmax_512(scores + g * ml, len - start, j->cap, j->stats ? j->stats + 2 * g : NULL); \
    memset(acc + g0 * d, 0, sizeof(float) * (size_t)(g1 - g0) * d);                            \
    for (int64_t blk = start / bs; blk * bs < len; blk++) { /* pass 2: weighted values */      \
        int64_t p0, p1;                                                                        \
        const T *v = block_rows(j, vc, sizeof(T), s, blk, start, hk0, hk1, &p0, &p1);          \
        for (int hk = hk0; hk < hk1; hk++)                                                     \
            for (int i = 0; i < d; i += 64) /* 64 dims at a time, up to 3 heads */             \
                for (int g = hk * gq; g < (hk + 1) * gq; g += 3) {                             \
                    const int n = (hk + 1) * gq - g < 3 ? (hk + 1) * gq - g : 3;               \
                    float *a = acc + g * d + i;                                                \
                    const float *w = scores + g * ml + (p0 - start);                           \
                    const T *vr = v + hk * d + i;                                              \
                    if (n == 3) pv_512##SFX(3, a, d, w, ml, vr, row, p1 - p0);                 \
                    else if (n == 2) pv_512##SFX(2, a, d, w, ml, vr, row, p1 - p0);            \
                    else pv_512##SFX(1, a, d, w, ml, vr, row, p1 - p0);                        \
                }                                                                              \
    }                                                                                          \
}

/* the float32 instance: q, keys and values float32, scores by FMA */
#define HAVE_ATTEND_512_F32 1
#define MAC_F32(acc, q, k) _mm512_fmadd_ps(q, k, acc)
DOT_FNS_512(_f32, float, __m512, _mm512_loadu_ps, MAC_F32, 16)
PV_512(_f32, float, _mm512_loadu_ps)
ATTEND_512(_f32, float, 16)
#endif
"""

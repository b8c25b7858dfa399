"""C source of the AVX-512 BF16 paged decode attention for bf16 caches (``decode_kernel_src``
places it before the work-item code that calls it).

Why: the portable bf16 path widens every key and value block to float32 in a scratch and
runs 8-lane float32 dots, which made a bf16 cache slower than a float32 one (compute-bound:
64 x 192 tokens of SmolLM2, 380-390 vs 305 us per layer on the Zen 5). Here scores come from
``vdpbf16ps`` straight on the cache rows (the bf16 query pairs times the key pairs, summed in
float32: each product of two bf16 values is exact in float32, so this is the widened dot in
another summation order; the instruction flushes denormals) and 16 keys' partial sums are
reduced together; values are widened once per block and KV head (the GQA group shares them)
and summed with 16-lane FMAs in float32, softmax weights unrounded. Head sizes that are a
multiple of 64; others take the portable path."""

BF16_ATTEND_SOURCE = r"""
#if defined(__AVX512BF16__)
#include <immintrin.h>
#define HAVE_ATTEND_512 1

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

static inline __m512bh ld_bh(const uint16_t *p) {
    return (__m512bh)_mm512_loadu_si512((const void *)p);
}

/* scale * q . k for cnt keys at stride `row` (NQ = head_dim / 32 bf16 pairs vectors): per
   key NQ vdpbf16ps into one 16-lane partial sum, 16 keys reduced together. */
static inline __attribute__((always_inline)) void dots_512(const uint16_t *qh, int NQ,
                                                           const uint16_t *k, int64_t row,
                                                           int64_t cnt, float scale, float *out) {
    __m512bh q[8];
    for (int i = 0; i < NQ; i++) q[i] = ld_bh(qh + 32 * i);
    int64_t c = 0;
    for (; c + 16 <= cnt; c += 16) {
        __m512 a[16];
        for (int r = 0; r < 16; r++) {
            const uint16_t *kc = k + (c + r) * row;
            __m512 s = _mm512_dpbf16_ps(_mm512_setzero_ps(), q[0], ld_bh(kc));
            for (int i = 1; i < NQ; i++) s = _mm512_dpbf16_ps(s, q[i], ld_bh(kc + 32 * i));
            a[r] = s;
        }
        _mm512_storeu_ps(out + c, _mm512_mul_ps(hsum16x16(a), _mm512_set1_ps(scale)));
    }
    for (; c < cnt; c++) {
        const uint16_t *kc = k + c * row;
        __m512 s = _mm512_dpbf16_ps(_mm512_setzero_ps(), q[0], ld_bh(kc));
        for (int i = 1; i < NQ; i++) s = _mm512_dpbf16_ps(s, q[i], ld_bh(kc + 32 * i));
        out[c] = _mm512_reduce_add_ps(s) * scale;
    }
}

/* acc[0..64) += sum_c w[c] * v[c][0..64) over float32 rows at stride d (4 zmm sums) */
static inline void axpys_512(float *acc, const float *w, const float *v, int64_t d,
                             int64_t cnt) {
    __m512 r0 = _mm512_loadu_ps(acc), r1 = _mm512_loadu_ps(acc + 16);
    __m512 r2 = _mm512_loadu_ps(acc + 32), r3 = _mm512_loadu_ps(acc + 48);
    for (int64_t c = 0; c < cnt; c++) {
        const __m512 wc = _mm512_set1_ps(w[c]);
        const float *vc = v + c * d;
        r0 = _mm512_fmadd_ps(wc, _mm512_loadu_ps(vc), r0);
        r1 = _mm512_fmadd_ps(wc, _mm512_loadu_ps(vc + 16), r1);
        r2 = _mm512_fmadd_ps(wc, _mm512_loadu_ps(vc + 32), r2);
        r3 = _mm512_fmadd_ps(wc, _mm512_loadu_ps(vc + 48), r3);
    }
    _mm512_storeu_ps(acc, r0), _mm512_storeu_ps(acc + 16, r1);
    _mm512_storeu_ps(acc + 32, r2), _mm512_storeu_ps(acc + 48, r3);
}

/* cnt bf16 rows of d values at stride `row` widened into buf (cnt x d float32) */
static inline void stage_512(const uint16_t *src, int64_t row, int64_t cnt, int d, float *buf) {
    for (int64_t c = 0; c < cnt; c++)
        for (int i = 0; i < d; i += 16)
            _mm512_storeu_ps(buf + c * d + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + c * row + i))),
                16)));
}

/* attend_bf16 (decode_kernel_src) for head_dim % 64 == 0: q is the sequence's (h, d) bf16
   row, acc receives the float32 outputs of heads [hk0 * gq, hk1 * gq). */
static void attend_512(const job_t *j, int s, int hk0, int hk1, const uint16_t *q,
                       float *scores, float *acc, float *buf) {
    const int gq = j->h / j->h_kv, d = j->d, nq = d / 32, bs = j->bs, ml = j->max_len;
    const int g0 = hk0 * gq, g1 = hk1 * gq;
    const int64_t len = j->lens[s], row = (int64_t)j->h_kv * d;
    const int64_t start = (j->window > 0 && len > j->window) ? len - j->window : 0;
    const uint16_t *kc = (const uint16_t *)j->kc, *vc = (const uint16_t *)j->vc;
    for (int64_t blk = start / bs; blk * bs < len; blk++) { /* pass 1: scores */
        int64_t p0, p1;
        const uint16_t *k = block_rows(j, kc, 2, s, blk, start, hk0, hk1, &p0, &p1);
        for (int g = g0; g < g1; g++) {
            const uint16_t *kg = k + (g / gq) * d;
            float *out = scores + g * ml + (p0 - start);
            if (nq == 2) dots_512(q + g * d, 2, kg, row, p1 - p0, j->scale, out);
            else if (nq == 4) dots_512(q + g * d, 4, kg, row, p1 - p0, j->scale, out);
            else dots_512(q + g * d, nq, kg, row, p1 - p0, j->scale, out);
        }
    }
    for (int g = g0; g < g1; g++) softmax(scores + g * ml, len - start, j->cap);
    memset(acc + g0 * d, 0, sizeof(float) * (size_t)(g1 - g0) * d);
    for (int64_t blk = start / bs; blk * bs < len; blk++) { /* pass 2: weighted values */
        int64_t p0, p1;
        const uint16_t *v = block_rows(j, vc, 2, s, blk, start, hk0, hk1, &p0, &p1);
        for (int hk = hk0; hk < hk1; hk++) {
            stage_512(v + hk * d, row, p1 - p0, d, buf);
            for (int g = hk * gq; g < (hk + 1) * gq; g++)
                for (int i = 0; i < d; i += 64)
                    axpys_512(acc + g * d + i, scores + g * ml + (p0 - start), buf + i, d,
                              p1 - p0);
        }
    }
}
#endif
"""

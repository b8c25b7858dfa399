"""C source of the blocked bf16 prefill attention (AVX-512 BF16): a run of a prompt's new tokens
attended as tiles of query rows instead of one row at a time (``decode_kernel_src`` places it
after the per-row kernels and hands it the runs it finds among the rows).

Why: as rows, every token scores its causal prefix on its own: 16 keys x 1 query per
``vdpbf16ps`` group, then a 16 x 16 transpose-add per group, and the same keys again for the
next token; quadratic in the prompt, so a 2000-token SmolLM2 prompt spent ~590 of its ~1100 ms
prefill in attention on the 2-core Zen 5. Here a tile (PF_ROWS consecutive tokens x the query
heads of one KV head) first lays its keys out transposed (``kt``: per 16 keys, per pair of head
dims, the 16 keys' bf16 pairs side by side), so one ``vdpbf16ps`` scores 16 keys for one query
with the query's pair broadcast, and each transposed load serves PF_QV queries; no transposes
after. Scores are float32 and so is the softmax (16 lanes, the last group masked); the weights
are then rounded to bf16 (as flash attention's P) so that the value pass is ``vdpbf16ps`` too:
per key pair the two value rows interleaved by unpacklo / unpackhi, one instruction per 16 dims
and query. Keys past a query's own position (the causal mask: the tile's later tokens, and the
padding up to 32 keys) get weight 0.

Runs with a sliding window or a soft cap take the per-row path (Gemma's layers).

Measured (SmolLM2 bf16, 2 threads, Zen 5, the step's 30 layers), against the per-row kernel:
one 2000-token prompt 609 -> 256 ms of attention (the prefill step 1179 -> 749 ms), 4 x 500
tokens 145 -> 72 ms, 32 x 64 tokens 29.6 -> 19.9 ms. The value pass in float32 FMAs (weights
unrounded) had left 338, 98 and ~30 ms.
"""

PREFILL_BF16_SOURCE = r"""
#if defined(__AVX512BF16__)
#define HAVE_PREFILL_TILES 1
#define PF_ROWS 32 /* query rows (tokens) per tile */
#define PF_MIN 8   /* shorter runs of a prompt's rows take the per-row path */
#define PF_QV 8    /* queries scored per transposed key load */
#define PF_PV 6    /* queries summed per widened value row (x 4 vectors of 16 dims) */

/* the cache row of position blk * bs (a block's first) of table row t, KV head hk; the block's
   next rows follow at a stride of h_kv * d */
static inline const uint16_t *pf_block(const job_t *j, const uint16_t *cache, int64_t t,
                                       int64_t blk, int hk) {
    const int64_t id = j->tables[t * j->table_stride + blk];
    return cache + (id * j->bs * j->h_kv + hk) * (int64_t)j->d;
}

/* kt (nk rounded up to 16 keys, nd = d / 2 pairs, 16): keys [0, nk) of KV head hk, pair i of
   key c at kt[(c / 16) * nd * 16 + i * 16 + c % 16]; the padding keys are zero */
static void pf_transpose_keys(const job_t *j, int64_t t, int hk, int64_t nk, uint32_t *kt) {
    const int nd = j->d / 2;
    const int64_t row = (int64_t)j->h_kv * j->d, padded = (nk + 15) / 16 * 16;
    for (int64_t b0 = 0; b0 < nk; b0 += j->bs) {
        const uint16_t *base = pf_block(j, (const uint16_t *)j->kc, t, b0 / j->bs, hk);
        for (int64_t c = b0; c < nk && c < b0 + j->bs; c++) {
            const uint32_t *src = (const uint32_t *)(base + (c - b0) * row);
            uint32_t *dst = kt + (c / 16) * nd * 16 + c % 16;
            for (int i = 0; i < nd; i++) dst[i * 16] = src[i];
        }
    }
    for (int64_t c = nk; c < padded; c++)
        for (int i = 0; i < nd; i++) kt[(c / 16) * nd * 16 + i * 16 + c % 16] = 0;
}

/* scores sc[v][c] = scale * q_v . k_c of NV queries (qp: their bf16 pairs) for keys [0, keys)
   (a multiple of 16) from the transposed keys: per 16 keys, nd loads of 16 key pairs, each
   times NV broadcast query pairs */
static inline __attribute__((always_inline)) void pf_scores(
    const int NV, const uint32_t *const *qp, const uint32_t *kt, int nd, int64_t keys,
    float scale, float *sc, int64_t ml) {
    for (int64_t c = 0; c < keys; c += 16) {
        const uint32_t *kb = kt + (c / 16) * nd * 16;
        __m512 a[PF_QV];
        for (int v = 0; v < NV; v++) a[v] = _mm512_setzero_ps();
        for (int i = 0; i < nd; i++) {
            const __m512bh k = (__m512bh)_mm512_loadu_si512((const void *)(kb + i * 16));
            for (int v = 0; v < NV; v++)
                a[v] = _mm512_dpbf16_ps(a[v], (__m512bh)_mm512_set1_epi32((int)qp[v][i]), k);
        }
        for (int v = 0; v < NV; v++)
            _mm512_storeu_ps(sc + v * ml + c, _mm512_mul_ps(a[v], _mm512_set1_ps(scale)));
    }
}

/* o[v][i0, i0 + 64) = bf16(sum over keys [0, keys) of w[v][p] * value row p) for NV queries:
   per key pair, the two value rows' 64 dims interleaved into 4 vectors of 16 bf16 pairs
   (unpacklo / unpackhi: lanes in the dim order 0-3, 8-11, 16-19, 24-27 and 4-7, 12-15, ...),
   one vdpbf16ps per vector and query with the query's (w[p], w[p + 1]) bf16 pair broadcast;
   the sums are put back in dim order at the end. wb: each query's weights as bf16 at stride
   2 * ml uint16s (``pf_weights_bf16``). An odd last key pairs with zeros. */
static inline __attribute__((always_inline)) void pf_values(
    const int NV, const job_t *j, int64_t t, int hk, int i0, int64_t keys, const uint16_t *wb,
    int64_t ml, uint16_t *const *o) {
    const int64_t row = (int64_t)j->h_kv * j->d;
    __m512 a[PF_PV][4];
    for (int v = 0; v < NV; v++)
        for (int u = 0; u < 4; u++) a[v][u] = _mm512_setzero_ps();
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t b0 = 0; b0 < keys; b0 += j->bs) { /* bs is even: a pair never straddles */
        const uint16_t *base = pf_block(j, (const uint16_t *)j->vc, t, b0 / j->bs, hk) + i0;
        const int64_t b1 = keys < b0 + j->bs ? keys : b0 + j->bs;
        for (int64_t p = b0; p < b1; p += 2) {
            const uint16_t *r0 = base + (p - b0) * row;
            const __m512i x0 = _mm512_loadu_si512((const void *)r0),
                          x1 = _mm512_loadu_si512((const void *)(r0 + 32));
            /* the odd last key pairs with zeros (the row past it may not exist) */
            const __m512i y0 = p + 1 < b1 ? _mm512_loadu_si512((const void *)(r0 + row)) : zero,
                          y1 = p + 1 < b1 ? _mm512_loadu_si512((const void *)(r0 + row + 32))
                                          : zero;
            const __m512bh v0 = (__m512bh)_mm512_unpacklo_epi16(x0, y0),
                           v1 = (__m512bh)_mm512_unpackhi_epi16(x0, y0),
                           v2 = (__m512bh)_mm512_unpacklo_epi16(x1, y1),
                           v3 = (__m512bh)_mm512_unpackhi_epi16(x1, y1);
            for (int v = 0; v < NV; v++) {
                const __m512bh w = (__m512bh)_mm512_set1_epi32(
                    *(const int32_t *)(wb + v * 2 * ml + p));
                a[v][0] = _mm512_dpbf16_ps(a[v][0], w, v0);
                a[v][1] = _mm512_dpbf16_ps(a[v][1], w, v1);
                a[v][2] = _mm512_dpbf16_ps(a[v][2], w, v2);
                a[v][3] = _mm512_dpbf16_ps(a[v][3], w, v3);
            }
        }
    }
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29,
                                             30, 31);
    for (int v = 0; v < NV; v++) {
        const __m512 dims[4] = {_mm512_permutex2var_ps(a[v][0], first, a[v][1]),
                                _mm512_permutex2var_ps(a[v][0], second, a[v][1]),
                                _mm512_permutex2var_ps(a[v][2], first, a[v][3]),
                                _mm512_permutex2var_ps(a[v][2], second, a[v][3])};
        for (int u = 0; u < 4; u++) { /* round to nearest even, as f32_bf16 */
            __m512i x = _mm512_castps_si512(dims[u]);
            x = _mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                 _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1))));
            _mm256_storeu_si256((__m256i *)(o[v] + i0 + 16 * u),
                                _mm512_cvtepi32_epi16(_mm512_srli_epi32(x, 16)));
        }
    }
}

/* the first n (a multiple of 32) float32 weights of s as bf16 (round to nearest even) at the
   start of the same row: written behind what is read */
static inline void pf_weights_bf16(float *s, int64_t n) {
    uint16_t *dst = (uint16_t *)s;
    for (int64_t p = 0; p < n; p += 32) {
        const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + p + 16), _mm512_loadu_ps(s + p));
        _mm512_storeu_si512((void *)(dst + p), (__m512i)b);
    }
}

/* softmax of s[0, len) in place, 16 lanes at a time with the last group masked: lanes
   [len, len rounded up to 16) become 0 (no scalar tail) */
static void pf_softmax(float *s, int64_t len) {
    const int64_t full = len / 16 * 16;
    const __mmask16 last = (__mmask16)((1u << (len - full)) - 1u);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 m = ninf;
    for (int64_t p = 0; p < full; p += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(s + p));
    if (last) m = _mm512_max_ps(m, _mm512_mask_loadu_ps(ninf, last, s + full));
    const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(m));
    __m512 t = _mm512_setzero_ps();
    for (int64_t p = 0; p < full; p += 16) {
        const __m512 e = vexp512(_mm512_sub_ps(_mm512_loadu_ps(s + p), mv));
        _mm512_storeu_ps(s + p, e);
        t = _mm512_add_ps(t, e);
    }
    if (last) {
        const __m512 x = _mm512_mask_loadu_ps(mv, last, s + full);
        const __m512 e = _mm512_maskz_mov_ps(last, vexp512(_mm512_sub_ps(x, mv)));
        _mm512_storeu_ps(s + full, e);
        t = _mm512_add_ps(t, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(t));
    for (int64_t p = 0; p < len; p += 16)
        _mm512_storeu_ps(s + p, _mm512_mul_ps(_mm512_loadu_ps(s + p), inv));
}

#define PF_CASE(FN, N, ...) case N: FN(N, __VA_ARGS__); break;

/* One tile: rows [r0, r1) of the job (consecutive tokens of one sequence: row r attends keys
   [0, lens[r])), KV head hk. kt: scratch for the transposed keys (2 * d bytes a key); sc:
   scratch for (r1 - r0) * gq score rows of stride ml (at least the last row's length rounded
   up to 16). */
static void pf_tile(const job_t *j, int r0, int r1, int hk, uint32_t *kt, float *sc,
                    int64_t ml) {
    const int gq = j->h / j->h_kv, d = j->d, nd = d / 2;
    const int64_t t = j->table_of[r0];
    const int nq = (r1 - r0) * gq; /* query v: row r0 + v / gq, head hk * gq + v % gq */
    pf_transpose_keys(j, t, hk, j->lens[r1 - 1], kt);
    const uint16_t *q = (const uint16_t *)j->q;
    /* pass 1: PF_QV queries at a time, up to the group's last row's length (rounded up) */
    for (int v0 = 0; v0 < nq; v0 += PF_QV) {
        const int nv = nq - v0 < PF_QV ? nq - v0 : PF_QV;
        const uint32_t *qp[PF_QV];
        for (int v = 0; v < nv; v++) {
            const int r = r0 + (v0 + v) / gq, g = hk * gq + (v0 + v) % gq;
            qp[v] = (const uint32_t *)(q + (j->tokens[r] * j->h + g) * (int64_t)d);
        }
        const int64_t keys = (j->lens[r0 + (v0 + nv - 1) / gq] + 15) / 16 * 16;
        float *s = sc + v0 * ml;
        switch (nv) {
            PF_CASE(pf_scores, 1, qp, kt, nd, keys, j->scale, s, ml)
            PF_CASE(pf_scores, 2, qp, kt, nd, keys, j->scale, s, ml)
            PF_CASE(pf_scores, 3, qp, kt, nd, keys, j->scale, s, ml)
            PF_CASE(pf_scores, 4, qp, kt, nd, keys, j->scale, s, ml)
            PF_CASE(pf_scores, 5, qp, kt, nd, keys, j->scale, s, ml)
            PF_CASE(pf_scores, 6, qp, kt, nd, keys, j->scale, s, ml)
            PF_CASE(pf_scores, 7, qp, kt, nd, keys, j->scale, s, ml)
            default: pf_scores(PF_QV, qp, kt, nd, keys, j->scale, s, ml);
        }
    }
    /* softmax over each query's own keys; weight 0 from there to the tile's end (rounded up
       to 32), then the weights as bf16 */
    const int64_t kend = (j->lens[r1 - 1] + 31) / 32 * 32;
    for (int v = 0; v < nq; v++) {
        const int64_t len = j->lens[r0 + v / gq], padded = (len + 15) / 16 * 16;
        pf_softmax(sc + v * ml, len);
        memset(sc + v * ml + padded, 0, sizeof(float) * (size_t)(kend - padded));
        pf_weights_bf16(sc + v * ml, kend);
    }
    /* pass 2: PF_PV queries x 64 dims at a time */
    uint16_t *out = (uint16_t *)j->out;
    for (int v0 = 0; v0 < nq; v0 += PF_PV) {
        const int nv = nq - v0 < PF_PV ? nq - v0 : PF_PV;
        const int64_t keys = j->lens[r0 + (v0 + nv - 1) / gq];
        uint16_t *o[PF_PV];
        for (int v = 0; v < nv; v++) {
            const int r = r0 + (v0 + v) / gq, g = hk * gq + (v0 + v) % gq;
            o[v] = out + (j->tokens[r] * j->h + g) * (int64_t)d;
        }
        const uint16_t *w = (const uint16_t *)(sc + v0 * ml);
        for (int i0 = 0; i0 < d; i0 += 64)
            switch (nv) {
                PF_CASE(pf_values, 1, j, t, hk, i0, keys, w, ml, o)
                PF_CASE(pf_values, 2, j, t, hk, i0, keys, w, ml, o)
                PF_CASE(pf_values, 3, j, t, hk, i0, keys, w, ml, o)
                PF_CASE(pf_values, 4, j, t, hk, i0, keys, w, ml, o)
                PF_CASE(pf_values, 5, j, t, hk, i0, keys, w, ml, o)
                default: pf_values(PF_PV, j, t, hk, i0, keys, w, ml, o);
            }
    }
}

/* Whether row r continues row r - 1's run: the same sequence, the next token and position */
static inline int pf_continues(const job_t *j, int r) {
    return j->table_of[r] == j->table_of[r - 1] && j->tokens[r] == j->tokens[r - 1] + 1 &&
           j->lens[r] == j->lens[r - 1] + 1;
}

/* The tiles of the job's runs of at least PF_MIN rows: tile i is rows [starts[i], ends[i]);
   returns the count (starts / ends hold n entries at most); tiled[r] = 1 for their rows. */
static int pf_tiles(const job_t *j, int *starts, int *ends, unsigned char *tiled) {
    int count = 0;
    for (int r0 = 0; r0 < j->n;) {
        int r1 = r0 + 1;
        while (r1 < j->n && pf_continues(j, r1)) r1++;
        if (r1 - r0 >= PF_MIN) {
            for (int s = r0; s < r1; s += PF_ROWS) {
                starts[count] = s;
                ends[count++] = s + PF_ROWS < r1 ? s + PF_ROWS : r1;
            }
            memset(tiled + r0, 1, (size_t)(r1 - r0));
        }
        r0 = r1;
    }
    return count;
}

/* Whether the job's prefill rows may take tiles: bf16, head dims a multiple of 64, prompts
   with rows (table_of), no window, no soft cap */
static inline int pf_fits(const job_t *j, int bf16) {
    return bf16 && j->table_of != NULL && j->d % 64 == 0 && j->window <= 0 && j->cap <= 0;
}
#endif
"""

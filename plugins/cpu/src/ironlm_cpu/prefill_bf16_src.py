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
after. Scores and softmax are float32 (16 lanes, the last group masked: no scalar tail),
values are widened to float32 in registers and summed with FMAs into PF_PV queries' outputs
at a time (unrounded weights, as the per-row kernel). Keys past a query's own position (the causal
mask: the tile's later tokens, and the padding up to 16 keys) get weight 0.

Runs with a sliding window or a soft cap take the per-row path (Gemma's layers).

Measured (SmolLM2 bf16, 2 threads, Zen 5, the step's 30 layers): one 2000-token prompt 609 ->
320 ms of attention (the prefill step 1179 -> 809 ms), 4 x 500 tokens 145 -> 87 ms, 32 x 64
tokens 29.6 -> 22 ms. A value pass on ``vdpbf16ps`` with the weights rounded to bf16 (flash
attention's P) ran 256 / ~20 ms but moved outputs up to 0.0156 from torch's SDPA, past the
kernel choice's check: not kept.
"""

PREFILL_BF16_SOURCE = r"""
#define PF_ROWS 32 /* query rows (tokens) per tile (bf16 and float32) */
#define PF_MIN 8   /* shorter runs of a prompt's rows take the per-row path */

/* Element offset in a cache (K or V) of the row of position blk * bs (a block's first) of
   table row t, KV head hk; the block's next rows follow at a stride of h_kv * d (either
   dtype's tiles) */
static inline int64_t pf_block(const job_t *j, int64_t t, int64_t blk, int hk) {
    const int64_t id = j->tables[t * j->table_stride + blk];
    return (id * j->bs * j->h_kv + hk) * (int64_t)j->d;
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

#if defined(__AVX512BF16__)
#define HAVE_PREFILL_TILES 1 /* bf16 tiles */
#define PF_QV 8    /* queries scored per transposed key load */
#define PF_PV 6    /* queries summed per widened value row (x 4 vectors of 16 dims) */

/* kt (nk rounded up to 16 keys, nd = d / 2 pairs, 16): keys [0, nk) of KV head hk, pair i of
   key c at kt[(c / 16) * nd * 16 + i * 16 + c % 16]; the padding keys are zero */
static void pf_transpose_keys(const job_t *j, int64_t t, int hk, int64_t nk, uint32_t *kt) {
    const int nd = j->d / 2;
    const int64_t row = (int64_t)j->h_kv * j->d, padded = (nk + 15) / 16 * 16;
    for (int64_t b0 = 0; b0 < nk; b0 += j->bs) {
        const uint16_t *base = (const uint16_t *)j->kc + pf_block(j, t, b0 / j->bs, hk);
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

/* acc[v][0..64) = sum over keys [0, keys) of w[v][p] * value row p (64 dims from column i0)
   for NV queries (weights at stride ml), each value row widened once for all of them; the
   rows' bf16 outputs written to o[v] */
static inline __attribute__((always_inline)) void pf_values(
    const int NV, const job_t *j, int64_t t, int hk, int i0, int64_t keys, const float *w,
    int64_t ml, uint16_t *const *o) {
    const int64_t row = (int64_t)j->h_kv * j->d;
    __m512 a[PF_PV][4];
    for (int v = 0; v < NV; v++)
        for (int u = 0; u < 4; u++) a[v][u] = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < keys; b0 += j->bs) {
        const uint16_t *base = (const uint16_t *)j->vc + pf_block(j, t, b0 / j->bs, hk) + i0;
        const int64_t b1 = keys < b0 + j->bs ? keys : b0 + j->bs;
        for (int64_t p = b0; p < b1; p++) {
            const uint16_t *vr = base + (p - b0) * row;
            const __m512 x0 = widen16(vr), x1 = widen16(vr + 16), x2 = widen16(vr + 32),
                         x3 = widen16(vr + 48);
            for (int v = 0; v < NV; v++) {
                const __m512 wv = _mm512_set1_ps(w[v * ml + p]);
                a[v][0] = _mm512_fmadd_ps(wv, x0, a[v][0]);
                a[v][1] = _mm512_fmadd_ps(wv, x1, a[v][1]);
                a[v][2] = _mm512_fmadd_ps(wv, x2, a[v][2]);
                a[v][3] = _mm512_fmadd_ps(wv, x3, a[v][3]);
            }
        }
    }
    for (int v = 0; v < NV; v++)
        for (int u = 0; u < 4; u++) /* round to nearest even (vcvtneps2bf16) */
            _mm256_storeu_si256((__m256i *)(o[v] + i0 + 16 * u),
                                (__m256i)_mm512_cvtneps_pbh(a[v][u]));
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
    /* softmax over each query's own keys; weight 0 from there to the tile's end (rounded) */
    const int64_t kend = (j->lens[r1 - 1] + 15) / 16 * 16;
    for (int v = 0; v < nq; v++) {
        const int64_t len = j->lens[r0 + v / gq], padded = (len + 15) / 16 * 16;
        pf_softmax(sc + v * ml, len);
        memset(sc + v * ml + padded, 0, sizeof(float) * (size_t)(kend - padded));
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
        const float *w = sc + v0 * ml;
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

/* Whether the job's prefill rows may take tiles: bf16, head dims a multiple of 64, prompts
   with rows (table_of), no window, no soft cap */
static inline int pf_fits(const job_t *j, int bf16) {
    return bf16 && j->table_of != NULL && j->d % 64 == 0 && j->window <= 0 && j->cap <= 0;
}
#endif
"""

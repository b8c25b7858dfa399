"""C source of the blocked float32 prefill attention: the bf16 tiles' scheme
(``prefill_bf16_src``) with float32 FMAs on the target's register width, for every build
(``decode_kernel_src`` places it after the per-row kernels and hands it the same runs).

Why: as rows, each float32 prompt token scores its causal prefix on its own, reading every
key once per token; at 2048 keys that lost to torch's SDPA (SmolLM2, a layer, 2 threads, Zen
4: 63.4 vs 43.3 ms), so long float32 prompts (the auto dtype of AVX2-only CPUs) ran their
attention on torch. A tile (PF_ROWS consecutive tokens x the query heads of one KV head) lays
its keys out transposed once (``kt``: per PFW keys, per head dim, the PFW keys' values side by
side), so one vector load of keys serves PF32_QV queries' FMAs with the query's element
broadcast; the softmax runs on the same register width; values are summed with FMAs into PF32_PV
queries' outputs, PF32_VN vectors of head dims at a time. Sums and weights stay float32
throughout (the order of the sums differs from the per-row kernel's).
"""

PREFILL_F32_SOURCE = r"""
#ifdef __AVX512F__
#define PFW 16     /* float32 lanes per vector */
#define PF32_VN 4  /* vectors of head dims per value pass: 64 dims, 24 zmm accumulators */
#else
#define PFW 8
#define PF32_VN 2  /* 16 dims: 12 ymm accumulators, 2 value loads, 1 broadcast */
#endif
#define PF32_QV 8  /* queries scored per transposed key load */
#define PF32_PV 6  /* queries summed per value row */
#define PF32_KCH 256 /* keys per chunk: the tile's passes go over the keys chunk by chunk */
typedef float pfv __attribute__((vector_size(4 * PFW), aligned(4)));
typedef int32_t pfvi __attribute__((vector_size(4 * PFW), aligned(4)));
#ifdef __AVX512F__
static inline pfv pf32_exp(pfv x) { return (pfv)vexp512((__m512)x); }
#else
DEFINE_VEXP(pf32_exp, pfv, pfvi) /* exp of PFW lanes (vexp_src) */
#endif

/* softmax of s[0, len) in place on PFW lanes (the per-row kernel's runs on 8: the tile's
   exps are a share of its time at long prompts), a scalar tail */
static void pf32_softmax(float *s, int64_t len) {
    const int64_t full = len / PFW * PFW;
    pfv m = (pfv){0} - INFINITY, t = {0};
    for (int64_t p = 0; p < full; p += PFW) {
        const pfv x = *(const pfv *)(s + p);
        const pfvi gt = x > m; /* lanes of all ones where x is larger */
        m = (pfv)((gt & (pfvi)x) | (~gt & (pfvi)m));
    }
    float mx = -INFINITY, tot = 0.0f;
    for (int l = 0; l < PFW; l++) mx = m[l] > mx ? m[l] : mx;
    for (int64_t p = full; p < len; p++) mx = s[p] > mx ? s[p] : mx;
    for (int64_t p = 0; p < full; p += PFW) {
        const pfv e = pf32_exp(*(const pfv *)(s + p) - mx);
        *(pfv *)(s + p) = e;
        t += e;
    }
    for (int64_t p = full; p < len; p++) {
        s[p] = expf(s[p] - mx);
        tot += s[p];
    }
    for (int l = 0; l < PFW; l++) tot += t[l];
    const float inv = 1.0f / tot;
    for (int64_t p = 0; p < full; p += PFW) *(pfv *)(s + p) *= inv;
    for (int64_t p = full; p < len; p++) s[p] *= inv;
}

/* kt (nk rounded up to PFW keys, d, PFW): keys [0, nk) of KV head hk, dim i of key c at
   kt[(c / PFW) * d * PFW + i * PFW + c % PFW]; the padding keys are zero */
static void pf32_transpose_keys(const job_t *j, int64_t t, int hk, int64_t nk, float *kt) {
    const int d = j->d;
    const int64_t row = (int64_t)j->h_kv * d, padded = (nk + PFW - 1) / PFW * PFW;
    for (int64_t b0 = 0; b0 < nk; b0 += j->bs) {
        const float *base = (const float *)j->kc + pf_block(j, t, b0 / j->bs, hk);
        for (int64_t c = b0; c < nk && c < b0 + j->bs; c++) {
            const float *src = base + (c - b0) * row;
            float *dst = kt + (c / PFW) * d * PFW + c % PFW;
            for (int i = 0; i < d; i++) dst[i * PFW] = src[i];
        }
    }
    for (int64_t c = nk; c < padded; c++)
        for (int i = 0; i < d; i++) kt[(c / PFW) * d * PFW + i * PFW + c % PFW] = 0.0f;
}

/* scores sc[v][c] = scale * q_v . k_c of NV queries for keys [c0, c1) (multiples of PFW) */
static inline __attribute__((always_inline)) void pf32_scores(
    const int NV, const float *const *qv, const float *kt, int d, int64_t c0, int64_t c1,
    float scale, float *sc, int64_t ml) {
    for (int64_t c = c0; c < c1; c += PFW) {
        const float *kb = kt + (c / PFW) * d * PFW;
        pfv a[PF32_QV];
        for (int v = 0; v < NV; v++) a[v] = (pfv){0};
        for (int i = 0; i < d; i++) {
            const pfv k = *(const pfv *)(kb + i * PFW);
            for (int v = 0; v < NV; v++) a[v] += qv[v][i] * k;
        }
        for (int v = 0; v < NV; v++) *(pfv *)(sc + v * ml + c) = a[v] * scale;
    }
}

/* o[v][i0 .. i0 + PF32_VN * PFW) += sum over keys [c0, c1) of w[v][p] * value row p, for NV
   queries (weights at stride ml) */
static inline __attribute__((always_inline)) void pf32_values(
    const int NV, const job_t *j, int64_t t, int hk, int i0, int64_t c0, int64_t c1,
    const float *w, int64_t ml, float *const *o) {
    const int64_t row = (int64_t)j->h_kv * j->d;
    pfv a[PF32_PV][PF32_VN];
    for (int v = 0; v < NV; v++)
        for (int u = 0; u < PF32_VN; u++) a[v][u] = *(const pfv *)(o[v] + i0 + u * PFW);
    for (int64_t b0 = c0 / j->bs * j->bs; b0 < c1; b0 += j->bs) {
        const float *base = (const float *)j->vc + pf_block(j, t, b0 / j->bs, hk) + i0;
        const int64_t b1 = c1 < b0 + j->bs ? c1 : b0 + j->bs;
        for (int64_t p = b0 > c0 ? b0 : c0; p < b1; p++) {
            const float *vr = base + (p - b0) * row;
            pfv x[PF32_VN];
            for (int u = 0; u < PF32_VN; u++) x[u] = *(const pfv *)(vr + u * PFW);
            for (int v = 0; v < NV; v++) {
                const float wv = w[v * ml + p];
                for (int u = 0; u < PF32_VN; u++) a[v][u] += wv * x[u];
            }
        }
    }
    for (int v = 0; v < NV; v++)
        for (int u = 0; u < PF32_VN; u++) *(pfv *)(o[v] + i0 + u * PFW) = a[v][u];
}

#define PF32_CASE(FN, N, ...) case N: FN(N, __VA_ARGS__); break;

/* One tile: rows [r0, r1) of the job (consecutive tokens of one sequence: row r attends keys
   [0, lens[r])), KV head hk. kt: scratch for the transposed keys (4 * d bytes a key); sc:
   scratch for (r1 - r0) * gq score rows of stride ml (at least the last row's length rounded
   up to 16). */
static void pf32_tile(const job_t *j, int r0, int r1, int hk, float *kt, float *sc,
                      int64_t ml) {
    const int gq = j->h / j->h_kv, d = j->d;
    const int64_t t = j->table_of[r0];
    const int nq = (r1 - r0) * gq; /* query v: row r0 + v / gq, head hk * gq + v % gq */
    pf32_transpose_keys(j, t, hk, j->lens[r1 - 1], kt);
    const float *q = (const float *)j->q;
    /* pass 1, keys in chunks of PF32_KCH (their transposed rows stay in L2 while every query
       group of the tile scores them), PF32_QV queries at a time, each up to its group's last
       row's length (rounded up) */
    const int64_t kend = j->lens[r1 - 1], kpad = (kend + PFW - 1) / PFW * PFW;
    for (int64_t c0 = 0; c0 < kpad; c0 += PF32_KCH) {
        for (int v0 = 0; v0 < nq; v0 += PF32_QV) {
            const int nv = nq - v0 < PF32_QV ? nq - v0 : PF32_QV;
            const int64_t keys = (j->lens[r0 + (v0 + nv - 1) / gq] + PFW - 1) / PFW * PFW;
            if (c0 >= keys) continue;
            const int64_t c1 = c0 + PF32_KCH < keys ? c0 + PF32_KCH : keys;
            const float *qs[PF32_QV];
            for (int v = 0; v < nv; v++) {
                const int r = r0 + (v0 + v) / gq, g = hk * gq + (v0 + v) % gq;
                qs[v] = q + (j->tokens[r] * j->h + g) * (int64_t)d;
            }
            float *s = sc + v0 * ml;
            switch (nv) {
                PF32_CASE(pf32_scores, 1, qs, kt, d, c0, c1, j->scale, s, ml)
                PF32_CASE(pf32_scores, 2, qs, kt, d, c0, c1, j->scale, s, ml)
                PF32_CASE(pf32_scores, 3, qs, kt, d, c0, c1, j->scale, s, ml)
                PF32_CASE(pf32_scores, 4, qs, kt, d, c0, c1, j->scale, s, ml)
                PF32_CASE(pf32_scores, 5, qs, kt, d, c0, c1, j->scale, s, ml)
                PF32_CASE(pf32_scores, 6, qs, kt, d, c0, c1, j->scale, s, ml)
                PF32_CASE(pf32_scores, 7, qs, kt, d, c0, c1, j->scale, s, ml)
                default: pf32_scores(PF32_QV, qs, kt, d, c0, c1, j->scale, s, ml);
            }
        }
    }
    /* softmax over each query's own keys; weight 0 after them */
    float *out = (float *)j->out;
    for (int v = 0; v < nq; v++) {
        const int64_t len = j->lens[r0 + v / gq];
        pf32_softmax(sc + v * ml, len);
        memset(sc + v * ml + len, 0, sizeof(float) * (size_t)(kend - len));
        const int r = r0 + v / gq, g = hk * gq + v % gq;
        memset(out + (j->tokens[r] * j->h + g) * (int64_t)d, 0, sizeof(float) * (size_t)d);
    }
    /* pass 2, the same key chunks (their value rows stay in L2): PF32_PV queries x
       PF32_VN vectors of dims at a time, summed into the outputs */
    for (int64_t c0 = 0; c0 < kend; c0 += PF32_KCH) {
        for (int v0 = 0; v0 < nq; v0 += PF32_PV) {
            const int nv = nq - v0 < PF32_PV ? nq - v0 : PF32_PV;
            const int64_t keys = j->lens[r0 + (v0 + nv - 1) / gq];
            if (c0 >= keys) continue;
            const int64_t c1 = c0 + PF32_KCH < keys ? c0 + PF32_KCH : keys;
            float *o[PF32_PV];
            for (int v = 0; v < nv; v++) {
                const int r = r0 + (v0 + v) / gq, g = hk * gq + (v0 + v) % gq;
                o[v] = out + (j->tokens[r] * j->h + g) * (int64_t)d;
            }
            const float *w = sc + v0 * ml;
            for (int i0 = 0; i0 < d; i0 += PF32_VN * PFW)
                switch (nv) {
                    PF32_CASE(pf32_values, 1, j, t, hk, i0, c0, c1, w, ml, o)
                    PF32_CASE(pf32_values, 2, j, t, hk, i0, c0, c1, w, ml, o)
                    PF32_CASE(pf32_values, 3, j, t, hk, i0, c0, c1, w, ml, o)
                    PF32_CASE(pf32_values, 4, j, t, hk, i0, c0, c1, w, ml, o)
                    PF32_CASE(pf32_values, 5, j, t, hk, i0, c0, c1, w, ml, o)
                    default: pf32_values(PF32_PV, j, t, hk, i0, c0, c1, w, ml, o);
                }
        }
    }
}

/* Whether the job's float32 prefill rows may take tiles: head dims a multiple of a value
   pass, prompts with rows (table_of), no window, no soft cap */
static inline int pf32_fits(const job_t *j) {
    return j->table_of != NULL && j->d % (PF32_VN * PFW) == 0 && j->window <= 0 && j->cap <= 0;
}
"""

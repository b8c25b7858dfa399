/* Entry points: y = x @ W^T (+ bias) over a packed quantized weight, and rows of the weight as
   floats (quantized embeddings).

   Work split (drive): activation rows in chunks whose prepared form stays in L2, output rows
   in runs. With a few activation rows (decode), each thread takes one contiguous run of weight
   rows and streams it once: every weight row is read from memory once and dotted with all the
   activation rows (MR at a time, the rest from L1). With many (prefill), runs of 16 weight
   rows: for every MR activation rows of the chunk, the run's 16 rows, so both sides of the
   dot products come from L1 (a weight run is read from memory once per chunk). */

static row_kernel kernel_for(int fmt) {
    switch (fmt) {
    case FMT_INT8: return row_int8;
    case FMT_W8A8: /* panels: drive_w8a8 (or amx_w8a8) */
    case FMT_W8A8P:
    case FMT_INT8P:
    case FMT_FP8P:
    case FMT_INT4P: return NULL; /* panels: drive_panels */
    case FMT_INT4: return row_int4;
    case FMT_FP8: return row_fp8;
    case FMT_Q4_0:
    case FMT_Q4_1: return row_q4;
    case FMT_Q8_0: return row_q8_0;
    case FMT_Q4_K: return row_q4_k;
    case FMT_Q6_K: return row_q6_k;
    default: return NULL;
    }
}

static size_t align64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* The activations as the format's row kernels read them: float rows as they are, otherwise
   quantized into one scratch block (*scratch, freed by the caller). Returns the bytes of one
   prepared row (to size the chunks), or -1 when memory runs out. */
static int64_t prepare(const qweight *w, const float *x, int64_t ldx, int m, int threads, qact *a,
                       void **scratch) {
    const int k = w->k;
    const int par = m >= 16 && threads > 1;
    memset(a, 0, sizeof *a);
    a->xf = x;
    a->ldx = ldx;
    *scratch = NULL;
    if (w->fmt == FMT_INT8 || w->fmt == FMT_FP8 || w->fmt == FMT_INT8P || w->fmt == FMT_FP8P
        || w->fmt == FMT_INT4P)
        return 4 * (int64_t)k;
    if (w->fmt == FMT_INT4) {
        const int ng = k / w->group;
        float *gs = malloc(align64(sizeof(float) * (size_t)m * ng));
        if (gs == NULL) return -1;
        #pragma omp parallel for schedule(static) num_threads(threads) if (par)
        for (int t = 0; t < m; t++) group_sums(x + t * ldx, k, w->group, gs + (int64_t)t * ng);
        a->gsum = gs;
        a->ldd = ng;
        *scratch = gs;
        return 4 * (int64_t)k;
    }
    const size_t q_bytes = align64((size_t)m * k);
    a->ldq = k;
    if (is_w8a8(w->fmt)) {
        /* the tiles read q alone; the row kernels q + 128 (VNNI) or q as int16 (AVX2) */
        const int tiles = w8a8_on_tiles(w);
        const size_t extra = tiles ? 0 : HAVE_VNNI ? q_bytes : align64(2 * (size_t)m * k);
        char *buf = malloc(q_bytes + align64(4 * (size_t)m) + extra);
        if (buf == NULL) return -1;
        int8_t *q = (int8_t *)buf;
        float *sx = (float *)(buf + q_bytes);
        void *wide = buf + q_bytes + align64(4 * (size_t)m);
        int16_t *x16 = tiles || HAVE_VNNI ? NULL : (int16_t *)wide;
        uint8_t *xu = !tiles && HAVE_VNNI ? (uint8_t *)wide : NULL;
        #pragma omp parallel for schedule(static) num_threads(threads) if (par)
        for (int t = 0; t < m; t++)
            quantize_row_w8a8(x + t * ldx, k, q + (int64_t)t * k, sx + t,
                              x16 != NULL ? x16 + (int64_t)t * k : NULL,
                              xu != NULL ? xu + (int64_t)t * k : NULL);
        a->q = q;
        a->sx = sx;
        a->x16 = x16;
        a->xu = xu;
        *scratch = buf;
        return HAVE_VNNI ? 2 * (int64_t)k : 3 * (int64_t)k;
    }
    if (w->fmt == FMT_Q4_0 || w->fmt == FMT_Q4_1 || w->fmt == FMT_Q8_0) {
        const int nb = k / QK;
        const size_t d_bytes = align64(sizeof(float) * (size_t)m * nb);
        char *buf = malloc(q_bytes + 2 * d_bytes);
        if (buf == NULL) return -1;
        int8_t *q = (int8_t *)buf;
        float *d = (float *)(buf + q_bytes), *s = (float *)(buf + q_bytes + d_bytes);
        #pragma omp parallel for schedule(static) num_threads(threads) if (par)
        for (int t = 0; t < m; t++)
            quantize_row_q8(x + t * ldx, k, q + (int64_t)t * k, d + (int64_t)t * nb,
                            s + (int64_t)t * nb);
        a->q = q;
        a->d = d;
        a->s = s;
        a->ldd = nb;
        *scratch = buf;
        return k + 8 * (int64_t)nb;
    }
    /* K-quants */
    const int nbk = k / QKK;
    const size_t d_bytes = align64(sizeof(float) * (size_t)m * nbk);
    char *buf = malloc(q_bytes + d_bytes + align64(sizeof(int16_t) * (size_t)m * (k / 16)));
    if (buf == NULL) return -1;
    int8_t *q = (int8_t *)buf;
    float *d = (float *)(buf + q_bytes);
    int16_t *bs = (int16_t *)(buf + q_bytes + d_bytes);
    #pragma omp parallel for schedule(static) num_threads(threads) if (par)
    for (int t = 0; t < m; t++)
        quantize_row_q8k(x + t * ldx, k, q + (int64_t)t * k, d + (int64_t)t * nbk,
                         bs + (int64_t)t * (k / 16));
    a->q = q;
    a->d = d;
    a->bs = bs;
    a->ldd = nbk;
    a->ldb = k / 16;
    *scratch = buf;
    return k + 4 * (int64_t)nbk + k / 8;
}

static void drive(const qweight *w, const qact *a, int m, const float *bias, float *y, int threads,
                  row_kernel fn, int64_t row_bytes) {
    const int n = w->n;
    int mc = (int)((192 * 1024) / (row_bytes > 0 ? row_bytes : 1)) / MR * MR;
    if (mc < MR) mc = MR;
    if (mc > m) mc = m;
    const int chunks = (m + mc - 1) / mc;
    const int run = m <= 2 * MR ? (n + threads - 1) / threads : 16;
    const int runs = (n + run - 1) / run;
    #pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (threads > 1)
    for (int c = 0; c < chunks; c++) {
        for (int g = 0; g < runs; g++) {
            const int m0 = CHUNK_ROW(c, m, chunks), m1 = CHUNK_ROW(c + 1, m, chunks);
            const int n0 = g * run, n1 = n0 + run < n ? n0 + run : n;
            float out[MR];
            if (m <= 2 * MR) { /* decode: each weight row once, from memory */
                for (int row = n0; row < n1; row++) {
                    const float b = bias != NULL ? bias[row] : 0.0f;
                    for (int t = m0; t < m1; t += MR) {
                        const int rows = m1 - t < MR ? m1 - t : MR;
                        fn(w, a, row, t, rows, out);
                        for (int i = 0; i < rows; i++) y[(int64_t)(t + i) * n + row] = out[i] + b;
                    }
                }
                continue;
            }
            /* prefill: MR activation rows and the run's 16 weight rows both stay in L1 */
            for (int t = m0; t < m1; t += MR) {
                const int rows = m1 - t < MR ? m1 - t : MR;
                for (int row = n0; row < n1; row++) {
                    fn(w, a, row, t, rows, out);
                    const float b = bias != NULL ? bias[row] : 0.0f;
                    for (int i = 0; i < rows; i++) y[(int64_t)(t + i) * n + row] = out[i] + b;
                }
            }
        }
    }
}

/* y (m, n) = x (m, k; rows ldx apart) @ W^T (+ bias). Returns 0, -1 when scratch memory runs
   out, -2 for an unknown format. */
int ironlm_quant_linear(int fmt, const float *x, int64_t ldx, int m, int n, int k, int group,
                        const void *w0, const void *w1, const void *w2, const void *w3,
                        const float *bias, float *y, int threads) {
    const qweight w = {fmt, n, k, group, w0, w1, w2, w3};
    const row_kernel fn = kernel_for(fmt);
    const int panel = fmt == FMT_INT8P || fmt == FMT_FP8P || fmt == FMT_INT4P;
    if (fn == NULL && !is_w8a8(fmt) && !panel) return -2;
    if (panel) return drive_panels(&w, x, ldx, m, bias, y, threads);
    /* gguf prefill: float panels from the blocks (exact float activations), where the output
       rows make whole panels; decode: int8 activation blocks */
    if (is_gguf(fmt) && m > 2 * MR && n % 16 == 0) return drive_panels(&w, x, ldx, m, bias, y, threads);
    qact a;
    void *scratch;
    const int64_t row_bytes = prepare(&w, x, ldx, m, threads, &a, &scratch);
    if (row_bytes < 0) return -1;
    int rc = 0;
    if (!is_w8a8(fmt)) drive(&w, &a, m, bias, y, threads, fn, row_bytes);
    else if (!w8a8_on_tiles(&w)) drive_w8a8(&w, &a, m, bias, y, threads);
#if W8A8_AMX
    else if (!amx_w8a8(&w, &a, m, bias, y, threads)) rc = -1; /* no memory for the A tiles */
#endif
    free(scratch);
    return rc;
}

/* out (t, k) = rows ids of the (n, k) weight as floats. Returns the number of ids outside
   [0, n) (their rows are left unwritten), or -2 for an unknown format. */
int ironlm_quant_rows(int fmt, const int64_t *ids, int t, int n, int k, int group, const void *w0,
                      const void *w1, const void *w2, const void *w3, float *out) {
    const qweight w = {fmt, n, k, group, w0, w1, w2, w3};
    if (kernel_for(fmt) == NULL && !is_w8a8(fmt) && fmt < FMT_INT8P) return -2;
    if (fmt > FMT_W8A8P) return -2;
    int bad = 0;
    for (int r = 0; r < t; r++) {
        const int64_t v = ids[r];
        float *o = out + (int64_t)r * k;
        if (v < 0 || v >= n) {
            bad++;
            continue;
        }
        if (fmt == FMT_INT8) dequant_row_int8(&w, v, o);
        else if (is_w8a8(fmt)) dequant_row_w8a8(&w, v, o);
        else if (fmt >= FMT_INT8P) dequant_row_panel(&w, v, o);
        else if (fmt == FMT_FP8) dequant_row_fp8(&w, v, o);
        else if (fmt == FMT_INT4) dequant_row_int4(&w, v, o);
        else dequant_row_gguf(&w, v, o);
    }
    return bad;
}

/* 1: w8a8 weights on 16-row panels (FMT_W8A8P) run on the AMX tile unit here (the build has
   AMX int8 and this process may use the tiles); the packing asks before it lays them out */
int ironlm_quant_amx_int8(void) {
#if W8A8_AMX
    return amx_permitted();
#else
    return 0;
#endif
}

/* which instruction-set path this build compiled */
const char *ironlm_quant_isa(void) {
#if W8A8_AMX
    return "avx2 + avx512-vnni + amx-int8";
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return "avx2 + avx512-vnni";
#elif defined(__AVXVNNI__)
    return "avx2 + avx-vnni";
#elif defined(__AVX2__)
    return "avx2";
#else
    return "generic";
#endif
}

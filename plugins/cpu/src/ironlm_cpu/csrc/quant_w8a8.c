/* w8a8: int8 weights x per-token int8 activations, exact int32 dot products.

   Packed by ironlm_cpu.quant_packing: w0 panels of 8 output rows, (n8 / 8, k / 4, 8, 4) int8:
   for every 4 consecutive inputs (a "quad"), the 8 rows' 4 weights, 32 bytes. One quad of an
   activation row broadcast against those 32 bytes advances all 8 rows at once (no horizontal
   sums), for one activation row (decode) as for many (prefill: a tile of up to MRP rows reuses
   each weight vector). n is padded to a multiple of 8 with zero rows; k % 4 == 0.
   w1 (n,) float scales, w2 (n,) int32 row sums of q.
   FMT_W8A8P (AMX builds, n % 16 == 0): panels of 16 rows, (n / 16, k / 4, 16, 4), 64 bytes per
   quad: 16 quads of a panel are one AMX B tile (1 KiB, k values 64s .. 64s + 63). The 8-row
   kernels below read 8-row panel p of it as half p % 2 of panel p / 2, its quads 64 bytes apart
   (w8a8_panel); where the tiles run (amx_w8a8, any row count), tdpbssd multiplies the int8
   activations by it.

   AVX2: weights widened to int16 (rows 0-3 and 4-7 of a quad: two vectors), activations as
   int16, _mm256_madd_epi16 sums each row's pairs; the two pair sums of a row are added at the
   end. VNNI: activations as u8 (q + 128), vpdpbusd sums a row's quad into its int32 lane;
   minus 128 * (row sum of q) at the end.
   Activations are quantized as the reference does (quantize_row_w8a8): y = (double)dot * sx *
   scale, the reference's arithmetic, so results equal the reference's. */

/* activation rows per tile: as many as the 16 vector registers hold accumulators for (AVX2:
   two per row, plus two weight vectors and a broadcast; VNNI: one per row) */
#if HAVE_VNNI
#define MRP 8
#else
#define MRP 3
#endif

/* 8-row panel p of the weight, and the bytes from one of its quads to the next */
static inline const int8_t *w8a8_panel(const qweight *w, int64_t p) {
    const int8_t *w0 = (const int8_t *)w->w0;
    if (w->fmt == FMT_W8A8P) return w0 + (p >> 1) * (int64_t)w->k * 16 + 32 * (p & 1);
    return w0 + p * (int64_t)w->k * 8;
}
static inline int64_t w8a8_quad_bytes(const qweight *w) { return w->fmt == FMT_W8A8P ? 64 : 32; }

/* One activation row -> int8 q (and x16 / xu where given): s = max(max |x|, 1e-8) / 127, q =
   round(x / s) to nearest even, clamped to +-127; the vector paths divide and round as the
   scalar loop does (IEEE division, round-to-nearest-even), so every q is the same. The scalar
   loop alone took ~2 ns an element: a 64 x 1536 down projection's activations cost more than
   its AMX tile products. */
static void quantize_row_w8a8(const float *x, int k, int8_t *q, float *sx, int16_t *x16,
                              uint8_t *xu) {
    float amax = 0.0f;
    int j0 = 0;
#if defined(__AVX512F__)
    __m512 vmax = _mm512_setzero_ps();
    for (; j0 + 16 <= k; j0 += 16)
        vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(x + j0)));
    amax = _mm512_reduce_max_ps(vmax);
#endif
    for (int j = j0; j < k; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float s = fmaxf(amax, 1e-8f) / 127.0f;
    *sx = s;
    int j = 0;
#if defined(__AVX512F__)
    const __m512 vs = _mm512_set1_ps(s), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    for (; j + 16 <= k; j += 16) {
        const __m512 r = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + j), vs),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 v = _mm512_min_ps(hi, _mm512_max_ps(lo, r));
        const __m512i vi = _mm512_cvtps_epi32(v);
        _mm_storeu_si128((__m128i *)(q + j), _mm512_cvtepi32_epi8(vi));
        if (x16 != NULL) _mm256_storeu_si256((__m256i *)(x16 + j), _mm512_cvtepi32_epi16(vi));
        if (xu != NULL)
            _mm_storeu_si128((__m128i *)(xu + j),
                             _mm512_cvtepi32_epi8(_mm512_add_epi32(vi, _mm512_set1_epi32(128))));
    }
#elif defined(__AVX2__)
    const __m256 vs = _mm256_set1_ps(s), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    for (; j + 8 <= k; j += 8) {
        const __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + j), vs),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256 v = _mm256_min_ps(hi, _mm256_max_ps(lo, r));
        const __m256i vi = _mm256_cvtps_epi32(v);
        const __m128i i16 =
            _mm_packs_epi32(_mm256_castsi256_si128(vi), _mm256_extracti128_si256(vi, 1));
        const __m128i i8 = _mm_packs_epi16(i16, i16); /* the 8 values in the low 8 bytes */
        _mm_storel_epi64((__m128i *)(q + j), i8);
        if (x16 != NULL) _mm_storeu_si128((__m128i *)(x16 + j), i16);
        if (xu != NULL) /* q + 128 as a byte: the sign bit flipped */
            _mm_storel_epi64((__m128i *)(xu + j), _mm_xor_si128(i8, _mm_set1_epi8((char)0x80)));
    }
#endif
    for (; j < k; j++) {
        float v = nearbyintf(x[j] / s);
        v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
        q[j] = (int8_t)v;
        if (x16 != NULL) x16[j] = (int16_t)v;
        if (xu != NULL) xu[j] = (uint8_t)((int)v + 128);
    }
}

/* out[i][r] = dot of panel p's row r (r < 8) with activation row t0 + i (i < rows <= MRP) */
ALWAYS_INLINE void panel_w8a8_mr(const qweight *w, const qact *a, int64_t p, int t0,
                                 const int mr, int64_t out[MRP][8]) {
    const int k = w->k, quads = k / 4;
    const int8_t *wp = w8a8_panel(w, p);
    const int64_t ld = a->ldq, qs = w8a8_quad_bytes(w);
#if HAVE_VNNI
    const uint8_t *xu = a->xu + (int64_t)t0 * ld;
    __m256i acc[MRP];
    UNROLL(8) for (int i = 0; i < mr; i++) acc[i] = _mm256_setzero_si256();
    for (int g = 0; g < quads; g++) {
        const __m256i wv = _mm256_loadu_si256((const __m256i *)(wp + qs * g));
        UNROLL(8) for (int i = 0; i < mr; i++) {
            int32_t quad;
            memcpy(&quad, xu + i * ld + 4 * g, 4);
            acc[i] = DPBUSD(acc[i], _mm256_set1_epi32(quad), wv);
        }
    }
    const int32_t *wsum = (const int32_t *)w->w2 + 8 * p;
    UNROLL(8) for (int i = 0; i < mr; i++) {
        int32_t lanes[8];
        _mm256_storeu_si256((__m256i *)lanes, acc[i]);
        for (int r = 0; r < 8; r++)
            out[i][r] = (int64_t)lanes[r] - 128 * (int64_t)(8 * p + r < w->n ? wsum[r] : 0);
    }
#elif defined(__AVX2__)
    /* named accumulators (rows 0-3 / 4-7 of the panel for each activation row): gcc keeps them
       in registers without the copies an array costs */
    const int16_t *x16 = a->x16 + (int64_t)t0 * ld;
    __m256i l0 = _mm256_setzero_si256(), h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0;
#define W8A8_ROW(I, L, H)                                                                      \
    if (mr > I) {                                                                              \
        int64_t quad;                                                                          \
        memcpy(&quad, x16 + I * ld + 4 * g, 8);                                                \
        const __m256i xv = _mm256_set1_epi64x(quad);                                           \
        L = _mm256_add_epi32(_mm256_madd_epi16(w03, xv), L);                                   \
        H = _mm256_add_epi32(_mm256_madd_epi16(w47, xv), H);                                   \
    }
    for (int g = 0; g < quads; g++) {
        const __m128i *wq = (const __m128i *)(wp + qs * g);
        const __m256i w03 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wq));
        const __m256i w47 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wq + 1));
        W8A8_ROW(0, l0, h0) W8A8_ROW(1, l1, h1) W8A8_ROW(2, l2, h2) W8A8_ROW(3, l3, h3)
    }
#undef W8A8_ROW
    /* hadd: [r0 r1 r4 r5 | r2 r3 r6 r7]; the permute restores row order */
#define W8A8_OUT(I, L, H)                                                                      \
    if (mr > I) {                                                                              \
        int32_t lanes[8];                                                                      \
        _mm256_storeu_si256((__m256i *)lanes,                                                  \
                            _mm256_permute4x64_epi64(_mm256_hadd_epi32(L, H), 0xD8));          \
        for (int r = 0; r < 8; r++) out[I][r] = lanes[r];                                      \
    }
    W8A8_OUT(0, l0, h0) W8A8_OUT(1, l1, h1) W8A8_OUT(2, l2, h2) W8A8_OUT(3, l3, h3)
#undef W8A8_OUT
#else
    const int8_t *xq = a->q + (int64_t)t0 * ld;
    for (int i = 0; i < mr; i++)
        for (int r = 0; r < 8; r++) out[i][r] = 0;
    for (int g = 0; g < quads; g++)
        for (int i = 0; i < mr; i++)
            for (int r = 0; r < 8; r++)
                for (int j = 0; j < 4; j++)
                    out[i][r] += (int32_t)wp[qs * g + 4 * r + j] * xq[i * ld + 4 * g + j];
#endif
}

static void panel_w8a8(const qweight *w, const qact *a, int64_t p, int t0, int rows,
                       int64_t out[MRP][8]) {
    switch (rows) {
    case 1: panel_w8a8_mr(w, a, p, t0, 1, out); break;
    case 2: panel_w8a8_mr(w, a, p, t0, 2, out); break;
    case 3: panel_w8a8_mr(w, a, p, t0, 3, out); break;
#if MRP > 4
    case 4: panel_w8a8_mr(w, a, p, t0, 4, out); break;
    case 5: panel_w8a8_mr(w, a, p, t0, 5, out); break;
    case 6: panel_w8a8_mr(w, a, p, t0, 6, out); break;
    case 7: panel_w8a8_mr(w, a, p, t0, 7, out); break;
#endif
    default: panel_w8a8_mr(w, a, p, t0, MRP, out); break;
    }
}

/* y rows t.. (at most MRP, before m1) x panel p's 8 outputs: the reference's rescale */
static void w8a8_tile(const qweight *w, const qact *a, int64_t p, int t, int m1, const float *bias,
                      float *y) {
    const int n = w->n, rows = m1 - t < MRP ? m1 - t : MRP;
    const float *scale = (const float *)w->w1;
    int64_t out[MRP][8];
    panel_w8a8(w, a, p, t, rows, out);
    for (int i = 0; i < rows; i++) {
        const double sx = a->sx[t + i];
        for (int r = 0; r < 8 && 8 * p + r < n; r++) {
            const int row = 8 * p + r;
            const float v = (float)((double)out[i][r] * sx * (double)scale[row]);
            y[(int64_t)(t + i) * n + row] = bias != NULL ? v + bias[row] : v;
        }
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
/* AVX-512 VNNI batch tile: 8 activation rows x 4 panels (32 outputs). Panels p, p + 1 (and
   p + 2, p + 3) share one zmm per quad (two 32-byte loads), so each broadcast quad of an
   activation row feeds two 512-bit vpdpbusd: 16 accumulators, 4x the multiply-adds per
   instruction of the 256-bit tile above (which ran batch 64 at the float32 tile's speed). The
   rescale is the reference's arithmetic on 8 doubles at a time: (double)dot * sx * scale, then
   float, then + bias, so results equal the reference's bit for bit. Needs n % 32 == 0. */
#define W8_RT 8
static void w8a8_tile512(const qweight *w, const qact *a, int64_t p, int t, const float *bias,
                         float *y) {
    const int k = w->k, quads = k / 4, n = w->n;
    const int64_t ld = a->ldq, qs = w8a8_quad_bytes(w);
    const int8_t *w0 = w8a8_panel(w, p), *w1 = w8a8_panel(w, p + 1), *w2 = w8a8_panel(w, p + 2),
                 *w3 = w8a8_panel(w, p + 3);
    const uint8_t *xu = a->xu + (int64_t)t * ld;
    __m512i acc[W8_RT][2];
    for (int i = 0; i < W8_RT; i++) acc[i][0] = acc[i][1] = _mm512_setzero_si512();
    for (int g = 0; g < quads; g++) {
        const __m512i wa = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w0 + qs * g))),
            _mm256_loadu_si256((const __m256i *)(w1 + qs * g)), 1);
        const __m512i wb = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w2 + qs * g))),
            _mm256_loadu_si256((const __m256i *)(w3 + qs * g)), 1);
        UNROLL(8) for (int i = 0; i < W8_RT; i++) {
            int32_t quad;
            memcpy(&quad, xu + i * ld + 4 * g, 4);
            const __m512i xb = _mm512_set1_epi32(quad);
            acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], xb, wa);
            acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], xb, wb);
        }
    }
    const int32_t *wsum = (const int32_t *)w->w2 + 8 * p;
    const float *scale = (const float *)w->w1 + 8 * p;
    for (int i = 0; i < W8_RT; i++) {
        const __m512d sx = _mm512_set1_pd((double)a->sx[t + i]);
        float *yr = y + (int64_t)(t + i) * n + 8 * p;
        for (int h = 0; h < 2; h++) { /* outputs 16h .. 16h + 15 of the tile */
            const __m512i dot = _mm512_sub_epi32(
                acc[i][h], _mm512_slli_epi32(_mm512_loadu_si512(wsum + 16 * h), 7));
            for (int e = 0; e < 2; e++) { /* 8 outputs at a time as doubles */
                const int o = 16 * h + 8 * e;
                const __m256i d8 = e ? _mm512_extracti64x4_epi64(dot, 1)
                                     : _mm512_castsi512_si256(dot);
                const __m512d v = _mm512_mul_pd(_mm512_mul_pd(_mm512_cvtepi32_pd(d8), sx),
                                                _mm512_cvtps_pd(_mm256_loadu_ps(scale + o)));
                __m256 f = _mm512_cvtpd_ps(v);
                if (bias != NULL) f = _mm256_add_ps(f, _mm256_loadu_ps(bias + 8 * p + o));
                _mm256_storeu_ps(yr + o, f);
            }
        }
    }
}
#endif

#if HAVE_AMX && defined(__AVX512F__)
/* AMX (the driver: amx_tiles_src's amx_run): 16 activation rows x 64 k values (A, int8 q)
   times a 16-row panel's B tile (64 k values x 16 outputs) into a 16 x 16 int32 tile in one
   tdpbssd: exact sums as vpdpbusd's, with no +128 offset (both sides signed). From one row:
   padded to 16 with zeros, a decode row still ran 1.3x faster than the VNNI loop (SmolLM2's
   linears x 30 layers from DRAM, 2-core AMX Xeon: 6.9-7.1 vs 9.0-9.1 ms). */
#define W8A8_AMX 1
#define W8_AMX_AHEAD 8 /* k steps (1 KiB of a panel each) ahead that the weight is asked for */

typedef struct {
    const qweight *w;
    const qact *a;
    int m;
    const float *bias;
    float *y;
} w8a8_amx_out;

/* int32 dots (16 x 16, rows 64 bytes apart) of y rows [row0, row0 + 16) below m, columns col0
   .. col0 + 15 -> y, with the reference's rescale ((double)dot * sx * scale, then float, +
   bias), as w8a8_tile512 */
static void w8a8_amx_flush(const void *tile, int row0, int col0, const void *ctx) {
    const w8a8_amx_out *o = ctx;
    const int32_t *dots = tile;
    const int valid = o->m - row0 < 16 ? o->m - row0 : 16;
    const float *scale = (const float *)o->w->w1 + col0;
    const __m512d s0 = _mm512_cvtps_pd(_mm256_loadu_ps(scale));
    const __m512d s1 = _mm512_cvtps_pd(_mm256_loadu_ps(scale + 8));
    for (int r = 0; r < valid; r++) {
        const __m512d sx = _mm512_set1_pd((double)o->a->sx[row0 + r]);
        const __m512i d = _mm512_loadu_si512(dots + 16 * r);
        __m256 lo = _mm512_cvtpd_ps(
            _mm512_mul_pd(_mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(d)), sx), s0));
        __m256 hi = _mm512_cvtpd_ps(
            _mm512_mul_pd(_mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(d, 1)), sx),
                          s1));
        if (o->bias != NULL) {
            lo = _mm256_add_ps(lo, _mm256_loadu_ps(o->bias + col0));
            hi = _mm256_add_ps(hi, _mm256_loadu_ps(o->bias + col0 + 8));
        }
        float *yr = o->y + (int64_t)(row0 + r) * o->w->n + col0;
        _mm256_storeu_ps(yr, lo);
        _mm256_storeu_ps(yr + 8, hi);
    }
}

/* whether this weight runs on the tile unit (its layout, shape, and the process's permission):
   its activations then need no widened or offset copies (prepare) */
static int w8a8_on_tiles(const qweight *w) {
    return w->fmt == FMT_W8A8P && w->k % 64 == 0 && w->n % 16 == 0 && amx_permitted();
}

/* y (m, n) on the tile unit (w8a8_on_tiles first); 0: out of memory for the A tiles */
static int amx_w8a8(const qweight *w, const qact *a, int m, const float *bias, float *y,
                    int threads) {
    const w8a8_amx_out out = {w, a, m, bias, y};
    const amx_job job = {(const char *)a->q, a->ldq, (const char *)w->w0, 16 * (int64_t)w->k,
                         m, w->n / 16, w->k / 64, 1, W8_AMX_AHEAD, w8a8_amx_flush, &out};
    return amx_run(&job, threads);
}
#else
#define W8A8_AMX 0
static int w8a8_on_tiles(const qweight *w) { return (void)w, 0; }
#endif

/* y (m, n) over (activation chunk, run of panels) work items, as drive() splits rows */
static void drive_w8a8(const qweight *w, const qact *a, int m, const float *bias, float *y,
                       int threads) {
    const int n = w->n, panels = (n + 7) / 8;
    int mc = (int)((192 * 1024) / (3 * (int64_t)w->k)) / MRP * MRP;
    if (mc < MRP) mc = MRP;
    if (mc > m) mc = m;
    const int chunks = (m + mc - 1) / mc;
    const int run = m <= 2 * MRP ? (panels + threads - 1) / threads : 4;
    const int runs = (panels + run - 1) / run;
    #pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (threads > 1)
    for (int c = 0; c < chunks; c++) {
        for (int g = 0; g < runs; g++) {
            const int m0 = CHUNK_ROW(c, m, chunks), m1 = CHUNK_ROW(c + 1, m, chunks);
            const int p1 = (g + 1) * run < panels ? (g + 1) * run : panels;
            const int p0 = g * run;
            if (m <= 2 * MRP) { /* decode: each panel streamed once, for all activation rows */
                for (int p = p0; p < p1; p++)
                    for (int t = m0; t < m1; t += MRP) w8a8_tile(w, a, p, t, m1, bias, y);
            } else { /* prefill: for every block of activation rows, the run's panels (in L1) */
                int t = m0;
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
                if (n % 32 == 0 && p1 - p0 == 4) /* whole 8-row blocks on the 512-bit tile */
                    for (; t + W8_RT <= m1; t += W8_RT) w8a8_tile512(w, a, p0, t, bias, y);
#endif
                for (; t < m1; t += MRP)
                    for (int p = p0; p < p1; p++) w8a8_tile(w, a, p, t, m1, bias, y);
            }
        }
    }
}

static void dequant_row_w8a8(const qweight *w, int64_t n, float *out) {
    const int8_t *panel = w8a8_panel(w, n / 8);
    const int64_t qs = w8a8_quad_bytes(w);
    const float scale = ((const float *)w->w1)[n];
    for (int j = 0; j < w->k; j++)
        out[j] = (float)panel[qs * (j / 4) + 4 * (n % 8) + j % 4] * scale;
}

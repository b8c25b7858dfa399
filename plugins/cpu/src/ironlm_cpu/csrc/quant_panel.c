/* Float-activation formats on 16-row panels: int8 and fp8 per-channel, int4 group-wise.

   Packed by ironlm_cpu.quant_packing when n % 16 == 0 (other weights use the row kernels):
     int8 / fp8  w0 (n / 16, k, 16): per panel and input k, the 16 rows' bytes; w1 (n,) scales
     int4        w0 (n / 16, k / 2, 16): per panel and input pair, the 16 rows' bytes (low nibble
                 k even, high k odd); w1 scale and w2 scale * zero, (n / 16, k / g, 16) float
   A tile is up to PMR activation rows x one panel's 16 outputs, 2 * PMR accumulators of 8
   floats (the plugin's float32 linear kernel's shape): per k, the 16 weights become two float
   vectors in registers (int4: q * s - s * z, two FMAs), then one broadcast and two FMAs per
   activation row. Decode (a few rows) streams every panel once; prefill reuses each converted
   weight across PMR rows and keeps a run of panels in L1 while activation blocks pass. */

#define PMR 6 /* activation rows per tile */

#ifdef __AVX2__
/* one tile: y[t0 + i, 16p .. 16p + 15] for i < mr */
#define PTILE_ROW(I, KI)                                                                        \
    if (mr > I) {                                                                               \
        const __m256 xb = _mm256_broadcast_ss(x + I * ldx + (KI));                              \
        lo##I = _mm256_fmadd_ps(wl, xb, lo##I);                                                 \
        hi##I = _mm256_fmadd_ps(wh, xb, hi##I);                                                 \
    }
#define PTILE_ROWS(KI)                                                                          \
    PTILE_ROW(0, KI) PTILE_ROW(1, KI) PTILE_ROW(2, KI) PTILE_ROW(3, KI) PTILE_ROW(4, KI)        \
    PTILE_ROW(5, KI)
#define PTILE_OUT(I)                                                                            \
    if (mr > I) {                                                                               \
        _mm256_storeu_ps(out + 16 * I, lo##I);                                                  \
        _mm256_storeu_ps(out + 16 * I + 8, hi##I);                                              \
    }

/* out (mr, 16) = x rows . panel p (before the per-row scale of int8 / fp8) */
ALWAYS_INLINE void ptile_mr(const qweight *w, const float *x, int64_t ldx, int64_t p,
                            const int mr, float *out) {
    const int k = w->k;
    __m256 lo0 = _mm256_setzero_ps(), hi0 = lo0, lo1 = lo0, hi1 = lo0, lo2 = lo0, hi2 = lo0;
    __m256 lo3 = lo0, hi3 = lo0, lo4 = lo0, hi4 = lo0, lo5 = lo0, hi5 = lo0;
    if (w->fmt == FMT_INT4P) {
        const uint8_t *q = (const uint8_t *)w->w0 + p * (int64_t)k * 8;
        const int g = w->group, ng = k / g;
        const float *s = (const float *)w->w1 + p * (int64_t)ng * 16;
        const float *sz = (const float *)w->w2 + p * (int64_t)ng * 16;
        for (int kk = 0; kk < k; kk += 2) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(q + 8 * kk));
            const __m128i even = _mm_and_si128(v, _mm_set1_epi8(0x0F));
            const __m128i odd = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
            const float *sg = s + (kk / g) * 16, *zg = sz + (kk / g) * 16;
            const __m256 s0 = _mm256_loadu_ps(sg), s1 = _mm256_loadu_ps(sg + 8);
            const __m256 z0 = _mm256_loadu_ps(zg), z1 = _mm256_loadu_ps(zg + 8);
            __m256 wl = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(even)), s0, z0);
            __m256 wh = _mm256_fmsub_ps(
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(even, 8))), s1, z1);
            PTILE_ROWS(kk)
            wl = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(odd)), s0, z0);
            wh = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(odd, 8))),
                                 s1, z1);
            PTILE_ROWS(kk + 1)
        }
    } else if (w->fmt == FMT_FP8P) {
        const uint8_t *q = (const uint8_t *)w->w0 + p * (int64_t)k * 16;
        for (int kk = 0; kk < k; kk++) {
            const __m256 wl = fp8x8(q + 16 * kk), wh = fp8x8(q + 16 * kk + 8);
            PTILE_ROWS(kk)
        }
    } else {
        const int8_t *q = (const int8_t *)w->w0 + p * (int64_t)k * 16;
        for (int kk = 0; kk < k; kk++) {
            const __m256 wl = int8x8(q + 16 * kk), wh = int8x8(q + 16 * kk + 8);
            PTILE_ROWS(kk)
        }
    }
    PTILE_OUT(0) PTILE_OUT(1) PTILE_OUT(2) PTILE_OUT(3) PTILE_OUT(4) PTILE_OUT(5)
}
#else
static inline float panel_value(const qweight *w, int64_t p, int kk, int r) {
    const int k = w->k;
    if (w->fmt == FMT_INT4P) {
        const uint8_t byte = ((const uint8_t *)w->w0)[p * (int64_t)k * 8 + (kk / 2) * 16 + r];
        const int64_t at = (p * (int64_t)(k / w->group) + kk / w->group) * 16 + r;
        const float q = (float)((kk & 1) ? (byte >> 4) : (byte & 0x0F));
        return q * ((const float *)w->w1)[at] - ((const float *)w->w2)[at];
    }
    const int64_t at = (p * (int64_t)k + kk) * 16 + r;
    if (w->fmt == FMT_FP8P) return fp8_to_float(((const uint8_t *)w->w0)[at]);
    return (float)((const int8_t *)w->w0)[at];
}

static void ptile_mr(const qweight *w, const float *x, int64_t ldx, int64_t p, const int mr,
                     float *out) {
    for (int i = 0; i < mr; i++)
        for (int r = 0; r < 16; r++) {
            float sum = 0.0f;
            for (int kk = 0; kk < w->k; kk++) sum += panel_value(w, p, kk, r) * x[i * ldx + kk];
            out[16 * i + r] = sum;
        }
}
#endif

#if defined(__AVX512F__)
/* one k of an int8 / fp8 panel, its 16 bytes -> 16 floats in one register (fp8: value / 256,
   as fp8x8): half the instructions of two 8-wide conversions, which is what bounds the
   batch-1 int8 decode on AVX-512 CPUs */
static inline __m512 int8x16(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
static inline __m512 fp8x16(const int8_t *p) {
    const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm512_cvtph_ps(
        _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16((short)0xBF80)));
}

/* k steps ahead (8 KiB of the panel stream) that software prefetch asks for: the hardware
   prefetchers stop at page boundaries and one core then streams ~29 GB/s; cold 3072 x 576 int8
   at one row: 29 -> 39-43 GB/s on one core, 52 -> 59-68 on two (Zen 5; 2 and 32 KiB ahead gave
   less). A prefetch past the weight's end is harmless. */
#define QP_PF 512
/* out (16) = x . panel p, four FMA chains of 16 lanes over k */
#define PANEL_ONE_512(CONVERT)                                                                  \
    {                                                                                           \
        for (; kk + 4 <= k; kk += 4) {                                                          \
            _mm_prefetch((const char *)(q + 16 * (kk + QP_PF)), _MM_HINT_T0);                     \
            UNROLL(4) for (int j = 0; j < 4; j++)                                               \
                acc[j] = _mm512_fmadd_ps(CONVERT(q + 16 * (kk + j)), _mm512_set1_ps(x[kk + j]), \
                                         acc[j]);                                               \
        }                                                                                       \
        for (; kk < k; kk++)                                                                    \
            acc[0] = _mm512_fmadd_ps(CONVERT(q + 16 * kk), _mm512_set1_ps(x[kk]), acc[0]);      \
    }

static void ptile_one_512(const qweight *w, const float *x, int64_t p, float *out) {
    const int k = w->k;
    const int8_t *q = (const int8_t *)w->w0 + p * (int64_t)k * 16;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    int kk = 0;
    if (w->fmt == FMT_FP8P)
        PANEL_ONE_512(fp8x16)
    else
        PANEL_ONE_512(int8x16)
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]),
                                        _mm512_add_ps(acc[2], acc[3])));
}
#endif

#ifdef __AVX2__
/* one activation row (batch-1 decode): four independent FMA chains per output vector, so the
   loop runs at the FMA units' throughput rather than their latency */
static void ptile_one(const qweight *w, const float *x, int64_t p, float *out) {
    const int k = w->k;
#if defined(__AVX512F__)
    if (w->fmt != FMT_INT4P) {
        ptile_one_512(w, x, p, out);
        return;
    }
#endif
    __m256 l[4], h[4];
    for (int j = 0; j < 4; j++) l[j] = h[j] = _mm256_setzero_ps();
    if (w->fmt == FMT_INT4P) {
        /* per group: raw sums of x * q in the chains, then total += s * sums - (s * z) * sum(x) */
        const uint8_t *q = (const uint8_t *)w->w0 + p * (int64_t)k * 8;
        const int g = w->group, ng = k / g;
        const float *s = (const float *)w->w1 + p * (int64_t)ng * 16;
        const float *sz = (const float *)w->w2 + p * (int64_t)ng * 16;
        __m256 tl = _mm256_setzero_ps(), th = tl;
        for (int gi = 0; gi < ng; gi++) {
            __m128 xs = _mm_setzero_ps(); /* sum of the group's x, 4 lanes */
            for (int kk = gi * g; kk < (gi + 1) * g; kk += 4) {
                xs = _mm_add_ps(xs, _mm_loadu_ps(x + kk));
                UNROLL(2) for (int j = 0; j < 2; j++) {
                    const __m128i v = _mm_loadu_si128((const __m128i *)(q + 8 * (kk + 2 * j)));
                    const __m128i e = _mm_and_si128(v, _mm_set1_epi8(0x0F));
                    const __m128i o = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
                    const __m256 xe = _mm256_broadcast_ss(x + kk + 2 * j);
                    const __m256 xo = _mm256_broadcast_ss(x + kk + 2 * j + 1);
                    l[2 * j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e)), xe, l[2 * j]);
                    h[2 * j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                        _mm_srli_si128(e, 8))), xe, h[2 * j]);
                    l[2 * j + 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(o)), xo,
                                                   l[2 * j + 1]);
                    h[2 * j + 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                        _mm_srli_si128(o, 8))), xo, h[2 * j + 1]);
                }
            }
            xs = _mm_add_ps(xs, _mm_movehl_ps(xs, xs));
            const __m256 sumx = _mm256_set1_ps(_mm_cvtss_f32(_mm_add_ss(xs, _mm_movehdup_ps(xs))));
            const float *sg = s + gi * 16, *zg = sz + gi * 16;
            const __m256 ls = _mm256_add_ps(_mm256_add_ps(l[0], l[1]), _mm256_add_ps(l[2], l[3]));
            const __m256 hs = _mm256_add_ps(_mm256_add_ps(h[0], h[1]), _mm256_add_ps(h[2], h[3]));
            tl = _mm256_fnmadd_ps(_mm256_loadu_ps(zg), sumx, _mm256_fmadd_ps(ls, _mm256_loadu_ps(sg), tl));
            th = _mm256_fnmadd_ps(_mm256_loadu_ps(zg + 8), sumx,
                                  _mm256_fmadd_ps(hs, _mm256_loadu_ps(sg + 8), th));
            for (int j = 0; j < 4; j++) l[j] = h[j] = _mm256_setzero_ps();
        }
        _mm256_storeu_ps(out, tl);
        _mm256_storeu_ps(out + 8, th);
        return;
    } else {
        const int8_t *q = (const int8_t *)w->w0 + p * (int64_t)k * 16;
        const int fp8 = w->fmt == FMT_FP8P;
        int kk = 0;
        for (; kk + 4 <= k; kk += 4) {
            UNROLL(4) for (int j = 0; j < 4; j++) {
                const int8_t *b = q + 16 * (kk + j);
                const __m256 wl = fp8 ? fp8x8((const uint8_t *)b) : int8x8(b);
                const __m256 wh = fp8 ? fp8x8((const uint8_t *)b + 8) : int8x8(b + 8);
                const __m256 xb = _mm256_broadcast_ss(x + kk + j);
                l[j] = _mm256_fmadd_ps(wl, xb, l[j]);
                h[j] = _mm256_fmadd_ps(wh, xb, h[j]);
            }
        }
        for (; kk < k; kk++) {
            const int8_t *b = q + 16 * kk;
            const __m256 xb = _mm256_broadcast_ss(x + kk);
            l[0] = _mm256_fmadd_ps(fp8 ? fp8x8((const uint8_t *)b) : int8x8(b), xb, l[0]);
            h[0] = _mm256_fmadd_ps(fp8 ? fp8x8((const uint8_t *)b + 8) : int8x8(b + 8), xb, h[0]);
        }
    }
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(l[0], l[1]), _mm256_add_ps(l[2], l[3])));
    _mm256_storeu_ps(out + 8, _mm256_add_ps(_mm256_add_ps(h[0], h[1]), _mm256_add_ps(h[2], h[3])));
}
#endif

static void ptile(const qweight *w, const float *x, int64_t ldx, int64_t p, int rows, float *out) {
    switch (rows) {
#ifdef __AVX2__
    case 1: ptile_one(w, x, p, out); break;
#else
    case 1: ptile_mr(w, x, ldx, p, 1, out); break;
#endif
    case 2: ptile_mr(w, x, ldx, p, 2, out); break;
    case 3: ptile_mr(w, x, ldx, p, 3, out); break;
    case 4: ptile_mr(w, x, ldx, p, 4, out); break;
    case 5: ptile_mr(w, x, ldx, p, 5, out); break;
    default: ptile_mr(w, x, ldx, p, PMR, out); break;
    }
}

/* y rows t.. (at most PMR, before m1) x panel p's 16 outputs, scaled and biased */
static void panel_tile(const qweight *w, const float *x, int64_t ldx, int64_t p, int t, int m1,
                       const float *bias, float *y) {
    const int n = w->n, rows = m1 - t < PMR ? m1 - t : PMR;
    float out[PMR * 16];
    ptile(w, x + (int64_t)t * ldx, ldx, p, rows, out);
    const float *scale = w->fmt == FMT_INT4P ? NULL : (const float *)w->w1 + 16 * p;
#ifdef __AVX2__
    const float fp8_unit = w->fmt == FMT_FP8P ? 256.0f : 1.0f; /* fp8x8 yields value / 256 */
#else
    const float fp8_unit = 1.0f;
#endif
    for (int i = 0; i < rows; i++) {
        float *yr = y + (int64_t)(t + i) * n + 16 * p;
        for (int r = 0; r < 16; r++) {
            float v = out[16 * i + r];
            if (scale != NULL) v *= scale[r] * fp8_unit;
            yr[r] = bias != NULL ? v + bias[16 * p + r] : v;
        }
    }
}

/* panel p as floats, (k, 16), each row's scale applied (the prefill path's weights) */
static void dequant_panel(const qweight *w, int64_t p, float *buf) {
    const int k = w->k;
#ifdef __AVX2__
    if (w->fmt == FMT_INT4P) {
        const uint8_t *q = (const uint8_t *)w->w0 + p * (int64_t)k * 8;
        const int g = w->group, ng = k / g;
        const float *s = (const float *)w->w1 + p * (int64_t)ng * 16;
        const float *sz = (const float *)w->w2 + p * (int64_t)ng * 16;
        for (int kk = 0; kk < k; kk += 2) {
            const float *sg = s + (kk / g) * 16, *zg = sz + (kk / g) * 16;
            const __m256 s0 = _mm256_loadu_ps(sg), s1 = _mm256_loadu_ps(sg + 8);
            const __m256 z0 = _mm256_loadu_ps(zg), z1 = _mm256_loadu_ps(zg + 8);
            const __m128i v = _mm_loadu_si128((const __m128i *)(q + 8 * kk));
            const __m128i e = _mm_and_si128(v, _mm_set1_epi8(0x0F));
            const __m128i o = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
            float *b = buf + 16 * kk;
            _mm256_storeu_ps(b, _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e)), s0, z0));
            _mm256_storeu_ps(b + 8, _mm256_fmsub_ps(_mm256_cvtepi32_ps(
                _mm256_cvtepu8_epi32(_mm_srli_si128(e, 8))), s1, z1));
            _mm256_storeu_ps(b + 16, _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(o)), s0, z0));
            _mm256_storeu_ps(b + 24, _mm256_fmsub_ps(_mm256_cvtepi32_ps(
                _mm256_cvtepu8_epi32(_mm_srli_si128(o, 8))), s1, z1));
        }
        return;
    }
    const float *sc = (const float *)w->w1 + 16 * p;
    const float unit = w->fmt == FMT_FP8P ? 256.0f : 1.0f; /* fp8x8 yields value / 256 */
    const __m256 s0 = _mm256_mul_ps(_mm256_loadu_ps(sc), _mm256_set1_ps(unit));
    const __m256 s1 = _mm256_mul_ps(_mm256_loadu_ps(sc + 8), _mm256_set1_ps(unit));
    const int8_t *q = (const int8_t *)w->w0 + p * (int64_t)k * 16;
    for (int kk = 0; kk < k; kk++) {
        const int8_t *b = q + 16 * kk;
        const int fp8 = w->fmt == FMT_FP8P;
        _mm256_storeu_ps(buf + 16 * kk, _mm256_mul_ps(fp8 ? fp8x8((const uint8_t *)b) : int8x8(b), s0));
        _mm256_storeu_ps(buf + 16 * kk + 8,
                         _mm256_mul_ps(fp8 ? fp8x8((const uint8_t *)b + 8) : int8x8(b + 8), s1));
    }
#else
    for (int kk = 0; kk < k; kk++)
        for (int r = 0; r < 16; r++) {
            const float v = panel_value(w, p, kk, r);
            buf[16 * kk + r] = w->fmt == FMT_INT4P ? v : v * ((const float *)w->w1)[16 * p + r];
        }
#endif
}

/* y rows t.. (at most PMR, before m1) x 16 outputs from a float panel (k, 16) */
static void float_tile(const float *panel, int k, const float *x, int64_t ldx, int t, int m1,
                       const float *bias, float *y, int64_t ldy) {
    const int rows = m1 - t < PMR ? m1 - t : PMR;
    x += (int64_t)t * ldx;
    y += (int64_t)t * ldy;
#ifdef __AVX2__
#define FTILE(MRC)                                                                              \
    {                                                                                           \
        const int mr = MRC;                                                                     \
        __m256 lo0 = _mm256_setzero_ps(), hi0 = lo0, lo1 = lo0, hi1 = lo0, lo2 = lo0, hi2 = lo0; \
        __m256 lo3 = lo0, hi3 = lo0, lo4 = lo0, hi4 = lo0, lo5 = lo0, hi5 = lo0;                \
        for (int kk = 0; kk < k; kk++) {                                                        \
            const __m256 wl = _mm256_loadu_ps(panel + 16 * kk), wh = _mm256_loadu_ps(panel + 16 * kk + 8); \
            PTILE_ROWS(kk)                                                                      \
        }                                                                                       \
        float out[PMR * 16];                                                                    \
        PTILE_OUT(0) PTILE_OUT(1) PTILE_OUT(2) PTILE_OUT(3) PTILE_OUT(4) PTILE_OUT(5)           \
        for (int i = 0; i < mr; i++)                                                            \
            for (int r = 0; r < 16; r++)                                                        \
                y[i * ldy + r] = bias != NULL ? out[16 * i + r] + bias[r] : out[16 * i + r];    \
    }
    switch (rows) {
    case 1: FTILE(1) break;
    case 2: FTILE(2) break;
    case 3: FTILE(3) break;
    case 4: FTILE(4) break;
    case 5: FTILE(5) break;
    default: FTILE(6) break;
    }
#undef FTILE
#else
    for (int i = 0; i < rows; i++)
        for (int r = 0; r < 16; r++) {
            float sum = 0.0f;
            for (int kk = 0; kk < k; kk++) sum += panel[16 * kk + r] * x[i * ldx + kk];
            y[i * ldy + r] = bias != NULL ? sum + bias[r] : sum;
        }
#endif
}

/* y (m, n), n % 16 == 0. Decode (a few rows; panel formats only): panels converted in
   registers. Prefill: each work item's panels as floats once (gguf: from its rows), then plain
   float tiles. */
static int drive_panels(const qweight *w, const float *x, int64_t ldx, int m, const float *bias,
                        float *y, int threads) {
    const int panels = w->n / 16, k = w->k;
    int mc = (int)((192 * 1024) / (4 * (int64_t)k)) / PMR * PMR;
    if (mc < PMR) mc = PMR;
    if (mc > m) mc = m;
    const int chunks = (m + mc - 1) / mc;
    const int decode = m <= 2 * PMR && !is_gguf(w->fmt);
    const int run = decode ? (panels + threads - 1) / threads : 2;
    const int runs = (panels + run - 1) / run;
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (threads > 1)
    {
        float *buf = decode ? NULL : malloc(sizeof(float) * (size_t)run * k * 16);
        float *rows = decode || !is_gguf(w->fmt) ? NULL : malloc(sizeof(float) * (size_t)k * 16);
        if (!decode && (buf == NULL || (is_gguf(w->fmt) && rows == NULL))) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for collapse(2) schedule(static)
        for (int c = 0; c < chunks; c++) {
            for (int g = 0; g < runs; g++) {
                const int m0 = CHUNK_ROW(c, m, chunks), m1 = CHUNK_ROW(c + 1, m, chunks);
                const int p0 = g * run, p1 = (g + 1) * run < panels ? (g + 1) * run : panels;
                if (decode) { /* each panel streamed once, converted in registers */
                    for (int p = p0; p < p1; p++)
                        for (int t = m0; t < m1; t += PMR) panel_tile(w, x, ldx, p, t, m1, bias, y);
                    continue;
                }
                if (buf == NULL || (is_gguf(w->fmt) && rows == NULL)) continue; /* failed */
                for (int p = p0; p < p1; p++) {
                    float *panel = buf + (int64_t)(p - p0) * k * 16;
                    if (is_gguf(w->fmt)) dequant_panel_gguf(w, p, panel, rows);
                    else dequant_panel(w, p, panel);
                }
                for (int t = m0; t < m1; t += PMR)
                    for (int p = p0; p < p1; p++)
                        float_tile(buf + (int64_t)(p - p0) * k * 16, k, x, ldx, t, m1,
                                   bias != NULL ? bias + 16 * p : NULL, y + 16 * p, w->n);
            }
        }
        free(buf);
        free(rows);
    }
    return failed ? -1 : 0;
}

/* a row of the (n, k) weight as floats (quantized embeddings) */
static void dequant_row_panel(const qweight *w, int64_t n, float *out) {
    const int64_t p = n / 16;
    const int r = (int)(n % 16), k = w->k;
    for (int kk = 0; kk < k; kk++) {
        if (w->fmt == FMT_INT4P) {
            const uint8_t byte = ((const uint8_t *)w->w0)[p * (int64_t)k * 8 + (kk / 2) * 16 + r];
            const int64_t at = (p * (int64_t)(k / w->group) + kk / w->group) * 16 + r;
            const float q = (float)((kk & 1) ? (byte >> 4) : (byte & 0x0F));
            out[kk] = q * ((const float *)w->w1)[at] - ((const float *)w->w2)[at];
        } else {
            const int64_t at = (p * (int64_t)k + kk) * 16 + r;
            const float scale = ((const float *)w->w1)[n];
            out[kk] = w->fmt == FMT_FP8P ? fp8_to_float(((const uint8_t *)w->w0)[at]) * scale
                                        : (float)((const int8_t *)w->w0)[at] * scale;
        }
    }
}

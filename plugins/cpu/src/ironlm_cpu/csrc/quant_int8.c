/* int8 weight-only and fp8 row kernels (float activations; w8a8 is quant_w8a8.c).

   int8  w0 (n, k) int8, w1 (n,) float scale: float activations, W[n, k] = q * scale[n]; the
         int8 -> float conversion happens in registers and the scale multiplies the dot.
   fp8   w0 (n, k) float8 e4m3fn bytes, w1 (n,) float scale. An e4m3 byte becomes a half float
         by moving its exponent and mantissa bits into place (the half is the value / 256, for
         normal and subnormal values alike); F16C converts 8 halves at once.

   Accumulators per activation row: NA (4 for one row, 2 for two to four) independent FMA
   chains, so a single-row decode is not bound by the FMA latency. */

#define NA(mr) ((mr) <= 2 ? 4 : 2)

static inline float fp8_to_float(uint8_t b) {
    /* e4m3fn: s eeee mmm, bias 7; e == 0: subnormal m * 2^-9 */
    const int e = (b >> 3) & 0xF, m = b & 7;
    const float v = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return (b & 0x80) ? -v : v;
}

#ifdef __AVX2__
/* 8 int8 weights -> 8 floats */
static inline __m256 int8x8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* 8 fp8 e4m3fn bytes -> 8 floats, each 1/256 of the byte's value: sign-extended to 16 bits
   and shifted left by 7, a byte s eeee mmm lands as s (bit 15, from the extension), eeee mmm
   (bits 13..7): the half float s 0eeee mmm0000000 */
static inline __m256 fp8x8(const uint8_t *p) {
    const __m128i b = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(b, 7), _mm_set1_epi16((short)0xBF80)));
}
#endif

/* float dot of one weight row (CONVERT: 8 bytes -> 8 floats) with mr float activation rows;
   returns the part of k handled by vectors in *done */
#define FLOAT_ROW_BODY(CONVERT, ELEM)                                                          \
    const int k = w->k;                                                                        \
    const float *x = a->xf + (int64_t)t0 * a->ldx;                                             \
    const int64_t ld = a->ldx;                                                                 \
    float r[MR] = {0.0f, 0.0f, 0.0f, 0.0f};                                                    \
    int kk = 0;                                                                                \
    FLOAT_ROW_VECTOR(CONVERT)                                                                  \
    for (; kk < k; kk++)                                                                       \
        for (int i = 0; i < mr; i++) r[i] += (ELEM) * x[i * ld + kk];

#ifdef __AVX2__
#define FLOAT_ROW_VECTOR(CONVERT)                                                              \
    {                                                                                          \
        __m256 acc[MR][4];                                                                     \
        for (int i = 0; i < mr; i++)                                                           \
            for (int j = 0; j < NA(mr); j++) acc[i][j] = _mm256_setzero_ps();                  \
        for (; kk + 32 <= k; kk += 32) {                                                       \
            for (int u = 0; u < 4; u++) {                                                      \
                const __m256 wv = CONVERT(q + kk + 8 * u);                                     \
                for (int i = 0; i < mr; i++)                                                   \
                    acc[i][u % NA(mr)] = _mm256_fmadd_ps(                                      \
                        wv, _mm256_loadu_ps(x + i * ld + kk + 8 * u), acc[i][u % NA(mr)]);     \
            }                                                                                  \
        }                                                                                      \
        for (; kk + 8 <= k; kk += 8) {                                                         \
            const __m256 wv = CONVERT(q + kk);                                                 \
            for (int i = 0; i < mr; i++)                                                       \
                acc[i][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * ld + kk), acc[i][0]);  \
        }                                                                                      \
        for (int i = 0; i < mr; i++) {                                                         \
            __m256 s = acc[i][0];                                                              \
            for (int j = 1; j < NA(mr); j++) s = _mm256_add_ps(s, acc[i][j]);                  \
            r[i] = hsum8(s);                                                                   \
        }                                                                                      \
    }
#else
#define FLOAT_ROW_VECTOR(CONVERT)
#endif

ALWAYS_INLINE void row_int8_mr(const qweight *w, const qact *a, int64_t n, int t0, const int mr,
                               float *out) {
    const int8_t *q = (const int8_t *)w->w0 + n * (int64_t)w->k;
    FLOAT_ROW_BODY(int8x8, (float)q[kk])
    const float scale = ((const float *)w->w1)[n];
    for (int i = 0; i < mr; i++) out[i] = r[i] * scale;
}
ROW_KERNEL(row_int8)

ALWAYS_INLINE void row_fp8_mr(const qweight *w, const qact *a, int64_t n, int t0, const int mr,
                              float *out) {
    const uint8_t *q = (const uint8_t *)w->w0 + n * (int64_t)w->k;
#ifdef __AVX2__
    /* vector part: values / 256 (fp8x8); scalar tail: true values, so rescale the tail apart */
    FLOAT_ROW_BODY(fp8x8, (float)fp8_to_float(q[kk]) / 256.0f)
    const float scale = ((const float *)w->w1)[n] * 256.0f;
#else
    FLOAT_ROW_BODY(fp8x8, fp8_to_float(q[kk]))
    const float scale = ((const float *)w->w1)[n];
#endif
    for (int i = 0; i < mr; i++) out[i] = r[i] * scale;
}
ROW_KERNEL(row_fp8)

/* rows of the (n, k) weight as floats (quantized embeddings) */
static void dequant_row_int8(const qweight *w, int64_t n, float *out) {
    const int8_t *q = (const int8_t *)w->w0 + n * (int64_t)w->k;
    const float scale = ((const float *)w->w1)[n];
    for (int j = 0; j < w->k; j++) out[j] = (float)q[j] * scale;
}

static void dequant_row_fp8(const qweight *w, int64_t n, float *out) {
    const uint8_t *q = (const uint8_t *)w->w0 + n * (int64_t)w->k;
    const float scale = ((const float *)w->w1)[n];
    for (int j = 0; j < w->k; j++) out[j] = fp8_to_float(q[j]) * scale;
}

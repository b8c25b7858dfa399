/* int4 group-wise row kernel (float activations).

   Packed by ironlm_cpu.quant_packing: w0 (n, k / 2) uint8, every 32 elements as 16 bytes whose
   low nibbles are elements 0..15 and high nibbles 16..31 (two shifts and masks unpack them in
   order); w1 (n, k / g) float scales; w2 (n, k / g) uint8 zero points, or NULL (symmetric: 8).
   g (the group) is a multiple of 32.

   y = sum over groups of s * (sum_j x_j q_j - z * sum_j x_j): the zero point leaves the inner
   loop, and the per-group sums of x (prepare_int4) are computed once per call. */

static inline int int4_at(const uint8_t *row, int j) {
    const uint8_t byte = row[(j / 32) * 16 + (j % 16)];
    return (j % 32) < 16 ? (byte & 0x0F) : (byte >> 4);
}

ALWAYS_INLINE void row_int4_mr(const qweight *w, const qact *a, int64_t n, int t0, const int mr,
                               float *out) {
    const int k = w->k, g = w->group, ng = k / g;
    const uint8_t *q = (const uint8_t *)w->w0 + n * (int64_t)(k / 2);
    const float *scale = (const float *)w->w1 + n * (int64_t)ng;
    const uint8_t *zero = w->w2 != NULL ? (const uint8_t *)w->w2 + n * (int64_t)ng : NULL;
    const float *x = a->xf + (int64_t)t0 * a->ldx;
    const int64_t ld = a->ldx;
    float r[MR] = {0.0f, 0.0f, 0.0f, 0.0f}, zterm[MR] = {0.0f, 0.0f, 0.0f, 0.0f};
#ifdef __AVX2__
    __m256 total[MR];
    for (int i = 0; i < mr; i++) total[i] = _mm256_setzero_ps();
#endif
    for (int gi = 0; gi < ng; gi++) {
        const float s = scale[gi], z = zero != NULL ? (float)zero[gi] : 8.0f;
        for (int i = 0; i < mr; i++) zterm[i] += s * z * a->gsum[(int64_t)(t0 + i) * a->ldd + gi];
#ifdef __AVX2__
        __m256 acc[MR][4];
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < NA(mr); j++) acc[i][j] = _mm256_setzero_ps();
        for (int kk = gi * g; kk < (gi + 1) * g; kk += 32) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(q + kk / 2));
            const __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0x0F));
            const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
            const __m256 wv[4] = {
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)),
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))),
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)),
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))),
            };
            for (int u = 0; u < 4; u++)
                for (int i = 0; i < mr; i++)
                    acc[i][u % NA(mr)] = _mm256_fmadd_ps(
                        wv[u], _mm256_loadu_ps(x + i * ld + kk + 8 * u), acc[i][u % NA(mr)]);
        }
        const __m256 sv = _mm256_set1_ps(s);
        for (int i = 0; i < mr; i++) {
            __m256 sum = acc[i][0];
            for (int j = 1; j < NA(mr); j++) sum = _mm256_add_ps(sum, acc[i][j]);
            total[i] = _mm256_fmadd_ps(sum, sv, total[i]);
        }
#else
        for (int i = 0; i < mr; i++) {
            float sum = 0.0f;
            for (int j = gi * g; j < (gi + 1) * g; j++) sum += (float)int4_at(q, j) * x[i * ld + j];
            r[i] += s * sum;
        }
#endif
    }
#ifdef __AVX2__
    for (int i = 0; i < mr; i++) r[i] = hsum8(total[i]);
#endif
    for (int i = 0; i < mr; i++) out[i] = r[i] - zterm[i];
}
ROW_KERNEL(row_int4)

/* per activation row, the sum of x over each group (the zero points' term) */
static void group_sums(const float *x, int k, int g, float *out) {
    for (int gi = 0; gi < k / g; gi++) {
        float s = 0.0f;
        for (int j = gi * g; j < (gi + 1) * g; j++) s += x[j];
        out[gi] = s;
    }
}

static void dequant_row_int4(const qweight *w, int64_t n, float *out) {
    const int k = w->k, g = w->group, ng = k / g;
    const uint8_t *q = (const uint8_t *)w->w0 + n * (int64_t)(k / 2);
    const float *scale = (const float *)w->w1 + n * (int64_t)ng;
    const uint8_t *zero = w->w2 != NULL ? (const uint8_t *)w->w2 + n * (int64_t)ng : NULL;
    for (int j = 0; j < k; j++) {
        const float z = zero != NULL ? (float)zero[j / g] : 8.0f;
        out[j] = ((float)int4_at(q, j) - z) * scale[j / g];
    }
}

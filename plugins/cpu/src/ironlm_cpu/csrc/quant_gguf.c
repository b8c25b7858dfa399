/* GGUF block formats kept quantized: Q4_0, Q4_1, Q8_0 (32-element blocks) and Q4_K, Q6_K
   (256-element super-blocks), dotted with int8-quantized activations.

   Block formats (GGML's, as the gguf package's dequantize reads them), repacked at load by
   ironlm_cpu.quant_packing into per-row arrays (same bytes, the half-float scales of a row
   contiguous so that F16C converts 8 at once):
     Q4_0  w0 qs (n, nb * 16): byte j of a block = element j (low nibble), j + 16 (high);
           w1 d (n, nb) half.                      W = d * (q - 8)
     Q4_1  w0 qs, w1 d as Q4_0; w2 m (n, nb) half. W = d * q + m
     Q8_0  w0 qs (n, nb * 32) int8; w1 d.          W = d * q
     Q4_K  w0 qs (n, nbk * 128): 32 bytes per 64 elements, low nibbles the first 32, high the
           next; w1 d, w2 dmin (n, nbk) half; w3 (n, nbk, 16) uint8: the 8 six-bit sub-block
           scales then the 8 mins, unpacked.     W = d * sc[e / 32] * q - dmin * mn[e / 32]
     Q6_K  w0 ql (n, nbk * 128), w2 qh (n, nbk * 64), w3 scales (n, nbk * 16) int8, w1 d half:
           element e = 128 h + r of a super-block: low 4 bits from ql[64 h + r % 64] (low
           nibble for r < 64), high 2 bits from qh[32 h + r % 32] >> 2 (r / 32).
                                                   W = d * scales[e / 16] * (q - 32)
   Activations (prepare_gguf): per row, int8 blocks of 32 with a float scale d and s = d * sum q
   (32-element formats; s carries the Q4_1 min and the Q4_0 "- 8" term), or one float scale per
   256 with int16 sums of q per 16 (K-quants: the Q4_K mins and the Q6_K "- 32" term). */

static inline int q4_at(const uint8_t *block, int j) { /* element j < 32 of a 16-byte block */
    return j < 16 ? (block[j] & 0x0F) : (block[j - 16] >> 4);
}

/* ---- Q4_0 / Q4_1 ---------------------------------------------------------------------------- */
ALWAYS_INLINE void row_q4_mr(const qweight *w, const qact *a, int64_t n, int t0, const int mr,
                             float *out) {
    const int nb = w->k / QK;
    const uint8_t *qs = (const uint8_t *)w->w0 + n * (int64_t)nb * 16;
    const uint16_t *dw = (const uint16_t *)w->w1 + n * (int64_t)nb;
    const uint16_t *mw = w->w2 != NULL ? (const uint16_t *)w->w2 + n * (int64_t)nb : NULL;
    /* locals, not a->...: the vector stores below may alias anything, so fields would be
       reloaded from memory on every use */
    const int64_t ldq = a->ldq, ldd = a->ldd;
    const int8_t *xq = a->q + (int64_t)t0 * ldq;
    const float *xd = a->d + (int64_t)t0 * ldd, *xs = a->s + (int64_t)t0 * ldd;
    float r[MR] = {0.0f, 0.0f, 0.0f, 0.0f};
    int b = 0;
#ifdef __AVX2__
    __m256 acc[MR][2], mins[MR];
    UNROLL(4) for (int i = 0; i < mr; i++) acc[i][0] = acc[i][1] = mins[i] = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        const __m256 dv = load_halves(dw + b);
        const __m256 mv = mw != NULL ? load_halves(mw + b) : _mm256_mul_ps(dv, _mm256_set1_ps(-8.0f));
        __m256 dd[MR]; /* weight scale * activation scale, per row, for the 8 blocks */
        UNROLL(4) for (int i = 0; i < mr; i++) {
            dd[i] = _mm256_mul_ps(dv, _mm256_loadu_ps(xd + i * ldd + b));
            mins[i] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(xs + i * ldd + b), mins[i]);
        }
        UNROLL(8) for (int j = 0; j < 8; j++) {
            const __m256i u = unpack_nibbles(qs + (b + j) * 16);
            UNROLL(4) for (int i = 0; i < mr; i++) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + i * ldq + (b + j) * QK));
                const __m256i dot = DPBUSD(_mm256_setzero_si256(), u, x);
                acc[i][j & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), lane(dd[i], j), acc[i][j & 1]);
            }
        }
    }
    for (; b < nb; b++) { /* the last nb % 8 blocks, one at a time */
        const float d = half_to_float(dw[b]), m = mw != NULL ? half_to_float(mw[b]) : -8.0f * d;
        const __m256i u = unpack_nibbles(qs + b * 16);
        UNROLL(4) for (int i = 0; i < mr; i++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + i * ldq + b * QK));
            const __m256i dot = DPBUSD(_mm256_setzero_si256(), u, x);
            acc[i][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d * xd[i * ldd + b]),
                                        acc[i][0]);
            r[i] += m * xs[i * ldd + b];
        }
    }
    UNROLL(4) for (int i = 0; i < mr; i++)
        r[i] += hsum8(_mm256_add_ps(_mm256_add_ps(acc[i][0], acc[i][1]), mins[i]));
#else
    for (; b < nb; b++) {
        const float d = half_to_float(dw[b]), m = mw != NULL ? half_to_float(mw[b]) : -8.0f * d;
        for (int i = 0; i < mr; i++) {
            const int8_t *x = xq + i * ldq + b * QK;
            int sum = 0;
            for (int j = 0; j < QK; j++) sum += q4_at(qs + b * 16, j) * x[j];
            r[i] += d * xd[i * ldd + b] * (float)sum + m * xs[i * ldd + b];
        }
    }
#endif
    for (int i = 0; i < mr; i++) out[i] = r[i];
}
ROW_KERNEL(row_q4)

/* ---- Q8_0 ----------------------------------------------------------------------------------- */
ALWAYS_INLINE void row_q8_0_mr(const qweight *w, const qact *a, int64_t n, int t0, const int mr,
                               float *out) {
    const int nb = w->k / QK;
    const int8_t *qs = (const int8_t *)w->w0 + n * (int64_t)nb * QK;
    const uint16_t *dw = (const uint16_t *)w->w1 + n * (int64_t)nb;
    const int64_t ldq = a->ldq, ldd = a->ldd;
    const int8_t *xq = a->q + (int64_t)t0 * ldq;
    const float *xd = a->d + (int64_t)t0 * ldd;
    float r[MR] = {0.0f, 0.0f, 0.0f, 0.0f};
    int b = 0;
#ifdef __AVX2__
    __m256 acc[MR][2];
    UNROLL(4) for (int i = 0; i < mr; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        const __m256 dv = load_halves(dw + b);
        __m256 dd[MR];
        UNROLL(4) for (int i = 0; i < mr; i++) dd[i] = _mm256_mul_ps(dv, _mm256_loadu_ps(xd + i * ldd + b));
        UNROLL(8) for (int j = 0; j < 8; j++) {
            /* s8 x s8 as |w| (u8) x (x with w's sign) (s8): |w| <= 128, so no pair saturates */
            const __m256i wv = _mm256_loadu_si256((const __m256i *)(qs + (b + j) * QK));
            const __m256i aw = _mm256_abs_epi8(wv);
            UNROLL(4) for (int i = 0; i < mr; i++) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + i * ldq + (b + j) * QK));
                const __m256i dot = DPBUSD(_mm256_setzero_si256(), aw, _mm256_sign_epi8(x, wv));
                acc[i][j & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), lane(dd[i], j), acc[i][j & 1]);
            }
        }
    }
    for (; b < nb; b++) { /* the last nb % 8 blocks, one at a time */
        const float d = half_to_float(dw[b]);
        const __m256i wv = _mm256_loadu_si256((const __m256i *)(qs + b * QK));
        const __m256i aw = _mm256_abs_epi8(wv);
        UNROLL(4) for (int i = 0; i < mr; i++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + i * ldq + b * QK));
            const __m256i dot = DPBUSD(_mm256_setzero_si256(), aw, _mm256_sign_epi8(x, wv));
            acc[i][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d * xd[i * ldd + b]),
                                        acc[i][0]);
        }
    }
    UNROLL(4) for (int i = 0; i < mr; i++) r[i] = hsum8(_mm256_add_ps(acc[i][0], acc[i][1]));
#else
    for (; b < nb; b++) {
        const float d = half_to_float(dw[b]);
        for (int i = 0; i < mr; i++) {
            const int8_t *x = xq + i * ldq + b * QK;
            int sum = 0;
            for (int j = 0; j < QK; j++) sum += qs[b * QK + j] * x[j];
            r[i] += d * xd[i * ldd + b] * (float)sum;
        }
    }
#endif
    for (int i = 0; i < mr; i++) out[i] = r[i];
}
ROW_KERNEL(row_q8_0)

/* ---- Q4_K ----------------------------------------------------------------------------------- */
ALWAYS_INLINE void row_q4_k_mr(const qweight *w, const qact *a, int64_t n, int t0, const int mr,
                               float *out) {
    const int nbk = w->k / QKK;
    const uint8_t *qs = (const uint8_t *)w->w0 + n * (int64_t)nbk * 128;
    const uint16_t *dw = (const uint16_t *)w->w1 + n * (int64_t)nbk;
    const uint16_t *dmw = (const uint16_t *)w->w2 + n * (int64_t)nbk;
    const uint8_t *scmn = (const uint8_t *)w->w3 + n * (int64_t)nbk * 16;
    float r[MR] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int b = 0; b < nbk; b++) {
        const uint8_t *qb = qs + b * 128, *sc = scmn + b * 16, *mn = sc + 8;
        int32_t dot[MR], msum[MR];
#ifdef __AVX2__
        __m256i isum[MR];
        for (int i = 0; i < mr; i++) isum[i] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) { /* 64 elements: sub-blocks 2c (low nibbles), 2c + 1 */
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qb + 32 * c));
            const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
            const __m256i s0 = _mm256_set1_epi16(sc[2 * c]), s1 = _mm256_set1_epi16(sc[2 * c + 1]);
            for (int i = 0; i < mr; i++) {
                const int8_t *x = a->q + (int64_t)(t0 + i) * a->ldq + b * QKK + 64 * c;
                const __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)x));
                const __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 32)));
                isum[i] = _mm256_add_epi32(isum[i], _mm256_add_epi32(_mm256_madd_epi16(p0, s0),
                                                                     _mm256_madd_epi16(p1, s1)));
            }
        }
        /* mins: each of the 8 repeated for the two 16-sums of its sub-block */
        const __m128i m8 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
        const __m256i m16 = _mm256_set_m128i(_mm_unpackhi_epi16(m8, m8), _mm_unpacklo_epi16(m8, m8));
        for (int i = 0; i < mr; i++) {
            const int16_t *bs = a->bs + (int64_t)(t0 + i) * a->ldb + b * 16;
            dot[i] = hsum8i(isum[i]);
            msum[i] = hsum8i(_mm256_madd_epi16(m16, _mm256_loadu_si256((const __m256i *)bs)));
        }
#else
        for (int i = 0; i < mr; i++) {
            const int8_t *x = a->q + (int64_t)(t0 + i) * a->ldq + b * QKK;
            const int16_t *bs = a->bs + (int64_t)(t0 + i) * a->ldb + b * 16;
            dot[i] = msum[i] = 0;
            for (int j = 0; j < 8; j++) {
                int sub = 0;
                for (int l = 0; l < 32; l++) {
                    const uint8_t byte = qb[(j / 2) * 32 + l];
                    sub += ((j & 1) ? (byte >> 4) : (byte & 0x0F)) * x[32 * j + l];
                }
                dot[i] += sc[j] * sub;
                msum[i] += mn[j] * (bs[2 * j] + bs[2 * j + 1]);
            }
        }
#endif
        const float d = half_to_float(dw[b]), dmin = half_to_float(dmw[b]);
        for (int i = 0; i < mr; i++) {
            const float dx = a->d[(int64_t)(t0 + i) * a->ldd + b];
            r[i] += d * dx * (float)dot[i] - dmin * dx * (float)msum[i];
        }
    }
    for (int i = 0; i < mr; i++) out[i] = r[i];
}
ROW_KERNEL(row_q4_k)

/* ---- Q6_K ----------------------------------------------------------------------------------- */
static inline int q6_at(const uint8_t *ql, const uint8_t *qh, int e) { /* 0..63 */
    const int h = e / 128, r = e % 128;
    const uint8_t lo = ql[64 * h + r % 64], hi = qh[32 * h + r % 32];
    return ((r < 64 ? lo & 0x0F : lo >> 4)) | (((hi >> (2 * (r / 32))) & 3) << 4);
}

ALWAYS_INLINE void row_q6_k_mr(const qweight *w, const qact *a, int64_t n, int t0, const int mr,
                               float *out) {
    const int nbk = w->k / QKK;
    const uint8_t *ql = (const uint8_t *)w->w0 + n * (int64_t)nbk * 128;
    const uint16_t *dw = (const uint16_t *)w->w1 + n * (int64_t)nbk;
    const uint8_t *qh = (const uint8_t *)w->w2 + n * (int64_t)nbk * 64;
    const int8_t *scales = (const int8_t *)w->w3 + n * (int64_t)nbk * 16;
    float r[MR] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int b = 0; b < nbk; b++) {
        const uint8_t *lb = ql + b * 128, *hb = qh + b * 64;
        const int8_t *sc = scales + b * 16;
        int32_t dot[MR], comp[MR];
#ifdef __AVX2__
        __m256i isum[MR];
        for (int i = 0; i < mr; i++) isum[i] = _mm256_setzero_si256();
        const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
        for (int h = 0; h < 2; h++) { /* 128 elements: four groups of 32 */
            const __m256i la = _mm256_loadu_si256((const __m256i *)(lb + 64 * h));
            const __m256i lb2 = _mm256_loadu_si256((const __m256i *)(lb + 64 * h + 32));
            const __m256i hv = _mm256_loadu_si256((const __m256i *)(hb + 32 * h));
            __m256i q6[4];
            q6[0] = _mm256_or_si256(_mm256_and_si256(la, m4),
                                    _mm256_slli_epi16(_mm256_and_si256(hv, m2), 4));
            q6[1] = _mm256_or_si256(_mm256_and_si256(lb2, m4),
                                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 2), m2), 4));
            q6[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), m4),
                                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 4), m2), 4));
            q6[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb2, 4), m4),
                                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 6), m2), 4));
            for (int j = 0; j < 4; j++) {
                /* the group's two 16-element scales: low half of the int16 pairs, high half */
                const int s = 8 * h + 2 * j;
                const __m256i sv = _mm256_set_m128i(_mm_set1_epi16(sc[s + 1]), _mm_set1_epi16(sc[s]));
                for (int i = 0; i < mr; i++) {
                    const int8_t *x = a->q + (int64_t)(t0 + i) * a->ldq + b * QKK + 128 * h + 32 * j;
                    const __m256i p = _mm256_maddubs_epi16(q6[j], _mm256_loadu_si256((const __m256i *)x));
                    isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(p, sv));
                }
            }
        }
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        for (int i = 0; i < mr; i++) {
            const int16_t *bs = a->bs + (int64_t)(t0 + i) * a->ldb + b * 16;
            dot[i] = hsum8i(isum[i]);
            comp[i] = hsum8i(_mm256_madd_epi16(s16, _mm256_loadu_si256((const __m256i *)bs)));
        }
#else
        for (int i = 0; i < mr; i++) {
            const int8_t *x = a->q + (int64_t)(t0 + i) * a->ldq + b * QKK;
            const int16_t *bs = a->bs + (int64_t)(t0 + i) * a->ldb + b * 16;
            dot[i] = comp[i] = 0;
            for (int e = 0; e < QKK; e++) dot[i] += sc[e / 16] * q6_at(lb, hb, e) * x[e];
            for (int g = 0; g < 16; g++) comp[i] += sc[g] * bs[g];
        }
#endif
        const float d = half_to_float(dw[b]);
        for (int i = 0; i < mr; i++)
            r[i] += d * a->d[(int64_t)(t0 + i) * a->ldd + b] * (float)(dot[i] - 32 * comp[i]);
    }
    for (int i = 0; i < mr; i++) out[i] = r[i];
}
ROW_KERNEL(row_q6_k)

/* ---- rows as floats (quantized embeddings), as gguf's dequantize computes them ------------- */
static void dequant_row_gguf(const qweight *w, int64_t n, float *out) {
    const int k = w->k;
    if (w->fmt == FMT_Q4_0 || w->fmt == FMT_Q4_1) {
        const int nb = k / QK;
        const uint8_t *qs = (const uint8_t *)w->w0 + n * (int64_t)nb * 16;
        for (int b = 0; b < nb; b++) {
            const float d = half_to_float(((const uint16_t *)w->w1)[n * nb + b]);
            const float m = w->fmt == FMT_Q4_1 ? half_to_float(((const uint16_t *)w->w2)[n * nb + b]) : 0.0f;
            for (int j = 0; j < QK; j++) {
                const int q = q4_at(qs + b * 16, j);
                out[b * QK + j] = w->fmt == FMT_Q4_1 ? d * (float)q + m : d * (float)(q - 8);
            }
        }
    } else if (w->fmt == FMT_Q8_0) {
        const int nb = k / QK;
        const int8_t *qs = (const int8_t *)w->w0 + n * (int64_t)nb * QK;
        for (int b = 0; b < nb; b++) {
            const float d = half_to_float(((const uint16_t *)w->w1)[n * nb + b]);
            for (int j = 0; j < QK; j++) out[b * QK + j] = d * (float)qs[b * QK + j];
        }
    } else if (w->fmt == FMT_Q4_K) {
        const int nbk = k / QKK;
        for (int b = 0; b < nbk; b++) {
            const uint8_t *qb = (const uint8_t *)w->w0 + (n * nbk + b) * 128;
            const uint8_t *sc = (const uint8_t *)w->w3 + (n * nbk + b) * 16;
            const float d = half_to_float(((const uint16_t *)w->w1)[n * nbk + b]);
            const float dmin = half_to_float(((const uint16_t *)w->w2)[n * nbk + b]);
            for (int j = 0; j < 8; j++) {
                const float ds = d * (float)sc[j], dm = dmin * (float)sc[8 + j];
                for (int l = 0; l < 32; l++) {
                    const uint8_t byte = qb[(j / 2) * 32 + l];
                    out[b * QKK + 32 * j + l] = ds * (float)((j & 1) ? (byte >> 4) : (byte & 0x0F)) - dm;
                }
            }
        }
    } else { /* Q6_K */
        const int nbk = k / QKK;
        for (int b = 0; b < nbk; b++) {
            const uint8_t *lb = (const uint8_t *)w->w0 + (n * nbk + b) * 128;
            const uint8_t *hb = (const uint8_t *)w->w2 + (n * nbk + b) * 64;
            const int8_t *sc = (const int8_t *)w->w3 + (n * nbk + b) * 16;
            const float d = half_to_float(((const uint16_t *)w->w1)[n * nbk + b]);
            for (int e = 0; e < QKK; e++)
                out[b * QKK + e] = d * (float)sc[e / 16] * (float)(q6_at(lb, hb, e) - 32);
        }
    }
}

/* ---- prefill: 16 rows as a float panel (k, 16), for the float32 tile (quant_panel.c) ------- */
#ifdef __AVX2__
/* one row of a 32-block format as floats, 8 blocks' worth of scales converted at once */
static void dequant_row_q4q8_avx2(const qweight *w, int64_t n, float *out) {
    const int nb = w->k / QK;
    const uint16_t *dw = (const uint16_t *)w->w1 + n * (int64_t)nb;
    for (int b = 0; b < nb; b++) {
        const __m256 d = _mm256_set1_ps(half_to_float(dw[b]));
        float *o = out + b * QK;
        if (w->fmt == FMT_Q8_0) {
            const int8_t *q = (const int8_t *)w->w0 + (n * (int64_t)nb + b) * QK;
            for (int j = 0; j < 4; j++)
                _mm256_storeu_ps(o + 8 * j, _mm256_mul_ps(d, int8x8(q + 8 * j)));
            continue;
        }
        const __m256 m = w->fmt == FMT_Q4_1
            ? _mm256_set1_ps(half_to_float(((const uint16_t *)w->w2)[n * nb + b]))
            : _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
        const __m256i u = unpack_nibbles((const uint8_t *)w->w0 + (n * (int64_t)nb + b) * 16);
        const __m128i lo = _mm256_castsi256_si128(u), hi = _mm256_extracti128_si256(u, 1);
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int j = 0; j < 4; j++)
            _mm256_storeu_ps(o + 8 * j, _mm256_fmadd_ps(
                d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[j])), m));
    }
}

/* rows (8, ld) x 8 columns at c -> 8 vectors of one column's 8 rows, stored to dst + 16 * j */
static inline void transpose8(const float *rows, int64_t ld, int c, float *dst) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(rows + i * ld + c);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int j = 0; j < 4; j++) {
        _mm256_storeu_ps(dst + 16 * j, _mm256_permute2f128_ps(r[j], r[j + 4], 0x20));
        _mm256_storeu_ps(dst + 16 * (j + 4), _mm256_permute2f128_ps(r[j], r[j + 4], 0x31));
    }
}
#endif

/* rows 16p .. 16p + 15 as a float panel: buf (k, 16); rows: scratch for (16, k) floats */
static void dequant_panel_gguf(const qweight *w, int64_t p, float *buf, float *rows) {
    const int k = w->k;
    for (int r = 0; r < 16; r++) {
#ifdef __AVX2__
        if (w->fmt == FMT_Q4_0 || w->fmt == FMT_Q4_1 || w->fmt == FMT_Q8_0) {
            dequant_row_q4q8_avx2(w, 16 * p + r, rows + (int64_t)r * k);
            continue;
        }
#endif
        dequant_row_gguf(w, 16 * p + r, rows + (int64_t)r * k);
    }
#ifdef __AVX2__
    for (int c = 0; c < k; c += 8) {
        transpose8(rows, k, c, buf + 16 * c);
        transpose8(rows + 8 * (int64_t)k, k, c, buf + 16 * c + 8);
    }
#else
    for (int c = 0; c < k; c++)
        for (int r = 0; r < 16; r++) buf[16 * c + r] = rows[(int64_t)r * k + c];
#endif
}

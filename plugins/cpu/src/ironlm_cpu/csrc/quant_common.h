/* Shared pieces of the quantized linear kernels (quant_*.c; concatenated after this file into
   one translation unit by ironlm_cpu.quant_kernels).

   ISA paths, chosen at compile time so a build per target picks the best one:
     __AVX2__ (+ FMA)                 256-bit float FMAs, maddubs/madd integer dots
     __AVX512VNNI__ + __AVX512VL__    u8 x s8 dot products in one instruction (vpdpbusd, 256-bit)
     __AVXVNNI__                      the same instruction on AVX-VNNI CPUs (no AVX-512)
     none of them                     plain C loops (the generic path; same results up to
                                      float summation order)
   Every AVX2 CPU also has F16C (half -> float conversion); gcc is told so with a target pragma
   when the build flags leave it out. */

#if defined(__AVX2__) && !defined(__F16C__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("f16c")
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define QK 32   /* elements per activation block (and per Q4_0 / Q4_1 / Q8_0 block) */
#define QKK 256 /* elements per K-quant super-block (Q4_K, Q6_K) */
#define MR 4    /* activation rows one pass of a row kernel computes */
/* First row of chunk c when m rows go in `chunks` chunks of equal size (+-1 row): with a
   fixed chunk size the short last chunk left one thread the full ones (static split). */
#define CHUNK_ROW(c, m, chunks) ((int)((int64_t)(c) * (m) / (chunks)))

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define HAVE_VNNI 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#elif defined(__AVXVNNI__)
#define HAVE_VNNI 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#elif defined(__AVX2__)
#define HAVE_VNNI 0
/* acc + sum of 4 adjacent u8 * s8 products per int32 lane (maddubs cannot saturate here: every
   caller keeps |u * s| pairs below 2^15) */
#define DPBUSD(acc, u, s) \
    _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1)))
#else
#define HAVE_VNNI 0
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* unroll the next loop fully (small constant trip counts: rows, vectors of a block), so that
   accumulator arrays become registers */
#define PRAGMA(x) _Pragma(#x)
#define UNROLL(n) PRAGMA(GCC unroll n)

/* weight formats (ironlm_cpu.quant_kernels.Format mirrors these numbers) */
enum { FMT_INT8, FMT_W8A8, FMT_INT4, FMT_FP8, FMT_Q4_0, FMT_Q4_1, FMT_Q8_0, FMT_Q4_K, FMT_Q6_K,
       FMT_INT8P, FMT_FP8P, FMT_INT4P, /* 16-row panels (quant_panel.c) */
       FMT_W8A8P /* w8a8 on 16-row panels: the AMX tile's B layout (quant_w8a8.c) */ };

static int is_w8a8(int fmt) { return fmt == FMT_W8A8 || fmt == FMT_W8A8P; }

/* The weight of one linear layer as its format's packing left it (ironlm_cpu.quant_packing). */
typedef struct {
    int fmt;       /* FMT_* */
    int n, k;      /* output and input features */
    int group;     /* int4: input features per scale group */
    const void *w0, *w1, *w2, *w3;
} qweight;

/* The activations as the format's row kernels read them (only the fields the format needs). */
typedef struct {
    const float *xf;  /* float rows (int8, int4, fp8) */
    int64_t ldx;      /* their row stride */
    const int8_t *q;  /* int8 rows, ldq apart (gguf: block-quantized; w8a8: per-token) */
    const float *d;   /* gguf: per block scale (QK or QKK elements), ldd apart per row */
    const float *s;   /* gguf 32-blocks: d * sum of the block's q */
    const int16_t *bs; /* gguf 256-blocks: sums of q per 16 elements, ldb apart per row */
    const int16_t *x16; /* w8a8 (AVX2): q widened to int16, ldq apart */
    const uint8_t *xu;  /* w8a8 (VNNI): q + 128, ldq apart */
    const float *sx;    /* w8a8: per-token scale */
    const float *gsum;  /* int4: per row, the sum of x over each group, ldd apart */
    int64_t ldq, ldd, ldb;
} qact;

/* out[i] = (row n of the weight) . (activation row t0 + i), i < rows (rows <= MR), no bias */
typedef void (*row_kernel)(const qweight *w, const qact *a, int64_t n, int t0, int rows, float *out);

static int is_gguf(int fmt) { return fmt >= FMT_Q4_0 && fmt <= FMT_Q6_K; }
/* gguf rows 16p .. 16p + 15 as a float panel (k, 16) (quant_gguf.c; rows: (16, k) scratch) */
static void dequant_panel_gguf(const qweight *w, int64_t p, float *buf, float *rows);

/* a row kernel from one written for a constant row count (inlined, so its loops specialise) */
#define ROW_KERNEL(name)                                                                         \
    static void name(const qweight *w, const qact *a, int64_t n, int t0, int rows, float *out) { \
        switch (rows) {                                                                          \
        case 1: name##_mr(w, a, n, t0, 1, out); break;                                           \
        case 2: name##_mr(w, a, n, t0, 2, out); break;                                           \
        case 3: name##_mr(w, a, n, t0, 3, out); break;                                           \
        default: name##_mr(w, a, n, t0, 4, out); break;                                          \
        }                                                                                        \
    }

static inline float half_to_float(uint16_t h) {
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    uint32_t bits;
    if (exp == 0) { /* zero or subnormal: man * 2^-24 */
        const float f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    bits = exp == 31 ? (sign | 0x7F800000u | (man << 13)) : (sign | ((exp + 112) << 23) | (man << 13));
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

#ifdef __AVX2__
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int32_t hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* lane j of v in every lane */
static inline __m256 lane(__m256 v, int j) { return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(j)); }

/* 8 half floats -> 8 floats */
static inline __m256 load_halves(const uint16_t *h) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15) then high (16..31) */
static inline __m256i unpack_nibbles(const uint8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}
#endif

/* ---- activation quantization (gguf formats) ---------------------------------------------- */

/* one row of k floats (k % QK == 0) -> int8 blocks of QK: d[b] = max |x| / 127,
   q = round(x / d) (ties to even), s[b] = d[b] * sum of the block's q */
static void quantize_row_q8(const float *x, int k, int8_t *q, float *d, float *s) {
    for (int b = 0; b < k / QK; b++) {
        const float *xb = x + b * QK;
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float db = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            const int v = (int)nearbyintf(xb[j] * id);
            q[b * QK + j] = (int8_t)v;
            sum += v;
        }
        d[b] = db;
        s[b] = db * (float)sum;
    }
}

/* one row of k floats (k % QKK == 0) -> int8 super-blocks of QKK: one scale d[b] per 256, and
   the sums of q over every 16 elements (bs, k / 16 of them) for the formats' offset terms */
static void quantize_row_q8k(const float *x, int k, int8_t *q, float *d, int16_t *bs) {
    for (int b = 0; b < k / QKK; b++) {
        const float *xb = x + b * QKK;
        float amax = 0.0f;
        for (int j = 0; j < QKK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        d[b] = amax / 127.0f;
        for (int g = 0; g < QKK / 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) {
                const int v = (int)nearbyintf(xb[g * 16 + j] * id);
                q[b * QKK + g * 16 + j] = (int8_t)v;
                sum += v;
            }
            bs[b * (QKK / 16) + g] = (int16_t)sum;
        }
    }
}

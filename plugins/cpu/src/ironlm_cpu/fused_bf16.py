"""The bfloat16 variants of the fused layer ops (C source, built into ``FusedKernels``' library).

Why: a bf16 model's norms, rotary, gated activations and row lookups otherwise fall back to the
core's torch reference (several torch ops each, ~7 ms of a 18 ms batch-1 decode step on
SmolLM2), and a decode graph cannot record them.

Numerics: values are widened to float32 (a 16-bit shift), computed in float32 and rounded back
to bf16 to nearest even wherever the core's reference (``LayerOps``) rounds, because torch's
bf16 ops compute each op in float32 and round its result:
- RMSNorm: s = bf16(x + residual); normed = bf16(bf16(s / rms(s)) * w), mean of squares in
  float32;
- rotary: bf16(bf16(x1 * c) - bf16(x2 * s)), bf16(bf16(x2 * c) + bf16(x1 * s)) with bf16 cos/sin;
- gated activations: bf16(bf16(act(g)) * u), act as in ``fused_kernels`` (one exp per element);
- row lookups copy 16-bit rows: row-major, or the bf16 panel layout of ``linear_kernel.pack``
  ((rows / 16, width / 2, 16, 2): row v's elements 2kk, 2kk + 1 sit at [v / 16, kk, v % 16]).
A NaN rounds to a quiet NaN. Vector code uses the float32 lanes of one register's width that
``vexp_src.LANES_SOURCE`` defines ahead of the float32 ops (``fused_kernels``; 16-lane types on
an AVX2 build made the gated activation 6.5x slower than torch, 189 vs 29 us at 64 x 1536, its
vectors going through memory); stores and the intermediate roundings use AVX-512 BF16's
``vcvtneps2bf16`` where the target has it (the same rounding; it flushes float32 denormals to
zero), integer rounding elsewhere; AVX-512 builds load 16 bf16 values with one ``vpmovzxwd``
and take exp by roundscale + scalef (2048 x 1536 gated activation 667 -> 380 us on 2 Zen 5
threads).
"""

from __future__ import annotations

BF16_SOURCE = r"""
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

typedef uint16_t vh __attribute__((vector_size(2 * BW)));   /* BW bf16 */

static inline float bf_f(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

/* round to nearest even (torch's float -> bf16); NaN -> quiet NaN */
static inline uint16_t f_bf(float f) {
    union { float f; uint32_t u; } v = {f};
    if (f != f) return 0x7fc0;
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

static inline float rbf(float f) { return bf_f(f_bf(f)); }  /* f rounded to bf16 precision */

#ifdef __AVX512BF16__
/* one vpmovzxwd + shift (the generic form below compiles to six instructions here) */
static inline vf ldv(const uint16_t *p) {
    return (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16);
}

/* f rounded to bf16 precision, kept as float32 lanes (low 16 bits zero): vcvtneps2bf16 and
   back, 3 instructions instead of the integer rounding's ~10 */
static inline vf vrbf(vf x) {
    const __m256bh h = _mm512_cvtneps_pbh((__m512)x);
    return (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16);
}
#else
static inline vf ldv(const uint16_t *p) {
    vh h;
    memcpy(&h, p, sizeof h);
    return (vf)(__builtin_convertvector(h, vu) << 16);
}

/* f rounded to bf16 precision, kept as float32 lanes (low 16 bits zero) */
static inline vf vrbf(vf x) {
    const vu u = (vu)x;
    const vu nan = (vu)(x != x);  /* all ones on NaN lanes */
    const vu r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return (vf)((r & ~nan) | (nan & 0x7fc00000u));
}
#endif

static inline void stv(uint16_t *p, vf x) {
#ifdef __AVX512BF16__
    const __m256bh h = _mm512_cvtneps_pbh((__m512)x); /* BW == 16 here */
    memcpy(p, &h, 32);
#else
    const vh h = __builtin_convertvector((vu)vrbf(x) >> 16, vh);
    memcpy(p, &h, sizeof h);
#endif
}

static inline vf vsel(vi m, vf a, vf b) { return (vf)((m & (vi)a) | (~m & (vi)b)); }

void ironlm_rms_norm_bf16(const uint16_t *x, int64_t xs, int heads, const uint16_t *residual,
                          uint16_t *res_out, const uint16_t *w, uint16_t *out, int t, int h,
                          float eps, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int r = 0; r < t * heads; r++) {
        const uint16_t *xr = x + (int64_t)(r / heads) * xs + (int64_t)(r % heads) * h, *s = xr;
        uint16_t *o = out + (int64_t)r * h;
        if (residual != NULL) {  /* s = bf16(x + residual), the new residual stream */
            const uint16_t *rr = residual + (int64_t)r * h;
            uint16_t *ro = res_out + (int64_t)r * h;
            int j = 0;
            for (; j + BW <= h; j += BW) stv(ro + j, ldv(xr + j) + ldv(rr + j));
            for (; j < h; j++) ro[j] = f_bf(bf_f(xr[j]) + bf_f(rr[j]));
            s = ro;
        }
        vf acc = {0}, acc2 = {0};  /* two chains: the FMA latency does not bound the row */
        float tail = 0.0f;
        int j = 0;
        for (; j + 2 * BW <= h; j += 2 * BW) {
            const vf v = ldv(s + j), v2 = ldv(s + j + BW);
            acc += v * v;
            acc2 += v2 * v2;
        }
        for (; j + BW <= h; j += BW) { const vf v = ldv(s + j); acc += v * v; }
        for (; j < h; j++) tail += bf_f(s[j]) * bf_f(s[j]);
        acc += acc2;
        double sum = tail;
        for (int l = 0; l < BW; l++) sum += acc[l];
        const float inv = 1.0f / sqrtf((float)(sum / h) + eps);
        for (j = 0; j + BW <= h; j += BW) stv(o + j, vrbf(ldv(s + j) * inv) * ldv(w + j));
        for (; j < h; j++) o[j] = f_bf(rbf(bf_f(s[j]) * inv) * bf_f(w[j]));
    }
}

/* neox rotary of one bf16 tensor: rows (t, heads, d) with token stride xs, cos/sin (t, d/2) */
static void rotate_bf16(const uint16_t *x, int64_t xs, int heads, const uint16_t *cs,
                        const uint16_t *sn, uint16_t *out, int t, int d, int threads) {
    const int half = d / 2;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int r = 0; r < t; r++) {
        const uint16_t *c = cs + (int64_t)r * half, *s = sn + (int64_t)r * half;
        for (int hh = 0; hh < heads; hh++) {
            const uint16_t *xr = x + (int64_t)r * xs + (int64_t)hh * d;
            uint16_t *o = out + ((int64_t)r * heads + hh) * d;
            int j = 0;
            for (; j + BW <= half; j += BW) {
                const vf x1 = ldv(xr + j), x2 = ldv(xr + j + half);
                const vf cv = ldv(c + j), sv = ldv(s + j);
                stv(o + j, vrbf(x1 * cv) - vrbf(x2 * sv));
                stv(o + j + half, vrbf(x2 * cv) + vrbf(x1 * sv));
            }
            for (; j < half; j++) {
                const float x1 = bf_f(xr[j]), x2 = bf_f(xr[j + half]);
                const float cj = bf_f(c[j]), sj = bf_f(s[j]);
                o[j] = f_bf(rbf(x1 * cj) - rbf(x2 * sj));
                o[j + half] = f_bf(rbf(x2 * cj) + rbf(x1 * sj));
            }
        }
    }
}

void ironlm_rotary_bf16(const uint16_t *q, int64_t qs, int hq, const uint16_t *k, int64_t ks,
                        int hk, const uint16_t *cs, const uint16_t *sn, uint16_t *q_out,
                        uint16_t *k_out, int t, int d, int threads) {
    rotate_bf16(q, qs, hq, cs, sn, q_out, t, d, threads);
    rotate_bf16(k, ks, hk, cs, sn, k_out, t, d, threads);
}

/* out (t, n) = bf16(bf16(g / (1 + exp(-a(g)))) * u), g = x[:, :n], u = x[:, n:2n] */
void ironlm_gated_act_bf16(const uint16_t *x, int64_t xs, uint16_t *out, int t, int n,
                           int gelu, int threads) {
    const float c = 1.5957691216f; /* 2 * sqrt(2 / pi) */
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int r = 0; r < t; r++) {
        const uint16_t *g = x + (int64_t)r * xs, *u = g + n;
        uint16_t *o = out + (int64_t)r * n;
        int j = 0;
        for (; j + BW <= n; j += BW) {
            const vf gv = ldv(g + j);
            const vf a = gelu ? c * (gv + 0.044715f * gv * gv * gv) : gv;
            stv(o + j, vrbf(gv / (1.0f + vexpv(-a))) * ldv(u + j));
        }
        for (; j < n; j++) {
            const float gj = bf_f(g[j]);
            const float a = gelu ? c * (gj + 0.044715f * gj * gj * gj) : gj;
            o[j] = f_bf(rbf(gj / (1.0f + expf(-a))) * bf_f(u[j]));
        }
    }
}

/* out (t, width) = rows ids of a bf16 (rows, width) table, row-major or, when packed, in the
   linear kernel's bf16 panels (rows / 16, width / 2, 16, 2). Returns the number of ids outside
   [0, rows) (their output rows are left unwritten); times `scale` unless it is 1 (a bf16 value),
   rounded to bf16 as torch's bf16 multiply rounds. */
int ironlm_gather_rows_bf16(const int64_t *ids, const uint16_t *table, uint16_t *out, int t,
                            int width, int64_t rows, int packed, float scale) {
    int bad = 0;
    for (int r = 0; r < t; r++) {
        const int64_t v = ids[r];
        uint16_t *o = out + (int64_t)r * width;
        if (v < 0 || v >= rows) {
            bad++;
            continue;
        }
        if (packed) {
            const uint16_t *p = table + (v / 16) * (int64_t)width * 16 + (v % 16) * 2;
            for (int kk = 0; kk < width / 2; kk++) {
                o[2 * kk] = p[(int64_t)kk * 32];
                o[2 * kk + 1] = p[(int64_t)kk * 32 + 1];
            }
        } else {
            memcpy(o, table + v * (int64_t)width, sizeof(uint16_t) * (size_t)width);
        }
        if (scale != 1.0f) /* the product of two bf16 values is exact in float32: one rounding */
            for (int j = 0; j < width; j++) o[j] = f_bf(bf_f(o[j]) * scale);
    }
    return bad;
}
"""

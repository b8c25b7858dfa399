"""C source of the AVX-512 BF16 paged decode attention for bf16 caches: the attention body of
``decode_512_src`` instantiated for bf16 (``decode_kernel_src`` places it after that file).

Why: the portable bf16 path widens every key and value block to float32 in a scratch and runs
8-lane float32 dots, which made a bf16 cache slower than a float32 one (compute-bound: 64 x 192
tokens of SmolLM2, 380-390 vs 305 us per layer on the Zen 5). Here scores come from
``vdpbf16ps`` straight on the cache rows (the bf16 query pairs times the key pairs, summed in
float32: each product of two bf16 values is exact in float32, so this is the widened dot in
another summation order; the instruction flushes denormals); value rows are widened (a 16-bit
shift) in registers and summed in float32, softmax weights unrounded. Head sizes that are a
multiple of 64 up to 256; others take the portable path.
"""

BF16_ATTEND_SOURCE = r"""
#if defined(__AVX512BF16__)
#define HAVE_ATTEND_512 1

static inline __m512bh ld_bh(const uint16_t *p) {
    return (__m512bh)_mm512_loadu_si512((const void *)p);
}

/* 16 bf16 -> 16 float32 (a 16-bit shift per lane) */
static inline __m512 widen16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

#define MAC_BF16(acc, q, k) _mm512_dpbf16_ps(acc, q, k)
DOT_FNS_512(_bf16, uint16_t, __m512bh, ld_bh, MAC_BF16, 32)
PV_512(_bf16, uint16_t, widen16)
ATTEND_512(_bf16, uint16_t, 32)
#endif
"""

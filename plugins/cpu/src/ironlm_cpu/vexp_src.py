"""C source shared by the cpu plugin's element-wise kernels (``fused_kernels``, ``fused_bf16``,
``logits_kernel``, ``decode_kernel_src``): ``DEFINE_VEXP(NAME, VF, VI)`` defines ``NAME``, exp of each lane of a
GNU float vector type VF (VI: the int32 vector of the same lanes): x clamped to [-87.3, 88.3],
x log2(e) = i + f with f in [0, 1), 2^f by a degree-6 polynomial (relative error ~2e-7), 2^i
through the exponent bits. Each kernel instantiates it for its own vector width: the width
must fit the target's registers (a 16-lane type on an AVX2 build made the logits reduction 8x
slower than 8 lanes: the vectors went through memory). AVX-512 builds also get ``vexp512``,
the same polynomial on one zmm with the floor by roundscale and 2^i by scalef (which saturates
to 0 or inf past the clamp): half the instructions of the generic form, used by the bf16
element-wise ops, the logits reductions and the decode attention's softmax.

``LANES_SOURCE`` (after ``VEXP_SOURCE``) gives the fused element-wise ops (``fused_kernels``,
``fused_bf16``) one vector type of the target's register width: ``BW`` float32 lanes ``vf``
(16 on AVX-512 builds, 8 elsewhere), its int32 / uint32 twins ``vi`` / ``vu``, and ``vexpv``,
exp of every lane (``vexp512`` on AVX-512)."""

VEXP_SOURCE = r"""
#define DEFINE_VEXP(NAME, VF, VI)                                                              \
static inline VF NAME(VF x) {                                                                  \
    const VF zero = {0}, lo = zero - 87.3f, hi = zero + 88.3f;                                 \
    const VI below = x < lo, above = x > hi;                                                   \
    x = (VF)((below & (VI)lo) | (~below & (VI)x));                                             \
    x = (VF)((above & (VI)hi) | (~above & (VI)x));                                             \
    const VF t = x * 1.44269504088896341f;                                                     \
    VI ti = __builtin_convertvector(t, VI); /* truncates; floor for t < 0: */                  \
    ti += (VI)(__builtin_convertvector(ti, VF) > t);                                           \
    const VF f = t - __builtin_convertvector(ti, VF);                                          \
    VF p = f * 1.535336188319500e-4f + 1.339887440266574e-3f;                                  \
    p = p * f + 9.618437357674640e-3f;                                                         \
    p = p * f + 5.550332471162809e-2f;                                                         \
    p = p * f + 2.402264791363012e-1f;                                                         \
    p = p * f + 6.931472028550421e-1f;                                                         \
    p = p * f + 1.0f;                                                                          \
    return (VF)((VI)p + (ti << 23));                                                           \
}

#if defined(__AVX512F__)
#include <immintrin.h>
static inline __m512 vexp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(88.8f));
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __m512 fi = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, fi);
    __m512 p = _mm512_fmadd_ps(f, _mm512_set1_ps(1.535336188319500e-4f),
                               _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, fi);
}
#endif
"""

LANES_SOURCE = VEXP_SOURCE + r"""
#include <stdint.h>

/* BW lanes per vector: what the target's registers hold (16 float32 lanes through ymm pairs on
   an AVX2 build ran 6x slower than torch: the vectors went through memory) */
#ifdef __AVX512F__
#define BW 16
#else
#define BW 8
#endif
typedef float vf __attribute__((vector_size(4 * BW)));      /* BW float32 lanes */
typedef int32_t vi __attribute__((vector_size(4 * BW)));
typedef uint32_t vu __attribute__((vector_size(4 * BW)));

#ifdef __AVX512F__
/* exp of 16 lanes (vexp512: 1125 -> ~700 us for the 2048 x 1536 bf16 gated activation on one
   Zen 5 thread against the generic form) */
static inline vf vexpv(vf x) { return (vf)vexp512((__m512)x); }
#else
/* exp of BW lanes */
DEFINE_VEXP(vexpv, vf, vi)
#endif
"""

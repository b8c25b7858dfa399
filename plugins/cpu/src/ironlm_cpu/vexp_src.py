"""C source shared by the cpu plugin's element-wise kernels (``fused_bf16``, ``logits_kernel``,
``decode_kernel_src``): ``DEFINE_VEXP(NAME, VF, VI)`` defines ``NAME``, exp of each lane of a
GNU float vector type VF (VI: the int32 vector of the same lanes): x clamped to [-87.3, 88.3],
x log2(e) = i + f with f in [0, 1), 2^f by a degree-6 polynomial (relative error ~2e-7), 2^i
through the exponent bits. Each kernel instantiates it for its own vector width: the width
must fit the target's registers (a 16-lane type on an AVX2 build made the logits reduction 8x
slower than 8 lanes: the vectors went through memory)."""

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
"""

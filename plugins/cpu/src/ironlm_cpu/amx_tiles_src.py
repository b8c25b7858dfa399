"""C source shared by the AMX kernels (the bf16 linear in ``linear_amx_src``, the int8 w8a8
linear in ``csrc/quant_w8a8.c``): the process's permission to use the tile registers and the
one tile configuration both use. Compiled only where the build targets AMX (``__AMX_TILE__``).

Linux gives a process the AMX tile state only on request (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``); the kernels ask once and run their AVX-512 paths where it is refused.
Palette 1, eight tiles of 16 rows x 64 bytes: the kernels use 0-3 as accumulators (16 x 16
float32 or int32), 4-5 for the activations (A) and 6-7 for the weight (B, 16 rows of 64 bytes:
16 pairs of bf16 or 16 quads of int8 for 16 output columns).
"""

AMX_TILES_SOURCE = r"""
#if defined(__AMX_TILE__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_ARCH_REQ_XCOMP_PERM 0x1023
#define AMX_XFEATURE_XTILEDATA 18

/* 1: this process may use the tile registers (asked once; the kernel grants it process-wide) */
static int amx_permitted(void) {
    static volatile int state = 0; /* 0 not asked, 1 granted, -1 refused */
    if (state == 0)
        state = syscall(SYS_arch_prctl, AMX_ARCH_REQ_XCOMP_PERM, AMX_XFEATURE_XTILEDATA) == 0
                    ? 1 : -1;
    return state == 1;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* this thread's tiles 0-7: 16 rows x 64 bytes each */
static void amx_configure(void) {
    amx_config c;
    __builtin_memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    _tile_loadconfig(&c);
}
#endif
"""

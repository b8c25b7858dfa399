"""C source shared by the AMX kernels (the bf16 linear in ``linear_amx_src``, the int8 w8a8
linear in ``csrc/quant_w8a8.c``): the process's permission to use the tile registers, the one
tile configuration both use, and the driver that runs a linear's tile products
(``amx_run``). Compiled where the build targets AMX with both tile products (``HAVE_AMX``).

Linux gives a process the AMX tile state only on request (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``); the kernels ask once and run their AVX-512 paths where it is refused.
Palette 1, eight tiles of 16 rows x 64 bytes: 0-3 accumulate (16 x 16 float32 or int32), 4-5
hold activations (A: 16 rows x 64 bytes of k values), 6-7 the weight (B: 16 rows of 64 bytes,
16 pairs of bf16 or 16 quads of int8 for 16 output columns).

The driver: the activation rows are packed once per call into A tiles (1 KiB each, rows past m
zero: each tile load then reads 1 KiB in a row), then work items (chunk of row blocks, 16-row
weight panel) go to the threads in a static split. Per item, four row blocks at a time
accumulate in tiles 0-3 over the k steps, B tiles 6 and 7 taking turns and the A tiles 4 and
5 alternating (a load need not wait for the product reading the other); the weight is asked
for ``ahead`` steps on, into L2. Decode (up to 4 blocks, one chunk): each thread streams whole
panels, every weight byte read once. Prefill: a chunk's packed rows stay in L2 while every
panel passes (SmolLM2's four shapes x 30 layers at 2048 rows, bf16, AMX Xeon, 2 threads: every
row per panel, re-reading the packed x from L3, 1360 ms; chunks of 16 blocks 870 ms). Each
finished 16 x 16 accumulator goes through a 1 KiB scratch to the kernel's ``flush``, which
writes it with that kernel's rounding, rescale and bias.
"""

AMX_TILES_SOURCE = r"""
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)
#define HAVE_AMX 1
#include <immintrin.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_ARCH_REQ_XCOMP_PERM 0x1023
#define AMX_XFEATURE_XTILEDATA 18
/* row blocks per prefill chunk: 256 rows, 288 KiB of packed bf16 x at K = 576 */
#define AMX_CHUNK 16

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

/* 16 x 16 results (float32 or int32, rows 64 bytes apart) of output rows row0 .. row0 + 15
   (those below m) and columns col0 .. col0 + 15, written by the kernel (ctx: its arguments) */
typedef void (*amx_flush_fn)(const void *tile, int row0, int col0, const void *ctx);

typedef struct {
    const char *x;      /* the activations: m rows, ldx bytes apart, 64 bytes per k step */
    int64_t ldx;
    const char *w;      /* the weight: panel p's B tiles at w + p * panel_bytes, 1 KiB a step */
    int64_t panel_bytes;
    int m, panels, steps;
    int int8;           /* tdpbssd (int8 x int8 -> int32), else tdpbf16ps (-> float32) */
    int ahead;          /* k steps ahead that the weight is asked for */
    amx_flush_fn flush;
    const void *ctx;
} amx_job;

/* row block RB's A tiles: step s's at + 1024 s */
#define AMX_A(RB) (xp + (int64_t)(RB) * steps * 1024)
/* accumulator C += A x B in the job's number type */
#define AMX_DP(C, A, B)                                                                        \
    do {                                                                                       \
        if (int8) _tile_dpbssd(C, A, B);                                                       \
        else _tile_dpbf16ps(C, A, B);                                                          \
    } while (0)
/* k step S of up to 4 row blocks against B tile TB */
#define AMX_STEP(TB, S)                                                                        \
    do {                                                                                       \
        const int64_t st_ = (S);                                                               \
        _tile_loadd(TB, b + 1024 * st_, 64);                                                   \
        for (int l = 0; l < 16; l++) /* the B tile `ahead` steps on, a line each */           \
            _mm_prefetch(b + 1024 * (st_ + ahead) + 64 * l, _MM_HINT_T1);                      \
        _tile_loadd(4, a0 + 1024 * st_, 64);                                                   \
        AMX_DP(0, 4, TB);                                                                      \
        if (nb > 1) { _tile_loadd(5, a1 + 1024 * st_, 64); AMX_DP(1, 5, TB); }                 \
        if (nb > 2) { _tile_loadd(4, a2 + 1024 * st_, 64); AMX_DP(2, 4, TB); }                 \
        if (nb > 3) { _tile_loadd(5, a3 + 1024 * st_, 64); AMX_DP(3, 5, TB); }                 \
    } while (0)
#define AMX_FLUSH(T, RB)                                                                       \
    do {                                                                                       \
        _tile_stored(T, tile, 64);                                                             \
        job->flush(tile, (RB) * 16, p * 16, job->ctx);                                         \
    } while (0)

/* The job's products on the tile unit, over `threads` threads. 1: done; 0: not run (no
   permission, no memory), the caller's other path runs it. */
static int amx_run(const amx_job *job, int threads) {
    if (!amx_permitted()) return 0;
    const int m = job->m, blocks = (m + 15) / 16, steps = job->steps, int8 = job->int8;
    const int chunks = (blocks + AMX_CHUNK - 1) / AMX_CHUNK, ahead = job->ahead;
    char *xp = aligned_alloc(64, (size_t)blocks * steps * 1024);
    if (xp == NULL) return 0;
    #pragma omp parallel num_threads(threads)
    {
        float tile[256] __attribute__((aligned(64)));
        #pragma omp for schedule(static)
        for (int rb = 0; rb < blocks; rb++)
            for (int r = 0; r < 16; r++) {
                const int row = rb * 16 + r;
                for (int st = 0; st < steps; st++) {
                    char *dst = xp + ((int64_t)rb * steps + st) * 1024 + 64 * r;
                    if (row < m) __builtin_memcpy(dst, job->x + row * job->ldx + 64 * st, 64);
                    else __builtin_memset(dst, 0, 64);
                }
            }
        amx_configure();
        #pragma omp for collapse(2) schedule(static)
        for (int c = 0; c < chunks; c++)
        for (int p = 0; p < job->panels; p++) {
            const char *b = job->w + p * job->panel_bytes;
            const int c1 = CHUNK_ROW(c + 1, blocks, chunks); /* equal chunks of blocks */
            for (int r0 = CHUNK_ROW(c, blocks, chunks); r0 < c1; r0 += 4) {
                const int nb = c1 - r0 < 4 ? c1 - r0 : 4;
                const char *a0 = AMX_A(r0), *a1 = AMX_A(r0 + 1), *a2 = AMX_A(r0 + 2),
                           *a3 = AMX_A(r0 + 3);
                _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                int s = 0;
                for (; s + 2 <= steps; s += 2) { /* B tiles 6 and 7 take turns */
                    AMX_STEP(6, s);
                    AMX_STEP(7, s + 1);
                }
                if (s < steps) AMX_STEP(6, s);
                AMX_FLUSH(0, r0);
                if (nb > 1) AMX_FLUSH(1, r0 + 1);
                if (nb > 2) AMX_FLUSH(2, r0 + 2);
                if (nb > 3) AMX_FLUSH(3, r0 + 3);
            }
        }
        _tile_release();
    }
    free(xp);
    return 1;
}
#else
#define HAVE_AMX 0
#endif
"""

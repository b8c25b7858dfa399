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
zero: each tile load then reads 1 KiB in a row). Each finished 16 x 16 accumulator goes
through a 1 KiB scratch to the kernel's ``flush``, which writes it with that kernel's rounding,
rescale and bias. Two loop orders, by the number of 16-row blocks:
- up to ``AMX_STREAM_BLOCKS`` (8: 128 rows; decode), ``amx_stream``: the threads take whole
  panels in a static split and stream them once, four row blocks of a panel per pass (tiles
  0-3), B tiles 6 and 7 taking turns and the A tiles 4 and 5 alternating (a load need not
  wait for the product reading the other); the weight is asked for ``ahead`` steps on, into
  L2.
- past it (prefill), ``amx_grouped``: work items (chunk of up to ``AMX_CHUNK`` row blocks, group
  of panels: equal, at most ``AMX_GROUP_BYTES`` of weight, ``AMX_ITEMS`` items a thread at
  least); per item, two row blocks against two panels at a time (four products per two A and two
  B loads) over the whole group: the chunk's first row pair reads the group's weight from memory
  (asked for ahead), the other pairs from L2. SmolLM2's four layer shapes x 30 layers (weights
  from DRAM), 2-core AMX Xeon, one process, the stream order for every size against this: bf16
  512 rows 80-85 -> 68-72 ms, 2048 rows 350-390 -> 252-273 (oneDNN 205-242); int8 (w8a8) 512
  rows 70 -> 59, 2048 rows 314-406 -> 215-290; 64 and 128 rows, where streaming stays, tied or
  lost.
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
/* row blocks up to which the weight is streamed once (amx_stream), past it grouped */
#define AMX_STREAM_BLOCKS 8
/* weight bytes of a prefill panel group at most, and work items a thread at least (amx_grouped) */
#define AMX_GROUP_BYTES (512 * 1024)
#define AMX_ITEMS 4

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
#define AMX_FLUSH(T, RB, P)                                                                    \
    do {                                                                                       \
        _tile_stored(T, tile, 64);                                                             \
        job->flush(tile, (RB) * 16, (P) * 16, job->ctx);                                       \
    } while (0)

/* Decode (up to AMX_STREAM_BLOCKS row blocks): the threads stream whole panels, every weight
   byte read once; four row blocks of a panel per pass, B tiles 6 and 7 taking turns */
static void amx_stream(const amx_job *job, const char *xp, float *tile, int blocks) {
    const int steps = job->steps, int8 = job->int8, ahead = job->ahead;
    #pragma omp for schedule(static)
    for (int p = 0; p < job->panels; p++) {
        const char *b = job->w + p * job->panel_bytes;
        for (int r0 = 0; r0 < blocks; r0 += 4) {
            const int nb = blocks - r0 < 4 ? blocks - r0 : 4;
            const char *a0 = AMX_A(r0), *a1 = AMX_A(r0 + 1), *a2 = AMX_A(r0 + 2),
                       *a3 = AMX_A(r0 + 3);
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            int s = 0;
            for (; s + 2 <= steps; s += 2) {
                AMX_STEP(6, s);
                AMX_STEP(7, s + 1);
            }
            if (s < steps) AMX_STEP(6, s);
            AMX_FLUSH(0, r0, p);
            if (nb > 1) AMX_FLUSH(1, r0 + 1, p);
            if (nb > 2) AMX_FLUSH(2, r0 + 2, p);
            if (nb > 3) AMX_FLUSH(3, r0 + 3, p);
        }
    }
}

/* Ask for k step t of panels p and p + 1 into L2 (t past the pair's last step: the next
   pair's), those that exist */
static inline void amx_pull(const amx_job *job, int p, int64_t t) {
    const int q = p + 2 * (int)(t / job->steps);
    const int64_t at = (t % job->steps) * 1024;
    for (int i = q; i < q + 2 && i < job->panels; i++)
        for (int l = 0; l < 16; l++)
            _mm_prefetch(job->w + i * job->panel_bytes + at + 64 * l, _MM_HINT_T1);
}

/* Prefill: work items (chunk of row blocks, group of panels whose weight bytes stay in L2);
   per item, two row blocks against two panels at a time (four products per two A and two B
   loads) over the whole group, the first row pair reading the weight from memory and the
   others from L2. Groups: equal, an even number of panels, at most AMX_GROUP_BYTES, and
   enough of them for AMX_ITEMS items a thread (every chunk reads all the weight once either
   way, so smaller groups cost no traffic; a thread with one large item more would idle the
   other for its length). */
static void amx_grouped(const amx_job *job, const char *xp, float *tile, int blocks,
                        int threads) {
    const int steps = job->steps, int8 = job->int8, ahead = job->ahead, panels = job->panels;
    const int chunks = (blocks + AMX_CHUNK - 1) / AMX_CHUNK;
    const int64_t bytes = panels * job->panel_bytes;
    int groups = (int)((bytes + AMX_GROUP_BYTES - 1) / AMX_GROUP_BYTES);
    const int want = (AMX_ITEMS * threads + chunks - 1) / chunks;
    groups = groups < want ? want : groups;
    int group = ((panels + groups - 1) / groups + 1) & ~1; /* even: panel pairs */
    group = group < 2 ? 2 : group;
    groups = (panels + group - 1) / group;
    #pragma omp for collapse(2) schedule(static)
    for (int c = 0; c < chunks; c++)
    for (int gi = 0; gi < groups; gi++) {
        const int g0 = gi * group, g1 = g0 + group < panels ? g0 + group : panels;
        const int c0 = CHUNK_ROW(c, blocks, chunks), c1 = CHUNK_ROW(c + 1, blocks, chunks);
        for (int r0 = c0; r0 < c1; r0 += 2)
        for (int p = g0; p < g1; p += 2) {
            const int nb = c1 - r0 < 2 ? c1 - r0 : 2, np = g1 - p < 2 ? g1 - p : 2;
            const char *a0 = AMX_A(r0), *a1 = AMX_A(r0 + 1);
            const char *b0 = job->w + p * job->panel_bytes, *b1 = b0 + job->panel_bytes;
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            for (int s = 0; s < steps; s++) {
                if (r0 == c0) amx_pull(job, p, s + ahead);
                _tile_loadd(4, a0 + 1024 * (int64_t)s, 64);
                _tile_loadd(6, b0 + 1024 * (int64_t)s, 64);
                AMX_DP(0, 4, 6);
                if (nb > 1) {
                    _tile_loadd(5, a1 + 1024 * (int64_t)s, 64);
                    AMX_DP(1, 5, 6);
                }
                if (np > 1) {
                    _tile_loadd(7, b1 + 1024 * (int64_t)s, 64);
                    AMX_DP(2, 4, 7);
                    if (nb > 1) AMX_DP(3, 5, 7);
                }
            }
            AMX_FLUSH(0, r0, p);
            if (nb > 1) AMX_FLUSH(1, r0 + 1, p);
            if (np > 1) AMX_FLUSH(2, r0, p + 1);
            if (nb > 1 && np > 1) AMX_FLUSH(3, r0 + 1, p + 1);
        }
    }
}

/* The job's products on the tile unit, over `threads` threads. 1: done; 0: not run (no
   permission, no memory), the caller's other path runs it. */
static int amx_run(const amx_job *job, int threads) {
    if (!amx_permitted() || job->steps == 0) return 0; /* K = 0: the caller's path */
    const int m = job->m, blocks = (m + 15) / 16, steps = job->steps;
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
        if (blocks <= AMX_STREAM_BLOCKS) amx_stream(job, xp, tile, blocks);
        else amx_grouped(job, xp, tile, blocks, threads);
        _tile_release();
    }
    free(xp);
    return 1;
}
#else
#define HAVE_AMX 0
#endif
"""

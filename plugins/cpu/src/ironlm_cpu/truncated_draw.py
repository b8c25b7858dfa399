"""C source of ``LayerOps.truncated_categorical``: the draw within each row's top-k / top-p /
min-p set, in a few passes over the row where the reference makes several (B, V) tensors.

Why: at batch 64 x 49,152 logits the reference (``ironlm.interfaces.truncation``: scale, a
128-wide ``topk``, the whole row's logsumexp for top-p, a (B, V) scatter of what was kept, then
the draw) cost 21-31 ms a sampler call on SmolLM2's chat logits on a 2-core x86 host; this
takes 1.3-3.5 ms. Weights are w = exp(s (x - max)) (``vexp``; the largest weighs 1).

- Top-k (k <= CAND_CAP): the k heaviest tokens in one pass, a min-heap of k whose lightest
  sets the bar a vector compare skips the rest by (tokens come in index order, so one of equal
  weight never displaces the root: ties keep the lower indices).
- Top-p without top-k: the tokens of weight >= 2^-10, collected in the pass that sums the
  row's weight Z. They settle the row when they hold more than p Z (the first token past the
  nucleus is then among them). Where they do not (the many small tokens of a flat tail hold
  more than 1 - p) or are more than CAND_CAP, the weights' counts and sums in eighth-octave
  bins down to 2^-40 give the highest threshold that holds p Z within CAND_CAP tokens, and
  the row is collected again at it; with none the row returns -2 (a nucleus wider than the
  kernel holds: random logits) and the caller's reference decides it.
- The candidates are sorted by weight (then index), cut to k, to the nucleus (a token is kept
  while the weight above it is at most p times what top-k kept, or Z), and to min-p
  (w >= min_p); the draw walks what is left in vocabulary order with the row's uniform, as
  the reference's inverse CDF does: the same token up to the rounding of the sums and of a
  cut within rounding of a boundary. Rows with min-p alone draw over the whole row with
  min_p as a weight floor (``row_draw``).

The same set, written out instead of drawn from, is ``LayerOps.truncated_logits`` (the (B, V)
logits speculative decoding verifies drafts against): s x where a token is kept, -inf elsewhere,
one pass to write the row after the passes that find the set. At 320 rows (64 requests' 5
verification rows) of SmolLM2's vocabulary, random logits, the 2-core Zen 4: 38 / 16 / 7 ms
a call for top-p 0.9 / top-k 50 / min-p 0.05 where the reference took 149 / 30 / 24.

Appended to ``logits_kernel``'s source: it uses its vector types, ``draw_weight`` and the
row helpers.
"""

from __future__ import annotations

CAND_CAP = 4096  # most candidates a row may need (on each thread's stack: 32 KiB)

TRUNCATED_DRAW_SOURCE = f"#define CAND_CAP {CAND_CAP}\n" + r"""
#include <stdlib.h>
#include <string.h>

typedef struct { float w; int32_t i; } cand_t;

static int by_weight(const void *a, const void *b) { /* weight descending, then index */
    const cand_t *x = (const cand_t *)a, *y = (const cand_t *)b;
    if (x->w != y->w) return x->w < y->w ? 1 : -1;
    return (x->i > y->i) - (x->i < y->i);
}
static int by_index(const void *a, const void *b) {
    const cand_t *x = (const cand_t *)a, *y = (const cand_t *)b;
    return (x->i > y->i) - (x->i < y->i);
}

/* The tokens of weight >= tau (and > 0) into c, their count, their weight into *held and,
   when z is not NULL, the row's into *z; -1 when there are more than CAND_CAP (*z is still
   the row's). Blocks of 32 vectors: weights summed and compared, and only a block with a
   candidate read again to pick them out. */
static int64_t collect(const float *x, int64_t v, float mx, float s, float tau, cand_t *c,
                       double *held, double *z) {
    int64_t n = 0, i = 0;
    int over = 0;
    double h = 0.0, t = 0.0;
    while (i + VW <= v) {
        const int64_t start = i;
        vf acc = (vf){0}; /* float lanes over at most 32 vectors, then a double */
        vi seen = (vi){0};
        for (int q = 0; q < 32 && i + VW <= v; q++, i += VW) {
            const vf w = draw_weight(*(const vf *)(x + i), mx, s, 0.0f);
            acc += w;
            seen |= (w >= tau) & (w > 0.0f);
        }
        int any = 0;
        for (int l = 0; l < VW; l++) {
            t += acc[l];
            any |= seen[l];
        }
        if (!any || over) continue;
        for (int64_t j = start; j < i && !over; j += VW) {
            const vf w = draw_weight(*(const vf *)(x + j), mx, s, 0.0f);
            for (int l = 0; l < VW; l++) {
                if (!(w[l] >= tau && w[l] > 0.0f)) continue;
                if (n == CAND_CAP) {
                    over = 1;
                    break;
                }
                c[n].w = w[l];
                c[n].i = (int32_t)(j + l);
                h += w[l];
                n++;
            }
        }
    }
    for (; i < v; i++) {
        const float w = draw_weight1(x[i], mx, s, 0.0f);
        t += w;
        if (w >= tau && w > 0.0f && !over) {
            if (n == CAND_CAP) {
                over = 1;
                continue;
            }
            c[n].w = w;
            c[n].i = (int32_t)i;
            h += w;
            n++;
        }
    }
    *held = h;
    if (z != NULL) *z = t;
    return over ? -1 : n;
}

/* For a top-p row that 2^-10 does not settle within CAND_CAP tokens: the highest threshold
   whose tokens hold more than `need` of weight, from their counts and weights in bins of an
   eighth of an octave (a float's exponent and three leading mantissa bits) from 1 down to
   2^-40. Returns the threshold (a bin's lower edge), or 0 when more than CAND_CAP tokens come
   before the weight is held (the nucleus is too wide for the kernel). */
static float settle_tau(const float *x, int64_t v, float mx, float s, double need) {
    enum { SHIFT = 20, TOP = 127 << 3, BINS = 8 * 40 + 1 }; /* 1.0f >> SHIFT is TOP */
    int64_t count[BINS] = {0};
    double mass[BINS] = {0};
    int64_t i = 0;
    for (; i + VW <= v; i += VW) {
        const vf w = draw_weight(*(const vf *)(x + i), mx, s, 0.0f);
        const vi b = TOP - ((vi)w >> SHIFT);
        for (int l = 0; l < VW; l++) {
            if (b[l] < BINS && w[l] > 0.0f) {
                count[b[l]]++;
                mass[b[l]] += w[l];
            }
        }
    }
    for (; i < v; i++) {
        const float w = draw_weight1(x[i], mx, s, 0.0f);
        int32_t bits;
        memcpy(&bits, &w, sizeof bits);
        const int32_t b = TOP - (bits >> SHIFT);
        if (b < BINS && w > 0.0f) {
            count[b]++;
            mass[b] += w;
        }
    }
    int64_t held_n = 0;
    double held = 0.0;
    for (int b = 0; b < BINS; b++) {
        held_n += count[b];
        held += mass[b];
        if (held_n > CAND_CAP) return 0.0f;
        if (held > need) {
            const int32_t edge = (TOP - b) << SHIFT;
            float tau;
            memcpy(&tau, &edge, sizeof tau);
            return tau;
        }
    }
    return 0.0f;
}

/* a ranks below b: a lower weight, or the same weight at a higher index */
static inline int worse(const cand_t *a, const cand_t *b) {
    return a->w < b->w || (a->w == b->w && a->i > b->i);
}
static void sift_down(cand_t *h, int64_t n, int64_t j) {
    for (;;) {
        const int64_t l = 2 * j + 1, r = l + 1;
        int64_t m = j;
        if (l < n && worse(&h[l], &h[m])) m = l;
        if (r < n && worse(&h[r], &h[m])) m = r;
        if (m == j) return;
        const cand_t t = h[j];
        h[j] = h[m];
        h[m] = t;
        j = m;
    }
}
/* Offers token (w, i) to the heap h of at most k (its root the worst held); *floor becomes
   the weight a later token must exceed (tokens come in index order, so one of equal weight
   ranks below the root). */
static void offer(cand_t *h, int64_t *n, int64_t k, float w, int64_t i, float *floor) {
    if (*n < k) {
        int64_t j = (*n)++;
        h[j].w = w;
        h[j].i = (int32_t)i;
        while (j > 0 && worse(&h[j], &h[(j - 1) / 2])) {
            const cand_t t = h[j];
            h[j] = h[(j - 1) / 2];
            h[(j - 1) / 2] = t;
            j = (j - 1) / 2;
        }
    } else {
        h[0].w = w;
        h[0].i = (int32_t)i;
        sift_down(h, k, 0);
    }
    *floor = *n == k ? h[0].w : 0.0f;
}
/* The row's k heaviest tokens of nonzero weight (fewer when it has fewer) into h, in one pass:
   a compare of a block's largest weights against the heap's lightest skips the rest (a token
   enters the heap about k ln(V / k) times over a row in random order). Returns how many. */
static int64_t heaviest(const float *x, int64_t v, float mx, float s, int64_t k, cand_t *h) {
    int64_t n = 0, i = 0;
    float floor = 0.0f;
    while (i + VW <= v) { /* blocks of 32 vectors: read again only when one beats the floor */
        const int64_t start = i;
        vf top = (vf){0} - INFINITY; /* the block's largest logits (a weight rises with its
                                        logit: one exp a block, not one a token) */
        for (int q = 0; q < 32 && i + VW <= v; q++, i += VW) {
            const vf a = *(const vf *)(x + i);
            const vi gt = a > top;
            top = (vf)((gt & (vi)a) | (~gt & (vi)top));
        }
        const vf tw = draw_weight(top, mx, s, 0.0f);
        int any = 0;
        for (int l = 0; l < VW; l++) any |= tw[l] > floor;
        if (!any) continue;
        for (int64_t j = start; j < i; j += VW) {
            const vf w = draw_weight(*(const vf *)(x + j), mx, s, 0.0f);
            for (int l = 0; l < VW; l++)
                if (w[l] > floor) offer(h, &n, k, w[l], j + l, &floor);
        }
    }
    for (; i < v; i++) {
        const float w = draw_weight1(x[i], mx, s, 0.0f);
        if (w > floor) offer(h, &n, k, w, i, &floor);
    }
    return n;
}

/* A row's top-k / top-p / min-p set (k < v or p < 1; mx its finite maximum) into c[0..n),
   heaviest first (then by index); returns n, or -2 for a set needing more than CAND_CAP
   candidates. */
static int64_t row_kept(const float *x, int64_t v, float mx, float s, int64_t k, float p,
                        float mp, cand_t *c) {
    double z = 0.0, held = 0.0;
    int64_t n = 0;
    if (k < v) { /* top-k: its set, then top-p within it */
        if (k > CAND_CAP) return -2;
        n = heaviest(x, v, mx, s, k, c);
    } else { /* top-p: candidates that hold more than p of the row's weight */
        n = collect(x, v, mx, s, 0x1p-10f, c, &held, &z);
        if (n < 0 || held <= (double)p * z) { /* too many, or too little: the threshold that
                                                 holds p (the tail may hold more than 1 - p) */
            const float tau = settle_tau(x, v, mx, s, (double)p * z);
            if (tau == 0.0f) return -2;
            n = collect(x, v, mx, s, tau, c, &held, NULL);
            if (n < 0 || held <= (double)p * z) return -2; /* (rounding of the bins' sums) */
        }
    }
    qsort(c, (size_t)n, sizeof *c, by_weight);
    int64_t keep = k < n ? k : n;
    double mass = z; /* what top-p's masses are relative to: what top-k kept, else the row */
    if (k < v) {
        mass = 0.0;
        for (int64_t j = 0; j < keep; j++) mass += c[j].w;
    }
    if (p < 1.0f) {
        const double cut = (double)p * mass;
        double above = 0.0;
        int64_t j = 0;
        for (; j < keep && above <= cut; j++) above += c[j].w;
        keep = j;
    }
    while (keep > 1 && c[keep - 1].w < mp) keep--; /* the largest weighs 1 >= min_p */
    return keep;
}

/* One row (see the module docstring): k >= v or k < 1, p >= 1, mp <= 0 mean none. Returns the token,
   -1 for a row holding a NaN, -2 for a row needing more than CAND_CAP candidates. */
static int64_t row_truncated_draw(const float *x, int64_t v, float s, int64_t k, float p,
                                  float mp, double u, double *sums, cand_t *c) {
    if (k < 1 || k > v) k = v; /* no top-k (SamplingParams' -1; the reference's rule) */
    if (k >= v && p >= 1.0f) return row_draw(x, v, s, u, sums, mp > 0.0f ? mp : 0.0f);
    float mx;
    const int64_t degenerate = row_degenerate(x, v, &mx);
    if (degenerate != -2) return degenerate;
    const int64_t keep = row_kept(x, v, mx, s, k, p, mp, c);
    if (keep < 0) return keep;
    qsort(c, (size_t)keep, sizeof *c, by_index);
    double total = 0.0;
    for (int64_t j = 0; j < keep; j++) total += c[j].w;
    const double target = u * total;
    double run = 0.0;
    for (int64_t j = 0; j < keep; j++) {
        run += c[j].w;
        if (run > target) return c[j].i;
    }
    return c[keep - 1].i; /* rounding: the last kept token */
}

/* rows of v logits at stride `stride`: scale s[r], top-k k[r], top-p p[r], min-p mp[r],
   uniform u[r]; sums: rows x ceil(v / DRAW_BLOCK) doubles of scratch. out[r]: the token, -1 /
   -2 as row_truncated_draw. Returns the number of rows left to the caller. */
int ironlm_truncated_draw_f32(const float *x, int64_t rows, int64_t v, int64_t stride,
                              const float *s, const int64_t *k, const float *p,
                              const float *mp, const double *u, double *sums, int64_t *out,
                              int threads) {
    const int64_t nb = (v + DRAW_BLOCK - 1) / DRAW_BLOCK;
    int bad = 0;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1) \
        reduction(+: bad)
    for (int64_t r = 0; r < rows; r++) {
        cand_t c[CAND_CAP];
        out[r] = row_truncated_draw(x + r * stride, v, s[r], k[r], p[r], mp[r], u[r],
                                    sums + r * nb, c);
        bad += out[r] < 0;
    }
    return bad;
}

/* One row of LayerOps.truncated_logits into y: s x where the row's set keeps a token, -inf
   elsewhere (no limits: s x throughout; min-p alone: where the weight is at least mp).
   Returns 0; for a row with limits, -1 when it has no finite maximum (NaN, +inf or every
   value -inf: the reference's rules decide those) and -2 as row_kept. */
static int row_truncate(const float *x, int64_t v, float s, int64_t k, float p, float mp,
                        cand_t *c, float *y) {
    if (k < 1 || k > v) k = v;
    int64_t i = 0;
    if (k >= v && p >= 1.0f && mp <= 0.0f) { /* no limits: the scaled row, whatever it holds */
        for (; i + VW <= v; i += VW) *(vf *)(y + i) = *(const vf *)(x + i) * s;
        for (; i < v; i++) y[i] = x[i] * s;
        return 0;
    }
    float mx;
    if (row_degenerate(x, v, &mx) != -2) return -1;
    const vf ninf = (vf){0} - INFINITY;
    if (k >= v && p >= 1.0f) { /* min-p alone: a weight floor over the whole row */
        for (; i + VW <= v; i += VW) {
            const vf a = *(const vf *)(x + i);
            const vi kept = vexp_w((a - mx) * s) >= mp;
            *(vf *)(y + i) = (vf)((kept & (vi)(a * s)) | (~kept & (vi)ninf));
        }
        for (; i < v; i++) y[i] = expf((x[i] - mx) * s) >= mp ? x[i] * s : -INFINITY;
        return 0;
    }
    const int64_t keep = row_kept(x, v, mx, s, k, p, mp, c);
    if (keep < 0) return (int)keep;
    for (; i + VW <= v; i += VW) *(vf *)(y + i) = ninf;
    for (; i < v; i++) y[i] = -INFINITY;
    for (int64_t j = 0; j < keep; j++) y[c[j].i] = x[c[j].i] * s;
    return 0;
}

/* rows of v logits at stride `stride` -> y (rows x v at stride ystride): each row scaled by
   s[r] and cut to its top-k k[r], top-p p[r], min-p mp[r]. bad[r]: 0, -1 / -2 as
   row_truncate (that row of y unspecified). Returns the number of rows left to the caller. */
int ironlm_truncate_f32(const float *x, int64_t rows, int64_t v, int64_t stride,
                        const float *s, const int64_t *k, const float *p, const float *mp,
                        float *y, int64_t ystride, int32_t *bad, int threads) {
    int left = 0;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1) \
        reduction(+: left)
    for (int64_t r = 0; r < rows; r++) {
        cand_t c[CAND_CAP];
        bad[r] = row_truncate(x + r * stride, v, s[r], k[r], p[r], mp[r], c, y + r * ystride);
        left += bad[r] != 0;
    }
    return left;
}
"""

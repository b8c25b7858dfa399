"""C source of ``LayerOps.truncated_categorical``: the draw within each row's top-k / top-p /
min-p set, one pass over the row where the reference makes several (B, V) tensors.

Why: at batch 64 x 49,152 logits the reference (``ironlm.interfaces.truncation``: scale, a
128-wide ``topk``, the whole row's logsumexp for top-p, a (B, V) scatter of what was kept, the
draw) costs ~10-15 ms a decode step on a 2-core x86 host, each (B, V) pass ~2 ms. A row's set is
found here among its candidates, the tokens of weight w = exp(s (x - max)) >= tau (tau = 2^-10
first; 2^-30, 2^-60, then every token of nonzero weight where those do not settle the row):
collected in the same vectorised pass that sums the row's total weight Z. The candidates settle
the row when they hold its top-k (k of them) or, without top-k, more than p Z of weight (the
first token past the nucleus then lies among them). They are sorted by weight (ties: the lower
index first), cut to k, then to the nucleus (a token is kept while the weight above it is at
most p times the weight top-k kept, Z without top-k), then to min-p (w >= min_p: the largest
weighs 1), and the draw walks what is left in vocabulary order, as the reference's inverse CDF
does (same u, same token up to the rounding of the sums and of a cut within rounding of a
boundary). Rows with min-p alone draw over the whole row with min_p as a weight floor
(``row_draw``). A row needing more than CAND_CAP candidates (a flat row's wide nucleus) returns
-2: the caller's reference decides it.

Appended to ``logits_kernel``'s source: it uses its vector types, ``draw_weight`` and the
row helpers.
"""

from __future__ import annotations

CAND_CAP = 4096  # most candidates a row may need (on each thread's stack: 32 KiB)

TRUNCATED_DRAW_SOURCE = f"#define CAND_CAP {CAND_CAP}\n" + r"""
#include <stdlib.h>

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

/* The tokens of weight >= tau (and > 0) into c (at most CAND_CAP: returns -1 past that), their
   count otherwise; their weight into *held and, when z is not NULL, the row's into *z. Blocks
   of 32 vectors: weights summed and compared, and only a block with a candidate read again to
   pick them out. */
static int64_t collect(const float *x, int64_t v, float mx, float s, float tau, cand_t *c,
                       double *held, double *z) {
    int64_t n = 0, i = 0;
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
        if (!any) continue;
        for (int64_t j = start; j < i; j += VW) {
            const vf w = draw_weight(*(const vf *)(x + j), mx, s, 0.0f);
            for (int l = 0; l < VW; l++) {
                if (!(w[l] >= tau && w[l] > 0.0f)) continue;
                if (n == CAND_CAP) return -1;
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
        if (w >= tau && w > 0.0f) {
            if (n == CAND_CAP) return -1;
            c[n].w = w;
            c[n].i = (int32_t)i;
            h += w;
            n++;
        }
    }
    *held = h;
    if (z != NULL) *z = t;
    return n;
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
   a vector compare against the heap's lightest skips the rest (a token enters the heap about
   k ln(V / k) times over a row in random order). Returns how many. */
static int64_t heaviest(const float *x, int64_t v, float mx, float s, int64_t k, cand_t *h) {
    int64_t n = 0, i = 0;
    float floor = 0.0f;
    while (i + VW <= v) { /* blocks of 32 vectors: read again only when one beats the floor */
        const int64_t start = i;
        vf top = (vf){0};
        for (int q = 0; q < 32 && i + VW <= v; q++, i += VW) {
            const vf w = draw_weight(*(const vf *)(x + i), mx, s, 0.0f);
            const vi gt = w > top;
            top = (vf)((gt & (vi)w) | (~gt & (vi)top));
        }
        int any = 0;
        for (int l = 0; l < VW; l++) any |= top[l] > floor;
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

/* One row (see the module docstring): k >= v, p >= 1, mp <= 0 mean none. Returns the token,
   -1 for a row holding a NaN, -2 for a row needing more than CAND_CAP candidates. */
static int64_t row_truncated_draw(const float *x, int64_t v, float s, int64_t k, float p,
                                  float mp, double u, double *sums, cand_t *c) {
    if (k >= v && p >= 1.0f) return row_draw(x, v, s, u, sums, mp > 0.0f ? mp : 0.0f);
    float mx;
    const int64_t degenerate = row_degenerate(x, v, &mx);
    if (degenerate != -2) return degenerate;
    static const float taus[4] = {0x1p-10f, 0x1p-30f, 0x1p-60f, 0.0f};
    double z = 0.0, held = 0.0;
    int64_t n = 0;
    if (k < v) { /* top-k: its set, then top-p within it */
        if (k > CAND_CAP) return -2;
        n = heaviest(x, v, mx, s, k, c);
    } else { /* top-p: candidates that hold more than p of the row's weight */
        for (int t = 0; t < 4; t++) {
            n = collect(x, v, mx, s, taus[t], c, &held, t == 0 ? &z : NULL);
            if (n < 0) return -2;
            if (held > (double)p * z) break; /* settled */
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
"""

"""C source: decode attention of few, long rows split along the context (``decode_kernel_src``
includes it between its work items and ``paged_decode``).

Why: with fewer decode rows than four per thread, the kernel's work items were (row, KV head):
SmolLM2's three KV heads on two threads left a thread idle a third of the time, and an item
reads a third of every cache row (one head's 128 or 256 bytes of each token's 384 or 768), a
sparse stream the prefetchers serve poorly. One sequence of 4096 cached tokens, 30 layers'
caches from DRAM (Zen 5, 2 threads): 238 us a layer in bf16 (13 GB/s), 414 in float32.

How ("flash decoding"): each row's keys are cut into ``runs`` pieces of at least
``SPLIT_ROWS`` keys, every KV head of a piece together (whole cache rows: one dense stream);
each (row, piece) is a work item, attended by the ordinary bodies through a copy of the job
whose row ends at the piece's end and whose window starts at its start, the softmax storing
each head's max score m_c and sum of exponentials t_c. A second loop merges each row's pieces:
out = sum_c w_c out_c / sum_c w_c, w_c = t_c exp(m_c - M), M the largest m_c, in float32 (the
max and the sum kept apart: a log-sum-exp in one float loses an ulp of the max), then stores
it in the output's dtype. Prefill rows (``table_of``) are never split.

Same setting, us a layer before -> after, bf16 / float32: 1 row of 1024 keys 50 -> 26 / 108 ->
48, of 4096 238 -> 113 / 414 -> 199; 2 rows of 4096 392 -> 206 / 790 -> 404; 4 rows of 1024
176 -> 95 / 357 -> 197; 1 row of 256: even. SPLIT_ROWS 128 against 256 and 512: faster or
even at every length from 256 to 1024 keys and 1-4 rows (float32 4 rows of 256: 47 against
71 us).
"""

SPLIT_SOURCE = r"""
/* ---- decode rows split along the context (decode_split_src) ---- */
#define SPLIT_ROWS 128 /* keys a run keeps at least: below, a row stays one item */

/* Runs per row for this job (1: no split): fewer decode rows than four per thread get enough
   runs for every thread four times over, where the longest row has SPLIT_ROWS keys a run */
static int split_runs(const job_t *j, int threads) {
    const int items = j->n;
    if (j->table_of != NULL || threads < 2 || items >= 4 * threads) return 1;
    int64_t longest = 0;
    for (int s = 0; s < j->n; s++) {
        const int64_t rows = j->lens[s] - item_start(j, s);
        longest = rows > longest ? rows : longest;
    }
    int64_t runs = (4 * threads + items - 1) / items;
    if (runs > longest / SPLIT_ROWS) runs = longest / SPLIT_ROWS;
    return runs > 1 ? (int)runs : 1;
}

/* Inside the caller's parallel region: every (row, piece) attended, every KV head of it, into
   part (n * runs * h heads of d floats) and stats (each head's max score and sum of
   exponentials), then every row merged and stored. ok: this thread's scratch (scores, acc,
   ...) exists; a thread without it still meets both loops' barriers but skips their work.
   Returns 0, or 1 when this thread had no scratch. */
static int split_rows(const job_t *j, int bf16, int runs, float *part, float *stats, int ok,
                      float *scores, v8 *acc, float *qbuf, float *buf) {
    const int h = j->h, d = j->d, all = j->h_kv;
    const size_t esize = bf16 ? sizeof(uint16_t) : sizeof(float);
    int64_t *lens = malloc(sizeof(int64_t) * (size_t)j->n); /* this thread's row ends */
    float *mine = malloc(sizeof(float) * 2 * (size_t)h);      /* the softmax's stats */
    ok = ok && lens != NULL && mine != NULL;
    if (ok) memcpy(lens, j->lens, sizeof(int64_t) * (size_t)j->n);
    #pragma omp for schedule(dynamic, 1)
    for (int w = 0; w < j->n * runs; w++) {
        int s = w / runs, c = w % runs, hk0 = 0;
        float *sw = stats + (int64_t)w * 2 * h, *pw = part + (int64_t)w * h * d;
        const int64_t st = item_start(j, s), len = j->lens[s];
        const int64_t c0 = st + (len - st) * c / runs, c1 = st + (len - st) * (c + 1) / runs;
        if (!ok || c1 <= c0) { /* an empty piece (or no scratch): weight 0 in the merge */
            for (int g = 0; g < h; g++) sw[2 * g] = -INFINITY, sw[2 * g + 1] = 0.0f;
            continue;
        }
        job_t piece = *j; /* the row ends at c1; its window starts at c0 (item_start) */
        lens[s] = c1;
        piece.lens = lens;
        piece.window = (int)(c1 - c0);
        piece.stats = mine;
        touch_items(&piece, esize, 1, &s, &hk0, &all);
        attend_row(&piece, bf16, s, 0, all, scores, acc, qbuf, buf);
        lens[s] = len;
        memcpy(sw, mine, sizeof(float) * 2 * (size_t)h);
        memcpy(pw, acc, sizeof(float) * (size_t)h * d);
    }
    /* (the loop's barrier: every piece is in part / stats) */
    #pragma omp for schedule(static)
    for (int s = 0; s < j->n; s++) {
        if (!ok) continue;
        float *o = (float *)acc;
        for (int g = 0; g < h; g++) {
            float top = -INFINITY, tot = 0.0f;
            for (int c = 0; c < runs; c++) {
                const float m = stats[(((int64_t)s * runs + c) * h + g) * 2];
                top = m > top ? m : top;
            }
            float *og = o + (int64_t)g * d;
            memset(og, 0, sizeof(float) * (size_t)d);
            for (int c = 0; c < runs; c++) { /* piece c, normalized by t_c: weighted by it */
                const int64_t hc = ((int64_t)s * runs + c) * h + g;
                if (stats[2 * hc + 1] == 0.0f) continue;
                const float wt = stats[2 * hc + 1] * expf(stats[2 * hc] - top);
                const float *pc = part + hc * d;
                tot += wt;
                for (int e = 0; e < d; e++) og[e] += wt * pc[e];
            }
            const float inv = 1.0f / tot;
            for (int e = 0; e < d; e++) og[e] *= inv;
        }
        store_heads(j, bf16, s, 0, h, o);
    }
    free(lens);
    free(mine);
    return !ok;
}
"""

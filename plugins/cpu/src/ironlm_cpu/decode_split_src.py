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
each head's log-sum-exp. A second loop merges each row's pieces: out = sum_c exp(lse_c - M)
out_c / sum_c exp(lse_c - M), M the largest lse_c, in float32, then stores it in the output's
dtype. Prefill rows (``table_of``) are never split. Same setting, us a layer before -> after,
bf16 / float32: 1 row of 1024 keys 50 -> 26 / 108 -> 48, of 4096 238 -> 113 / 414 -> 199; 2
rows of 4096 392 -> 206 / 790 -> 404; 4 rows of 1024 176 -> 95 / 357 -> 197; 1 row of 256:
even. SPLIT_ROWS 128 against 256 and 512: faster or even at every length from 256 to 1024
keys and 1-4 rows (float32 4 rows of 256: 47 against 71 us).
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

/* Inside the caller's parallel region: every (item, run) attended into part / lse (shared:
   items * runs * span heads, span = the query heads of an item), then every item merged and
   stored. Returns 0, or 1 when this thread could not allocate its scratch. */
static int split_rows(const job_t *j, int bf16, int per_seq, int heads_per_item, int runs,
                      float *part, float *lse_all, float *scores, v8 *acc, float *qbuf,
                      float *buf) {
    const int items = j->n * per_seq, gq = j->h / j->h_kv, d = j->d;
    const int span = heads_per_item * gq;
    const size_t esize = bf16 ? sizeof(uint16_t) : sizeof(float);
    int64_t *lens = malloc(sizeof(int64_t) * (size_t)j->n); /* this thread's row ends */
    float *lse = malloc(sizeof(float) * (size_t)j->h);
    const int ok = lens != NULL && lse != NULL;
    if (ok) memcpy(lens, j->lens, sizeof(int64_t) * (size_t)j->n);
    #pragma omp for schedule(dynamic, 1)
    for (int w = 0; w < items * runs; w++) {
        const int it = w / runs, c = w % runs, s = it / per_seq;
        int hk0 = (it % per_seq) * heads_per_item, hk1 = hk0 + heads_per_item;
        float *ls = lse_all + (int64_t)w * span, *pt = part + (int64_t)w * span * d;
        const int64_t st = item_start(j, s), len = j->lens[s];
        const int64_t c0 = st + (len - st) * c / runs, c1 = st + (len - st) * (c + 1) / runs;
        if (!ok || c1 <= c0) { /* an empty run (or no scratch): weight 0 in the merge */
            for (int g = 0; g < span; g++) ls[g] = -INFINITY;
            continue;
        }
        job_t run = *j; /* the row ends at c1; its window starts at c0 (item_start) */
        lens[s] = c1;
        run.lens = lens;
        run.window = (int)(c1 - c0);
        run.lse = lse;
        touch_items(&run, esize, 1, &s, &hk0, &hk1);
        attend_row(&run, bf16, s, hk0, hk1, scores, acc, qbuf, buf);
        lens[s] = len;
        memcpy(ls, lse + hk0 * gq, sizeof(float) * (size_t)span);
        memcpy(pt, (const float *)acc + (int64_t)hk0 * gq * d, sizeof(float) * (size_t)span * d);
    }
    /* (the loop's barrier: every run is in part / lse_all) */
    #pragma omp for schedule(static)
    for (int it = 0; it < items; it++) {
        const int s = it / per_seq, g0 = (it % per_seq) * heads_per_item * gq;
        float *a = (float *)acc;
        for (int g = 0; g < span; g++) {
            float top = -INFINITY, tot = 0.0f;
            for (int c = 0; c < runs; c++) {
                const float l = lse_all[((int64_t)it * runs + c) * span + g];
                top = l > top ? l : top;
            }
            float *o = a + (int64_t)(g0 + g) * d;
            memset(o, 0, sizeof(float) * (size_t)d);
            for (int c = 0; c < runs; c++) {
                const int64_t w = (int64_t)it * runs + c;
                if (lse_all[w * span + g] == -INFINITY) continue;
                const float wt = expf(lse_all[w * span + g] - top);
                const float *pc = part + (w * span + g) * d;
                tot += wt;
                for (int e = 0; e < d; e++) o[e] += wt * pc[e];
            }
            const float inv = 1.0f / tot;
            for (int e = 0; e < d; e++) o[e] *= inv;
        }
        store_heads(j, bf16, s, g0, g0 + span, a);
    }
    free(lens);
    free(lse);
    return !ok;
}
"""

"""The llama.cpp baseline with every sequence in one batch (``--llama-cpp-batched``).

``LlamaCppRunner`` serves prompts one after another, as llama.cpp's Python server does. This
runner is llama.cpp at its best on a batch, as the issue's 81.6 tok/s figure was measured:
llama-cpp-python's low-level API (the C functions of llama.h), one context with a sequence
slot per prompt, prompts prefilled in ``n_batch``-token batches (only each prompt's last token
asks for logits), then every step decodes one token of each unfinished sequence in a single
``llama_decode``. Greedy (argmax of the logits), like the other engines here.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from ironlm_bench.baselines import _version, llama_cpp_missing_reason
from ironlm_bench.runners import BatchTiming

_PREFILL_BATCH = 512  # tokens per prefill llama_decode (llama.cpp's default n_batch)


class LlamaCppBatchedRunner:
    name = "llama-cpp"

    def __init__(self, gguf_path: str, threads: int, seed: int, flash_attn: bool = False) -> None:
        reason = llama_cpp_missing_reason()
        if reason is not None:
            raise RuntimeError(reason)
        if not Path(gguf_path).is_file():
            raise ValueError(f"llama-cpp baseline: GGUF file not found: {gguf_path}")
        import llama_cpp as lc

        # llama-cpp-python prints llama.cpp's log at or above this logger's level (its
        # ``verbose=False`` sets ERROR the same way)
        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
        self.lc = lc
        lc.llama_backend_init()
        self.model = lc.llama_model_load_from_file(gguf_path.encode(), lc.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.gguf_path, self.threads, self.seed, self.flash_attn = gguf_path, threads, seed, flash_attn

    def info(self) -> dict[str, Any]:
        return {"gguf": self.gguf_path, "flash_attn": self.flash_attn, "batching": "one batch",
                "prefill_batch": _PREFILL_BATCH, "llama_cpp_python": _version("llama_cpp_python")}

    def _context(self, n_seqs: int, n_ctx: int) -> Any:
        lc = self.lc
        params = lc.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = max(_PREFILL_BATCH, n_seqs)
        params.n_seq_max = n_seqs
        params.n_threads = params.n_threads_batch = self.threads
        params.flash_attn_type = (
            lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.flash_attn else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        ctx = lc.llama_init_from_model(self.model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context of {n_ctx} tokens")
        return ctx

    def run(self, prompts: list[list[int]], output_len: int,
            temperature: float = 0.0) -> BatchTiming:
        if temperature > 0:
            raise ValueError("the llama-cpp baseline runs greedy only (temperature 0)")
        lc, n = self.lc, len(prompts)
        # every sequence gets its own share of the context (llama.cpp splits n_ctx by n_seq_max
        # and pads each share to 256 cells; a share already padded keeps it quiet about that)
        per_seq = -(-(max(len(p) for p in prompts) + output_len + 1) // 256) * 256
        ctx = self._context(n, per_seq * n)
        batch = lc.llama_batch_init(max(_PREFILL_BATCH, n), 0, 1)
        ttft, e2e = [0.0] * n, [0.0] * n
        produced = [0] * n
        try:
            start = time.perf_counter()
            # prefill: (sequence, position, token, wants logits) rows, _PREFILL_BATCH at a time
            rows = [(s, j, t, j == len(p) - 1) for s, p in enumerate(prompts) for j, t in enumerate(p)]
            nxt: list[int] = [0] * n
            for lo in range(0, len(rows), _PREFILL_BATCH):
                chunk = rows[lo : lo + _PREFILL_BATCH]
                self._decode(ctx, batch, chunk)
                now = time.perf_counter()
                for i, (s, _, _, last) in enumerate(chunk):
                    if last:
                        nxt[s] = self._argmax(ctx, i)
                        ttft[s], produced[s] = now - start, 1
            while True:
                live = [s for s in range(n) if produced[s] < output_len]
                for s in range(n):
                    if produced[s] == output_len and e2e[s] == 0.0:
                        e2e[s] = time.perf_counter() - start
                if not live:
                    break
                self._decode(ctx, batch, [(s, len(prompts[s]) + produced[s] - 1, nxt[s], True)
                                          for s in live])  # fmt: skip
                for i, s in enumerate(live):
                    nxt[s] = self._argmax(ctx, i)
                    produced[s] += 1
        finally:
            lc.llama_batch_free(batch)
            lc.llama_free(ctx)
        return BatchTiming(ttft, e2e, [len(p) for p in prompts], produced)

    def _decode(self, ctx: Any, batch: Any, rows: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode over rows of (sequence id, position, token, wants logits)."""
        batch.n_tokens = len(rows)
        for i, (seq, pos, tok, logits) in enumerate(rows):
            batch.token[i], batch.pos[i], batch.logits[i] = tok, pos, int(logits)
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
        status = self.lc.llama_decode(ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")

    def _argmax(self, ctx: Any, row: int) -> int:
        logits = np.ctypeslib.as_array(self.lc.llama_get_logits_ith(ctx, row), shape=(self.n_vocab,))
        return int(logits.argmax())

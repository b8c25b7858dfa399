"""A fused paged-decode attention kernel in C, built on first use with the system C compiler.

Why: on CPU, decode attention is memory-bound. The torch path copies every sequence's KV blocks
into a padded buffer before SDPA reads them again (three passes over the context); this kernel
reads each key and value row once, straight from the paged cache, block by block, with no
padding. Measured here (benchmarks/attention_cpu.py) it is about 2x faster than gather + SDPA.
Work items (a sequence, or a sequence's KV head when there are few sequences, or a piece of
a long sequence's keys when there are few: ``decode_split_src``) are scheduled
dynamically over an OpenMP team that is torch's own: the library links libgomp.so.1, which the
loader resolves to the copy torch has already loaded, so torch's idle workers take the items
instead of spinning beside extra threads (separate pthreads ran slower than one thread here).

Scope: decode rows only (one new token per sequence), queries, cache and output all float32 or
all bfloat16, head_dim a multiple of 8; any GQA ratio, sliding window and logits soft cap. bf16
keys and values are widened to float32 (a 16-bit shift) once per block and KV head into a
scratch the group's query heads share (with GQA each key was otherwise widened once per query
head: 1.6x slower at 64 x 257 tokens); scores, softmax and the weighted sum are float32 (as
the torch path computes a bf16 cache), and the output is rounded to bf16 to nearest even.
AVX-512 builds run a 16-lane body instead (``decode_512_src``: query heads in pairs per key
load, value rows read once for up to 3 heads; head sizes that are multiples of 64, up to 128
for float32), with AVX-512 BF16 taking bf16 scores from ``vdpbf16ps`` on the cache rows and
widening only the values (``decode_bf16_src``; up to 256).
Everything else, and any machine without a working C compiler, uses the torch path (the kernel
reports why).
Built and cached by ``cbuild.load_library``.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ironlm_cpu.cbuild import KERNEL_DTYPES, KernelLibrary, heads_contiguous
from ironlm_cpu.decode_kernel_src import SOURCE as _SOURCE
from ironlm_cpu.isa import IsaTarget





def touch_budget(cache_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """K and V bytes of a work item that the kernel touches whole before its passes
    (``touch_items`` in the source): a quarter of a core's L2 (Linux's sysfs cache
    description), where the touched lines wait for their pass; 64 KiB where it is not
    described."""
    for index in sorted(cache_dir.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if level == "2" and kind in ("Unified", "Data") and size[:-1].isdigit():
            scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1])
            if scale is not None:
                return int(size[:-1]) * scale // 4
    return 64 * 1024


class PagedDecodeKernel(KernelLibrary):
    """Loads (building if needed) the C kernel; ``available`` / ``reason`` say whether it can
    run here. Calling it runs decode attention for one bucket of decode sequences."""

    def __init__(self, target: IsaTarget | None = None) -> None:
        ptr, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
        decode = ([ptr] * 7 + [i64, ptr] + [i32] * 7 + [f32, f32, i32, i64], i32)
        write = ([ptr, i64, ptr, i64] + [ptr] * 3 + [i32, i32, i64], i32)
        super().__init__(
            "cpu_paged_decode", _SOURCE,
            {f"ironlm_{fn}_{sfx}": sig for fn, sig in (("paged_decode", decode),
                                                      ("write_kv", write))
             for sfx in KERNEL_DTYPES.values()},
            "C decode kernel", target=target,
        )  # fmt: skip
        lib = self.lib
        self.touch_item_bytes = touch_budget()
        # dtype -> C function
        self._fn = {} if lib is None else {
            dt: getattr(lib, f"ironlm_paged_decode_{sfx}") for dt, sfx in KERNEL_DTYPES.items()}
        self._write = {} if lib is None else {
            dt: getattr(lib, f"ironlm_write_kv_{sfx}") for dt, sfx in KERNEL_DTYPES.items()}

    def __call__(
        self,
        q: torch.Tensor,  # (num_tokens, H, D) float32 or bf16, contiguous
        kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hkv, D) q's dtype, contiguous
        out: torch.Tensor,  # (num_tokens, H, D) q's dtype, contiguous: rows `tokens` are written
        tokens: torch.Tensor,  # (n,) int64: each sequence's query row
        seq_lens: torch.Tensor,  # (n,) int64: context length including the new token
        tables: torch.Tensor,  # (S, max_blocks) int32, contiguous: block ids of each sequence
        max_len: int,  # max(seq_lens)
        scale: float,
        window: int | None,
        soft_cap: float | None,
        table_of: torch.Tensor | None = None,  # (n,) int64: each row's row of tables (prefill
        # tokens of one sequence share it); None: row i reads tables[i] (S == n)
    ) -> None:
        assert self._fn, self.reason
        assert q.dtype == kv_cache.dtype == out.dtype, (q.dtype, kv_cache.dtype, out.dtype)
        _, _, block_size, h_kv, d = kv_cache.shape
        status = self.call(
            self._fn[q.dtype],
            q.data_ptr(), kv_cache[0].data_ptr(), kv_cache[1].data_ptr(), out.data_ptr(),
            tokens.data_ptr(), seq_lens.data_ptr(), tables.data_ptr(), tables.stride(0),
            None if table_of is None else table_of.data_ptr(), tokens.numel(), q.shape[1],
            h_kv, d, block_size, window or 0, max_len, scale, soft_cap or 0.0,
            torch.get_num_threads(), self.touch_item_bytes,
        )  # fmt: skip
        if status != 0:
            raise MemoryError("paged decode kernel could not allocate its scratch buffers")

    @staticmethod
    def write_kv_fits(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
        """float32 or bf16 everywhere (one dtype), a contiguous cache, and each token's (Hkv, D)
        rows contiguous in k and v (v may be a strided view of the fused QKV output)."""
        cache_ok = kv_cache.dtype in KERNEL_DTYPES and kv_cache.is_contiguous()
        same = k.dtype == v.dtype == kv_cache.dtype
        return cache_ok and same and heads_contiguous(k) and heads_contiguous(v)

    def write_kv(
        self,
        kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hkv, D) float32 / bf16, contiguous
        k: torch.Tensor,  # (num_tokens, Hkv, D) in the cache's dtype
        v: torch.Tensor,  # (num_tokens, Hkv, D)
        slot_mapping: torch.Tensor,  # (num_tokens,) int64: block_id * block_size + offset
    ) -> None:
        """Store the new tokens' keys and values at their cache slots (one C call); a slot of
        -1 marks a padding row, which is skipped."""
        assert self._write, self.reason
        _, num_blocks, block_size, h_kv, d = kv_cache.shape
        slots = slot_mapping.contiguous()
        bad = self.call(
            self._write[kv_cache.dtype],
            k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), kv_cache[0].data_ptr(),
            kv_cache[1].data_ptr(), slots.data_ptr(), slots.numel(), h_kv * d,
            num_blocks * block_size,
        )  # fmt: skip
        if bad:
            raise IndexError(f"{bad} KV cache slot(s) outside the cache of {num_blocks} blocks")

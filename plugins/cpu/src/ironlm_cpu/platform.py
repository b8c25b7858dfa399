"""Platform ``cpu``: always available; computes in bfloat16 where the CPU has bf16 arithmetic
(AVX-512 BF16 or AMX), else in float32.

Its C kernels are built for the ISA target ``isa.host_target()`` picks (``IRONLM_CPU_ISA``
forces a lower one); which kernel runs each op is measured at start-up (``tuner``).
"""

from __future__ import annotations

import logging
import os
from typing import Any, ClassVar

import torch
from ironlm.interfaces.graphs import GraphCapture
from ironlm.interfaces.model import ModelContext
from ironlm.interfaces.platform import Availability, LayerOps, Platform, usable_cores

from ironlm_cpu.host_memory import share_main_arena, trim_heap, tune_malloc
from ironlm_cpu.isa import ENV_VAR, IsaTarget, IsaUnavailable, compiler, host_cpu, host_target

logger = logging.getLogger(__name__)


class CpuPlatform(Platform):
    """Ranks are processes on the host's cores, not bound to devices: any number can run
    (``device_count`` is None); the ranks on one machine split its cores between them."""

    name: ClassVar[str] = "cpu"
    device_type: ClassVar[str] = "cpu"
    priority: ClassVar[int] = 0  # the fallback when nothing faster is available
    dist_backend: ClassVar[str] = "gloo"
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (
        torch.float32,
        torch.bfloat16,
        torch.float16,
    )
    default_attention_backend: ClassVar[str] = "cpu_paged"
    # Decode attention reads each sequence's keys and values block by block, bound by reading
    # the cache; the hardware prefetchers restart wherever a sequence's next block is not the
    # neighbour of its last, and a decode batch that takes blocks in step interleaves its
    # sequences. 128-token blocks (vLLM's CPU default) made the runs long (batch-64 bf16 decode
    # step 33-34.5 -> 29-32 ms on the Zen 5) but waste up to 127 tokens a sequence: the bench's
    # 512 MiB float32 cache held 91 of the 128 blocks 64 sequences of 129-192 tokens need, and a
    # third of them were preempted. 16-token blocks handed out in runs of 8 neighbours
    # (``kv_run_tokens``, ``FreeBlockPool``) keep the runs and waste nothing: 30 layers' decode
    # attention at 64 x 180 tokens on the Intel Xeon (AMX), medians of 14: float32 30.3 ms at
    # 128, 32.1 at 16 in step, 30.4 at 16 in runs (bf16 19.8 / 21.3 / 20.2).
    default_block_size: ClassVar[int] = 16
    kv_run_tokens: ClassVar[int] = 128
    supports_graph_capture: ClassVar[bool] = True

    def is_available(self) -> Availability:
        try:
            target = host_target()
        except IsaUnavailable as exc:
            return Availability.no(str(exc))
        return Availability.yes(f"{os.cpu_count()} CPU cores, kernels for {target.describe()}")

    def scheduler_defaults(self, serving: bool, world_size: int) -> tuple[int, int]:
        """vLLM's CPU defaults: 4096 tokens and 256 sequences a step for the offline ``LLM``,
        2048 and 128 for the server, each times the ranks. The larger offline step needs
        glibc's maps of large blocks off (``host_memory``): SmolLM2 float32's gate/up output
        is 50 MB at 4096 tokens, and mapped fresh in each layer its pages made a process's
        first 4096-token batch slower than two 2048-token steps (docs/performance.md)."""
        tokens, seqs = (2048, 128) if serving else (4096, 256)
        return tokens * world_size, seqs * world_size

    def memory_info(self, device_index: int = 0) -> tuple[int, int]:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    def default_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        return auto_dtype(host_target())

    def release_memory(self) -> None:
        trim_heap()  # the heap keeps freed pages (host_memory's settings)

    def configure_process(self, local_world_size: int = 1) -> None:
        """Torch threads: ``IRONLM_CPU_THREADS`` (default: the usable cores) shared by the
        ``local_world_size`` ranks on this machine, at least one each; glibc's malloc kept
        from returning the prefill intermediates' pages (``host_memory``); warns when the C
        kernels run their generic build."""
        tune_malloc()
        threads = int(os.environ.get("IRONLM_CPU_THREADS", "0")) or usable_cores()
        torch.set_num_threads(max(1, threads // local_world_size))
        target = host_target()  # raises IsaUnavailable for a bad IRONLM_CPU_ISA
        if not target.has("avx2"):
            logger.warning(
                "cpu platform: %s; the C kernels run their generic x86-64 builds and the "
                "measured kernel choice will mostly pick torch",
                "IRONLM_CPU_ISA=generic" if os.environ.get(ENV_VAR)
                else f"this CPU ({host_cpu().model}) has no AVX2 + FMA",
            )

    def before_engine_thread(self) -> None:
        """The server's engine thread allocates from glibc's main arena, as the offline
        ``LLM``'s engine on the main thread does: a thread arena hands its heaps back, so a
        prefill step's large intermediates would fault in fresh pages (``host_memory``)."""
        share_main_arena()

    def device_count(self) -> int | None:
        return None  # ranks share the host's cores

    def layer_ops(self) -> LayerOps:
        """Linears on packed weights through C kernels or torch, chosen by measurement
        (``CpuLayerOps``)."""
        from ironlm_cpu.layer_ops import CpuLayerOps

        return CpuLayerOps()

    def graph_capture(self, ctx: ModelContext) -> GraphCapture | None:
        """Decode graphs as recorded kernel calls (``graphs``), when the model's layer ops
        and attention backend are this plugin's and one process holds the whole model (the
        recording cannot hold tensor-parallel collectives nor pipeline sends)."""
        from ironlm_cpu.attention import CpuPagedAttentionBackend
        from ironlm_cpu.graphs import CpuGraphCapture
        from ironlm_cpu.layer_ops import CpuLayerOps

        if ctx.tp_size > 1 or ctx.pp_size > 1 or not isinstance(ctx.layer_ops, CpuLayerOps):
            return None
        if not isinstance(ctx.attention, CpuPagedAttentionBackend):
            return None
        return CpuGraphCapture(ctx.layer_ops.libraries() + ctx.attention.libraries())

    def describe(self) -> dict[str, Any]:
        """CPU, ISA target, compiler and the kernel choices measured on this machine (read from
        the tuning cache, so another process's start-up shows here too)."""
        from ironlm_cpu.tuner import KernelTuner

        cpu = host_cpu()
        out: dict[str, Any] = {"cpu": cpu.model, "isa_groups_on_cpu": list(cpu.groups()),
                               "compiler": compiler() or "none"}  # fmt: skip
        try:
            target = host_target()
        except IsaUnavailable as exc:
            return {**out, "isa_target": f"unavailable: {exc}"}
        out["isa_target"] = target.describe()
        out["isa_forced"] = os.environ.get(ENV_VAR) or None
        out["default_dtype"] = str(self.default_dtype(torch.float32)).removeprefix("torch.")
        tuner = KernelTuner(target)
        out["kernel_choices_file"] = str(tuner.path)
        out["kernel_choices"] = {key: format_choice(d) for key, d in sorted(tuner.cached().items())}
        return out


def auto_dtype(target: IsaTarget) -> torch.dtype:
    """bfloat16 where the target has bf16 dot products (AVX-512 BF16; every AMX CPU has it
    too), float32 elsewhere: without bf16 arithmetic a bf16 matmul widens to float32 first and
    torch's runs several times slower than its float32 one."""
    return torch.bfloat16 if target.has("avx512_bf16") else torch.float32


def format_choice(decision: dict[str, Any]) -> str:
    """One line: layout, implementation per bucket with its time and torch's, and why."""
    parts = []
    for bucket, impl in decision.get("impls", {}).items():
        times = decision.get("us", {}).get(bucket, {})
        t = times.get(impl)
        vs = times.get("torch")
        timing = "" if t is None else f" {t:.0f}us" + (
            "" if vs is None or impl == "torch" else f" vs torch {vs:.0f}us")
        parts.append(f"M={bucket}:{impl}{timing}")
    if not parts and "impl" in decision:
        parts.append(decision["impl"])
    layout = decision.get("layout")
    head = f"{layout} layout; " if layout else ""
    return f"{head}{', '.join(parts)}; {decision.get('why', '')}"

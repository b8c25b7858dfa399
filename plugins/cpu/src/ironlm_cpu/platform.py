"""Platform ``cpu``: always available; computes in float32 by default."""

from __future__ import annotations

import os
from typing import ClassVar

import torch

from ironlm.interfaces.graphs import GraphCapture
from ironlm.interfaces.model import ModelContext
from ironlm.interfaces.platform import Availability, LayerOps, Platform, usable_cores


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
    supports_graph_capture: ClassVar[bool] = True

    def is_available(self) -> Availability:
        return Availability.yes(f"{os.cpu_count()} CPU cores")

    def memory_info(self, device_index: int = 0) -> tuple[int, int]:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    def default_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        # bf16/fp16 matmuls run several times slower than fp32 on AVX2 CPUs without AMX.
        return torch.float32

    def configure_process(self, local_world_size: int = 1) -> None:
        """Torch threads: ``IRONLM_CPU_THREADS`` (default: the usable cores) shared by the
        ``local_world_size`` ranks on this machine, at least one each."""
        threads = int(os.environ.get("IRONLM_CPU_THREADS", "0")) or usable_cores()
        torch.set_num_threads(max(1, threads // local_world_size))

    def device_count(self) -> int | None:
        return None  # ranks share the host's cores

    def layer_ops(self) -> LayerOps:
        """Float32 linears on packed weights through a C kernel (``CpuLayerOps``)."""
        from ironlm_cpu.layer_ops import CpuLayerOps

        return CpuLayerOps()

    def graph_capture(self, ctx: ModelContext) -> GraphCapture | None:
        """Decode graphs as recorded C kernel calls (``graphs``), when the model's layer ops
        and attention backend are this plugin's and one process holds the whole model (the
        recording cannot hold tensor-parallel collectives nor pipeline sends)."""
        from ironlm_cpu.attention import CpuPagedAttentionBackend
        from ironlm_cpu.graphs import CpuGraphCapture
        from ironlm_cpu.layer_ops import CpuLayerOps

        if ctx.tp_size > 1 or ctx.pp_size > 1 or not isinstance(ctx.layer_ops, CpuLayerOps):
            return None
        if not isinstance(ctx.attention, CpuPagedAttentionBackend):
            return None
        libraries = ctx.layer_ops.libraries() + ctx.attention.libraries()
        return CpuGraphCapture(libraries) if libraries else None

"""Platform ``cuda``: NVIDIA GPUs through torch.cuda, Triton kernels, NCCL."""

from __future__ import annotations

import os
from typing import ClassVar

import torch

from ironlm.interfaces.graphs import GraphCapture
from ironlm.interfaces.model import ModelContext
from ironlm.interfaces.platform import Availability, LayerOps, Platform
from ironlm_cuda.availability import triton_installed


class CudaPlatform(Platform):
    name: ClassVar[str] = "cuda"
    device_type: ClassVar[str] = "cuda"
    priority: ClassVar[int] = 100
    dist_backend: ClassVar[str] = "nccl"
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (
        torch.bfloat16,
        torch.float16,
        torch.float32,
    )
    default_attention_backend: ClassVar[str] = "triton"
    visible_devices_env: ClassVar[str | None] = "CUDA_VISIBLE_DEVICES"
    supports_graph_capture: ClassVar[bool] = True
    ray_device_key: ClassVar[str] = "GPU"

    def is_available(self) -> Availability:
        if torch.version.cuda is None:
            return Availability.no(
                f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None); "
                "install a CUDA build of torch"
            )
        if not torch.cuda.is_available():
            visible = os.environ.get(self.visible_devices_env or "", None)
            mask = f" ({self.visible_devices_env}={visible!r})" if visible is not None else ""
            return Availability.no(f"torch.cuda.is_available() is False: no CUDA device{mask}")
        triton = triton_installed()
        if not triton.available:
            return triton
        n = torch.cuda.device_count()
        return Availability.yes(f"{n} x {torch.cuda.get_device_name(0)}")

    def memory_info(self, device_index: int = 0) -> tuple[int, int]:
        return torch.cuda.mem_get_info(device_index)

    def release_memory(self) -> None:
        torch.cuda.empty_cache()  # the caching allocator's free blocks back to the driver

    def scheduler_defaults(self, serving: bool, world_size: int) -> tuple[int, int]:
        """vLLM's GPU defaults (``batch_defaults``) for this host's first device; where the
        engine's front end sees none (a Ray driver without a GPU), a device of no memory's."""
        try:
            props = torch.cuda.get_device_properties(0)
            memory, name = int(props.total_memory), str(props.name)
        except (RuntimeError, AssertionError):  # no CUDA device or driver in this process
            memory, name = 0, ""
        return batch_defaults(memory, name, serving)

    def default_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        if model_dtype == torch.float32:
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return model_dtype

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def set_device(self, index: int) -> None:
        torch.cuda.set_device(index)

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def layer_ops(self) -> LayerOps:
        """Fused Triton kernels for RMSNorm (+ residual), rotary and the gated activations."""
        from ironlm_cuda.triton_layer_ops import TritonLayerOps

        return TritonLayerOps()

    def graph_capture(self, ctx: ModelContext) -> GraphCapture | None:
        """CUDA graphs for decode steps when one process holds the whole model with the triton
        attention backend (the one with graph metadata); tensor- and pipeline-parallel ranks
        run eagerly (their collectives are not captured)."""
        from ironlm_cuda.graphs import CudaGraphCapture
        from ironlm_cuda.triton_attention import TritonAttentionBackend

        if ctx.tp_size > 1 or ctx.pp_size > 1:
            return None
        if not isinstance(ctx.attention, TritonAttentionBackend):
            return None
        return CudaGraphCapture()


def batch_defaults(total_memory: int, device_name: str, serving: bool) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) as vLLM sets them for a GPU of ``total_memory``
    bytes: at least 70 GiB and not an A100 (vLLM measured a larger step slowing the A100
    down), 16384 tokens offline / 8192 serving and 1024 sequences; otherwise 8192 offline /
    2048 serving and 256 sequences."""
    if total_memory >= 70 * 2**30 and "a100" not in device_name.lower():
        return (8192 if serving else 16384), 1024
    return (2048 if serving else 8192), 256

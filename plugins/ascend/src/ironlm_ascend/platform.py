"""Platform ``npu``: Ascend NPUs through torch_npu (CANN), HCCL, block size 128."""

from __future__ import annotations

import importlib
from typing import ClassVar

import torch

from ironlm.interfaces.platform import Availability, LayerOps, Platform


class AscendPlatform(Platform):
    name: ClassVar[str] = "npu"
    device_type: ClassVar[str] = "npu"
    priority: ClassVar[int] = 90
    dist_backend: ClassVar[str] = "hccl"
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (
        torch.float16,
        torch.bfloat16,
        torch.float32,
    )
    default_attention_backend: ClassVar[str] = "ascend"
    supported_block_sizes: ClassVar[tuple[int, ...] | None] = (128,)
    default_block_size: ClassVar[int] = 128
    visible_devices_env: ClassVar[str | None] = "ASCEND_RT_VISIBLE_DEVICES"
    ray_device_key: ClassVar[str] = "NPU"

    def _torch_npu(self):  # type: ignore[no-untyped-def]
        return importlib.import_module("torch_npu")

    def is_available(self) -> Availability:
        try:
            self._torch_npu()
        except Exception as exc:  # ImportError, or CANN libraries missing at load
            return Availability.no(
                f"torch_npu is not importable ({exc.__class__.__name__}: {exc}); install the "
                "CANN toolkit and the torch_npu build matching torch"
            )
        npu = getattr(torch, "npu", None)
        if npu is None or not npu.is_available() or npu.device_count() == 0:
            return Availability.no("torch_npu imported but torch.npu reports no Ascend device")
        return Availability.yes(f"{npu.device_count()} Ascend NPU(s)")

    def memory_info(self, device_index: int = 0) -> tuple[int, int]:
        return torch.npu.mem_get_info(device_index)  # type: ignore[attr-defined]

    def release_memory(self) -> None:
        torch.npu.empty_cache()  # type: ignore[attr-defined]  # torch_npu's caching allocator

    def default_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        return torch.float16 if model_dtype == torch.float32 else model_dtype

    def device_count(self) -> int:
        return int(torch.npu.device_count())  # type: ignore[attr-defined]

    def set_device(self, index: int) -> None:
        torch.npu.set_device(index)  # type: ignore[attr-defined]

    def synchronize(self) -> None:
        torch.npu.synchronize()  # type: ignore[attr-defined]

    def layer_ops(self) -> LayerOps:
        """The core's ops, with the w8a8 layout on torch_npu's int8 operators
        (``AscendLayerOps``)."""
        from ironlm_ascend.layer_ops import AscendLayerOps

        return AscendLayerOps()

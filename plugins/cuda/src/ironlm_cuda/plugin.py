"""Entry point of ironlm-cuda. Imports nothing from triton or CUDA at load time."""

from __future__ import annotations

from typing import Callable

from ironlm import hookimpl

IRONLM_CONTRACT_VERSION = "1.2"  # the plugin contract this module is written against


@hookimpl
def register_platforms(register: Callable[[type], None]) -> None:
    from ironlm_cuda.platform import CudaPlatform

    register(CudaPlatform)


@hookimpl
def register_attention_backends(register: Callable[[type], None]) -> None:
    from ironlm_cuda.triton_attention import TritonAttentionBackend

    register(TritonAttentionBackend)

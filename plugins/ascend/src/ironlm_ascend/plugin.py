"""Entry point of ironlm-ascend. torch_npu is imported only inside availability checks and when
a backend or quantization method runs, never here."""

from __future__ import annotations

from typing import Callable

from ironlm import hookimpl

IRONLM_CONTRACT_VERSION = "1.2"  # the plugin contract this module is written against


@hookimpl
def register_platforms(register: Callable[[type], None]) -> None:
    from ironlm_ascend.platform import AscendPlatform

    register(AscendPlatform)


@hookimpl
def register_attention_backends(register: Callable[[type], None]) -> None:
    from ironlm_ascend.attention import AscendAttentionBackend

    register(AscendAttentionBackend)


@hookimpl
def register_quantization_methods(register: Callable[[type], None]) -> None:
    from ironlm_ascend.w8a8 import AscendW8A8Method

    register(AscendW8A8Method)

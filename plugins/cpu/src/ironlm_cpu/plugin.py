"""Entry point of ironlm-cpu: registers the ``cpu`` platform and its attention backend."""

from __future__ import annotations

from collections.abc import Callable

from ironlm import hookimpl

IRONLM_CONTRACT_VERSION = "1.2"  # the plugin contract this module is written against


@hookimpl
def register_platforms(register: Callable[[type], None]) -> None:
    from ironlm_cpu.platform import CpuPlatform

    register(CpuPlatform)


@hookimpl
def register_attention_backends(register: Callable[[type], None]) -> None:
    from ironlm_cpu.attention import CpuPagedAttentionBackend

    register(CpuPagedAttentionBackend)

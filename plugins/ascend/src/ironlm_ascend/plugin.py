"""Entry point of ironlm-ascend. torch_npu is imported only inside availability checks."""

from __future__ import annotations

from typing import Callable

from ironlm import hookimpl


@hookimpl
def register_platforms(register: Callable[[type], None]) -> None:
    from ironlm_ascend.platform import AscendPlatform

    register(AscendPlatform)

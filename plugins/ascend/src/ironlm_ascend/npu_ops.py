"""Lazy access to torch_npu.

torch_npu is imported here, on use, never when the plugin module is imported: hooks must stay
cheap and hardware-free, and tests resolve the import against a fake package on ``sys.path``.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Iterable

from ironlm.interfaces.platform import Availability

TORCH_NPU = "torch_npu"


def import_torch_npu() -> ModuleType:
    """The ``torch_npu`` module; RuntimeError naming it when it cannot be imported."""
    try:
        return importlib.import_module(TORCH_NPU)
    except Exception as exc:  # ImportError, or CANN shared libraries missing at load
        raise RuntimeError(_not_importable(exc)) from exc


def torch_npu_availability(ops: Iterable[str]) -> Availability:
    """Whether torch_npu imports and provides every operator in ``ops``; the reason when not."""
    try:
        module = importlib.import_module(TORCH_NPU)
    except Exception as exc:
        return Availability.no(_not_importable(exc))
    version = getattr(module, "__version__", "unknown version")
    missing = [op for op in ops if not callable(getattr(module, op, None))]
    if missing:
        return Availability.no(
            f"torch_npu {version} lacks operator(s) {', '.join(missing)}; install a torch_npu "
            "release that provides them (with the matching CANN toolkit)"
        )
    return Availability.yes(f"torch_npu {version}")


def _not_importable(exc: BaseException) -> str:
    return (
        f"torch_npu is not importable ({exc.__class__.__name__}: {exc}); install the CANN "
        "toolkit and the torch_npu build matching torch"
    )

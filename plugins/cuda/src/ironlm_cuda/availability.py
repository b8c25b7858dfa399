"""Whether triton is installed, found without importing it: listing plugins (``ironlm
plugins``, start-up) must not pay for triton's import, which the kernels do lazily."""

from __future__ import annotations

import importlib.metadata
import importlib.util

from ironlm.interfaces.platform import Availability


def triton_installed() -> Availability:
    if importlib.util.find_spec("triton") is None:
        return Availability.no("triton is not installed (pip install triton)")
    try:  # torch's nightlies ship it as the distribution pytorch-triton
        version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        version = "(version unknown)"
    return Availability.yes(f"triton {version}")

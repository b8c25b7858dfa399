"""Summary statistics of a list of samples (mean and percentiles, numpy's linear method)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def summarize(
    values: Sequence[float], percentiles: Sequence[int] = (50, 90, 99)
) -> dict[str, float]:
    """``{"mean", "p50", ...}`` of ``values``; NaN for every field when there are none."""
    if not values:
        return {"mean": float("nan"), **{f"p{p}": float("nan") for p in percentiles}}
    arr = np.asarray(values, dtype=np.float64)
    out = {"mean": float(arr.mean())}
    for p in percentiles:
        out[f"p{p}"] = float(np.percentile(arr, p))
    return out

"""TEST helpers for the platform quantized kernels: round-to-nearest quantization of float weights
into each canonical layout (ironlm.interfaces.quant), and a quantization method per layout that
applies it at load and runs the platform's ``quantized_linear``. They exist to drive the layer
ops' kernels through real models; the user-facing methods (weight_only_int8, awq, gptq, ...)
live in the core's quantization package."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import numpy as np
import torch
from ironlm.hookspecs import hookimpl
from ironlm.interfaces.quant import QuantLayout, pack_int4
from ironlm.interfaces.quantization import QuantizationMethod

# test method name suffix -> layout
LAYOUTS: dict[str, QuantLayout] = {
    "int8": QuantLayout("int8"),
    "w8a8": QuantLayout("w8a8"),
    "int4": QuantLayout("int4", group_size=32, zero_points=True),
    "int4sym": QuantLayout("int4", group_size=64),
    "fp8": QuantLayout("fp8"),
    "q4_1": QuantLayout("gguf", ggml_type=3),
    "q8_0": QuantLayout("gguf", ggml_type=8),
}


def rtn_quantize(layout: QuantLayout, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """(n, k) float weight -> the layout's canonical tensors, round to nearest."""
    w = weight.detach().float()
    n, k = w.shape
    if layout.kind in ("int8", "w8a8"):
        scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return {"qweight": q, "scale": scale}
    if layout.kind == "fp8":
        scale = (w.abs().amax(dim=1) / 448.0).clamp(min=1e-12)
        return {"qweight": (w / scale[:, None]).to(torch.float8_e4m3fn), "scale": scale}
    if layout.kind == "int4":
        assert layout.group_size is not None
        wg = w.reshape(n, k // layout.group_size, layout.group_size)
        if layout.zero_points:
            lo, hi = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
            scale = ((hi - lo) / 15.0).clamp(min=1e-12)
            zero = torch.round(-lo / scale).clamp(0, 15)
        else:
            scale = (wg.abs().amax(-1) / 7.5).clamp(min=1e-12)
            zero = torch.full_like(scale, 8.0)
        q = (torch.round(wg / scale[..., None]) + zero[..., None]).clamp(0, 15)
        out = {"qweight": pack_int4(q.reshape(n, k)), "scale": scale}
        if layout.zero_points:
            out["zero"] = zero.to(torch.uint8)
        return out
    from gguf import GGMLQuantizationType, quantize

    raw = quantize(w.numpy().astype(np.float32), GGMLQuantizationType(layout.ggml_type))
    return {"qweight": torch.from_numpy(raw)}


class RtnTestMethod(QuantizationMethod):
    """TEST method: float checkpoint weights quantized at load into ``LAYOUT``."""

    LAYOUT: ClassVar[QuantLayout]
    supported_platforms: ClassVar[tuple[str, ...]] = ("cpu",)

    def layout(self) -> QuantLayout:
        return self.LAYOUT

    def create_weights(
        self, layer: torch.nn.Module, in_features: int, out_features: int, dtype: torch.dtype
    ) -> None:
        layer.weight = torch.nn.Parameter(
            torch.empty(out_features, in_features, dtype=dtype), requires_grad=False
        )

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        tensors = rtn_quantize(self.LAYOUT, layer.weight.data)
        layer.qpacked = layer.layer_ops.pack_quantized(self.LAYOUT, tensors)
        del layer.weight

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return layer.layer_ops.quantized_linear(self.LAYOUT, x, layer.qpacked, bias)


def rtn_method(suffix: str) -> type[RtnTestMethod]:
    """The test method class for ``LAYOUTS[suffix]``, named ``test_rtn_<suffix>``."""
    return type(f"RtnTest_{suffix}", (RtnTestMethod,),
                {"name": f"test_rtn_{suffix}", "LAYOUT": LAYOUTS[suffix]})  # fmt: skip


class RtnTestPlugin:
    """Registers one test method per layout (``test_rtn_int8``, ``test_rtn_int4``, ...)."""

    @hookimpl
    def register_quantization_methods(self, register: Callable[[type], None]) -> None:
        for suffix in LAYOUTS:
            register(rtn_method(suffix))


def greedy_tokens(model: Any, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy continuation of ``prompt`` through ``model`` (prefill, then one token per step);
    returns the tokens and the first step's logits."""
    from test_models_helpers import PagedRunner

    runner = PagedRunner(model, num_blocks=-(-(len(prompt) + steps) // 4) + 2, block_size=4)
    seq = runner.add_sequence(len(prompt) + steps)
    logits = runner.step({seq: prompt})[0][-1]
    first, out = logits, []
    for _ in range(steps):
        token = int(logits.argmax())
        out.append(token)
        logits = runner.step({seq: [token]})[0][-1]
    return out, first

"""Quantization method ``ascend_w8a8``: int8 weights, int8 activations, on Ascend NPUs.

The checkpoint format is vllm-ascend's W8A8 (msModelSlim's static W8A8, selected there with
``quantization="ascend"`` and ``"W8A8"`` per layer in quant_model_description.json); IronLM
registers one method per scheme, so the name here is ``ascend_w8a8``.

Per linear layer (out_features x in_features):
  weight        (out, in)  int8      per-output-channel symmetric: W ~= weight_scale * weight
  weight_scale  (out, 1)   dtype
  weight_offset (out, 1)   dtype     must be 0 (symmetric; asymmetric weights are refused)
  input_scale   (1,)       dtype     per-tensor static activation quantization:
  input_offset  (1,)       int8        x ~= input_scale * (x_q - input_offset)
  quant_bias    (out,)     int32     -input_offset * sum_k weight[o, k]: the zero-point term
  deq_scale     (out,)     float32   input_scale * weight_scale

apply:  x_q = npu_quantize(x, 1 / input_scale, input_offset, torch.qint8, -1, False)
        y   = npu_quant_matmul(x_q, weight.t(), deq_scale, bias=quant_bias, output_dtype=x.dtype)
            = (x_q @ weight.t() + quant_bias) * deq_scale
            = input_scale * weight_scale * ((x_q - input_offset) @ weight.t())  ~=  x @ W.t()
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

import torch

from ironlm.interfaces.quantization import QuantizationMethod
from ironlm_ascend.npu_ops import import_torch_npu


class AscendW8A8Method(QuantizationMethod):
    """Static W8A8 through ``torch_npu.npu_quantize`` + ``torch_npu.npu_quant_matmul``."""

    name: ClassVar[str] = "ascend_w8a8"
    supported_platforms: ClassVar[tuple[str, ...]] = ("npu",)
    # HF quantization_config["quant_method"] values this method accepts
    config_names: ClassVar[tuple[str, ...]] = ("ascend_w8a8", "ascend")
    # npu_quant_matmul output dtypes for a float result (A2/A3 table: float16, bfloat16)
    output_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float16, torch.bfloat16)

    def __init__(self) -> None:
        self._npu: ModuleType | None = None  # torch_npu, resolved on first apply

    @classmethod
    def from_config(cls, quant_config: dict[str, Any] | None) -> AscendW8A8Method:
        method = (quant_config or {}).get("quant_method", cls.name)
        if method not in cls.config_names:
            raise ValueError(
                f"quantization {cls.name!r} cannot read a checkpoint quantized with "
                f"quant_method={method!r} (accepted: {', '.join(cls.config_names)})"
            )
        return cls()

    def create_weights(
        self, layer: torch.nn.Module, in_features: int, out_features: int, dtype: torch.dtype
    ) -> None:
        def param(*shape: int, dtype: torch.dtype) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)

        layer.weight = param(out_features, in_features, dtype=torch.int8)
        layer.weight_scale = param(out_features, 1, dtype=dtype)
        layer.weight_offset = param(out_features, 1, dtype=dtype)
        layer.input_scale = param(1, dtype=dtype)
        layer.input_offset = param(1, dtype=torch.int8)
        layer.quant_bias = param(out_features, dtype=torch.int32)
        layer.deq_scale = param(out_features, dtype=torch.float32)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Derive what the kernels take: npu_quantize's element-wise scale/offset vectors (in
        the activation dtype, one per input feature, as vllm-ascend repeats them) and the
        float32 deq_scale. deq_scale is recomputed: fp16 checkpoints store it bit-packed as int64
        (npu_trans_quant_param), which only the graph-mode path needs."""
        if torch.count_nonzero(layer.weight_offset.data) != 0:
            raise ValueError(
                f"quantization {self.name!r} supports symmetric weights only; this checkpoint "
                "has a non-zero weight_offset"
            )
        in_features = layer.weight.shape[1]
        act_dtype = layer.input_scale.dtype
        input_scale = layer.input_scale.data.float()
        reciprocal = (1.0 / input_scale).to(act_dtype).repeat(in_features)  # (in,)
        offset = layer.input_offset.data.to(act_dtype).repeat(in_features)  # (in,)
        layer.register_buffer("aclnn_input_scale_reciprocal", reciprocal, persistent=False)
        layer.register_buffer("aclnn_input_offset", offset, persistent=False)
        deq = input_scale * layer.weight_scale.data.float().flatten()
        layer.deq_scale.data = deq.to(layer.deq_scale.device)

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if x.dtype not in self.output_dtypes:
            raise ValueError(
                f"quantization {self.name!r} computes in float16 or bfloat16 "
                f"(npu_quant_matmul output dtypes); got activations in {x.dtype}"
            )
        npu = self._torch_npu()
        # torch_npu doc: npu_quantize(input, scales, zero_points, dtype, axis=1, div_mode=True)
        # div_mode=False: result = input * scales + zero_points, saturated to int8; with
        # axis=-1 the 1-D scales/zero_points run along the last axis (zero_points share the
        # scales' dtype). Called as vllm-ascend's quant_per_tensor does.
        x_q = npu.npu_quantize(
            x, layer.aclnn_input_scale_reciprocal, layer.aclnn_input_offset, torch.qint8, -1, False
        )
        # torch_npu doc: npu_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None,
        #   bias=None, output_dtype=None, group_sizes=None) -> Tensor
        # int32 bias: out = (x1 @ x2 + bias) * scale; x2 given as the transpose of the (n, k)
        # weight, as the doc's bfloat16-output example does.
        out = npu.npu_quant_matmul(
            x_q, layer.weight.t(), layer.deq_scale, bias=layer.quant_bias, output_dtype=x.dtype
        )
        return out if bias is None else out + bias

    @classmethod
    def quantize(
        cls, weight: torch.Tensor, *, input_min: float = -8.0, input_max: float = 8.0
    ) -> dict[str, torch.Tensor]:
        """Quantize one float weight (out, in) into the tensors ``create_weights`` declares.

        ``input_min``/``input_max`` are the calibrated range of the layer's input activations
        (static per-tensor quantization needs it; a calibration run records it). The default
        [-8, 8] suits RMS-normalised inputs at a resolution of 16/255; values outside saturate.
        Scales are returned in ``weight.dtype``.
        """
        if weight.dim() != 2 or not weight.is_floating_point():
            raise ValueError(f"quantize() takes a float (out, in) weight; got {weight.shape}")
        low, high = min(float(input_min), 0.0), max(float(input_max), 0.0)
        if high - low <= 0.0:
            raise ValueError(f"empty activation range [{input_min}, {input_max}]")
        w = weight.detach().float()
        weight_scale = (w.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-12)  # (out, 1)
        q_weight = torch.round(w / weight_scale).clamp(-127, 127).to(torch.int8)
        input_scale = (high - low) / 255.0
        input_offset = int(max(-128, min(127, round(-128.0 - low / input_scale))))
        quant_bias = -input_offset * q_weight.to(torch.int64).sum(dim=1)  # (out,)
        dtype = weight.dtype
        return {
            "weight": q_weight,
            "weight_scale": weight_scale.to(dtype),
            "weight_offset": torch.zeros_like(weight_scale, dtype=dtype),
            "input_scale": torch.tensor([input_scale], dtype=dtype),
            "input_offset": torch.tensor([input_offset], dtype=torch.int8),
            "quant_bias": quant_bias.to(torch.int32),
            "deq_scale": (input_scale * weight_scale.flatten()).to(torch.float32),
        }

    def _torch_npu(self) -> ModuleType:
        if self._npu is None:
            self._npu = import_torch_npu()
        return self._npu

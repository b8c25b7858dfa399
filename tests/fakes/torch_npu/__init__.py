"""TEST FAKE of ``torch_npu`` -- not torch_npu, and never installed.

Pure-torch CPU reference implementations of the few torch_npu operators that ironlm-ascend calls,
with their documented signatures, argument checks for the documented constraints the plugin
relies on, and the documented semantics. Tests put ``tests/fakes`` on ``sys.path`` so that the
plugin's ``importlib.import_module("torch_npu")`` resolves here. Passing against this fake proves
the plugin calls the operators as documented; it proves nothing about the hardware kernels.

Operators and the documents they follow:
  _npu_reshape_and_cache, _npu_paged_attention  -- op-plugin op_plugin/ops/atb/*.cpp schemas,
      ATB ReshapeAndCacheOperation / PagedAttentionOperation docs
  npu_fused_infer_attention_score               -- op-plugin
      docs/context/torch_npu-npu_fused_infer_attention_score.md
  npu_quantize, npu_quant_matmul                -- op-plugin docs/context/torch_npu-npu_quantize.md,
      torch_npu-npu_quant_matmul.md
  npu_dynamic_quant                             -- torch_npu API reference (ptaoplist
      torch_npu.npu_dynamic_quant) and CANN's aclnnDynamicQuant formula
"""

from __future__ import annotations

from torch_npu._attention import (
    _npu_paged_attention,
    _npu_reshape_and_cache,
    npu_fused_infer_attention_score,
)
from torch_npu._quant import npu_dynamic_quant, npu_quant_matmul, npu_quantize

__version__ = "0.0.0+ironlm.testfake"
IS_IRONLM_TEST_FAKE = True

__all__ = [
    "_npu_paged_attention",
    "_npu_reshape_and_cache",
    "npu_dynamic_quant",
    "npu_fused_infer_attention_score",
    "npu_quant_matmul",
    "npu_quantize",
]

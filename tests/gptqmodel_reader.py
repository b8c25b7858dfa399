"""Reads a GPTQ or AWQ folder with HF transformers + GPTQModel (the reference readers of both
formats) and saves what they make of it: ``python gptqmodel_reader.py FOLDER OUT.pt IDS_JSON``.

Run in its own process by tests/test_quant_reference_read.py: importing gptqmodel patches
transformers' quantizers and safetensors' save_file and starts worker threads, which must not
leak into the test session. Imports nothing from ironlm.

OUT.pt holds:
- ``kernels``: the quantized linear classes transformers loaded (GPTQModel's pure-torch ones,
  forced by the backend below: no native extension is built);
- ``weights``: module name -> (N, K) float32 weight of every quantized linear, dequantized by
  GPTQModel's own code (its qweight / qzeros / g_idx handling), with the scales widened to
  float32 first so that the products are exact;
- ``logits_kernel``: the logits of ``IDS_JSON`` through GPTQModel's kernels as loaded (float16:
  the torch kernels take float16 / bfloat16 only);
- ``logits_float``: the logits of the same model in float32 with every quantized linear replaced
  by an ``nn.Linear`` holding its ``weights`` and every other tensor re-read in float32 from the
  folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from gptqmodel.nn_modules.qlinear.torch import TorchLinear
from gptqmodel.nn_modules.qlinear.torch_awq import AwqTorchLinear
from gptqmodel.quantization.awq.utils.packing_utils import dequantize_gemm
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AwqConfig, GPTQConfig


def main(folder: Path, out: Path, ids: list[int]) -> None:
    method = json.loads((folder / "config.json").read_text())["quantization_config"]["quant_method"]
    # the pure-torch kernels (AUTO would pick a CPU kernel that compiles a C++ extension)
    override = (GPTQConfig(bits=4, backend="gptq_torch") if method == "gptq"
                else AwqConfig(bits=4, backend="torch_awq"))  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(
        folder, device_map="cpu", dtype=torch.float16, quantization_config=override
    )
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        logits_kernel = model(input_ids=input_ids).logits[0].float()

    kernels, weights = set(), {}
    for name, module in model.named_modules():
        if isinstance(module, TorchLinear):  # GPTQ; qzeros already converted to its "v2" zeros
            module.scales = module.scales.float()
            w = TorchLinear.dequantize_weight(module)  # (K, N), rows in input order via g_idx
        elif isinstance(module, AwqTorchLinear):
            w = dequantize_gemm(module.qweight, module.qzeros, module.scales.float(),
                                module.bits, module.group_size)  # fmt: skip
        else:
            continue
        kernels.add(type(module).__name__)
        weights[name] = w.t().contiguous()

    for name, w in weights.items():
        parent, child = name.rsplit(".", 1)
        linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        linear.weight = torch.nn.Parameter(w, requires_grad=False)
        setattr(model.get_submodule(parent), child, linear)
    torch.nn.Module.float(model)  # transformers refuses .float() on a quantized model
    state = model.state_dict()
    stored = {}
    for f in folder.glob("*.safetensors"):
        stored.update(load_file(str(f)))
    model.load_state_dict({k: v for k, v in stored.items() if k in state}, strict=False)
    model.tie_weights()
    with torch.no_grad():
        logits_float = model(input_ids=input_ids).logits[0].float()

    torch.save({"kernels": sorted(kernels), "weights": weights, "logits_kernel": logits_kernel,
                "logits_float": logits_float}, out)  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]))

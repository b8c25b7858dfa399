"""The reference readers read what ``ironlm quantize`` writes (issue 15): HF transformers with
GPTQModel (which transformers needs for both formats; the GPTQ path also needs optimum) loads
SmolLM2 quantized by the tool as ``gptq`` and as ``awq`` on the CPU, and

- GPTQModel's own dequantization of every quantized linear equals ours exactly;
- the float32 model with those weights gives our logits (float32, reference kernels);
- GPTQModel's own float16 torch kernels give our logits within float16 rounding.

The reading runs in a child process (tests/gptqmodel_reader.py: importing gptqmodel patches
transformers and safetensors), with the interpreter named by IRONLM_REFERENCE_PYTHON (default:
the one running the tests). Skipped where that default lacks gptqmodel or optimum; an error where
IRONLM_REFERENCE_PYTHON names one that lacks them. They are not in the CI's install, nor meant
for the project's venv (peft imports an installed gptqmodel whenever it wraps a linear, so the
LoRA tests would load it too): a venv of their own, about a minute on 2 cores, whose one C
extension (PyPcre) builds against the system PCRE2 in seconds:

    apt-get install -y libpcre2-dev
    python3 -m venv .venv-ref
    .venv-ref/bin/pip install torch==2.13.0
    .venv-ref/bin/pip install transformers==5.24.0 accelerate==1.15.0 pillow requests
    .venv-ref/bin/pip install --no-deps gptqmodel==7.7.0 optimum==2.3.0 pypcre==0.6.4 \
        logbar==0.4.15 tokenicer==0.0.14 device-smi==0.5.7 defuser==0.0.28 threadpoolctl
    IRONLM_REFERENCE_PYTHON=.venv-ref/bin/python .venv/bin/python -m pytest -q \
        tests/test_quant_reference_read.py

``--no-deps`` matters: GPTQModel 7.7.0 asks for torch>=2.14.1 (pip would bring a CUDA torch)
and for packages that reading a checkpoint does not use (datasets, pyarrow, torchao, maturin).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch
from quant_helpers import our_logits
from safetensors.torch import load_file
from test_models_helpers import assert_logits_close

from ironlm.interfaces.quant import dequantize
from ironlm.plugin_manager import PluginManager

pytestmark = pytest.mark.real_model

PYTHON = os.environ.get("IRONLM_REFERENCE_PYTHON") or sys.executable
READER = Path(__file__).resolve().parent / "gptqmodel_reader.py"
IDS = [1, 504, 3216, 314, 253, 1345, 28, 9110, 30, 2, 504, 3458, 282, 4649, 314]
METHODS = ("gptq", "awq")
KERNELS = {"gptq": ["TorchLinear"], "awq": ["AwqTorchLinear"]}


def _missing() -> list[str]:
    probe = ("import importlib.util as u; print(' '.join(m for m in ('gptqmodel', 'optimum') "
             "if u.find_spec(m) is None))")  # fmt: skip
    try:
        out = subprocess.run([PYTHON, "-c", probe], check=False, capture_output=True, text=True,
                             timeout=60)  # fmt: skip
    except OSError as exc:
        return [f"{PYTHON} ({exc})"]
    return out.stdout.split() if out.returncode == 0 else [f"{PYTHON} ({out.stderr.strip()})"]


_MISSING = _missing()
if _MISSING:
    _WHY = (f"reference readers not installed for {PYTHON}: {', '.join(_MISSING)} (see this "
            f"file's docstring)")  # fmt: skip
    if os.environ.get("IRONLM_REFERENCE_PYTHON"):
        raise RuntimeError(_WHY)
    pytest.skip(_WHY, allow_module_level=True)


@pytest.fixture(scope="module")
def reference(
    quantized_smollm2: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], dict]:
    """method -> (folder, what GPTQModel read from it), read once per module."""
    root = tmp_path_factory.mktemp("reference-read")
    read: dict[str, dict] = {}

    def get(method: str) -> dict:
        if method not in read:
            folder = quantized_smollm2(method)
            out = root / f"{method}.pt"
            env = {**os.environ, "TORCHDYNAMO_DISABLE": "1"}  # its torch kernel compiles lazily
            proc = subprocess.run([PYTHON, str(READER), str(folder), str(out), json.dumps(IDS)],
                                  check=False, capture_output=True, text=True, env=env,
                                  timeout=600)  # fmt: skip
            assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
            read[method] = {"folder": folder, **torch.load(out)}
        return read[method]

    return get


def _ours_dequantized(folder: Path) -> dict[str, torch.Tensor]:
    """module name -> (N, K) float32 weight of every quantized linear, through our method's
    checkpoint reading (``checkpoint_tensor``, ``canonical_tensors``) and the int4 layout's
    ``dequantize``; act-order input rows put back in the checkpoint's order."""
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    cls = PluginManager().registries.quantization_methods.get(config["quant_method"])
    method = cls.from_config(config)
    tensors = load_file(str(folder / "model.safetensors"))
    out = {}
    for name in sorted(n.removesuffix(".qweight") for n in tensors if n.endswith(".qweight")):
        k = tensors[f"{name}.scales"].shape[0] * method.group_size
        n = tensors[f"{name}.scales"].shape[1]
        layer = torch.nn.Module()
        method.create_weights(layer, k, n, torch.float32)
        for pname, param in layer.named_parameters():
            param.data = method.checkpoint_tensor(pname, tensors[f"{name}.{pname}"])
        w = dequantize(method.layout(), method.canonical_tensors(layer))
        perm = getattr(layer, "input_perm", None)
        out[name] = w if perm is None else w[:, torch.argsort(perm)]
    return out


@pytest.mark.parametrize("method", METHODS)
def test_gptqmodel_dequantizes_every_linear_as_we_do(reference: Callable[[str], dict],
                                                     method: str) -> None:  # fmt: skip
    read = reference(method)
    assert read["kernels"] == KERNELS[method]
    ours = _ours_dequantized(read["folder"])
    assert sorted(read["weights"]) == sorted(ours)
    assert len(ours) == 30 * 7  # every decoder linear of SmolLM2
    for name, w in ours.items():
        assert torch.equal(read["weights"][name], w), name


@pytest.mark.parametrize("method", METHODS)
def test_transformers_logits_match_ours(reference: Callable[[str], dict], method: str) -> None:
    read = reference(method)
    ours = our_logits(read["folder"], IDS)
    # float32 with GPTQModel's weights: only summation order differs (measured 3e-6 relative)
    assert_logits_close(ours, read["logits_float"], rel_tol=1e-4)
    # GPTQModel's float16 kernels as loaded (measured 3.6e-3 relative)
    kernel = read["logits_kernel"]
    diff = (ours - kernel).abs().max().item()
    assert diff <= 1e-2 * kernel.abs().max().item(), diff

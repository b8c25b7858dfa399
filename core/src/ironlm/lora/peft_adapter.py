"""Reading a LoRA adapter as the ``peft`` library saves it.

A folder holds ``adapter_config.json`` and ``adapter_model.safetensors`` (or the older
``adapter_model.bin``). Tensors are named after the module they adapt, for example
``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` (r, in) and
``...q_proj.lora_B.weight`` (out, r). The adapter adds ``scaling * B @ A @ x`` to the module's
output, with ``scaling = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with ``use_rslora``);
``rank_pattern`` / ``alpha_pattern`` override r and alpha per module (keys matched against the
module name's tail, as peft matches them).

What IronLM refuses, with the reason: DoRA, trained biases (``bias`` / ``lora_bias``),
``modules_to_save`` (whole replaced modules), adapters that add tokens
(``new_embeddings.safetensors``), embedding or LM-head LoRA, ranks above ``max_lora_rank``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# peft prefixes every module name with the PeftModel's wrapper path
_PEFT_PREFIX = "base_model.model."
# the names LoRA may target: attention and MLP projections of the Llama family and Gemma 3
SUPPORTED_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRAAdapterError(ValueError):
    """An adapter that cannot be served here; the message names the adapter and the reason."""


@dataclass
class LoRAModuleWeights:
    """One adapted module: ``delta(x) = x @ a.T @ b.T`` (the scaling is folded into ``b``)."""

    a: torch.Tensor  # (rank, in_features) float32
    b: torch.Tensor  # (out_features, rank) float32, times the module's scaling

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass
class PeftAdapter:
    path: str
    config: dict[str, Any]
    where: str  # how error messages name it: "LoRA adapter 'name' at 'path'"
    # HF module name (``model.layers.0.self_attn.q_proj``) -> its weights
    modules: dict[str, LoRAModuleWeights] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return max((m.rank for m in self.modules.values()), default=0)


def load_peft_adapter(path: str | Path, max_lora_rank: int, name: str | None = None) -> PeftAdapter:
    """Read and check one adapter folder; LoRAAdapterError says what is wrong."""
    folder = Path(path).expanduser()
    where = f"LoRA adapter {name!r} at {str(path)!r}" if name else \
        f"LoRA adapter at {str(path)!r}"
    if not folder.is_dir():
        raise LoRAAdapterError(f"{where}: no such folder")
    config = _read_config(folder / "adapter_config.json", where)
    _check_config(config, where)
    if (folder / "new_embeddings.safetensors").exists() or (folder / "new_embeddings.bin").exists():
        raise LoRAAdapterError(
            f"{where} adds tokens to the vocabulary (new_embeddings): not supported; adapters "
            "share the base model's vocabulary (as in current vLLM)"
        )
    tensors = _read_tensors(folder, where)
    modules = _pair_tensors(tensors, config, where)
    adapter = PeftAdapter(str(path), config, where, modules)
    if not modules:
        raise LoRAAdapterError(f"{where} holds no lora_A / lora_B weights")
    if adapter.rank > max_lora_rank:
        raise LoRAAdapterError(
            f"{where}: LoRA rank {adapter.rank} is greater than max_lora_rank {max_lora_rank}"
        )
    return adapter


def _read_config(file: Path, where: str) -> dict[str, Any]:
    if not file.is_file():
        raise LoRAAdapterError(f"{where}: no adapter_config.json (not a PEFT adapter folder)")
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise LoRAAdapterError(f"{where}: adapter_config.json is unreadable: {exc}") from None
    if not isinstance(config, dict):
        raise LoRAAdapterError(f"{where}: adapter_config.json is not a JSON object")
    return config


def _check_config(config: dict[str, Any], where: str) -> None:
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise LoRAAdapterError(f"{where} is a {peft_type} adapter; only LORA is supported")
    for key in ("r", "lora_alpha"):
        value = config.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise LoRAAdapterError(f"{where}: adapter_config.json {key} must be positive, "
                                   f"got {value!r}")
    if config.get("use_dora"):
        raise LoRAAdapterError(f"{where} is a DoRA adapter (use_dora): not supported")
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        raise LoRAAdapterError(f"{where} trains biases (bias / lora_bias): not supported")
    if config.get("modules_to_save"):
        raise LoRAAdapterError(
            f"{where} replaces whole modules (modules_to_save={config['modules_to_save']}): "
            "not supported"
        )
    if config.get("fan_in_fan_out"):
        raise LoRAAdapterError(f"{where}: fan_in_fan_out (Conv1D layers) is not supported")


def _read_tensors(folder: Path, where: str) -> dict[str, torch.Tensor]:
    st, binary = folder / "adapter_model.safetensors", folder / "adapter_model.bin"
    try:
        if st.is_file():
            from safetensors.torch import load_file

            return load_file(str(st))
        if binary.is_file():
            loaded = torch.load(str(binary), map_location="cpu", weights_only=True)
            if not isinstance(loaded, dict):
                raise ValueError("not a state dict")
            return loaded
    except Exception as exc:  # any reader failure is a corrupt file, reported as such
        name = st.name if st.is_file() else binary.name
        raise LoRAAdapterError(f"{where}: {name} is unreadable: {exc}") from None
    raise LoRAAdapterError(
        f"{where}: no adapter_model.safetensors or adapter_model.bin in the folder"
    )


def _pair_tensors(
    tensors: dict[str, torch.Tensor], config: dict[str, Any], where: str
) -> dict[str, LoRAModuleWeights]:
    """Module name -> (A, scaled B), checking every lora_A has its lora_B and vice versa."""
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        module, kind = _split_name(name, where)
        halves.setdefault(module, {})[kind] = tensor
    out: dict[str, LoRAModuleWeights] = {}
    for module, pair in halves.items():
        if set(pair) != {"lora_A", "lora_B"}:
            lacking = "lora_B" if "lora_A" in pair else "lora_A"
            raise LoRAAdapterError(f"{where}: {module} has no {lacking} weight")
        a, b = pair["lora_A"], pair["lora_B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise LoRAAdapterError(
                f"{where}: {module} lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} are "
                "not (r, in) and (out, r)"
            )
        scaling = _scaling(config, module, int(a.shape[0]))
        out[module] = LoRAModuleWeights(a.float().contiguous(), (b.float() * scaling).contiguous())
    return out


def _split_name(name: str, where: str) -> tuple[str, str]:
    """``base_model.model.X.lora_A.weight`` -> (``X``, ``lora_A``)."""
    path = name[len(_PEFT_PREFIX):] if name.startswith(_PEFT_PREFIX) else name
    parts = path.split(".")
    if len(parts) >= 3 and parts[-2] in ("lora_A", "lora_B") and parts[-1] == "weight":
        module, kind = ".".join(parts[:-2]), parts[-2]
    elif len(parts) >= 4 and parts[-3] in ("lora_A", "lora_B") and parts[-1] == "weight":
        module, kind = ".".join(parts[:-3]), parts[-3]  # an unstripped adapter name
    else:
        what = "embedding LoRA" if "lora_embedding" in name else \
            "DoRA magnitude" if "magnitude" in name else "an unexpected tensor"
        raise LoRAAdapterError(f"{where}: {name!r} is {what}; only lora_A / lora_B weights of "
                               "linear layers are supported")
    target = module.rsplit(".", 1)[-1]
    if target not in SUPPORTED_TARGETS:
        raise LoRAAdapterError(
            f"{where} targets module {module!r}: only {', '.join(SUPPORTED_TARGETS)} are "
            "supported"
        )
    return module, kind


def _scaling(config: dict[str, Any], module: str, rank: int) -> float:
    alpha = float(config["lora_alpha"])
    for key, value in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):  # peft's matching of pattern keys
            alpha = float(value)
            break
    if config.get("use_rslora"):
        return alpha / math.sqrt(rank)
    return alpha / rank

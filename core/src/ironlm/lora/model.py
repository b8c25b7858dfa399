"""Adapters on a model: which linear layers take LoRA, and an adapter's weights cut for them.

Adapters name HF modules (``model.layers.3.self_attn.q_proj``); the model merges some of them
(q/k/v -> ``qkv_proj``, gate/up -> ``gate_up_proj``) and names them through ``weight_targets``,
the same routing the checkpoint loader uses. ``LoRAModel.prepare`` resolves each adapted module
to its layer and part, checks the shapes against the base model, and cuts this rank's shard of A
and B as the layer cuts its weight (``LinearBase.shard_output_rows`` /
``shard_input_columns``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ironlm.interfaces.platform import LayerOps
from ironlm.layers.linear import LinearBase
from ironlm.layers.weight_loading import resolve_target
from ironlm.lora.layer import LinearLoRA, LoRAStepState
from ironlm.lora.peft_adapter import SUPPORTED_TARGETS, LoRAAdapterError, PeftAdapter

# per layer path: per part, this rank's (A (r, input_size), B (part rows, r))
LayerWeights = dict[str | int | None, tuple[torch.Tensor, torch.Tensor]]


@dataclass
class PreparedAdapter:
    """One adapter ready to copy into a slot: its layers' weights in the LoRA dtype."""

    lora_id: int
    rank: int
    layers: dict[str, LayerWeights]

    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for lw in self.layers.values() for a, b in lw.values())


class LoRAModel:
    """Attaches adapter slots to every LoRA-capable linear layer of ``model``."""

    def __init__(
        self,
        model: torch.nn.Module,
        max_loras: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
        layer_ops: LayerOps,
    ) -> None:
        self.modules = dict(model.named_modules())
        self.state = LoRAStepState(max_loras, device)
        self.dtype = dtype
        self.max_rank = max_rank
        self.layers: dict[str, LinearLoRA] = {}
        for path in _lora_layer_paths(self.modules):
            layer = self.modules[path]
            assert isinstance(layer, LinearBase)
            layer.lora = LinearLoRA(layer.lora_parts(), layer.input_size, max_loras, max_rank,
                                    dtype, device, self.state, layer_ops)
            self.layers[path] = layer.lora
        if not self.layers:
            raise ValueError(f"{type(model).__name__} has no layer LoRA can adapt")

    def prepare(self, adapter: PeftAdapter, lora_id: int) -> PreparedAdapter:
        """Resolve, check and shard every adapted module (LoRAAdapterError naming the first
        module the model lacks or whose shape differs)."""
        where = adapter.where
        out: dict[str, LayerWeights] = {}
        for name, weights in adapter.modules.items():
            path, shard_id = resolve_target(self.modules, name)
            layer = self.modules.get(path) if path is not None else None
            if path not in self.layers or not isinstance(layer, LinearBase):
                raise LoRAAdapterError(f"{where} targets {name!r}, which this model lacks")
            expected_in = layer.in_features
            expected_out = _part_out_features(layer, shard_id)
            if weights.a.shape[1] != expected_in or weights.b.shape[0] != expected_out:
                raise LoRAAdapterError(
                    f"{where} does not fit the base model: {name} has lora_A "
                    f"{tuple(weights.a.shape)} and lora_B {tuple(weights.b.shape)}, the "
                    f"model's layer takes ({weights.rank}, {expected_in}) and "
                    f"({expected_out}, {weights.rank})"
                )
            a = layer.shard_input_columns(weights.a).to(self.dtype).contiguous()
            b = layer.shard_output_rows(weights.b, shard_id).to(self.dtype).contiguous()
            out.setdefault(path, {})[shard_id] = (a, b)
        return PreparedAdapter(lora_id, adapter.rank, out)

    def set_slot(self, slot: int, adapter: PreparedAdapter) -> None:
        self.state.slot_ranks[slot] = adapter.rank
        for path, lora in self.layers.items():
            weights = adapter.layers.get(path)
            if weights is None:
                lora.clear_slot(slot)
            else:
                lora.set_slot(slot, weights)


def _lora_layer_paths(modules: dict[str, torch.nn.Module]) -> list[str]:
    """Linear layers an adapter may target: those loading q/k/v/o/gate/up/down weights."""
    paths = []
    for path, module in modules.items():
        if not isinstance(module, LinearBase):
            continue
        parent_path, _, child = path.rpartition(".")
        parent = modules.get(parent_path)
        targets = getattr(parent, "weight_targets", None)
        names = {child}
        if targets is not None:
            names |= {ckpt for ckpt, (dst, _) in targets().items() if dst == child}
        if names & set(SUPPORTED_TARGETS):
            paths.append(path)
    return paths


def _part_out_features(layer: LinearBase, shard_id: str | int | None) -> int:
    """Full (unsharded) output features of one part of ``layer``."""
    if shard_id is None:
        return layer.out_features
    sizes = getattr(layer, "output_sizes", None)
    if isinstance(shard_id, int) and sizes is not None:
        return int(sizes[shard_id])
    head_dim = int(getattr(layer, "head_dim"))
    heads = layer.total_num_heads if shard_id == "q" else layer.total_num_kv_heads  # type: ignore[attr-defined]
    return int(heads) * head_dim

"""A worker extension as reinforcement-learning frameworks write one for vLLM (TRL's and
OpenRLHF's weight-sync classes: methods that reach the model through ``self.model_runner``),
and module-level callables for ``collective_rpc``. A module of its own so that worker
processes import it by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class WeightSyncExtension:
    """Mixed into the worker by ``worker_extension_cls``: ``self`` is the worker."""

    def update_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.model_runner.model.load_weights(weights=weights)  # type: ignore[attr-defined]

    def update_weight(self, name: str, tensor: torch.Tensor) -> None:
        self.model_runner.model.load_weights(weights=[(name, tensor)])  # type: ignore[attr-defined]

    def rank_and_world(self) -> tuple[int, int]:
        return self.rank.rank, self.rank.world_size  # type: ignore[attr-defined]


class ClashingExtension:
    def execute_model(self) -> None:  # the worker's own method: refused
        raise AssertionError("never called")


def load_weights_call(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> int:
    """A callable for ``collective_rpc``: the worker comes first. Returns the call's rank."""
    worker.model_runner.model.load_weights(weights)
    return int(worker.rank.rank)


def qkv_rows(model: torch.nn.Module) -> int:
    """For ``apply_model``: output rows of this rank's first q/k/v projection (its shard)."""
    layer = model.model.stage_layers()[0]  # type: ignore[union-attr, operator]
    return int(layer.self_attn.qkv_proj.output_size)


def perturbed(model_dir: Path, scale: float = 0.05) -> tuple[Any, dict[str, torch.Tensor]]:
    """HF's model with every matrix moved by ``scale`` of its own spread (seeded), and those
    new matrices by name (the tied LM head is the embedding: sent once, as trainers do)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    new = {name: w + scale * w.std() * torch.randn(w.shape, generator=gen)
           for name, w in hf.state_dict().items() if w.dim() == 2 and name != "lm_head.weight"}
    hf.load_state_dict(new, strict=False)
    return hf, new

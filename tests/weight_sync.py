"""A worker extension as reinforcement-learning frameworks write one for vLLM (TRL's and
OpenRLHF's weight-sync classes: methods that reach the model through ``self.model_runner``),
and module-level callables for ``collective_rpc``. A module of its own so that worker
processes import it by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class WeightSyncExtension:
    """Made a base of the worker's class by ``worker_extension_cls``: ``self`` is the worker.
    Like TRL's, it declares state as class attributes and calls its own helpers."""

    updates_applied = 0  # class attribute, set per worker once an update lands

    def update_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self._apply_update(weights)

    def update_weight(self, name: str, tensor: torch.Tensor) -> None:
        self._apply_update([(name, tensor)])

    def _apply_update(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.model_runner.model.load_weights(weights=weights)  # type: ignore[attr-defined]
        self.updates_applied += 1

    def updates(self) -> int:
        return self.updates_applied

    def rank_and_world(self) -> tuple[int, int]:
        return self.rank, self.worker_rank.world_size  # type: ignore[attr-defined]


class ClashingExtension:
    def execute_model(self) -> None:  # the worker's own method: refused
        raise AssertionError("never called")


def load_weights_call(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> int:
    """A callable for ``collective_rpc``: the worker comes first. Returns the call's rank."""
    worker.model_runner.model.load_weights(weights)
    return int(worker.rank)


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


def greedy_logprobs(
    llm: Any, prompts: list[str], params: Any
) -> list[tuple[list[int], list[float]]]:
    """(token ids, their logprobs) per prompt of ``llm.generate`` (``params`` with logprobs)."""
    result = []
    for out in llm.generate(prompts, params, use_tqdm=False):
        o = out.outputs[0]
        logprobs = [lp[t].logprob for t, lp in zip(o.token_ids, o.logprobs, strict=True)]
        result.append((list(o.token_ids), logprobs))
    return result

"""Routing checkpoint tensors (HF names) to the layers that own them.

A layer that holds weights implements ``load_weight(param_name, tensor, shard_id)`` and lists the
shards one parameter is assembled from in ``shard_ids`` (``(None,)`` for a whole tensor). A module
that merges several checkpoint modules into one (q/k/v -> qkv_proj) maps the checkpoint names to
its child and shard in ``weight_targets()``.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

ShardId = str | int | None


def load_named_weights(
    model: torch.nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    skip: Callable[[str], bool] = lambda name: False,
) -> None:
    """Load every (HF name, tensor) into ``model``; ValueError on an unknown name, a shape that
    does not fit, or a parameter (or shard of one) the checkpoint never provided."""
    modules = dict(model.named_modules())
    loaded: dict[str, set[ShardId]] = {}
    for name, tensor in weights:
        if skip(name):
            continue
        target_path, param_name, shard_id = route_weight(modules, name)
        load_one(modules[target_path], name, param_name, tensor, shard_id)
        loaded.setdefault(f"{target_path}.{param_name}" if target_path else param_name, set()).add(
            shard_id
        )
    _check_complete(model, modules, loaded)


def route_weight(modules: dict[str, torch.nn.Module], name: str) -> tuple[str, str, ShardId]:
    """(path of the layer that takes checkpoint tensor ``name``, its parameter name there,
    shard id); ValueError when no layer of the model takes it."""
    module_path, _, param_name = name.rpartition(".")
    target_path, shard_id = resolve_target(modules, module_path)
    if target_path is None:
        raise ValueError(f"unexpected weight {name!r}: no layer of the model takes it")
    if getattr(modules[target_path], "load_weight", None) is None:
        raise ValueError(f"unexpected weight {name!r}: {target_path} loads no weights")
    return target_path, param_name, shard_id


def load_one(
    target: torch.nn.Module, name: str, param_name: str, tensor: torch.Tensor, shard_id: ShardId
) -> None:
    """``target.load_weight``, with a failure naming checkpoint tensor ``name``."""
    try:
        target.load_weight(param_name, tensor, shard_id)
    except ValueError as exc:  # shapes, dtypes, formats: name the checkpoint tensor
        raise ValueError(f"checkpoint tensor {name!r}: {exc}") from exc


def resolve_target(
    modules: dict[str, torch.nn.Module], module_path: str
) -> tuple[str | None, ShardId]:
    """(path of the layer that takes weights of checkpoint module ``module_path``, shard id)."""
    if module_path in modules:
        return module_path, None
    parent_path, _, child = module_path.rpartition(".")
    parent = modules.get(parent_path)
    targets = getattr(parent, "weight_targets", None)
    if targets is None:
        return None, None
    mapping = targets()
    if child not in mapping:
        return None, None
    child_name, shard_id = mapping[child]
    return (f"{parent_path}.{child_name}" if parent_path else child_name), shard_id


def _check_complete(
    model: torch.nn.Module, modules: dict[str, torch.nn.Module], loaded: dict[str, set[ShardId]]
) -> None:
    missing: list[str] = []
    for full_name, _ in model.named_parameters():  # tied parameters appear once
        module_path, _, param_name = full_name.rpartition(".")
        needed = set(getattr(modules[module_path], "shard_ids", (None,)))
        got = loaded.get(full_name, set())
        if not needed <= got:
            lacking = sorted(str(s) for s in needed - got)
            missing.append(full_name if needed == {None} else f"{full_name} (shards {lacking})")
    if missing:
        shown = ", ".join(missing[:8]) + (
            f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        )
        raise ValueError(f"checkpoint lacks weights for: {shown}")

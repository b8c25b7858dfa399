"""Weight updates after loading: ``model.load_weights`` on a model whose layers already
processed their weights, as reinforcement-learning weight sync calls it (vLLM's pattern: a
trainer sends new weights, often one tensor a call, and the engine generates with them).

The first load fills parameters in the checkpoint's layout, then each layer repacks them for
the platform's kernels (``process_weights_after_loading``). An update runs that backwards,
one checkpoint tensor at a time: the layer that takes it gives its loaded parameters back
(``unpack_weights``: the platform's ``unpack_linear_weight``), the tensor is copied in through
the same ``load_weight`` as the first load (this rank's shard, its part of a merged q/k/v or
gate/up), and ``repack_weights`` writes the result into the tensors the forward reads, in
place. Their storage stays, so captured decode graphs replay with the new weights, and at
most one layer is unpacked at a time. Any subset of the checkpoint's names may come; the
rest keep their values. An embedding tied to the LM head is unpacked through the head (they
share one packed table). A quantized layer refuses its tensor (ValueError) before copying
it; tensors earlier in the same call stay applied.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from ironlm.layers.weight_loading import load_one, route_weight


def update_named_weights(
    model: torch.nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    skip: Callable[[str], bool] = lambda name: False,
) -> None:
    """Copy every (HF name, tensor) into the processed ``model``; ValueError on an unknown
    name, a shape that does not fit, or a layer that cannot take new weights."""
    modules = dict(model.named_modules())
    # a table tied to the LM head is held in the head's packed layout: unpack it there
    head_of = {id(m.tied_to): path for path, m in modules.items()
               if getattr(m, "tied_to", None) is not None}  # fmt: skip
    for name, tensor in weights:
        if skip(name):
            continue
        target_path, param_name, shard_id = route_weight(modules, name)
        target = modules[target_path]
        owner = modules[head_of.get(id(target), target_path)]
        if not hasattr(owner, "unpack_weights"):  # as loaded (norms): copied in directly
            load_one(target, name, param_name, tensor, shard_id)
            continue
        try:
            kept = owner.unpack_weights()
        except ValueError as exc:
            raise ValueError(f"checkpoint tensor {name!r}: {exc}") from exc
        try:
            load_one(target, name, param_name, tensor, shard_id)
        finally:  # the layer reads its packed tensors again, updated or not
            owner.repack_weights(kept)

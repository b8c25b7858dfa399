"""The LoRA side of one linear layer: adapter slots stacked for the segmented matmul.

A layer built from parts (``qkv_proj`` = q | k | v, ``gate_up_proj`` = gate | up) keeps one
(A, B) pair per part and slot. They are stacked so that one kernel call serves every token of
a step, whatever adapter each token uses:

    a: (max_loras, num_parts * max_rank, input_size)   rows [p*R, p*R + r_p) = part p's A
    b: (max_loras, max_rank, output_size)              rows [0, r_p), part p's columns = its B.T

``LayerOps.lora_linear`` adds, for each token t whose slot s = token_slots[t] >= 0,
``(x[t] @ a[s].T)[p*R:(p+1)*R] @ b[s, :, columns of p]`` to y's columns of part p. Unused rank rows
and columns stay zero, so an adapter of rank r < R costs nothing in accuracy. Scaling is
folded into B when an adapter loads.

``LoRAStepState`` is shared by every LoRA layer of a model: the worker sets the per-token slot
index before each forward (a decode graph binds its own static slot tensor while capturing).
"""

from __future__ import annotations

import torch

from ironlm.interfaces.platform import LayerOps


class LoRAStepState:
    """Which adapter slot each token of the running step uses (-1: the base model only), and
    the rank of the adapter in each slot (updated in place, so recorded kernels see it)."""

    def __init__(self, max_loras: int, device: torch.device) -> None:
        self.token_slots = torch.empty(0, dtype=torch.int32, device=device)  # (T,)
        self.slot_ranks = torch.zeros(max_loras, dtype=torch.int32, device=device)  # (S,)
        # False: no token of this step uses an adapter, LoRA layers skip the kernel
        self.active = False

    def bind(self, token_slots: torch.Tensor, active: bool) -> None:
        self.token_slots = token_slots
        self.active = active


class LinearLoRA:
    """Adapter slots of one linear layer (a plain object, never part of the model's state
    dict). ``parts`` lists the layer's output parts as (shard id, rows on this rank)."""

    def __init__(
        self,
        parts: list[tuple[str | int | None, int]],
        input_size: int,
        max_loras: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
        state: LoRAStepState,
        layer_ops: LayerOps,
    ) -> None:
        self.part_ids = [pid for pid, _ in parts]
        self.slices = tuple(size for _, size in parts)  # output rows of each part
        self.offsets = [sum(self.slices[:i]) for i in range(len(parts))]
        self.input_size = input_size
        self.max_rank = max_rank
        self.state = state
        self.layer_ops = layer_ops
        output_size = sum(self.slices)
        self.a = torch.zeros(max_loras, len(parts) * max_rank, input_size, dtype=dtype,
                             device=device)
        self.b = torch.zeros(max_loras, max_rank, output_size, dtype=dtype, device=device)

    def set_slot(
        self, slot: int, weights: dict[str | int | None, tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        """Fill ``slot`` with one adapter's (A (r, input_size), B (part rows, r)) per part it
        adapts; parts it leaves alone stay zero."""
        self.clear_slot(slot)
        R = self.max_rank
        for pid, (a, b) in weights.items():
            p = self.part_ids.index(pid)
            r = a.shape[0]
            self.a[slot, p * R : p * R + r].copy_(a)
            self.b[slot, :r, self.offsets[p] : self.offsets[p] + self.slices[p]].copy_(b.T)

    def clear_slot(self, slot: int) -> None:
        self.a[slot].zero_()
        self.b[slot].zero_()

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y (T, output_size) plus each token's adapter delta of x (T, input_size)."""
        if not self.state.active:
            return y
        return self.layer_ops.lora_linear(y, x, self.a, self.b, self.slices,
                                          self.state.token_slots, self.state.slot_ranks)

"""The segmented LoRA matmul every platform provides (``LayerOps.lora_linear``): its layout and
its pure-torch reference.

One step's tokens may each use a different adapter (or none). A linear layer's adapters sit in
slots, stacked (see ``ironlm.lora.layer``)::

    lora_a: (S, P * R, K)   slot s, part p: rows [p*R, (p+1)*R) hold that part's A (r_p, K),
                            zero beyond r_p
    lora_b: (S, R, N)       slot s: B transposed; rows [0, r_p), part p's output columns hold
                            part p's B.T (scaled)
    slices: (N_0, ..., N_{P-1}), sum = N: output rows of each part (q | k | v, gate | up, or
                            one part for a plain layer)
    token_slots: (T,) int32, the slot of each token, -1 for the base model only
    slot_ranks: (S,) int32, the rank of the adapter in each slot (0: empty): rows of A and of
                            B.T from it on are zero, so a kernel may skip them

B is stored transposed so that the expand step reads contiguous output rows (an axpy per rank
row), which is what CPU kernels vectorise.

For token t with s = token_slots[t] >= 0 and part p (rows off_p .. off_p + N_p):

    y[t, off_p:off_p+N_p] += (x[t] @ lora_a[s, p*R:(p+1)*R].T) @ lora_b[s, :, off_p:off_p+N_p]

in float32 accumulation, the shrunk vector rounded to the LoRA dtype between the two products
(as the reference computes it). ``y`` is updated in place and returned.
"""

from __future__ import annotations

import torch


def reference_lora_linear(
    y: torch.Tensor,  # (T, N), updated in place
    x: torch.Tensor,  # (T, K)
    lora_a: torch.Tensor,  # (S, P * R, K)
    lora_b: torch.Tensor,  # (S, R, N)
    slices: tuple[int, ...],  # (P,) output rows per part
    token_slots: torch.Tensor,  # (T,) int, -1 = no adapter
    slot_ranks: torch.Tensor,  # (S,) int32; the reference computes the zero padding too
) -> torch.Tensor:
    rank = lora_b.shape[1]
    slots = token_slots.to(torch.int64)
    for s in slots.unique().tolist():
        if s < 0:
            continue
        rows = (slots == s).nonzero().squeeze(1)
        shrunk = x[rows].to(lora_a.dtype) @ lora_a[s].T  # (n, P * R)
        offset = 0
        for p, size in enumerate(slices):
            part = shrunk[:, p * rank : (p + 1) * rank]  # (n, R)
            delta = part @ lora_b[s, :, offset : offset + size]  # (n, size)
            y[rows, offset : offset + size] += delta.to(y.dtype)
            offset += size
    return y

"""The segmented LoRA matmul (``LayerOps.lora_linear``): the core's reference against a plain
per-token loop, the cpu plugin's C kernel and the cuda plugin's Triton kernels (in Triton's
interpreter without a GPU) against the reference, on mixed batches (several adapters, tokens
without one, merged layers of 1-3 parts, ranks below the slot width)."""

from __future__ import annotations

import pytest
import torch

from ironlm.interfaces.lora import reference_lora_linear
from ironlm.interfaces.platform import LayerOps

SHAPES = [  # (tokens, K, part sizes, R)
    (1, 64, (48,), 8),
    (7, 96, (64, 32, 32), 16),  # qkv-like
    (33, 80, (40, 40), 8),  # gate/up-like, K not a multiple of 16
    (12, 64, (64,), 1),
    (40, 72, (40, 24, 24), 80),  # several tiles per adapter, rank beyond one 64-wide pass
]


def _stacks(
    k: int, slices: tuple[int, ...], rank: int, num_slots: int, ranks: list[int], seed: int,
    dtype: torch.dtype = torch.float32, device: str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Random slot stacks with each slot's rows / columns beyond its rank zeroed."""
    g = torch.Generator().manual_seed(seed)
    parts, n = len(slices), sum(slices)
    a = torch.randn(num_slots, parts * rank, k, generator=g) / k**0.5
    b = torch.randn(num_slots, rank, n, generator=g)  # B transposed
    for s, r in enumerate(ranks):
        for p in range(parts):
            a[s, p * rank + r : (p + 1) * rank] = 0
        b[s, r:] = 0
    return a.to(device, dtype), b.to(device, dtype), torch.tensor(ranks, dtype=torch.int32,
                                                                  device=device)


def _naive(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
           slices: tuple[int, ...], slots: list[int]) -> torch.Tensor:
    out = y.clone().double()
    rank = b.shape[1]
    for t, s in enumerate(slots):
        if s < 0:
            continue
        off = 0
        for p, size in enumerate(slices):
            shrunk = a[s, p * rank : (p + 1) * rank].double() @ x[t].double()
            out[t, off : off + size] += b[s, :, off : off + size].double().T @ shrunk
            off += size
    return out


def _case(shape: tuple[int, int, tuple[int, ...], int], seed: int):  # type: ignore[no-untyped-def]
    t, k, slices, rank = shape
    g = torch.Generator().manual_seed(seed)
    ranks = [rank, max(1, rank // 2), 0]  # slot 2 empty (never used by a token)
    a, b, slot_ranks = _stacks(k, slices, rank, 3, ranks, seed)
    x = torch.randn(t, k, generator=g)
    y = torch.randn(t, sum(slices), generator=g)
    slots = [[-1, 0, 1][i % 3] for i in range(t)]
    return x, y, a, b, slices, slots, slot_ranks


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_reference_matches_per_token_definition(shape) -> None:  # type: ignore[no-untyped-def]
    x, y, a, b, slices, slots, ranks = _case(shape, seed=1)
    expected = _naive(y, x, a, b, slices, slots)
    token_slots = torch.tensor(slots, dtype=torch.int32)
    got = reference_lora_linear(y.clone(), x, a, b, slices, token_slots, ranks)
    torch.testing.assert_close(got.double(), expected, atol=1e-4, rtol=1e-4)
    base_rows = [i for i, s in enumerate(slots) if s < 0]
    assert torch.equal(got[base_rows], y[base_rows])  # tokens without an adapter untouched


def test_reference_in_place_and_all_base_noop() -> None:
    x, y, a, b, slices, _, ranks = _case(SHAPES[1], seed=2)
    before = y.clone()
    out = LayerOps().lora_linear(y, x, a, b, slices, torch.full((y.shape[0],), -1,
                                 dtype=torch.int32), ranks)
    assert out is y and torch.equal(y, before)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cpu_kernel_matches_reference(shape) -> None:  # type: ignore[no-untyped-def]
    from ironlm_cpu.layer_ops import CpuLayerOps

    ops = CpuLayerOps()
    assert ops.lora.available, ops.lora.reason
    x, y, a, b, slices, slots, ranks = _case(shape, seed=3)
    token_slots = torch.tensor(slots, dtype=torch.int32)
    assert ops.lora.fits(y, x, a, b, slices, token_slots, ranks)
    ref = reference_lora_linear(y.clone(), x, a, b, slices, token_slots, ranks)
    got = ops.lora_linear(y.clone(), x, a, b, slices, token_slots, ranks)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_cpu_kernel_strided_input_and_rank_table_read_at_call_time() -> None:
    from ironlm_cpu.layer_ops import CpuLayerOps

    ops = CpuLayerOps()
    x, y, a, b, slices, slots, ranks = _case(SHAPES[2], seed=4)
    wide = torch.randn(x.shape[0], x.shape[1] * 2)
    wide[:, : x.shape[1]] = x
    xs = wide[:, : x.shape[1]]  # rows x.shape[1] * 2 apart
    token_slots = torch.tensor(slots, dtype=torch.int32)
    ref = reference_lora_linear(y.clone(), x, a, b, slices, token_slots, ranks)
    torch.testing.assert_close(ops.lora_linear(y.clone(), xs, a, b, slices, token_slots, ranks),
                               ref, atol=1e-5, rtol=1e-5)
    # a rank of 0 makes the kernel skip the slot (the table is read on every call)
    ranks[0] = 0
    got = ops.lora_linear(y.clone(), x, a, b, slices, token_slots, ranks)
    rows0 = [i for i, s in enumerate(slots) if s == 0]
    assert torch.equal(got[rows0], y[rows0])


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=2e-2, rtol=2e-2),
    torch.bfloat16: dict(atol=1e-1, rtol=5e-2),
}


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("shape", SHAPES[:3], ids=str)
def test_triton_kernel_matches_reference(shape, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    from ironlm_cuda.kernels.lora import lora_linear

    x, y, a, b, slices, slots, ranks = _case(shape, seed=5)
    token_slots = torch.tensor(slots, dtype=torch.int32)
    ref = reference_lora_linear(y.clone().double(), x.double(), a.double(), b.double(), slices,
                                token_slots, ranks)
    got = lora_linear(y.to(DEVICE, dtype), x.to(DEVICE, dtype), a.to(DEVICE, dtype),
                      b.to(DEVICE, dtype), slices, token_slots.to(DEVICE), ranks.to(DEVICE))
    torch.testing.assert_close(got.double().cpu(), ref, **TOL[dtype])


def test_triton_layer_ops_use_the_kernel() -> None:
    from ironlm_cuda.triton_layer_ops import TritonLayerOps

    x, y, a, b, slices, slots, ranks = _case(SHAPES[1], seed=6)
    token_slots = torch.tensor(slots, dtype=torch.int32)
    ref = reference_lora_linear(y.clone(), x, a, b, slices, token_slots, ranks)
    got = TritonLayerOps().lora_linear(y.clone().to(DEVICE), x.to(DEVICE), a.to(DEVICE),
                                       b.to(DEVICE), slices, token_slots.to(DEVICE),
                                       ranks.to(DEVICE))
    torch.testing.assert_close(got.cpu(), ref, atol=1e-4, rtol=1e-4)

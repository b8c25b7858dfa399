"""Swap preemption (--swap-space, issue 22): when KV blocks run out, a preempted request's KV
goes to the host swap space and comes back intact; when the swap space is full it is
recomputed instead. Greedy outputs equal those of a run that never preempts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ironlm import LLM, SamplingParams
from ironlm.engine.block_manager import BlockManager
from ironlm.engine.request import Request
from ironlm.interfaces.attention import AttentionBackend

PROMPTS = [f"Story {i}: once upon a time" for i in range(6)]


def test_block_manager_swap_round_trip() -> None:
    bm = BlockManager(num_kv_blocks=8, block_size=4, enable_prefix_caching=True,
                      num_swap_blocks=3)
    req = Request("r", list(range(10)), SamplingParams(), None)
    assert bm.allocate(req, 10)
    req.num_computed_tokens = 10
    device = list(bm.block_ids("r"))
    assert len(device) == 3 and bm.can_swap_out(req)
    out = bm.swap_out(req)
    assert [d for d, _ in out] == device and bm.num_used_blocks == 0
    assert bm.swap_usage == 1.0 and not bm.can_swap_out(req)
    assert bm.can_swap_in(req, 1)
    back = bm.swap_in(req)
    assert sorted(h for h, _ in back) == sorted(h for _, h in out)
    assert bm.block_ids("r") == [d for _, d in back] and bm.swap_usage == 0.0
    bm.swap_out(req)
    bm.free("r")  # aborted while swapped: the host blocks come back too
    assert bm.swap_usage == 0.0 and bm.num_used_blocks == 0


class _Backend(AttentionBackend):
    name = "t"
    supported_platforms = ("*",)

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise NotImplementedError


def test_default_swap_blocks_moves_whole_blocks() -> None:
    device = torch.arange(2 * 5 * 2 * 1 * 3, dtype=torch.float32).view(2, 5, 2, 1, 3)
    host = torch.zeros(2, 4, 2, 1, 3)
    backend = _Backend()
    backend.swap_blocks(device, host, [4, 1], [0, 3])
    assert torch.equal(host[:, 0], device[:, 4]) and torch.equal(host[:, 3], device[:, 1])
    restored = torch.zeros_like(device)
    backend.swap_blocks(host, restored, [0, 3], [2, 0])
    assert torch.equal(restored[:, 2], device[:, 4]) and torch.equal(restored[:, 0], device[:, 1])


def test_swapped_requests_finish_as_if_never_preempted(tiny_llama_dir: Path) -> None:
    """Logic on the tiny model (the real-model check is test_engine_real's preemption run,
    which swaps with the default swap_space and must match HF transformers)."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    common = dict(dtype="float32", max_model_len=128, block_size=16, max_num_seqs=6,
                  enforce_eager=True)
    reference = LLM(str(tiny_llama_dir), num_kv_blocks=64, swap_space=0, **common)
    want = [o.outputs[0].token_ids for o in reference.generate(PROMPTS, params, use_tqdm=False)]
    assert reference.engine.stats()["num_preemptions"] == 0
    del reference
    per_block = 2 * 16 * 2 * 16 * 4 * 2  # tiny Llama: 2 layers, 2 KV heads of 16, float32
    # 10 device blocks cannot hold six requests of ~55 tokens (4 blocks each); 4 host
    # blocks hold one preempted request at a time, the others are recomputed
    small = LLM(str(tiny_llama_dir), num_kv_blocks=10, swap_space=4 * per_block / 1024**3,
                **common)
    assert small.engine.block_manager.num_swap_blocks == 4
    got = [o.outputs[0].token_ids for o in small.generate(PROMPTS, params, use_tqdm=False)]
    stats = small.engine.stats()
    assert stats["num_swap_outs"] > 0, stats
    assert stats["num_preemptions"] > stats["num_swap_outs"], stats  # some were recomputed
    assert got == want
    assert stats["num_swapped"] == 0 and stats["swap_usage"] == 0.0
    assert small.engine.block_manager.num_used_blocks == 0

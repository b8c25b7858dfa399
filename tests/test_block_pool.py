"""The free KV block pool: runs of neighbouring blocks per request, claims given way under
pressure, and the plain least-recently-freed queue at ``run == 1`` (no model)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ironlm import LLM
from ironlm.engine.block_manager import BlockManager
from ironlm.engine.block_pool import FreeBlockPool
from ironlm.engine.request import Request
from ironlm.sampling_params import SamplingParams


def _lockstep(pool: FreeBlockPool, names: list[str], steps: int) -> dict[str, list[int]]:
    """Each request takes one block per step, in turn (a decode batch growing together)."""
    taken: dict[str, list[int]] = {n: [] for n in names}
    for _ in range(steps):
        for n in names:
            taken[n].append(pool.take(n))
    return taken


def test_run_one_is_a_queue_of_the_least_recently_freed() -> None:
    pool = FreeBlockPool(4)
    assert [pool.take("a") for _ in range(4)] == [0, 1, 2, 3]
    for b in (2, 0, 3):
        pool.put(b)
    assert len(pool) == 3 and 0 in pool and 1 not in pool
    assert [pool.take("b") for _ in range(3)] == [2, 0, 3]
    with pytest.raises(IndexError):
        pool.take("b")


def test_requests_growing_together_get_runs_of_neighbouring_blocks() -> None:
    pool = FreeBlockPool(36, run=8)  # 4 whole groups and 4 blocks that form no group
    taken = _lockstep(pool, ["a", "b", "c", "d"], 9)
    for i, name in enumerate("abcd"):
        assert taken[name][:8] == list(range(8 * i, 8 * i + 8))  # one group each, in order
    assert sorted(t[8] for t in taken.values()) == [32, 33, 34, 35]  # the rest, one each
    assert len(pool) == 0


def test_claims_give_way_when_nothing_else_is_free() -> None:
    pool = FreeBlockPool(16, run=8)
    assert pool.take("a") == 0 and pool.take("b") == 8  # a claims 1-7, b claims 9-15
    assert len(pool) == 14  # claimed blocks are free
    stolen = [pool.take("c") for _ in range(3)]  # c finds no whole group and no unclaimed block
    assert stolen == [15, 14, 13]  # the latest claims first
    assert [pool.take("b") for _ in range(5)] == [9, 10, 11, 12, 7]  # b's claims, then a's
    assert [pool.take("a") for _ in range(6)] == [1, 2, 3, 4, 5, 6]
    assert len(pool) == 0


def test_taking_a_claimed_block_for_the_prefix_cache_ends_that_claim() -> None:
    pool = FreeBlockPool(16, run=4)
    assert pool.take("a") == 0
    pool.take_block(2)  # a cached block reused by another request
    assert 2 not in pool
    assert [pool.take("a") for _ in range(2)] == [1, 3]
    assert pool.take("a") == 4  # claims used up: a new group


def test_release_returns_claims_and_whole_groups_come_back() -> None:
    pool = FreeBlockPool(8, run=4)
    assert pool.take("a") == 0 and pool.take("b") == 4
    pool.release("a")  # a finished with one block: 1-3 are unclaimed again
    pool.put(0)
    assert pool.take("c") == 0  # group 0 whole again, and ...
    assert [pool.take("c") for _ in range(3)] == [1, 2, 3]  # ... claimed for c


def test_groups_go_in_the_prefix_caches_order() -> None:
    """A prompt cached by the request that finished last survives a new request while older free
    blocks remain (the least recently freed go first, a whole group at a time)."""

    def req(rid: str, tokens: list[int]) -> Request:
        return Request(rid, tokens, SamplingParams(max_tokens=4), eos_token_id=None)

    bm = BlockManager(num_kv_blocks=12, block_size=4, enable_prefix_caching=True, run=4)
    first = req("F", list(range(100, 116)) + [0])  # 5 blocks: a group and one more
    assert bm.allocate(first, 17)
    first.num_computed_tokens = 17
    sharer = req("G", list(range(100, 108)) + [1, 2, 3])  # shares F's first two blocks
    cached = bm.find_cached_prefix(sharer)
    sharer.num_computed_tokens = 8
    assert bm.allocate(sharer, 3, cached)
    bm.free("F")  # F's other blocks: free, but F's group is not whole (G holds two)
    last = req("A", list(range(200, 216)) + [9])
    assert bm.allocate(last, 17)
    last.num_computed_tokens = 17
    bm.free("A")  # A's prompt: the most recently freed
    again = list(range(200, 216)) + [5]
    assert len(bm.find_cached_prefix(req("A2", again))) == 4
    assert bm.allocate(req("X", [7, 7, 7]), 3)  # an unrelated request takes an older block
    assert len(bm.find_cached_prefix(req("A3", again))) == 4


def test_trimmed_blocks_stay_the_requests_next() -> None:
    """Blocks taken for speculative tokens that were rejected go back to their request's run."""
    bm = BlockManager(num_kv_blocks=16, block_size=4, enable_prefix_caching=False, run=8)
    r = Request("r", list(range(4)), SamplingParams(max_tokens=16), eos_token_id=None)
    assert bm.allocate(r, 4 + 8)  # the prompt's block and two for 8 speculative tokens
    assert bm.block_ids("r") == [0, 1, 2]
    bm.trim("r", 5)  # one token accepted: the last block goes back
    assert bm.block_ids("r") == [0, 1] and bm.num_free_blocks == 14
    other = Request("o", list(range(40, 44)), SamplingParams(max_tokens=4), eos_token_id=None)
    assert bm.allocate(other, 4) and bm.block_ids("o") == [8]  # the next whole group
    r.num_computed_tokens = 5
    assert bm.allocate(r, 8) and bm.block_ids("r") == [0, 1, 2, 3]  # the run goes on


def test_random_use_never_hands_a_block_out_twice() -> None:
    rng = random.Random(7)
    num, run = 50, 4  # 12 groups and 2 loose blocks
    pool = FreeBlockPool(num, run)
    owned: dict[str, list[int]] = {}
    for step in range(3000):
        name = f"r{rng.randrange(12)}"
        action = rng.random()
        if action < 0.6 and len(pool):
            b = pool.take(name)
            assert all(b not in blocks for blocks in owned.values())
            owned.setdefault(name, []).append(b)
        elif action < 0.65 and owned.get(name):
            pool.give_back(name, owned[name].pop())
        elif action < 0.7 and len(pool):
            free = [b for b in range(num) if b in pool]
            b = rng.choice(free)
            pool.take_block(b)
            owned.setdefault("cached", []).append(b)
        elif owned.get(name):
            pool.release(name)
            for b in owned.pop(name):
                pool.put(b)
        held = [b for blocks in owned.values() for b in blocks]
        assert len(held) == len(set(held)) and len(pool) == num - len(held), step
        assert all((b in pool) != (b in held) for b in range(num))


def test_block_manager_lays_a_decode_batch_out_in_runs_and_keeps_prefix_caching() -> None:
    bm = BlockManager(num_kv_blocks=32, block_size=4, enable_prefix_caching=True, run=4)
    reqs = [Request(f"s{i}", [100 * i + t for t in range(8)], SamplingParams(max_tokens=8),
                    eos_token_id=None) for i in range(4)]  # fmt: skip
    for r in reqs:  # prefill: 2 blocks each
        assert bm.allocate(r, 8)
        r.num_computed_tokens = 8
    for step in range(8):  # decode in step: each crosses into a 3rd and 4th block
        for r in reqs:
            r.output_token_ids.append(step)
            assert bm.allocate(r, 1)
            r.num_computed_tokens += 1
    for i, r in enumerate(reqs):
        assert bm.block_ids(r.request_id) == list(range(4 * i, 4 * i + 4))
    # a request sharing s1's prompt reuses its two full prompt blocks
    again = Request("again", [100 + t for t in range(8)] + [7], SamplingParams(max_tokens=1),
                    eos_token_id=None)  # fmt: skip
    assert bm.find_cached_prefix(again) == [4, 5]
    for r in reqs:
        bm.free(r.request_id)
    assert bm.num_free_blocks == 32


def test_smollm2_runs_on_cpu_give_the_outputs_of_plain_blocks(smollm2_dir: Path) -> None:
    """The cpu platform's default: 16-token blocks in runs of 8. A cache so small that claims
    are taken from their claimants and requests are preempted gives the tokens of 128-token
    blocks with a roomy cache."""
    prompts = ["The capital of France is", "List three colours:", "def fib(n):",
               "Water boils at", "Once upon a time", "The largest planet is"]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    kw = {"device": "cpu", "dtype": "float32", "max_model_len": 128}

    def run(llm: LLM) -> list[list[int]]:
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params,
                                                                     use_tqdm=False)]

    runs = LLM(str(smollm2_dir), num_kv_blocks=16, **kw)  # 2 groups of 8; ~3-4 blocks each
    assert runs.engine.config.block_size == 16 and runs.engine.block_manager.run == 8
    got = run(runs)
    assert runs.engine.stats()["num_preemptions"] > 0
    plain = LLM(str(smollm2_dir), block_size=128, num_kv_blocks=8, **kw)
    assert plain.engine.block_manager.run == 1
    assert got == run(plain)

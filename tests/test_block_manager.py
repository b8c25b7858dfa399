"""Block manager and scheduler logic on synthetic requests (no model)."""

from __future__ import annotations

from ironlm.engine.block_manager import BlockManager
from ironlm.engine.request import Request, RequestStatus
from ironlm.engine.scheduler import Scheduler
from ironlm.interfaces.step import ModelOutput
from ironlm.sampling_params import SamplingParams


def _req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4), eos_token_id=None)


def test_prefix_blocks_are_shared_and_reference_counted() -> None:
    bm = BlockManager(num_kv_blocks=8, block_size=4, enable_prefix_caching=True)
    a = _req("a", list(range(10)))  # 2 full blocks + 2 tokens
    assert bm.find_cached_prefix(a) == []
    assert bm.allocate(a, 10)
    assert bm.num_used_blocks == 3
    b = _req("b", list(range(8)) + [99, 98, 97])  # same first 2 blocks
    cached = bm.find_cached_prefix(b)
    assert cached == bm.block_ids("a")[:2]
    b.num_computed_tokens = 8
    assert bm.allocate(b, 3, cached)
    assert bm.num_used_blocks == 4  # only one new block for b
    assert [bm.blocks[i].ref_count for i in cached] == [2, 2]
    bm.free("a")
    bm.free("b")
    assert bm.num_used_blocks == 0
    # freed blocks stay cached until reused
    c = _req("c", list(range(9)))
    assert len(bm.find_cached_prefix(c)) == 2


def test_cache_salt_starts_its_own_chain() -> None:
    # vLLM's cache_salt: a salted prompt's blocks serve the same salt only, not the unsalted
    # prompt nor another salt; a salt and an adapter together start one more chain
    bm = BlockManager(num_kv_blocks=16, block_size=4, enable_prefix_caching=True)
    tokens = list(range(9))

    def cached(rid: str, salt: str | None) -> int:
        req = _req(rid, tokens)
        req.cache_salt = salt
        found = bm.find_cached_prefix(req)
        req.num_computed_tokens = 4 * len(found)
        assert bm.allocate(req, len(tokens) - req.num_computed_tokens, found)
        bm.free(rid)
        return len(found)

    assert cached("a", "alice") == 0
    assert cached("b", "alice") == 2
    assert cached("c", "bob") == 0
    assert cached("d", None) == 0
    assert cached("e", None) == 2


def test_blocks_filled_by_decode_steps_are_cached() -> None:
    # decode steps fill blocks one token at a time (a step that needs no new block takes
    # allocate's early return); each block is offered to the cache when it becomes full, so
    # after every step the full blocks are hashed and a later prompt of the prompt + output
    # finds them all
    bm = BlockManager(num_kv_blocks=16, block_size=4, enable_prefix_caching=True)
    a = _req("a", list(range(6)))
    assert bm.allocate(a, 6)
    a.num_computed_tokens = 6
    for tok in range(100, 110):  # 10 decode steps: tokens 6..15
        a.output_token_ids.append(tok)
        assert bm.allocate(a, 1)
        a.num_computed_tokens += 1
        hashed = [bm.blocks[b].block_hash is not None for b in bm.block_ids("a")]
        assert sum(hashed) == a.num_tokens // 4 and all(hashed[: a.num_tokens // 4])
    assert a.num_tokens == 16 and len(bm.block_ids("a")) == 4
    later = _req("b", a.all_token_ids + [7])
    assert bm.find_cached_prefix(later) == bm.block_ids("a")


def test_duplicate_blocks_are_offered_again_once_the_holder_goes() -> None:
    # two live requests with the same prompt: the second's blocks duplicate the first's and
    # are not cached while the first holds the hashes; once the first is freed and its blocks
    # are reused, the second's blocks serve the prefix
    bm = BlockManager(num_kv_blocks=6, block_size=4, enable_prefix_caching=True)
    a, b = _req("a", list(range(9))), _req("b", list(range(9)))
    assert bm.allocate(a, 9) and bm.allocate(b, 9)  # b computes its own copy (no lookup)
    bm.free("a")
    filler = _req("f", [50 + i for i in range(12)])
    assert bm.allocate(filler, 12)  # takes a's freed blocks: their hashes are gone
    b.num_computed_tokens = 9
    b.output_token_ids.append(42)
    assert bm.allocate(b, 1)  # a decode step of b offers its blocks again
    assert bm.find_cached_prefix(_req("c", list(range(9)))) == bm.block_ids("b")[:2]


def test_swapped_in_blocks_take_over_the_hashes_of_their_free_copies() -> None:
    # swap-out frees the device blocks (they keep their hashes); swap-in copies the KV into
    # other free blocks, which take the hashes over, so the prefix stays cached after the old
    # blocks are reused
    bm = BlockManager(num_kv_blocks=8, block_size=4, enable_prefix_caching=True,
                      num_swap_blocks=4)  # fmt: skip
    a = _req("a", list(range(10)))
    assert bm.allocate(a, 10)
    a.num_computed_tokens = 10
    old = list(bm.block_ids("a"))
    bm.swap_out(a)
    bm.swap_in(a)
    new = bm.block_ids("a")
    assert not set(old) & set(new)  # the pool handed out blocks freed longer ago
    assert [bm.blocks[b].block_hash is not None for b in new] == [True, True, False]
    assert bm.allocate(_req("f", [50 + i for i in range(20)]), 20)  # the 5 other blocks
    assert bm.find_cached_prefix(_req("c", list(range(9)))) == new[:2]


def test_allocation_fails_cleanly_when_full() -> None:
    bm = BlockManager(num_kv_blocks=2, block_size=4, enable_prefix_caching=False)
    a = _req("a", list(range(8)))
    assert bm.allocate(a, 8)
    b = _req("b", [1])
    assert not bm.allocate(b, 1)
    assert bm.num_free_blocks == 0 and bm.block_ids("b") == []


def test_last_token_is_never_served_from_cache() -> None:
    bm = BlockManager(num_kv_blocks=8, block_size=4, enable_prefix_caching=True)
    a = _req("a", list(range(8)))
    assert bm.allocate(a, 8)
    b = _req("b", list(range(8)))
    assert len(bm.find_cached_prefix(b)) == 1  # 7 tokens at most -> one full block


def test_scheduler_chunks_prefill_and_preempts_when_out_of_blocks() -> None:
    bm = BlockManager(num_kv_blocks=4, block_size=4, enable_prefix_caching=False)
    s = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=6, enable_chunked_prefill=True)
    a, b = _req("a", list(range(7))), _req("b", list(range(100, 107)))
    s.add(a)
    s.add(b)
    plan = s.schedule()
    assert [(r.request_id, n) for r, n in plan.scheduled] == [("a", 6)]
    s.on_step_done(plan, ModelOutput())  # counters advance by the tokens run
    plan = s.schedule()
    assert [(r.request_id, n) for r, n in plan.scheduled] == [("a", 1), ("b", 5)]
    s.on_step_done(plan, ModelOutput())  # counters advance by the tokens run
    # a samples a token, grows past its 2 blocks; b needs its 2nd block: 4 blocks total
    a.output_token_ids.append(5)
    b_left = b.num_tokens - b.num_computed_tokens
    plan = s.schedule()
    names = [(r.request_id, n) for r, n in plan.scheduled]
    assert ("a", 1) in names and ("b", b_left) in names
    s.on_step_done(plan, ModelOutput())  # counters advance by the tokens run
    a.output_token_ids.extend([6, 7, 8, 9])  # a now needs a third block: none free
    plan = s.schedule()
    assert plan.preempted and plan.preempted[0] is b
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert s.stats.num_preemptions == 1
    s.finish(a, RequestStatus.FINISHED_STOPPED)
    s.finish(b, RequestStatus.FINISHED_ABORTED)
    assert bm.num_used_blocks == 0 and not s.has_unfinished()


def test_long_prefill_token_threshold_caps_a_prompt_per_step() -> None:
    # vLLM's long_prefill_token_threshold: a 10-token prompt goes 4 tokens a step, and the
    # budget it leaves takes the next request in the same step
    bm = BlockManager(num_kv_blocks=16, block_size=4, enable_prefix_caching=False)
    s = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=16, enable_chunked_prefill=True,
                  long_prefill_token_threshold=4)  # fmt: skip
    a, b = _req("a", list(range(10))), _req("b", list(range(100, 103)))
    s.add(a)
    s.add(b)
    steps = []
    while a.num_computed_tokens < a.num_tokens:
        plan = s.schedule()
        steps.append([(r.request_id, n) for r, n in plan.scheduled])
        s.on_step_done(plan, ModelOutput())
    assert steps == [[("a", 4), ("b", 3)], [("a", 4)], [("a", 2)]]

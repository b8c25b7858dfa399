"""The free KV blocks, handed out so that a request's blocks lie next to each other in memory.

Why: a platform whose attention streams each sequence's keys and values (the cpu plugin's decode
kernel, bound by reading the cache) runs faster on long contiguous runs, since the hardware
prefetchers restart at every jump; a decode batch that takes blocks in step from one queue
interleaves its sequences, so each sequence's blocks lie a batch apart. Large blocks make the runs
long but waste up to a block per sequence (128-token blocks hold 91 of the 128 blocks that 64
sequences of 129-192 tokens need in 512 MiB of a float32 SmolLM2 cache: a third of them wait).
Small blocks handed out in runs give both.

``run`` blocks form a group (ids ``g * run`` to ``g * run + run - 1``). A request that needs a
block and holds no claimed one gets the least recently freed block (the prefix cache's eviction
order: a cached prompt freed last stays longest) or, where that block's whole group is free, the
group's first block, the rest of the group claimed for its next blocks: a group goes as one when
its turn comes (a finished request's group was freed at once, so groups go in the order their
requests finished). Claimed blocks stay free: they count in ``len()``, prefix-cache hits still
take them, and when no unclaimed block is left they are taken from their claimant (the latest
claims first), so the pool never refuses a block that ``len()`` promised. A block a request gives
back unfilled (rejected speculative tokens) stays claimed by it, next in its run.

``run == 1`` is a plain queue of free blocks, least recently freed first.
"""

from __future__ import annotations

from collections import OrderedDict, deque


class FreeBlockPool:
    def __init__(self, num_blocks: int, run: int = 1) -> None:
        if run < 1:
            raise ValueError(f"run must be at least 1, got {run}")
        self.run = run
        # Free blocks nobody claimed, least recently freed first; value unused.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        # free block -> its claimant, in claim order
        self._claimed: OrderedDict[int, str] = OrderedDict()
        self._claims: dict[str, deque[int]] = {}  # claimant -> its claimed blocks, in id order
        # per group: how many of its blocks are in _free (run == 1: no groups)
        self._group_free = [run] * (num_blocks // run if run > 1 else 0)

    def __len__(self) -> int:
        return len(self._free) + len(self._claimed)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._free or block_id in self._claimed

    # -- taking ------------------------------------------------------------------------------
    def take(self, claimant: str) -> int:
        """A free block for ``claimant``'s next tokens (IndexError when none is free)."""
        claims = self._claims.get(claimant)
        if claims:
            block_id = claims.popleft()
            del self._claimed[block_id]
            if not claims:
                del self._claims[claimant]
            return block_id
        if self._free:
            oldest = next(iter(self._free))
            group = oldest // self.run
            if group < len(self._group_free) and self._group_free[group] == self.run:
                first = group * self.run  # the whole group: its first block, the rest claimed
                rest = range(first + 1, first + self.run)
                self._unfree(first)
                for b in rest:
                    self._unfree(b)
                    self._claimed[b] = claimant
                self._claims[claimant] = deque(rest)
                return first
            self._unfree(oldest)
            return oldest
        if self._claimed:  # only claimed blocks left: the latest claim gives way
            block_id, owner = self._claimed.popitem(last=True)
            self._drop_claim(owner, block_id)
            return block_id
        raise IndexError("no free KV block")

    def take_block(self, block_id: int) -> None:
        """Take one particular free block (a cached prefix block being reused)."""
        owner = self._claimed.pop(block_id, None)
        if owner is not None:
            self._drop_claim(owner, block_id)
        else:
            self._unfree(block_id)

    def put(self, block_id: int) -> None:
        """``block_id`` is free again (the most recently freed)."""
        self._free[block_id] = None
        self._count(block_id, 1)

    def give_back(self, claimant: str, block_id: int) -> None:
        """``claimant`` returns a block it took but did not fill (speculative tokens rejected):
        free again, and claimed by it as its next block, so that its run goes on there."""
        self._claimed[block_id] = claimant
        self._claims.setdefault(claimant, deque()).appendleft(block_id)

    def release(self, claimant: str) -> None:
        """``claimant`` takes no more blocks (finished or preempted): its claims end."""
        for b in self._claims.pop(claimant, ()):
            del self._claimed[b]
            self.put(b)

    # -- bookkeeping -------------------------------------------------------------------------
    def _unfree(self, block_id: int) -> None:
        del self._free[block_id]
        self._count(block_id, -1)

    def _count(self, block_id: int, change: int) -> None:
        """Keep its group's count of unclaimed free blocks (blocks past the last group: none)."""
        group = block_id // self.run
        if group < len(self._group_free):
            self._group_free[group] += change

    def _drop_claim(self, owner: str, block_id: int) -> None:
        claims = self._claims[owner]
        claims.remove(block_id)
        if not claims:
            del self._claims[owner]

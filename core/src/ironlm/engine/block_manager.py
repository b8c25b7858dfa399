"""Paged KV blocks: reference counts, a free queue, and automatic prefix caching.

A full block's identity is the chained hash of (parent block hash, its token ids; for positions
of a prompt given as embeddings, a digest of their rows too; SHA-256 unless
``--prefix-caching-hash-algo`` says otherwise, ``block_hash``), so two requests with the same
prefix map to the same physical blocks. The chain of a request that runs
with a LoRA adapter starts from that adapter's id: its KV depends on the adapter, so requests of
different adapters (or of an adapter and the base model) never share blocks; a request's
``cache_salt`` starts it too (vLLM's: only requests with the same salt share blocks). Freed
blocks keep their hash and stay reusable until the free pool hands them out again (least recently freed first; where the
platform wants runs, a wholly free group of neighbours at a time: ``FreeBlockPool``).

Swap preemption: a preempted request's blocks can move to a host pool of ``num_swap_blocks``
(``swap_out`` / ``swap_in`` plan the copies the workers make; the host pool has no prefix
cache: a swapped request owns its host blocks alone).
"""

from __future__ import annotations

from dataclasses import dataclass

from ironlm.engine.block_hash import BlockHasher, block_hasher
from ironlm.engine.block_pool import FreeBlockPool
from ironlm.engine.request import Request


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None  # set once the block is full and registered in the cache


@dataclass
class PrefixCacheStats:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of those, tokens found in the cache

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class BlockManager:
    def __init__(self, num_kv_blocks: int, block_size: int, enable_prefix_caching: bool,
                 num_swap_blocks: int = 0, run: int = 1,
                 hasher: BlockHasher | None = None) -> None:
        """``run``: blocks a request takes next to each other where free (``FreeBlockPool``);
        ``hasher``: the prefix cache's block hash (default SHA-256, ``block_hash``)."""
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._hash = hasher or block_hasher("sha256")
        self.blocks = [Block(i) for i in range(num_kv_blocks)]
        self._free = FreeBlockPool(num_kv_blocks, run)
        self._cached: dict[bytes, int] = {}  # block hash -> block id
        self._req_blocks: dict[str, list[int]] = {}
        self._req_hashes: dict[str, list[bytes]] = {}  # hashes of the request's full blocks
        # how many of the request's first blocks are settled in the cache: each block is
        # offered when it becomes full (a decode step then walks none of its blocks); one
        # whose hash another live request's copy holds is offered again on later steps
        self._req_published: dict[str, int] = {}
        self.stats = PrefixCacheStats()
        self.num_swap_blocks = num_swap_blocks
        self._swap_free: list[int] = list(range(num_swap_blocks - 1, -1, -1))  # a stack
        self._swapped: dict[str, list[int]] = {}  # request id -> its host blocks, in order

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_kv_blocks(self) -> int:
        return len(self.blocks)

    @property
    def run(self) -> int:
        """Neighbouring blocks a request takes at a time where free (1: no runs)."""
        return self._free.run

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_kv_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_kv_blocks

    @property
    def swap_usage(self) -> float:
        """Fraction of the host swap pool in use (0 without one)."""
        if not self.num_swap_blocks:
            return 0.0
        return 1 - len(self._swap_free) / self.num_swap_blocks

    def block_ids(self, request_id: str) -> list[int]:
        return self._req_blocks.get(request_id, [])

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache ----------------------------------------------------------------------
    def _hashes(self, req: Request, num_full_blocks: int) -> list[bytes]:
        """Chained hashes of the request's first ``num_full_blocks`` blocks (memoised)."""
        hashes = self._req_hashes.setdefault(req.request_id, [])
        bs = self.block_size
        if len(hashes) >= num_full_blocks:
            return hashes[:num_full_blocks]
        root = self._hash(("root", req.lora_id, req.cache_salt)) \
            if req.lora_id or req.cache_salt is not None else b""
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else root
            hashes.append(self._hash((parent, req.block_key(i * bs, (i + 1) * bs))))
        return hashes[:num_full_blocks]

    def find_cached_prefix(self, req: Request) -> list[int]:
        """Block ids holding the longest cached prefix of the request. At least one token is
        always left to compute, so the last position's logits can be produced."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = (req.num_tokens - 1) // self.block_size
        found: list[int] = []
        for h in self._hashes(req, max_blocks):
            block_id = self._cached.get(h)
            if block_id is None:
                break
            found.append(block_id)
        return found

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count one successful first scheduling of a request (for the hit-rate metric)."""
        self.stats.queries += num_tokens
        self.stats.hits += num_hit_tokens

    # -- allocation ------------------------------------------------------------------------
    def allocate(
        self, req: Request, num_new_tokens: int, cached_blocks: list[int] | None = None
    ) -> bool:
        """Make room for ``num_new_tokens`` more tokens of ``req`` (after taking
        ``cached_blocks`` as its prefix, on its first allocation). False if blocks ran out;
        then nothing changed."""
        total = req.num_computed_tokens + num_new_tokens
        owned = self._req_blocks.get(req.request_id, [])
        if not cached_blocks and total <= len(owned) * self.block_size:  # a decode, mostly
            self._register_full_blocks(req, total)
            return True
        cached_blocks = cached_blocks or []
        need = self.blocks_needed(total) - len(owned) - len(cached_blocks)
        reusable_free = sum(1 for b in cached_blocks if self.blocks[b].ref_count == 0)
        if need > len(self._free) - reusable_free:
            return False
        owned = self._req_blocks.setdefault(req.request_id, owned)
        for b in cached_blocks:
            self._take(b)
            owned.append(b)
        for _ in range(max(need, 0)):
            block_id = self._free.take(req.request_id)
            self._evict_hash(block_id)
            self.blocks[block_id].ref_count = 1
            owned.append(block_id)
        self._register_full_blocks(req, total)
        return True

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            self._free.take_block(block_id)
        block.ref_count += 1

    def _evict_hash(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.block_hash is not None:
            if self._cached.get(block.block_hash) == block_id:
                del self._cached[block.block_hash]
            block.block_hash = None

    def _register_full_blocks(self, req: Request, num_tokens: int) -> None:
        """Publish the request's blocks that are full once ``num_tokens`` are computed."""
        if not self.enable_prefix_caching:
            return
        rid = req.request_id
        num_full = min(num_tokens, req.num_tokens) // self.block_size
        done = self._req_published.get(rid, 0)
        if num_full <= done:
            return
        owned = self._req_blocks[rid]
        hashes = self._hashes(req, num_full)
        retry_from = num_full
        for i in range(done, num_full):
            block, h = self.blocks[owned[i]], hashes[i]
            if block.block_hash is not None:
                continue  # a cached prefix block it took, or published before
            holder = self._cached.get(h)
            if holder is not None and self.blocks[holder].ref_count == 0:
                self._evict_hash(holder)  # a free copy (e.g. left by a swap-out) gives way
                holder = None
            if holder is None:
                block.block_hash = h
                self._cached[h] = block.block_id
            else:  # another live request's copy holds the hash: offer this one again later
                retry_from = min(retry_from, i)
        self._req_published[rid] = retry_from

    def fork(self, parent_id: str, child_id: str) -> None:
        """Share all of the parent's blocks with a new child (copy-on-write by the caller)."""
        blocks = list(self._req_blocks[parent_id])
        for b in blocks:
            self.blocks[b].ref_count += 1
        self._req_blocks[child_id] = blocks
        self._req_hashes[child_id] = list(self._req_hashes.get(parent_id, []))
        self._req_published[child_id] = self._req_published.get(parent_id, 0)

    # -- swap preemption ----------------------------------------------------------------------
    def can_swap_out(self, req: Request) -> bool:
        return 0 < len(self.block_ids(req.request_id)) <= len(self._swap_free)

    def swap_out(self, req: Request) -> list[tuple[int, int]]:
        """Move the request's blocks to host blocks: the (device, host) copies to make. Its
        device blocks are freed (they stay in the prefix cache until reused)."""
        device = list(self.block_ids(req.request_id))
        host = [self._swap_free.pop() for _ in device]
        self.free(req.request_id)
        self._swapped[req.request_id] = host
        return list(zip(device, host))

    def can_swap_in(self, req: Request, num_new_tokens: int) -> bool:
        """Whether device blocks suffice for the swapped request plus ``num_new_tokens``."""
        need = self.blocks_needed(req.num_computed_tokens + num_new_tokens)
        return need <= len(self._free)

    def swap_in(self, req: Request) -> list[tuple[int, int]]:
        """Bring a swapped request's blocks back into fresh device blocks: the (host, device)
        copies to make. The caller then allocates its new tokens as usual."""
        host = self._swapped.pop(req.request_id)
        owned: list[int] = []
        for _ in host:
            block_id = self._free.take(req.request_id)
            self._evict_hash(block_id)
            self.blocks[block_id].ref_count = 1
            owned.append(block_id)
        self._req_blocks[req.request_id] = owned
        self._swap_free.extend(reversed(host))
        self._register_full_blocks(req, req.num_computed_tokens)
        return list(zip(host, owned))

    def trim(self, request_id: str, num_tokens: int) -> None:
        """Return the request's blocks past the first ``num_tokens`` slots (blocks taken for
        speculative tokens that were rejected). Blocks holding real tokens are never past it."""
        owned = self._req_blocks.get(request_id)
        keep = self.blocks_needed(num_tokens)
        if owned is None or len(owned) <= keep:
            return
        for b in reversed(owned[keep:]):
            block = self.blocks[b]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._evict_hash(b)  # only real tokens' full blocks are hashed; none here
                self._free.give_back(request_id, b)  # its next block again (in order)
        del owned[keep:]

    def free(self, request_id: str) -> None:
        """Return the request's blocks; the last blocks are freed first so that a prefix's
        head stays cached longest."""
        self._swap_free.extend(reversed(self._swapped.pop(request_id, [])))
        blocks = self._req_blocks.pop(request_id, [])
        self._req_hashes.pop(request_id, None)
        self._req_published.pop(request_id, None)
        self._free.release(request_id)
        for b in reversed(blocks):
            block = self.blocks[b]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free.put(b)

    def forget(self, block_ids: list[int]) -> None:
        """Drop these blocks from the prefix cache: they do not hold what their hash says (a
        load into them failed)."""
        for b in block_ids:
            self._evict_hash(b)

    def reset_prefix_cache(self) -> None:
        for h, b in list(self._cached.items()):
            if self.blocks[b].ref_count == 0:
                self._evict_hash(b)

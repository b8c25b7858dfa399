"""Scheduler: picks, each step, how many tokens of which requests to run.

One rule covers prefill, chunked prefill and decode: a request owes ``num_tokens -
num_computed_tokens`` tokens, and each step pays as much of that as the token budget allows
(running requests first, then swapped ones, then waiting ones in priority/FCFS order). When
KV blocks run out, the most recently admitted running request is preempted: its KV is swapped
to the host pool when it fits there (``swap_space``), and swapped back before new requests are
admitted; otherwise it is freed and later recomputed.

Two decode-speed features change what a decode owes: with speculative decoding
(``SpeculationPolicy``) a decode also runs its drafts (and keeps KV slots for the proposer's
next ones); with multi-step scheduling a plan of decodes only runs each of them for up to
``num_scheduler_steps`` steps, its blocks allocated for all of them up front.

LoRA: the running requests use at most ``max_loras`` distinct adapters (so every step does). A
waiting request whose adapter would be one too many is passed over, keeping its place in the
queue, until a running adapter's requests finish.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ironlm.engine.block_manager import BlockManager
from ironlm.engine.request import Request, RequestStatus
from ironlm.engine.speculation import SpeculationPolicy
from ironlm.interfaces.step import ModelOutput

if TYPE_CHECKING:
    from ironlm.engine.kv_transfer import KVTransfer


@dataclass
class SchedulerOutput:
    """One step's plan."""

    # Scheduled requests in batch order, each with the number of new tokens to run this step.
    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    # Requests preempted this step (their blocks were freed; they wait to be recomputed).
    preempted: list[Request] = field(default_factory=list)
    # Requests that reached a finished state since the last step (workers drop their state).
    finished_ids: list[str] = field(default_factory=list)
    # Swap preemption copies for the workers: (device, host) out, then (host, device) in.
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    # Speculative decoding: drafts each request verifies (counted in its number of tokens),
    # and how many drafts to propose after this step.
    spec_tokens: dict[str, list[int]] = field(default_factory=dict)
    num_proposals: dict[str, int] = field(default_factory=dict)
    # Multi-step: decode steps per request when the plan runs more than one (absent: one).
    num_steps: dict[str, int] = field(default_factory=dict)
    # KV transfer: (request, index of its first block, number of blocks) the workers load
    # from the KV connector's store before the step runs
    kv_loads: list[tuple[Request, int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def has_swaps(self) -> bool:
        return bool(self.blocks_to_swap_out or self.blocks_to_swap_in)


@dataclass
class SchedulerStats:
    num_preemptions: int = 0
    num_swap_outs: int = 0  # preemptions that swapped (the others recomputed)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool,
        use_priority: bool = False,
        spec: SpeculationPolicy | None = None,
        num_scheduler_steps: int = 1,
        max_model_len: int | None = None,
        max_loras: int = 0,  # 0: LoRA disabled
        long_prefill_token_threshold: int = 0,  # most prompt tokens a step (0: no cap)
        kv_transfer: KVTransfer | None = None,  # prompt blocks from a KV connector's store
    ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.use_priority = use_priority
        self.spec = spec
        self.num_scheduler_steps = num_scheduler_steps
        self.max_model_len = max_model_len
        self.max_loras = max_loras
        self.long_prefill_cap = long_prefill_token_threshold or max_num_batched_tokens
        self.kv_transfer = kv_transfer
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()  # preempted to host swap, oldest first
        self.stats = SchedulerStats()
        self._finished_ids: list[str] = []

    # -- requests in and out ---------------------------------------------------------------
    def add(self, req: Request) -> None:
        self.waiting.append(req)
        if self.use_priority:
            self.waiting = deque(sorted(self.waiting, key=lambda r: (r.priority, r.arrival_time)))

    def finish(self, req: Request, status: RequestStatus) -> None:
        """Mark finished (stop, length, abort) and free its blocks at once."""
        req.status = status
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        elif req in self.swapped:
            self.swapped.remove(req)
        self.block_manager.free(req.request_id)
        self._finished_ids.append(req.request_id)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    @property
    def num_swapped(self) -> int:
        return len(self.swapped)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # -- the plan --------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_ids=self._finished_ids)
        self._finished_ids = []
        budget = self.max_num_batched_tokens
        scheduled_ids: set[str] = set()
        spec_on = self.spec is not None and self.spec.step_enabled(len(self.running))

        # Running requests first, in admission order; preempt from the back when out of KV.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            owed = req.num_tokens - req.num_computed_tokens
            n = min(owed, budget, self.long_prefill_cap)
            if spec_on and n == owed and self._speculate(req, n, budget, out):
                n += len(out.spec_tokens.get(req.request_id, []))
            else:
                while not self.block_manager.allocate(req, n):
                    victim = self.running[-1]
                    self._preempt(victim, out)
                    if victim is req:
                        n = 0
                        break
            if n == 0:
                break  # req itself was preempted (it was the last running request)
            out.scheduled.append((req, n))
            scheduled_ids.add(req.request_id)
            budget -= n
            i += 1

        # Then swapped requests come back, before anything new is admitted.
        while self.swapped and budget > 0 and len(self.running) < self.max_num_seqs:
            if out.preempted:
                break  # KV is short this step
            req = self.swapped[0]
            n = min(req.num_tokens - req.num_computed_tokens, budget, self.long_prefill_cap)
            if not self.block_manager.can_swap_in(req, n):
                break
            self.swapped.popleft()
            out.blocks_to_swap_in.extend(self.block_manager.swap_in(req))
            allocated = self.block_manager.allocate(req, n)
            assert allocated, "can_swap_in counted the new tokens' blocks"
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append((req, n))
            budget -= n

        # Then waiting requests, while there is budget, room and KV.
        adapters = {r.lora_id for r in self.running if r.lora_id}
        passed_over: list[Request] = []  # their adapter would exceed max_loras this step
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            if out.preempted or self.swapped:
                break  # KV is short: do not admit more
            req = self.waiting[0]
            if req.lora_id and req.lora_id not in adapters and len(adapters) >= self.max_loras:
                passed_over.append(self.waiting.popleft())
                continue
            # Prompt logprobs and an embedding's mean need every prompt position computed: no
            # prefix-cache reuse (a classifier's request reads its last row only: reuse).
            wants_all = req.sampling_params.prompt_logprobs is not None or (
                req.pooling and not req.pools_last_row)
            cached = [] if wants_all else self.block_manager.find_cached_prefix(req)
            # then the blocks after those that a KV connector's store holds (loaded, not run)
            loaded = self.kv_transfer.lookup(req, len(cached)) \
                if self.kv_transfer is not None and not wants_all else 0
            bs = self.block_manager.block_size
            num_cached = (len(cached) + loaded) * bs
            n = min(req.num_tokens - num_cached, self.long_prefill_cap)
            if n > budget:
                if not self.enable_chunked_prefill:
                    break
                n = budget
            req.num_computed_tokens = num_cached
            props = 0
            if spec_on and num_cached + n == req.num_tokens:  # drafts right after the prompt
                assert self.spec is not None
                props = self.spec.plan_proposals(req, 0)
            extra = self.spec.lookahead(props) if self.spec is not None and props else 0
            if not (extra and self.block_manager.allocate(req, n + extra, cached)):
                props = 0
                if not self.block_manager.allocate(req, n, cached):
                    req.num_computed_tokens = 0
                    break
            if props:
                out.num_proposals[req.request_id] = props
            if req.status == RequestStatus.WAITING:
                req.num_cached_tokens = num_cached
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.monotonic()
            self.block_manager.record_lookup(req.num_tokens, len(cached) * bs)
            if self.kv_transfer is not None:
                self.kv_transfer.record(req.num_tokens, loaded * bs)
            if loaded:
                out.kv_loads.append((req, len(cached), loaded))
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            if req.lora_id:
                adapters.add(req.lora_id)
            out.scheduled.append((req, n))
            budget -= n
        self.waiting.extendleft(reversed(passed_over))  # back in place, in order
        if self.num_scheduler_steps > 1:
            self._plan_window(out)
        return out

    def lora_ids(self) -> tuple[set[int], set[int]]:
        """Adapters of the running and of the waiting requests (lora_int_ids)."""
        running = {r.lora_id for r in self.running if r.lora_id}
        return running, {r.lora_id for r in self.waiting if r.lora_id}

    def _speculate(self, req: Request, n: int, budget: int, out: SchedulerOutput) -> bool:
        """Schedule the rest of a request (a decode, or the last chunk of its prompt) with its
        drafts (decodes) and room for the next ones; False (nothing changed) when it has
        neither or the blocks for them are short."""
        assert self.spec is not None
        drafts = self.spec.drafts(req, budget) if n == 1 else []
        props = self.spec.plan_proposals(req, len(drafts))
        if not drafts and not props:
            return False
        if not self.block_manager.allocate(req, n + len(drafts) + self.spec.lookahead(props)):
            return False
        if drafts:
            out.spec_tokens[req.request_id] = drafts
        if props:
            out.num_proposals[req.request_id] = props
        return True

    def _plan_window(self, out: SchedulerOutput) -> None:
        """Multi-step: a plan of decodes only runs each up to num_scheduler_steps steps (guided
        requests one: their masks come from the engine token by token; no further than
        max_tokens or max_model_len), as far as blocks allow."""
        if out.preempted or not out.scheduled:
            return
        for req, n in out.scheduled:
            owed = req.num_tokens - req.num_computed_tokens
            if n != 1 or owed != 1 or not req.output_token_ids or req.pooling:
                return  # a prefill (chunk) in the plan: one step, so its first token is not held
        for req, _ in out.scheduled:
            steps = self.num_scheduler_steps
            if req.grammar is not None:
                steps = 1
            left = req.tokens_left(self.max_model_len)
            if left is not None:
                steps = min(steps, left)
            while steps > 1 and not self.block_manager.allocate(req, steps):
                steps -= 1
            if steps > 1:
                out.num_steps[req.request_id] = steps

    def requeue(self, req: Request) -> None:
        """Put a scheduled request back at the head of the queue, its blocks freed, to be
        computed afresh (its KV could not be loaded)."""
        self.running.remove(req)
        self.block_manager.free(req.request_id)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED if req.num_preemptions else RequestStatus.WAITING
        self.waiting.appendleft(req)

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        """Swap the request's KV to the host pool when it fits there; otherwise free it and
        put the request back at the head of the queue for recompute."""
        self.running.remove(req)
        req.spec_token_ids = []
        req.num_preemptions += 1
        self.stats.num_preemptions += 1
        out.preempted.append(req)  # victims are never already in out.scheduled (see loop)
        # a request whose prompt is still being computed (or that needs every prompt
        # position again) is cheaper to recompute than to swap
        resumable = req.num_computed_tokens >= req.num_prompt_tokens and not req.pooling \
            and req.sampling_params.prompt_logprobs is None
        if resumable and self.block_manager.can_swap_out(req):
            out.blocks_to_swap_out.extend(self.block_manager.swap_out(req))
            req.status = RequestStatus.SWAPPED
            self.stats.num_swap_outs += 1
            self.swapped.append(req)
            return
        self.block_manager.free(req.request_id)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        self.waiting.appendleft(req)

    def on_step_done(self, plan: SchedulerOutput, output: ModelOutput) -> None:
        """Advance computed-token counters after the step ran: rejected drafts do not count
        (their KV is overwritten later), each extra step of a multi-step run does."""
        for req, n in plan.scheduled:
            rid = req.request_id
            drafts = plan.spec_tokens.get(rid, [])
            emitted = len(output.sampled.get(rid, ()))
            req.num_computed_tokens += n - len(drafts) + max(emitted - 1, 0)
            req.spec_token_ids = []
            if self.spec is not None:
                if drafts:
                    self.spec.on_verified(req, len(drafts), emitted)
                self.block_manager.trim(rid, req.num_computed_tokens + self.spec.keep_slots)

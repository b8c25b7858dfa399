"""Scheduler: picks, each step, how many tokens of which requests to run.

One rule covers prefill, chunked prefill and decode: a request owes ``num_tokens -
num_computed_tokens`` tokens, and each step pays as much of that as the token budget allows
(running requests first, then waiting ones in priority/FCFS order). When KV blocks run out, the
most recently admitted running request is preempted and later recomputed.

LoRA: the running requests use at most ``max_loras`` distinct adapters (so every step does). A
waiting request whose adapter would be one too many is passed over, keeping its place in the
queue, until a running adapter's requests finish.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ironlm.engine.block_manager import BlockManager
from ironlm.engine.request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    """One step's plan."""

    # Scheduled requests in batch order, each with the number of new tokens to run this step.
    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    # Requests preempted this step (their blocks were freed; they wait to be recomputed).
    preempted: list[Request] = field(default_factory=list)
    # Requests that reached a finished state since the last step (workers drop their state).
    finished_ids: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class SchedulerStats:
    num_preemptions: int = 0


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool,
        use_priority: bool = False,
        max_loras: int = 0,  # 0: LoRA disabled
    ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.use_priority = use_priority
        self.max_loras = max_loras
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
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
        self.block_manager.free(req.request_id)
        self._finished_ids.append(req.request_id)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

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

        # Running requests first, in admission order; preempt from the back when out of KV.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
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

        # Then waiting requests, while there is budget, room and KV.
        adapters = {r.lora_id for r in self.running if r.lora_id}
        passed_over: list[Request] = []  # their adapter would exceed max_loras this step
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            if out.preempted:
                break  # KV is short this step: do not admit more
            req = self.waiting[0]
            if req.lora_id and req.lora_id not in adapters and len(adapters) >= self.max_loras:
                passed_over.append(self.waiting.popleft())
                continue
            # Prompt logprobs need every prompt position computed: no prefix-cache reuse.
            wants_all = req.sampling_params.prompt_logprobs is not None or req.pooling
            cached = [] if wants_all else self.block_manager.find_cached_prefix(req)
            num_cached = len(cached) * self.block_manager.block_size
            n = req.num_tokens - num_cached
            if n > budget:
                if not self.enable_chunked_prefill:
                    break
                n = budget
            req.num_computed_tokens = num_cached
            if not self.block_manager.allocate(req, n, cached):
                req.num_computed_tokens = 0
                break
            if req.status == RequestStatus.WAITING:
                req.num_cached_tokens = num_cached
            self.block_manager.record_lookup(req.num_tokens, num_cached)
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            if req.lora_id:
                adapters.add(req.lora_id)
            out.scheduled.append((req, n))
            budget -= n
        self.waiting.extendleft(reversed(passed_over))  # back in place, in order
        return out

    def lora_ids(self) -> tuple[set[int], set[int]]:
        """Adapters of the running and of the waiting requests (lora_int_ids)."""
        running = {r.lora_id for r in self.running if r.lora_id}
        return running, {r.lora_id for r in self.waiting if r.lora_id}

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        """Free the request's KV and put it back at the head of the queue for recompute."""
        self.running.remove(req)
        self.block_manager.free(req.request_id)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.waiting.appendleft(req)
        out.preempted.append(req)  # victims are never already in out.scheduled (see loop)

    def on_step_done(self, scheduled: list[tuple[Request, int]]) -> None:
        """Advance computed-token counters after the step ran."""
        for req, n in scheduled:
            req.num_computed_tokens += n

"""The engine's side of KV transfer (vLLM's ``--kv-transfer-config``; the store is a
``KVConnector`` plugin, the workers' side ``ironlm.worker.kv_transfer``).

A prompt's full blocks are named by chained content hashes: block i's key hashes the key of
block i-1 (the first one's parent: the model and the settings its KV depends on, the engines'
KV layout and the request's ``cache_salt``) with the block's token ids, so a key names one
prefix of one model's KV in one layout, whichever engine computed it. A consumer (kv_consumer / kv_both), admitting a request,
asks the store for its blocks past those its own prefix cache holds (at most up to the
prompt's last token, which is always computed, so the first token's logits exist); the
scheduler allocates them like computed ones and the workers copy them in before the step
runs. A producer (kv_producer / kv_both) has the workers store each prompt block a step
completes. Requests with a LoRA adapter or a prompt given as embeddings are not transferred
(their KV depends on what the keys do not name).

A block the store listed but a worker could not load fails its request (vLLM's default
``kv_load_failure_policy`` "fail": the request's output carries the error; a 500 on the
server), or with "recompute" sends it back to the head of the queue to compute its prompt
itself. Either way the failing requests' blocks that no other request holds leave the prefix
cache (a failed block, and those registered at admission for tokens that never ran).
"""

from __future__ import annotations

import hashlib
import json
import logging
from array import array
from dataclasses import dataclass

from ironlm.config import EngineConfig
from ironlm.engine.block_manager import BlockManager
from ironlm.engine.output_processor import OutputProcessor
from ironlm.engine.request import Request
from ironlm.engine.scheduler import Scheduler, SchedulerOutput
from ironlm.interfaces.executor import Executor
from ironlm.interfaces.kv_connector import KVConnector, KVTransferConfig
from ironlm.outputs import RequestOutput
from ironlm.plugin_manager import PluginManager
from ironlm.worker.kv_transfer import build_kv_connector, rank_key

log = logging.getLogger("ironlm.engine")


@dataclass
class ExternalCacheStats:
    """vLLM's vllm:external_prefix_cache_queries / _hits: tokens of admitted requests looked
    up in the store, and of those, tokens loaded from it."""

    queries: int = 0
    hits: int = 0


class KVTransfer:
    def __init__(
        self,
        config: KVTransferConfig,
        connector: KVConnector,
        identity: str,  # the model and the settings its KV depends on (model_identity)
        layouts: list[str],  # each rank's kv_transfer_layout(), in rank order
        block_size: int,
    ) -> None:
        self.config = config
        self.connector = connector
        self.block_size = block_size
        self.num_ranks = len(layouts)
        self._root = hashlib.sha256(
            "\n".join([identity, f"block_size {block_size}", *layouts]).encode()).hexdigest()
        self.stats = ExternalCacheStats()

    # -- keys ------------------------------------------------------------------------------
    @staticmethod
    def transfers(req: Request) -> bool:
        """Whether the request's KV is named by its tokens alone (no adapter, no embeds)."""
        return req.lora_request is None and req.prompt_embeds is None

    def block_keys(self, req: Request, num_blocks: int) -> list[str]:
        """Keys of the request's first ``num_blocks`` full blocks (memoised on the request)."""
        keys = req.kv_block_keys
        bs = self.block_size
        if not keys:
            salt = req.cache_salt if req.cache_salt is not None else ""
            keys.append(hashlib.sha256(f"{self._root}\n{salt}".encode()).hexdigest()[:40])
        while len(keys) <= num_blocks:
            i = len(keys) - 1  # keys[0] is the root
            tokens = array("q", req.token_slice(i * bs, (i + 1) * bs)).tobytes()
            keys.append(hashlib.blake2b(keys[-1].encode() + tokens, digest_size=20).hexdigest())
        return keys[1:num_blocks + 1]

    # -- the scheduler's lookup ------------------------------------------------------------
    def lookup(self, req: Request, num_cached_blocks: int) -> int:
        """Blocks the store holds, in a row, right after the request's first
        ``num_cached_blocks`` (those its own prefix cache holds); prompt blocks only, the
        prompt's last token left to compute."""
        if not self.config.is_kv_consumer or req.kv_load_refused or not self.transfers(req):
            return 0
        last = min(req.num_tokens - 1, req.num_prompt_tokens) // self.block_size
        found = 0
        for key in self.block_keys(req, last)[num_cached_blocks:]:
            if not all(self.connector.contains(rank_key(key, r)) for r in range(self.num_ranks)):
                break
            found += 1
        return found

    def record(self, num_tokens: int, num_loaded_tokens: int) -> None:
        """Count one admitted request's lookup (the external prefix-cache metrics)."""
        if self.config.is_kv_consumer:
            self.stats.queries += num_tokens
            self.stats.hits += num_loaded_tokens

    # -- around a step ---------------------------------------------------------------------
    def load(self, plan: SchedulerOutput, executor: Executor, scheduler: Scheduler,
             outputs: OutputProcessor) -> list[RequestOutput]:  # fmt: skip
        """Have every worker copy the plan's blocks from the store into the KV cache before
        the step runs. The requests holding a block some worker could not load leave the
        plan (with every request their failure finishes) and meet kv_load_failure_policy;
        the final outputs of those that fail."""
        blocks = scheduler.block_manager
        loaded = {req.request_id: count for req, _, count in plan.kv_loads}
        loads = [(blocks.block_ids(req.request_id)[i], key)
                 for req, first, count in plan.kv_loads if not req.is_finished
                 for i, key in enumerate(self.block_keys(req, first + count)) if i >= first]
        plan.kv_loads = []
        failed = set().union(*executor.collective_rpc("load_kv_blocks", loads))
        if not failed:
            return []
        victims = [req for req, _ in plan.scheduled
                   if failed.intersection(blocks.block_ids(req.request_id))]
        # the victims' blocks that no other request holds are not what their hashes say
        # (a failed load, or registered at admission for tokens this step would have run):
        # out of the prefix cache; a block another request holds was filled before
        refs: dict[int, int] = {}
        for req in victims:
            for b in blocks.block_ids(req.request_id):
                refs[b] = refs.get(b, 0) + 1
        blocks.forget([b for b, n in refs.items() if blocks.blocks[b].ref_count == n])
        for req in victims:  # a failed load counts as no hit
            self.stats.queries -= req.num_tokens
            self.stats.hits -= loaded.get(req.request_id, 0) * self.block_size
        finals = self._fail_or_requeue(victims, scheduler, outputs)
        # aborting a request finishes its siblings (n > 1) too: none may run
        plan.scheduled = [(req, n) for req, n in plan.scheduled
                          if req not in victims and not req.is_finished]
        return finals

    def _fail_or_requeue(self, victims: list[Request], scheduler: Scheduler,
                         outputs: OutputProcessor) -> list[RequestOutput]:  # fmt: skip
        names = ", ".join(r.request_id for r in victims)
        if self.config.kv_load_failure_policy == "recompute":
            log.warning("KV blocks of %s could not be loaded: computing their prompts", names)
            for req in reversed(victims):  # back at the head of the queue, in order
                req.kv_load_refused = True
                scheduler.requeue(req)
            return []
        log.warning("KV blocks of %s could not be loaded: failing them", names)
        return outputs.abort(victims, scheduler, error=(
            f"KV blocks of the request could not be loaded from KV connector "
            f"{self.connector.name!r} (kv_load_failure_policy 'fail')"))

    def saves(self, plan: SchedulerOutput, blocks: BlockManager) -> list[tuple[int, str]]:
        """(block id, key) of each prompt block the plan's step completes (taken before the
        step advances the requests' counters)."""
        if not self.config.is_kv_producer:
            return []
        bs = self.block_size
        out: list[tuple[int, str]] = []
        for req, n in plan.scheduled:
            start = req.num_computed_tokens
            end = min(start + n, req.num_prompt_tokens) // bs
            if end <= start // bs or not self.transfers(req):
                continue
            ids = blocks.block_ids(req.request_id)
            keys = self.block_keys(req, end)
            out += [(ids[i], keys[i]) for i in range(start // bs, end)]
        return out


def kv_transfer_of(config: EngineConfig, plugins: PluginManager,
                   executor: Executor) -> KVTransfer | None:  # fmt: skip
    """The engine's KV transfer for ``config`` (None without kv_transfer_config); the
    workers describe their KV layouts for the keys."""
    ktc = config.kv_transfer_config
    if ktc is None:
        return None
    assert isinstance(ktc, KVTransferConfig)  # EngineConfig made it one
    assert config.block_size is not None  # the platform's, set before the workers start
    connector = build_kv_connector(plugins, ktc)
    log.info("KV transfer: %s as %s (kv_load_failure_policy %s)", connector.name, ktc.kv_role,
             ktc.kv_load_failure_policy)
    return KVTransfer(ktc, connector, model_identity(config),
                      executor.collective_rpc("kv_transfer_layout"), config.block_size)


def model_identity(config: EngineConfig) -> str:
    """The engine settings a prompt's KV depends on besides the layout the workers report:
    the model as named, its revision, the weights' format, dtype and quantization, config
    overrides and the attention backend's options (e.g. fp8 cache scales). Weights loaded
    into a running engine afterwards are not in it (README: clear the store)."""
    return json.dumps({
        "model": config.model, "revision": config.revision, "load_format": config.load_format,
        "dtype": config.dtype, "quantization": config.quantization,
        "hf_overrides": config.hf_overrides, "kv_cache_dtype": config.kv_cache_dtype,
        "attention_backend_options": config.attention_backend_options,
        "disable_sliding_window": config.disable_sliding_window,
    }, sort_keys=True, default=str)

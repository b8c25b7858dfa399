"""ModelRunner: one step of a loaded model (the worker owns the model, the KV cache and the
runner; the runner holds the sampler and the per-request sampling state).

Each step flattens all scheduled tokens into one batch, builds the attention backend's
metadata once, runs the model, computes logits only at positions that sample (or whose prompt
logprobs were asked for), and samples. With speculative decoding the drafts run in the same
forward, right after their request's last token, and the ``Speculator`` (on the sampling rank)
verifies them and asks for the next ones; with multi-step scheduling ``run_window`` runs
several decode steps.

With pipeline stages, every rank runs the same step on its own layers: a stage after the first
receives the previous stage's activations first, a stage before the last sends its own and
returns None. The last stage's ranks all compute logits (the LM head gathers them over the
tensor-parallel group); only the sampling rank samples and returns the output.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ironlm.attention.batch import build_attention_batch
from ironlm.config import EngineConfig
from ironlm.distributed.pipeline import PipelineChannel
from ironlm.interfaces.attention import AttentionBackend
from ironlm.interfaces.model import ModelArchitecture
from ironlm.interfaces.platform import LayerOps
from ironlm.interfaces.step import ModelInput, ModelOutput, ScheduledSeq
from ironlm.worker.decode_graphs import DecodeGraphs
from ironlm.worker.logits_batch import LogitsProcessorBatch
from ironlm.worker.lora_manager import WorkerLoRAManager
from ironlm.worker.multi_step import run_window
from ironlm.worker.prompt_rows import spliced_embeds
from ironlm.worker.sampler import Sampler, SamplingState, top_logprobs
from ironlm.worker.speculator import Speculator


@dataclass
class StageInfo:
    """This rank's part of a step."""

    is_last: bool = True  # holds the last pipeline stage (norm, LM head)
    samples: bool = True  # samples and returns the step's output to the engine
    channel: PipelineChannel | None = None  # to and from the neighbour stages (pp > 1)
    hidden_size: int = 0  # of the activations a later stage receives
    dtype: torch.dtype = torch.float32


class ModelRunner:
    """Runs one step of a loaded model over its KV cache (set by the worker once allocated)."""

    def __init__(
        self,
        config: EngineConfig,
        model: ModelArchitecture,
        attention: AttentionBackend,
        device: torch.device,
        vocab_size: int,
        stage: StageInfo | None = None,
        lora: WorkerLoRAManager | None = None,
        ops: LayerOps | None = None,  # the platform's (the sampler's row reductions)
    ) -> None:
        self.stage = stage or StageInfo()
        self.steps = 0  # model forwards run (the collective statistics' denominator)
        self.config = config
        self.model = model
        self.attention = attention
        self.device = device
        self.vocab_size = vocab_size
        self.kv_caches: list[torch.Tensor] = []  # one per attention layer
        self.swap_caches: list[torch.Tensor] = []  # host swap space, one per layer (or none)
        self.graphs: DecodeGraphs | None = None  # set with the KV cache unless enforce_eager
        self.lora = lora  # the adapters, when LoRA is enabled
        # vLLM's --logits-processors (classes: the engine loaded them), on the sampling rank
        custom = LogitsProcessorBatch(config.logits_processors, config, device) \
            if config.logits_processors and self.stage.samples else None
        self.sampler = Sampler(ops, config.logprobs_mode, custom)
        self.states: dict[str, SamplingState] = {}
        self.embed_sums: dict[str, torch.Tensor] = {}  # pooling requests: running hidden sums
        # token pooling requests: each chunk's rows so far, (chunk_tokens, hidden | labels)
        self.row_parts: dict[str, list[torch.Tensor]] = {}
        self.speculator: Speculator | None = None  # set by the worker with a proposer

    # -- one step --------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, mi: ModelInput) -> ModelOutput | None:
        stage = self.stage
        if mi.blocks_to_swap_out or mi.blocks_to_swap_in:
            self.swap(mi.blocks_to_swap_out, mi.blocks_to_swap_in)
        for rid in mi.finished_ids:
            self.states.pop(rid, None)
            self.embed_sums.pop(rid, None)
            self.row_parts.pop(rid, None)
        for rid in mi.preempted_ids:  # a pooling request is recomputed from its first token
            self.embed_sums.pop(rid, None)
            self.row_parts.pop(rid, None)
        if stage.is_last:  # only the last stage samples or pools
            for nr in mi.new_requests:
                self.states[nr.request_id] = SamplingState.create(
                    nr.sampling_params, nr.eos_token_id, nr.prompt_token_ids, self.vocab_size,
                    self.device,
                )
                self.states[nr.request_id].pooling = nr.pooling
                self.states[nr.request_id].pool_every_row = nr.pool_every_row
        if self.speculator is not None:
            self.speculator.drop(mi.finished_ids + mi.preempted_ids)
        out = ModelOutput()
        if not mi.seqs:
            return out if stage.samples else None
        self.steps += 1
        if any(s.num_steps > 1 for s in mi.seqs):
            return run_window(self, mi, out)  # one rank only (EngineConfig checks)
        start = time.perf_counter()
        hidden_of = self._run(mi, out)
        if not stage.samples:
            return None
        if self.speculator is not None:
            mid = time.perf_counter()
            out.spec_token_ids = self.speculator.propose(mi.seqs, out.sampled, hidden_of)
            out.target_time, out.draft_time = mid - start, time.perf_counter() - mid
        return out

    def _run(self, mi: ModelInput, out: ModelOutput) -> dict[str, torch.Tensor] | None:
        """This rank's part of the step: the forward, then on the sampling rank sampling (or
        verification); returns each request's accepted rows of hidden states when the
        proposer reads them."""
        stage = self.stage
        lora_slots = self._lora_slots(mi.seqs)
        logits = self._decode_graph_logits(mi.seqs, lora_slots)
        if logits is not None:  # every sequence samples its next token
            self._sample(out, mi, logits, mi.seqs)
            return None
        input_ids, positions, batch = self._flatten(mi.seqs)
        if self.lora is not None:  # each sequence's rows: its new tokens, then its drafts
            self.lora.bind_tokens(lora_slots, [len(s.token_ids) + len(s.spec_token_ids)
                                               for s in mi.seqs])  # fmt: skip
        meta = self.attention.build_metadata(batch)
        intermediate = None
        if stage.channel is not None and stage.channel.prev_rank is not None:
            intermediate = stage.channel.recv(
                len(input_ids), stage.hidden_size, stage.dtype, self.device
            )  # fmt: skip
        extra: dict[str, torch.Tensor] = {}  # prompt_embeds: the first stage runs the rows
        if any(s.prompt_embeds is not None for s in mi.seqs) and intermediate is None:
            extra["inputs_embeds"] = spliced_embeds(self.model, mi.seqs, input_ids)
        result = self.model(input_ids, positions, self.kv_caches, meta, intermediate, **extra)
        if not stage.is_last:
            assert stage.channel is not None and isinstance(result, dict)
            stage.channel.send(result)
            return None
        assert isinstance(result, torch.Tensor)
        hidden = result  # (T, hidden)

        starts = batch.query_start_loc.tolist()
        sample_rows: list[int] = []
        sample_seqs: list[ScheduledSeq] = []
        for i, seq in enumerate(mi.seqs):
            state = self.states[seq.request_id]
            if state.pool_every_row:  # a token task: every row (classified on a classifier)
                rows = hidden[starts[i] : starts[i + 1]]
                parts = self.row_parts.setdefault(seq.request_id, [])
                # a copy in host memory: a view would keep the step's whole hidden tensor
                parts.append((self.model.classify(rows) if self.model.classifies else rows)
                             .to("cpu", torch.float32, copy=True))
                if seq.sample:
                    out.embeddings[seq.request_id] = torch.cat(self.row_parts.pop(seq.request_id))
                continue
            if state.pooling and self.model.classifies:  # the prompt's last row, classified
                if seq.sample:
                    row = hidden[starts[i + 1] - 1 : starts[i + 1]]
                    out.embeddings[seq.request_id] = self.model.classify(row)[0]
                continue
            if state.pooling:  # embedding request: accumulate mean-pool sums
                part = hidden[starts[i] : starts[i + 1]].float().sum(dim=0)
                acc = self.embed_sums.get(seq.request_id)
                self.embed_sums[seq.request_id] = part if acc is None else acc + part
                if seq.sample:
                    total = self.embed_sums.pop(seq.request_id)
                    out.embeddings[seq.request_id] = total / (seq.start_pos + len(seq.token_ids))
                continue
            if seq.want_prompt_logprobs:
                out.prompt_logprobs[seq.request_id] = self._prompt_logprobs(
                    seq, hidden[starts[i] : starts[i + 1]], state
                )
            if seq.sample:  # the last real token's row, then one row per draft
                end = starts[i + 1]
                sample_rows += range(end - 1 - len(seq.spec_token_ids), end)
                sample_seqs.append(seq)
        if sample_rows:
            logits = self.model.compute_logits(hidden[sample_rows])  # (rows, V) float32
            if not stage.samples:
                return None
            if any(s.spec_token_ids for s in sample_seqs):
                assert self.speculator is not None, "drafts sent to a worker without a proposer"
                for seq, toks in zip(sample_seqs, self.speculator.verify(
                        logits, sample_seqs, mi.allowed_mask)):  # fmt: skip
                    out.sampled[seq.request_id] = toks
            else:
                self._sample(out, mi, logits, sample_seqs)
        if self.speculator is None or not self.speculator.proposer.needs_target_hidden_states:
            return None
        return _accepted_hidden(hidden, starts, mi.seqs, out)

    def swap(self, out: list[tuple[int, int]], into: list[tuple[int, int]]) -> None:
        """Swap preemption: preempted requests' blocks to the host swap space, then resumed
        ones back (out first: a device block freed by a swap-out may be reused by a swap-in
        of the same step)."""
        if not self.swap_caches:
            raise RuntimeError("blocks to swap, but this worker has no swap space")
        for device_cache, host_cache in zip(self.kv_caches, self.swap_caches):
            if out:
                self.attention.swap_blocks(device_cache, host_cache, [d for d, _ in out],
                                           [h for _, h in out])
            if into:
                self.attention.swap_blocks(host_cache, device_cache, [h for h, _ in into],
                                           [d for _, d in into])

    def _lora_slots(self, seqs: list[ScheduledSeq]) -> list[int]:
        """Each sequence's adapter slot (-1: none), adapters copied into slots as needed."""
        if self.lora is None:
            if any(s.lora_id for s in seqs):
                raise ValueError("a sequence names a LoRA adapter but LoRA is not enabled")
            return [-1] * len(seqs)
        return self.lora.slots_for([s.lora_id for s in seqs])

    def _decode_graph_logits(
        self, seqs: list[ScheduledSeq], lora_slots: list[int]
    ) -> torch.Tensor | None:
        """(B, V) logits through a decode graph when the step is plain decode (one new token
        per sequence, each sampling, no pooling or prompt logprobs); None: run eagerly."""
        if self.graphs is None or not self.graphs.accepts(len(seqs)):
            return None
        for s in seqs:
            if len(s.token_ids) != 1 or not s.sample or s.want_prompt_logprobs or s.spec_token_ids:
                return None
            if s.prompt_embeds is not None:  # a prompt's last row, given as an embedding
                return None
            if self.states[s.request_id].pooling:
                return None
        return self.graphs.run(
            [s.token_ids[0] for s in seqs], [s.start_pos for s in seqs],
            [s.block_ids for s in seqs], lora_slots,
        )  # fmt: skip

    def _sample(
        self, out: ModelOutput, mi: ModelInput, logits: torch.Tensor, seqs: list[ScheduledSeq]
    ) -> None:
        states = [self.states[s.request_id] for s in seqs]
        mask = mi.allowed_mask
        if mask is not None and mask.shape[1] != logits.shape[1]:
            raise ValueError("guided mask width differs from the model's vocabulary")
        for seq, tok in zip(seqs, self.sampler(logits, states, mask)):
            out.sampled[seq.request_id] = [tok]

    def decode_logits(self, seqs: list[ScheduledSeq]) -> torch.Tensor:
        """(B, V) logits of a pure decode step (one token per sequence), through a decode graph
        when one applies."""
        lora_slots = self._lora_slots(seqs)
        logits = self._decode_graph_logits(seqs, lora_slots)
        if logits is not None:
            return logits
        input_ids, positions, batch = self._flatten(seqs)
        if self.lora is not None:
            self.lora.bind_tokens(lora_slots, [1] * len(seqs))
        hidden = self.model(input_ids, positions, self.kv_caches,
                            self.attention.build_metadata(batch))  # fmt: skip
        return self.model.compute_logits(hidden)

    def _flatten(self, seqs: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        ids: list[int] = []
        pos: list[int] = []
        for s in seqs:
            ids.extend(s.token_ids)
            ids.extend(s.spec_token_ids)
            pos.extend(range(s.start_pos, s.start_pos + len(s.token_ids) + len(s.spec_token_ids)))
        batch = build_attention_batch(
            [s.start_pos for s in seqs],
            [len(s.token_ids) + len(s.spec_token_ids) for s in seqs],
            [s.block_ids for s in seqs],
            self.config.block_size,
            self.device,
        )
        return (
            torch.tensor(ids, dtype=torch.long, device=self.device),
            torch.tensor(pos, dtype=torch.long, device=self.device),
            batch,
        )

    def _prompt_logprobs(
        self, seq: ScheduledSeq, hidden: torch.Tensor, state: SamplingState
    ) -> list[list[tuple[int, float, int]]]:
        """Logprobs of the prompt tokens at positions start_pos+1 .. predicted by this chunk."""
        prompt = state.prompt_token_ids
        assert prompt is not None, "prompt logprobs of a prompt given as embeddings"
        # hidden row r (position start_pos + r) predicts the token at position start_pos + r + 1
        last_pos = min(seq.start_pos + len(seq.token_ids), len(prompt) - 1)
        rows = list(range(0, last_pos - seq.start_pos))
        if not rows:
            return []
        # (rows, V) logprobs of the model's distribution in every logprobs_mode (vLLM's: no
        # processor acts on a prompt, and its prompt logprobs are logprobs in the logits modes)
        lps = torch.log_softmax(self.model.compute_logits(hidden[rows]).float(), dim=-1)
        k = state.params.prompt_logprobs or 0
        return [
            top_logprobs(lps[j], prompt[seq.start_pos + r + 1], k) for j, r in enumerate(rows)
        ]


def _accepted_hidden(
    hidden: torch.Tensor, starts: list[int], seqs: list[ScheduledSeq], out: ModelOutput
) -> dict[str, torch.Tensor]:
    """Per sampling request: its rows whose tokens are now part of the sequence (a prefill
    chunk's rows; a decode's last token and its accepted drafts)."""
    rows: dict[str, torch.Tensor] = {}
    for i, s in enumerate(seqs):
        sampled = out.sampled.get(s.request_id)
        if sampled is None:
            continue
        keep = len(s.token_ids) + len(sampled) - 1  # real tokens, then the accepted drafts
        rows[s.request_id] = hidden[starts[i] : starts[i] + keep]
    return rows

"""ModelRunner: one step of a loaded model (the worker owns the model, the KV cache and the
runner; the runner holds the sampler and the per-request sampling state).

Each step flattens all scheduled tokens into one batch, builds the attention backend's
metadata once, runs the model, computes logits only at positions that sample (or whose prompt
logprobs were asked for), and samples.

With pipeline stages, every rank runs the same step on its own layers: a stage after the first
receives the previous stage's activations first, a stage before the last sends its own and
returns None. The last stage's ranks all compute logits (the LM head gathers them over the
tensor-parallel group); only the sampling rank samples and returns the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ironlm.attention.batch import build_attention_batch
from ironlm.config import EngineConfig
from ironlm.distributed.pipeline import PipelineChannel
from ironlm.interfaces.attention import AttentionBackend
from ironlm.interfaces.model import ModelArchitecture
from ironlm.interfaces.step import ModelInput, ModelOutput, ScheduledSeq
from ironlm.worker.decode_graphs import DecodeGraphs
from ironlm.worker.sampler import Sampler, SamplingState, top_logprobs


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
        self.sampler = Sampler()
        self.states: dict[str, SamplingState] = {}
        self.embed_sums: dict[str, torch.Tensor] = {}  # pooling requests: running hidden sums

    # -- one step --------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, mi: ModelInput) -> ModelOutput | None:
        stage = self.stage
        if mi.blocks_to_swap_out or mi.blocks_to_swap_in:
            self.swap(mi.blocks_to_swap_out, mi.blocks_to_swap_in)
        for rid in mi.finished_ids:
            self.states.pop(rid, None)
            self.embed_sums.pop(rid, None)
        if stage.is_last:  # only the last stage samples or pools
            for nr in mi.new_requests:
                self.states[nr.request_id] = SamplingState.create(
                    nr.sampling_params, nr.eos_token_id, nr.prompt_token_ids, self.vocab_size,
                    self.device,
                )
                self.states[nr.request_id].pooling = nr.pooling
        out = ModelOutput()
        if not mi.seqs:
            return out if stage.samples else None
        self.steps += 1
        logits = self._decode_graph_logits(mi.seqs)
        if logits is not None:  # every sequence samples its next token
            self._sample(out, mi, logits, mi.seqs)
            return out
        input_ids, positions, batch = self._flatten(mi.seqs)
        meta = self.attention.build_metadata(batch)
        intermediate = None
        if stage.channel is not None and stage.channel.prev_rank is not None:
            intermediate = stage.channel.recv(
                len(input_ids), stage.hidden_size, stage.dtype, self.device
            )  # fmt: skip
        result = self.model(input_ids, positions, self.kv_caches, meta, intermediate)
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
            if seq.sample:
                sample_rows.append(starts[i + 1] - 1)
                sample_seqs.append(seq)
        if sample_rows:
            logits = self.model.compute_logits(hidden[sample_rows])  # (B, V) float32
            if stage.samples:
                self._sample(out, mi, logits, sample_seqs)
        return out if stage.samples else None

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

    def _decode_graph_logits(self, seqs: list[ScheduledSeq]) -> torch.Tensor | None:
        """(B, V) logits through a decode graph when the step is plain decode (one new token
        per sequence, each sampling, no pooling or prompt logprobs); None: run eagerly."""
        if self.graphs is None or not self.graphs.accepts(len(seqs)):
            return None
        for s in seqs:
            if len(s.token_ids) != 1 or not s.sample or s.want_prompt_logprobs:
                return None
            if self.states[s.request_id].pooling:
                return None
        return self.graphs.run(
            [s.token_ids[0] for s in seqs], [s.start_pos for s in seqs],
            [s.block_ids for s in seqs],
        )  # fmt: skip

    def _sample(
        self, out: ModelOutput, mi: ModelInput, logits: torch.Tensor, seqs: list[ScheduledSeq]
    ) -> None:
        states = [self.states[s.request_id] for s in seqs]
        mask = mi.allowed_mask
        if mask is not None and mask.shape[1] != logits.shape[1]:
            raise ValueError("guided mask width differs from the model's vocabulary")
        for seq, tok in zip(seqs, self.sampler(logits, states, mask)):
            out.sampled[seq.request_id] = tok

    def _flatten(self, seqs: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        ids: list[int] = []
        pos: list[int] = []
        for s in seqs:
            ids.extend(s.token_ids)
            pos.extend(range(s.start_pos, s.start_pos + len(s.token_ids)))
        batch = build_attention_batch(
            [s.start_pos for s in seqs],
            [len(s.token_ids) for s in seqs],
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
        # hidden row r (position start_pos + r) predicts the token at position start_pos + r + 1
        last_pos = min(seq.start_pos + len(seq.token_ids), len(prompt) - 1)
        rows = list(range(0, last_pos - seq.start_pos))
        if not rows:
            return []
        lps = torch.log_softmax(self.model.compute_logits(hidden[rows]), dim=-1)
        k = state.params.prompt_logprobs or 0
        return [
            top_logprobs(lps[j], prompt[seq.start_pos + r + 1], k) for j, r in enumerate(rows)
        ]

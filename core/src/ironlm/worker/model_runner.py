"""ModelRunner: one step of a loaded model (the worker owns the model, the KV cache and the
runner; the runner holds the sampler and the per-request sampling state).

Each step flattens all scheduled tokens into one batch, builds the attention backend's
metadata once, runs the model, computes logits only at positions that sample (or whose prompt
logprobs were asked for), and samples.
"""

from __future__ import annotations

from typing import Any

import torch

from ironlm.attention.batch import build_attention_batch
from ironlm.config import EngineConfig
from ironlm.interfaces.attention import AttentionBackend
from ironlm.interfaces.model import ModelArchitecture
from ironlm.interfaces.step import ModelInput, ModelOutput, ScheduledSeq
from ironlm.worker.decode_graphs import DecodeGraphs
from ironlm.worker.lora_manager import WorkerLoRAManager
from ironlm.worker.sampler import Sampler, SamplingState, top_logprobs


class ModelRunner:
    """Runs one step of a loaded model over its KV cache (set by the worker once allocated)."""

    def __init__(
        self,
        config: EngineConfig,
        model: ModelArchitecture,
        attention: AttentionBackend,
        device: torch.device,
        vocab_size: int,
        lora: WorkerLoRAManager | None = None,
    ) -> None:
        self.config = config
        self.model = model
        self.attention = attention
        self.device = device
        self.vocab_size = vocab_size
        self.kv_caches: list[torch.Tensor] = []  # one per attention layer
        self.graphs: DecodeGraphs | None = None  # set with the KV cache unless enforce_eager
        self.lora = lora  # the adapters, when LoRA is enabled
        self.sampler = Sampler()
        self.states: dict[str, SamplingState] = {}
        self.embed_sums: dict[str, torch.Tensor] = {}  # pooling requests: running hidden sums

    # -- one step --------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, mi: ModelInput) -> ModelOutput:
        for rid in mi.finished_ids:
            self.states.pop(rid, None)
            self.embed_sums.pop(rid, None)
        for nr in mi.new_requests:
            self.states[nr.request_id] = SamplingState.create(
                nr.sampling_params, nr.eos_token_id, nr.prompt_token_ids, self.vocab_size,
                self.device,
            )
            self.states[nr.request_id].pooling = nr.pooling
        out = ModelOutput()
        if not mi.seqs:
            return out
        lora_slots = self._lora_slots(mi.seqs)
        logits = self._decode_graph_logits(mi.seqs, lora_slots)
        if logits is not None:  # every sequence samples its next token
            self._sample(out, mi, logits, mi.seqs)
            return out
        input_ids, positions, batch = self._flatten(mi.seqs)
        if self.lora is not None:
            self.lora.bind_tokens(lora_slots, [len(s.token_ids) for s in mi.seqs])
        meta = self.attention.build_metadata(batch)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)  # (T, hidden)

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
            self._sample(out, mi, logits, sample_seqs)
        return out

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
            if len(s.token_ids) != 1 or not s.sample or s.want_prompt_logprobs:
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

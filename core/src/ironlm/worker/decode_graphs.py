"""DecodeGraphs: pure-decode steps of small batches through the platform's captured graphs.

vLLM's CUDA-graph scheme, through the platform (``ironlm.interfaces.graphs``): a batch of n
decode sequences is padded to the next capture size (``capture_sizes``: vLLM's 1, 2, 4, 8,
16, 24, ... up to the capture's ``max_batch_size``, or the engine's cudagraph_capture_sizes /
max_cudagraph_capture_size); the first step of each size copies its inputs into static
tensors and runs the forward, LM head included, under capture (where the platform's capture
computes as it records, that forward is the step: no replay); every later step of that size
copies its inputs into those tensors and replays. Padding rows read token 0 at position 0 with seq_len 1 and write
nothing (slot -1); their logits are dropped. A capture that fails (``GraphCaptureError``) turns
graphs off for the engine, with the reason logged once, and every step runs eagerly, as with
``enforce_eager``.

With LoRA enabled the capture binds a static per-row slot tensor to the model's LoRA layers
(``LoRAStepState``) and records their kernel calls; each replay writes the rows' adapter slots
into it (padding rows: -1), so mixed-adapter decode steps replay too. The slot stacks are
updated in place when adapters change slots, so recorded pointers stay valid.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from ironlm.interfaces.attention import AttentionBackend, AttentionBatch
from ironlm.interfaces.graphs import GraphCapture, GraphCaptureError, StepGraph
from ironlm.interfaces.model import ModelArchitecture
from ironlm.lora.layer import LoRAStepState

logger = logging.getLogger(__name__)


@dataclass
class _StaticInputs:
    batch: AttentionBatch  # static: seq_lens, context_lens, block_tables, slot_mapping
    metadata: Any  # the backend's graph metadata over ``batch``
    # (3, size) int64 rows: input ids, positions, slot mapping (batch.slot_mapping is row 2);
    # one host-to-device copy fills them each step
    longs: torch.Tensor
    # (2, size) int32 rows: batch.seq_lens, batch.context_lens; one copy each step
    lens: torch.Tensor
    lora_slots: torch.Tensor | None  # (size,) int32 adapter slot per row, with LoRA

    @property
    def input_ids(self) -> torch.Tensor:
        return self.longs[0]

    @property
    def positions(self) -> torch.Tensor:
        return self.longs[1]


@dataclass
class _Captured:
    graph: StepGraph
    inputs: _StaticInputs
    logits: torch.Tensor  # (size, vocab) float32, rewritten by each replay


def capture_sizes(
    requested: list[int] | None, largest: int | None, platform_largest: int,
    max_num_seqs: int | None = None, num_speculative_tokens: int = 0,
) -> list[int]:  # fmt: skip
    """The decode batch sizes to capture, ascending: the ``requested`` ones (EngineConfig
    checked them against ``largest``), else vLLM's pattern, 1, 2, 4, then every 8th size to
    256 and every 16th beyond, up to ``largest``; by default (vLLM's) twice the tokens a step
    of ``max_num_seqs`` sequences decodes, within the platform's largest."""
    if requested:
        return sorted(set(requested))
    top = largest
    if top is None:
        top = platform_largest
        if max_num_seqs is not None:
            top = min(top, max_num_seqs * (1 + num_speculative_tokens) * 2)
    pattern = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
    return [n for n in pattern if n <= top]


class DecodeGraphs:
    def __init__(
        self,
        capture: GraphCapture,
        model: ModelArchitecture,
        attention: AttentionBackend,
        kv_caches: list[torch.Tensor],
        block_size: int,
        max_model_len: int,
        device: torch.device,
        lora_state: LoRAStepState | None = None,
        sizes: list[int] | None = None,  # ascending (capture_sizes); None: its default
    ) -> None:
        self.capture = capture
        self.lora_state = lora_state
        self.model = model
        self.attention = attention
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.max_blocks = -(-max_model_len // block_size)
        self.sizes = sizes or capture_sizes(None, None, capture.max_batch_size)
        self.graphs: dict[int, _Captured] = {}
        self.disabled: str | None = None  # why graphs are off, once a capture failed

    def forget(self) -> None:
        """Drop every captured graph (the weights or the KV cache moved, sleep mode: the
        recorded addresses are stale); the next step of each size captures again."""
        self.graphs.clear()

    def accepts(self, num_seqs: int) -> bool:
        return self.disabled is None and 0 < num_seqs <= self.sizes[-1]

    def run(
        self,
        token_ids: list[int],  # (n,) each sequence's new token
        positions: list[int],  # (n,) its position (= tokens cached before it)
        block_tables: list[list[int]],  # per sequence: its blocks, covering position + 1 slots
        lora_slots: list[int] | None = None,  # (n,) adapter slot per sequence, -1: none
    ) -> torch.Tensor | None:
        """(n, vocab) float32 logits of one decode step, or None when graphs are off (the
        caller runs the step eagerly). The tensor is overwritten by the next replay."""
        n = len(token_ids)
        size = next(s for s in self.sizes if s >= n)
        captured = self.graphs.get(size)
        if captured is None:
            try:
                inputs = self._static_inputs(size)
                self._fill(inputs, token_ids, positions, block_tables, lora_slots)
                captured = self._capture(inputs)
            except GraphCaptureError as exc:
                self.disabled = str(exc)
                logger.info("decode graphs off, every step runs eagerly: %s", exc)
                return None
            self.graphs[size] = captured
            if self.capture.computes_on_capture:  # the captured forward was this step
                return captured.logits[:n]
        else:
            self._fill(captured.inputs, token_ids, positions, block_tables, lora_slots)
        captured.graph.replay()
        return captured.logits[:n]

    def _fill(
        self, c: _StaticInputs, ids: list[int], pos: list[int], tables: list[list[int]],
        lora_slots: list[int] | None,
    ) -> None:  # fmt: skip
        n, size, bs = len(ids), c.input_ids.shape[0], self.block_size
        pad = size - n
        slots = [t[p // bs] * bs + p % bs for t, p in zip(tables, pos)]
        c.longs.copy_(torch.tensor([ids + [0] * pad, pos + [0] * pad, slots + [-1] * pad],
                                   dtype=torch.int64))  # fmt: skip
        c.lens.copy_(torch.tensor([[p + 1 for p in pos] + [1] * pad, pos + [0] * pad],
                                  dtype=torch.int32))  # fmt: skip
        width = max(len(t) for t in tables)
        c.batch.block_tables[:n, :width].copy_(
            torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        )
        if c.lora_slots is not None:
            slots = (lora_slots or [-1] * n) + [-1] * pad
            c.lora_slots.copy_(torch.tensor(slots, dtype=torch.int32))
        self.attention.refresh_graph_metadata(c.metadata, c.batch)

    def _static_inputs(self, size: int) -> _StaticInputs:
        dev = self.device
        longs = torch.zeros(3, size, dtype=torch.int64, device=dev)
        longs[2] = -1  # slot mapping: padding rows write nothing
        lens = torch.zeros(2, size, dtype=torch.int32, device=dev)
        lens[0] = 1  # seq_lens
        batch = AttentionBatch(
            query_start_loc=torch.arange(size + 1, dtype=torch.int32, device=dev),
            seq_lens=lens[0],
            context_lens=lens[1],
            block_tables=torch.zeros(size, self.max_blocks, dtype=torch.int32, device=dev),
            slot_mapping=longs[2],
            block_size=self.block_size,
            max_query_len=1,
            max_seq_len=self.max_blocks * self.block_size,
            query_lens_cpu=[1] * size,
            seq_lens_cpu=[1] * size,
        )
        metadata = self.attention.graph_metadata(batch)
        if metadata is None:
            raise GraphCaptureError(f"attention backend {self.attention.name!r} has no graphs")
        lora_slots = None
        if self.lora_state is not None:  # the LoRA kernels read a static slot tensor
            lora_slots = torch.full((size,), -1, dtype=torch.int32, device=dev)
        return _StaticInputs(batch, metadata, longs, lens, lora_slots)

    def _capture(self, inputs: _StaticInputs) -> _Captured:
        if self.lora_state is not None:  # record the LoRA kernels over the static slot tensor
            assert inputs.lora_slots is not None
            self.lora_state.bind(inputs.lora_slots, active=True)

        def forward() -> torch.Tensor:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches,
                                inputs.metadata)  # fmt: skip
            return self.model.compute_logits(hidden)  # (size, vocab)

        graph, logits = self.capture.capture(forward)
        return _Captured(graph, inputs, logits)

"""DraftModelRunner: a second model on the worker, for a proposer (``DraftModel``).

Loaded like the target (same platform, attention backend, dtype; its own quantization config
when it has one), with its own KV cache of the target's block layout, allocated with the
target's block count, and its own decode graphs for single-token steps.
"""

from __future__ import annotations

import torch

from ironlm.attention.batch import build_attention_batch
from ironlm.config import EngineConfig
from ironlm.interfaces.attention import AttentionBackend
from ironlm.interfaces.model import ModelArchitecture, ModelContext
from ironlm.interfaces.platform import Platform
from ironlm.interfaces.quantization import QuantizationMethod, UnquantizedMethod
from ironlm.interfaces.spec_decode import DraftModel, DraftSeq
from ironlm.model_loader import HubOptions, load_model, resolve_model
from ironlm.plugin_manager import PluginManager
from ironlm.worker.decode_graphs import DecodeGraphs
from ironlm.worker.kv_cache import KVCache


class DraftModelRunner(DraftModel):
    def __init__(
        self,
        path: str,
        config: EngineConfig,
        plugins: PluginManager,
        platform: Platform,
        attention: AttentionBackend,  # a fresh instance of the target's backend
        dtype: torch.dtype,
        device: torch.device,
        device_index: int,
    ) -> None:
        source = resolve_model(path, config.trust_remote_code, None, HubOptions.cache_of(config))
        layer_ops = platform.layer_ops()
        quant: QuantizationMethod = UnquantizedMethod()
        qcfg = source.quantization_config
        if qcfg is not None:
            quant = plugins.select_quantization(qcfg["quant_method"], platform).from_config(qcfg)
        self.ctx = ModelContext(attention=attention, layer_ops=layer_ops, quantization=quant,
                                dtype=dtype, device=device)  # fmt: skip
        model_cls = plugins.select_model(source.architectures)
        # a draft of a dummy-weight benchmark is random too; otherwise its own files decide
        fmt = "dummy" if config.load_format == "dummy" else "auto"
        self.model: ModelArchitecture = load_model(source, model_cls, self.ctx, fmt, config.seed)
        self.config = config
        self.platform = platform
        self.attention = attention
        self.device = device
        self.vocab_size = int(source.hf_config.vocab_size)
        self.max_model_len = source.max_position_embeddings
        self.kv = KVCache(config, platform, attention, self.model.attention_layers(), dtype,
                          device, device_index)  # fmt: skip
        self.kv_caches: list[torch.Tensor] = []
        self.graphs: DecodeGraphs | None = None

    def kv_cache_bytes_per_block(self) -> int:
        return self.kv.bytes_per_block()

    def initialize_kv_cache(self, num_kv_blocks: int) -> None:
        self.kv_caches = self.kv.allocate(num_kv_blocks)
        capture = None if self.config.enforce_eager else self.platform.graph_capture(self.ctx)
        if capture is not None:
            longest = min(self.max_model_len, num_kv_blocks * self.config.block_size)
            self.graphs = DecodeGraphs(capture, self.model, self.attention, self.kv_caches,
                                       self.config.block_size, longest, self.device)  # fmt: skip

    @torch.inference_mode()
    def forward(self, seqs: list[DraftSeq]) -> torch.Tensor:
        if not self.kv_caches:
            raise RuntimeError("draft model: initialize_kv_cache() has not run")
        if self.graphs is not None and self.graphs.accepts(len(seqs)) and all(
            len(s.token_ids) == 1 for s in seqs
        ):
            logits = self.graphs.run([s.token_ids[0] for s in seqs], [s.start_pos for s in seqs],
                                     [s.block_ids for s in seqs])  # fmt: skip
            if logits is not None:
                return logits.clone()  # the graph rewrites its output on the next replay
        ids: list[int] = []
        pos: list[int] = []
        for s in seqs:
            ids += s.token_ids
            pos += range(s.start_pos, s.start_pos + len(s.token_ids))
        batch = build_attention_batch([s.start_pos for s in seqs],
                                      [len(s.token_ids) for s in seqs],
                                      [s.block_ids for s in seqs], self.config.block_size,
                                      self.device)  # fmt: skip
        hidden = self.model(
            torch.tensor(ids, dtype=torch.long, device=self.device),
            torch.tensor(pos, dtype=torch.long, device=self.device),
            self.kv_caches,
            self.attention.build_metadata(batch),
        )  # (T, hidden)
        last = (batch.query_start_loc[1:] - 1).long()
        return self.model.compute_logits(hidden[last])  # (len(seqs), V)

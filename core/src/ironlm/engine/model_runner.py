"""ModelRunner (worker side): owns the model, the KV cache and the sampler.

Each step flattens all scheduled tokens into one batch, builds the attention backend's
metadata once, runs the model, computes logits only at positions that sample (or whose prompt
logprobs were asked for), and samples.
"""

from __future__ import annotations

from typing import Any

import torch

from ironlm.attention.batch import build_attention_batch
from ironlm.engine.config import EngineConfig
from ironlm.engine.decode_graphs import DecodeGraphs
from ironlm.engine.model_input import ModelInput, ModelOutput, ScheduledSeq
from ironlm.engine.sampler import Sampler, SamplingState, top_logprobs
from ironlm.interfaces.model import ModelArchitecture, ModelContext
from ironlm.interfaces.quantization import UnquantizedMethod
from ironlm.model_loader import ModelSource, load_model, resolve_model
from ironlm.plugin_manager import PluginManager

_CPU_DEFAULT_KV_BYTES = 4 * 1024**3  # like vLLM's VLLM_CPU_KVCACHE_SPACE default


class ModelRunner:
    def __init__(self, config: EngineConfig, pm: PluginManager, rank: int = 0) -> None:
        self.config = config
        self.pm = pm
        self.rank = rank
        self.platform = pm.select_platform(config.device)
        self.platform.check_block_size(config.block_size)
        self.platform.configure_process()
        self.device = self.platform.device(rank)
        self.source: ModelSource = resolve_model(config.model, config.trust_remote_code)
        self.dtype = config.torch_dtype(
            self.source.checkpoint_dtype, self.platform.default_dtype(self.source.checkpoint_dtype)
        )
        if self.dtype not in self.platform.supported_dtypes:
            raise ValueError(
                f"dtype {self.dtype} is not supported on device {self.platform.name!r}; "
                f"supported: {[str(d) for d in self.platform.supported_dtypes]}"
            )
        backend_cls = pm.select_attention_backend(config.attention_backend, self.platform)
        options = dict(config.attention_backend_options)
        if config.kv_cache_dtype != "auto":  # only backends with a quantized cache accept it
            options["kv_cache_dtype"] = config.kv_cache_dtype
        self.attention = backend_cls(**options)
        quant = UnquantizedMethod()
        if config.quantization:
            qcls = pm.select_quantization(config.quantization, self.platform)
            quant = qcls.from_config(self.source.quantization_config)
        model_cls = pm.select_model(self.source.architectures)
        ctx = ModelContext(
            attention=self.attention,
            layer_ops=self.platform.layer_ops(),
            quantization=quant,
            dtype=self.dtype,
            device=self.device,
            tp_rank=rank,
            tp_size=config.tensor_parallel_size,
        )
        self.model: ModelArchitecture = load_model(
            self.source, model_cls, ctx, config.load_format, config.seed
        )
        self.ctx = ctx
        self.graphs: DecodeGraphs | None = None  # set with the KV cache unless enforce_eager
        self.vocab_size = int(self.source.hf_config.vocab_size)
        self.layers = self.model.attention_layers()
        self.kv_caches: list[torch.Tensor] = []
        self.sampler = Sampler()
        self.states: dict[str, SamplingState] = {}
        self.embed_sums: dict[str, torch.Tensor] = {}  # pooling requests: running hidden sums

    # -- KV cache --------------------------------------------------------------------------
    def kv_bytes_per_block(self) -> int:
        elem = torch.empty((), dtype=self.attention.cache_dtype(self.dtype)).element_size()
        return sum(
            2 * self.config.block_size * spec.num_kv_heads * spec.head_dim * elem
            for spec in self.layers
        )

    def determine_num_blocks(self) -> int:
        cfg = self.config
        if cfg.num_kv_blocks is not None:
            return cfg.num_kv_blocks
        if cfg.kv_cache_memory is not None:
            budget = cfg.kv_cache_memory
        elif self.platform.device_type == "cpu":
            _, total = self.platform.memory_info()
            budget = min(_CPU_DEFAULT_KV_BYTES, total // 4)
        else:
            self.platform.synchronize()
            free, total = self.platform.memory_info(self.rank)
            budget = int(total * cfg.gpu_memory_utilization) - (total - free)
        num = budget // self.kv_bytes_per_block()
        if num < 1:
            raise ValueError(
                f"no memory left for the KV cache (budget {budget} bytes); lower the model "
                "size or raise kv_cache_memory / gpu_memory_utilization"
            )
        return int(num)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Allocate every layer's cache once, at the size asked for."""
        self.kv_caches = [
            torch.zeros(
                self.attention.kv_cache_shape(
                    num_blocks, self.config.block_size, spec.num_kv_heads, spec.head_dim
                ),
                dtype=self.attention.cache_dtype(self.dtype),
                device=self.device,
            )
            for spec in self.layers
        ]
        capture = None if self.config.enforce_eager else self.platform.graph_capture(self.ctx)
        if capture is not None:
            # the longest context a sequence can reach: the model's limit, or the whole cache
            longest = self.config.max_model_len or self.source.max_position_embeddings
            longest = min(longest or num_blocks * self.config.block_size,
                          num_blocks * self.config.block_size)  # fmt: skip
            self.graphs = DecodeGraphs(
                capture, self.model, self.attention, self.kv_caches, self.config.block_size,
                longest, self.device,
            )  # fmt: skip

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
        logits = self._decode_graph_logits(mi.seqs)
        if logits is not None:  # every sequence samples its next token
            self._sample(out, mi, logits, mi.seqs)
            return out
        input_ids, positions, batch = self._flatten(mi.seqs)
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

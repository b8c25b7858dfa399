"""Timed generation: the ``Runner`` protocol, the ``BatchTiming`` it returns, and IronLM's runner.

Every runner generates exactly ``output_len`` tokens per prompt (EOS ignored), greedy or, at a
temperature above 0, sampled from the model's whole distribution (no top-k / top-p), and
records, per request, when its first token and its last token came, relative to the moment
the batch was handed over.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol


@dataclass
class BatchTiming:
    ttft: list[float]  # seconds from batch start to each request's first token
    e2e: list[float]  # seconds from batch start to each request's last token
    prompt_tokens: list[int]
    output_tokens: list[int]

    @property
    def elapsed(self) -> float:
        return max(self.e2e)

    def decode_tok_s(self) -> list[float]:
        """Per request: tokens after the first over the time after the first token."""
        return [
            (n - 1) / (e - t) if n > 1 and e > t else float("nan")
            for n, t, e in zip(self.output_tokens, self.ttft, self.e2e)
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BatchTiming:
        return cls(d["ttft"], d["e2e"], d["prompt_tokens"], d["output_tokens"])


class Runner(Protocol):
    name: str

    def info(self) -> dict[str, Any]:
        """What was loaded: dtype, KV-cache size, batch policy... (goes into the result)."""
        ...

    def run(self, prompts: list[list[int]], output_len: int,
            temperature: float = 0.0) -> BatchTiming:
        """Generate ``output_len`` tokens for every prompt (greedy at temperature 0); time each
        request. A runner that cannot sample raises ValueError for a temperature above 0."""
        ...


class IronlmRunner:
    """Drives ``LLMEngine.step`` directly, so first-token times are those of the step."""

    def __init__(self, model: str, engine_kwargs: dict[str, Any], detokenize: bool = True,
                 name: str = "ironlm", lora_paths: list[str] | None = None) -> None:
        import torch

        self.name = name
        from ironlm.config import EngineConfig
        from ironlm.engine.llm_engine import LLMEngine
        from ironlm.lora.request import LoRARequest

        config = EngineConfig(model=model, **engine_kwargs)
        torch.manual_seed(config.seed)
        self.engine = LLMEngine(config)
        self.detokenize = detokenize
        self._ids = itertools.count()
        # prompt i runs with adapter i % len(loras) (none without lora_paths)
        self.loras = [LoRARequest(f"lora{j}", j + 1, p) for j, p in enumerate(lora_paths or [])]
        for lora in self.loras:
            self.engine.add_lora(lora)

    def info(self) -> dict[str, Any]:
        bytes_per_block = self.engine.executor.collective_rpc("kv_cache_bytes_per_block")[0]
        num_kv_blocks = self.engine.block_manager.num_kv_blocks
        return {
            "num_kv_blocks": num_kv_blocks,
            "block_size": self.engine.config.block_size,  # the platform's when --block-size unset
            "kv_cache_bytes": int(bytes_per_block) * num_kv_blocks,
            "max_model_len": self.engine.max_model_len,
            "max_num_seqs": self.engine.config.max_num_seqs,
            "max_num_batched_tokens": self.engine.config.max_num_batched_tokens,
            "dtype": self.engine.config.dtype,
            "detokenize": self.detokenize,
            "quantization": self.engine.config.quantization,
            "weight_bytes": int(self.engine.executor.collective_rpc("weight_bytes")[0]),
            "world_size": self.engine.config.world_size,
            # per rank: seconds in all-reduce / all-gather / pipeline send-recv, and steps
            "collective": self.engine.executor.collective_rpc("collective_stats"),
            "lora_adapters": len(self.loras),
        }

    def run(self, prompts: list[list[int]], output_len: int,
            temperature: float = 0.0) -> BatchTiming:
        from ironlm.sampling_params import RequestOutputKind, SamplingParams

        # final outputs only, as LLM.generate asks for them; each request's first token time
        # comes with its final output (RequestOutput.metrics, time.monotonic)
        params = SamplingParams(
            temperature=temperature, max_tokens=output_len, ignore_eos=True,
            detokenize=self.detokenize, output_kind=RequestOutputKind.FINAL_ONLY,
        )
        n = len(prompts)
        index: dict[str, int] = {}
        first: list[float | None] = [None] * n
        last: list[float | None] = [None] * n
        produced = [0] * n
        start, start_mono = time.perf_counter(), time.monotonic()
        for i, p in enumerate(prompts):
            rid = f"bench-{next(self._ids)}"
            lora = self.loras[i % len(self.loras)] if self.loras else None
            self.engine.add_request(rid, {"prompt_token_ids": p}, params, lora_request=lora)
            index[rid] = i
        while self.engine.has_unfinished_requests():
            outputs = self.engine.step()
            now = time.perf_counter() - start
            for out in outputs:
                i = index.get(out.request_id, -1)
                if i < 0 or not out.outputs or not out.finished:
                    continue
                first_token = (out.metrics or {}).get("first_token_time")
                first[i] = None if first_token is None else first_token - start_mono
                last[i], produced[i] = now, len(out.outputs[0].token_ids)
        if any(t is None for t in last):
            raise RuntimeError("the engine stopped with requests unfinished")
        return BatchTiming(
            ttft=[t if t is not None else float("nan") for t in first],
            e2e=[t for t in last if t is not None],
            prompt_tokens=[len(p) for p in prompts],
            output_tokens=produced,
        )

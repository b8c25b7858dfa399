"""Baselines timed like IronLM: HF transformers ``generate`` and llama-cpp-python.

- ``hf``: float32, greedy, ``min_new_tokens == max_new_tokens`` (exactly ``output_len`` tokens),
  left-padded batches of ``batch_size`` prompts (default: all at once). A logits processor
  timestamps every decoding step, so the first step's time is the batch's first token.
- ``llama-cpp``: the GGUF file through llama-cpp-python's ``Llama.generate`` (greedy, state reset
  per prompt so no prefix is reused), prompts one after another as its server serves them.
  It is an optional extra: it compiles llama.cpp at install time (about 16 minutes here).
- ``unquantized``: IronLM itself with the same engine flags but no ``--quantization``, on
  ``--baseline-model`` (default ``--model``): what a quantization method buys.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import torch

from ironlm_bench.runners import BatchTiming

BASELINES = ("hf", "llama-cpp", "unquantized")
LLAMA_CPP_INSTALL = 'pip install "llama-cpp-python>=0.3"'


def llama_cpp_missing_reason() -> str | None:
    """None when llama-cpp-python is importable, else what to run to get it."""
    if importlib.util.find_spec("llama_cpp") is not None:
        return None
    return (
        "llama-cpp-python is not installed; install it with\n"
        f"    {LLAMA_CPP_INSTALL}\n"
        "(it compiles llama.cpp from source: about 16 minutes on a 2-core machine)"
    )


class _StepClock:
    """A transformers LogitsProcessor that records when each decoding step's logits arrive."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return scores


class HfRunner:
    name = "hf"

    def __init__(self, model: str, dummy_weights: bool, batch_size: int | None, seed: int,
                 dtype: str = "float32") -> None:
        from transformers import AutoModelForCausalLM

        from ironlm.model_loader import resolve_model

        source = resolve_model(model, False)
        if source.is_gguf:
            raise ValueError("the hf baseline needs an HF folder, not a GGUF file")
        torch.manual_seed(seed)
        self.dtype = dtype
        torch_dtype = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
                       "float16": torch.float16, "half": torch.float16}[dtype]  # fmt: skip
        if dummy_weights:  # same shapes, random weights (timing does not depend on values)
            self.model = AutoModelForCausalLM.from_config(source.hf_config, dtype=torch_dtype)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype)
        self.model.eval()
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen is not None else None
        eos = eos[0] if isinstance(eos, list) else eos
        pad = gen.pad_token_id if gen is not None else None
        self.pad_id = int(pad if pad is not None else (eos if eos is not None else 0))
        self.batch_size = batch_size

    def info(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "batch_size": self.batch_size or "all", "padding": "left",
                "transformers": _version("transformers")}

    @torch.inference_mode()
    def run(self, prompts: list[list[int]], output_len: int,
            temperature: float = 0.0) -> BatchTiming:
        from transformers import LogitsProcessorList

        # sampling as IronLM's runner samples: the whole distribution at this temperature
        # (top_k 0 turns off the top-50 filter generation configs default to)
        sampling: dict[str, Any] = (
            {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
            if temperature > 0 else {"do_sample": False}
        )  # fmt: skip
        size = self.batch_size or len(prompts)
        ttft: list[float] = []
        e2e: list[float] = []
        produced: list[int] = []
        start = time.perf_counter()
        for lo in range(0, len(prompts), size):
            chunk = prompts[lo : lo + size]
            ids, mask = self._left_padded(chunk)
            clock = _StepClock()
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=output_len,
                min_new_tokens=output_len, pad_token_id=self.pad_id, **sampling,
                logits_processor=LogitsProcessorList([clock]),
            )
            done = time.perf_counter() - start
            first = clock.times[0] - start if clock.times else done
            ttft += [first] * len(chunk)
            e2e += [done] * len(chunk)
            produced += [int(out.shape[1] - ids.shape[1])] * len(chunk)
        return BatchTiming(ttft, e2e, [len(p) for p in prompts], produced)

    def _left_padded(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[row, width - len(p) :] = 1
        return ids, mask


class LlamaCppRunner:
    name = "llama-cpp"

    def __init__(self, gguf_path: str, threads: int, n_ctx: int, seed: int,
                 flash_attn: bool = False) -> None:
        reason = llama_cpp_missing_reason()
        if reason is not None:
            raise RuntimeError(reason)
        if not Path(gguf_path).is_file():
            raise ValueError(f"llama-cpp baseline: GGUF file not found: {gguf_path}")
        from llama_cpp import Llama

        self.gguf_path = gguf_path
        self.n_ctx = n_ctx
        self.flash_attn = flash_attn
        self.llm = Llama(
            model_path=gguf_path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
            seed=seed, flash_attn=flash_attn, verbose=False,
        )

    def info(self) -> dict[str, Any]:
        return {"gguf": self.gguf_path, "n_ctx": self.n_ctx, "flash_attn": self.flash_attn,
                "batching": "sequential", "llama_cpp_python": _version("llama_cpp_python")}

    def run(self, prompts: list[list[int]], output_len: int,
            temperature: float = 0.0) -> BatchTiming:
        if temperature > 0:
            raise ValueError("the llama-cpp baseline runs greedy only (temperature 0)")
        ttft: list[float] = []
        e2e: list[float] = []
        produced: list[int] = []
        start = time.perf_counter()
        for p in prompts:
            self.llm.reset()  # no KV reuse between prompts: every prompt is prefilled in full
            count = 0
            for _token in self.llm.generate(p, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                            repeat_penalty=1.0):
                count += 1
                if count == 1:
                    ttft.append(time.perf_counter() - start)
                if count >= output_len:
                    break
            e2e.append(time.perf_counter() - start)
            produced.append(count)
        return BatchTiming(ttft, e2e, [len(p) for p in prompts], produced)


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None

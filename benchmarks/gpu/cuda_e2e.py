"""Offline figures of the cuda platform on a lent GPU, with HF transformers in the same run.

    python benchmarks/gpu/cuda_e2e.py .gpu/llama1b --eager --hf --result-file $OUT/e2e.json

Dummy weights (``load_format="dummy"``: timing does not depend on values), bf16, greedy,
fixed lengths (EOS ignored). Per engine (CUDA graphs; with ``--eager`` also
``enforce_eager=True``): batch-1 decode of 256 tokens after a 32-token prompt, then ``--prompts``
prompts of ``--input-len`` random tokens, ``--output-len`` new tokens each, handed over at
once. The bound of batch-1 decode: the weights' bytes per token over the device-to-device copy
traffic (bytes read + written per second, torch's 1 GiB copy); HF: ``generate`` on the same
prompts, weights random on the GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ironlm import LLM, SamplingParams


def seconds(fn: Any) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def copy_traffic() -> float:
    """Bytes read + written per second by a 1 GiB device-to-device copy."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    took = seconds(lambda: [dst.copy_(src) for _ in range(20)])
    return 2 * src.numel() * 20 / took


def ironlm_figures(args: argparse.Namespace, prompts: list[list[int]], eager: bool) -> dict:
    out: dict[str, Any] = {}
    start = time.perf_counter()
    llm = LLM(args.model, device="cuda", dtype="bfloat16", load_format="dummy",
              max_model_len=args.max_model_len, enforce_eager=eager,
              gpu_memory_utilization=args.gpu_memory_utilization)  # fmt: skip
    out["load_s"] = time.perf_counter() - start
    one = [{"prompt_token_ids": list(range(100, 132))}]
    fixed = lambda n: SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)  # noqa: E731
    llm.generate(one, fixed(8), use_tqdm=False)  # warm-up (captures the batch-1 graph)
    out["b1_tok_s"] = 256 / seconds(lambda: llm.generate(one, fixed(256), use_tqdm=False))
    batch = [{"prompt_token_ids": p} for p in prompts]
    took = seconds(lambda: llm.generate(batch, fixed(args.output_len), use_tqdm=False))
    out["batch_tok_s"] = len(prompts) * args.output_len / took
    runner = llm.engine.executor.worker.model_runner
    out["weight_bytes"] = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    graphs = runner.graphs
    out["graphs"] = None if graphs is None else {"off": graphs.disabled,
                                                 "sizes": sorted(graphs.graphs)}  # fmt: skip
    del llm, runner, graphs
    gc.collect()
    torch.cuda.empty_cache()
    return out


def hf_figures(args: argparse.Namespace, prompts: list[list[int]]) -> dict:
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model),
                                                 dtype=torch.bfloat16).eval()  # fmt: skip
    ids = torch.tensor(prompts, device="cuda")
    run = lambda x, n: model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n,  # noqa: E731
                                      min_new_tokens=n, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        run(ids[:8], 4)
        batch = seconds(lambda: run(ids, args.output_len))
        b1 = seconds(lambda: run(ids[:1, :32], 256))
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return {"batch_tok_s": len(prompts) * args.output_len / batch, "b1_tok_s": 256 / b1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.45)
    parser.add_argument("--eager", action="store_true", help="also run with enforce_eager")
    parser.add_argument("--hf", action="store_true", help="also run HF transformers")
    parser.add_argument("--result-file")
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 49000, (args.input_len,), generator=gen).tolist()
               for _ in range(args.prompts)]  # fmt: skip
    res: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                           "args": vars(args), "copy_traffic_gbs": copy_traffic() / 1e9}
    res["graphs"] = ironlm_figures(args, prompts, eager=False)
    bound = res["copy_traffic_gbs"] * 1e9 / res["graphs"]["weight_bytes"]
    res["b1_bound_tok_s"] = bound
    res["b1_of_bound"] = res["graphs"]["b1_tok_s"] / bound
    if args.eager:
        res["eager"] = ironlm_figures(args, prompts, eager=True)
    if args.hf:
        res["hf"] = hf_figures(args, prompts)
        res["batch_vs_hf"] = res["graphs"]["batch_tok_s"] / res["hf"]["batch_tok_s"]
    print(json.dumps(res, indent=1))
    if args.result_file:
        with open(args.result_file, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

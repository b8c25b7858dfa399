"""Weight updates after loading, as reinforcement-learning weight sync does them with vLLM:
``LLM(..., worker_extension_cls=...)``, ``llm.collective_rpc(name | callable, args=...)``,
and ``self.model_runner.model.load_weights(weights)`` on each worker (partial sets welcome),
``llm.apply_model(func)``.

Reference: HF transformers holding the same new weights (SmolLM2, float32): the engine's
greedy tokens and their logprobs equal HF's teacher-forced ones, with the decode graphs
captured before the update (the packed weights are rewritten in place). Updating back one
tensor per call restores the first outputs exactly, in bfloat16 too (whatever layouts the
cpu plugin measured here). Every cpu layout's unpack / repack round trip; tensor parallelism
and pipeline parallelism through worker processes (Gemma 3, mp, tp=2 and pp=2, after a level-2
sleep and ``reload_weights`` on every rank) against one rank, which matches HF; the refusals.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from parallel_utils import worker_pids
from transformers import AutoModelForCausalLM, AutoTokenizer
from weight_sync import greedy_logprobs, load_weights_call, perturbed, qkv_rows

from ironlm import LLM, SamplingParams
from ironlm_cpu.layer_ops import CpuLayerOps, with_rows

EXTENSION = "weight_sync.WeightSyncExtension"  # vLLM's form: a "module.Class" name
PROMPTS = ["The capital of France is", "def fibonacci(n):"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)
ARGS: dict[str, Any] = {"max_model_len": 256, "kv_cache_memory": 32 << 20, "max_num_seqs": 4}


def outputs(llm: LLM) -> list[tuple[list[int], list[float]]]:
    """(greedy token ids, their logprobs) per prompt."""
    return greedy_logprobs(llm, PROMPTS, GREEDY)


def hf_logprobs(hf: Any, tokenizer: Any, prompt: str, ids: list[int]) -> list[float]:
    """HF's logprobs of ``ids`` after ``prompt``, teacher-forced."""
    prompt_ids = tokenizer(prompt).input_ids
    with torch.no_grad():
        logits = hf(torch.tensor([prompt_ids + ids])).logits[0].float()
    rows = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)
    return [float(rows[i, t]) for i, t in enumerate(ids)]


def test_updated_smollm2_generates_as_hf_with_the_new_weights(smollm2_dir: Path) -> None:
    llm = LLM(str(smollm2_dir), dtype="float32", worker_extension_cls=EXTENSION, **ARGS)
    before = outputs(llm)  # decode graphs captured with the loaded weights
    hf, new = perturbed(smollm2_dir)
    assert llm.collective_rpc("update_weights", args=(list(new.items()),)) == [None]
    assert llm.collective_rpc("updates") == [1]  # the extension's helper and class attribute
    llm.reset_prefix_cache()
    after = outputs(llm)
    assert after != before
    tokenizer = llm.get_tokenizer()
    for prompt, (ids, logprobs) in zip(PROMPTS, after):
        want = hf.generate(**tokenizer(prompt, return_tensors="pt"), max_new_tokens=12,
                           do_sample=False, min_new_tokens=12)
        assert ids == want[0, -12:].tolist()
        torch.testing.assert_close(torch.tensor(logprobs),
                                   torch.tensor(hf_logprobs(hf, tokenizer, prompt, ids)),
                                   atol=2e-4, rtol=0)
    # back to the checkpoint one tensor per call (trainers' per-parameter broadcasts)
    original = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).state_dict()
    for name in new:
        llm.collective_rpc("update_weight", args=(name, original[name]))
    llm.reset_prefix_cache()
    assert outputs(llm) == before
    llm.shutdown()


def test_bf16_round_trip_restores_the_outputs(smollm2_dir: Path) -> None:
    llm = LLM(str(smollm2_dir), dtype="bfloat16", **ARGS)
    before = outputs(llm)
    _, new = perturbed(smollm2_dir, scale=0.2)
    assert llm.collective_rpc(load_weights_call, args=(list(new.items()),)) == [0]
    llm.reset_prefix_cache()
    assert outputs(llm) != before
    original = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).state_dict()
    llm.collective_rpc(load_weights_call, args=([(n, original[n]) for n in new],))
    llm.reset_prefix_cache()
    assert outputs(llm) == before
    assert llm.apply_model(qkv_rows) == [576 + 2 * 192]  # 9 + 2 x 3 heads of 64
    llm.shutdown()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("layout", ["rows", "panel", "panel+rows", "onednn"])
def test_cpu_layouts_unpack_and_repack_in_place(dtype: torch.dtype, layout: str) -> None:
    ops = CpuLayerOps()
    if layout == "onednn" and not ops.onednn.supports(dtype):
        pytest.skip(f"oneDNN cannot reorder {dtype} on this CPU")
    gen = torch.Generator().manual_seed(0)
    old, new = (torch.randn(48, 32, generator=gen).to(dtype) for _ in range(2))
    stored = {"rows": lambda w: w.clone(), "panel": ops.kernel.pack,
              "panel+rows": lambda w: with_rows(ops.kernel.pack(w), w),
              "onednn": ops.onednn.pack}[layout](old)
    address = stored.data_ptr() if layout != "onednn" else None
    rows = ops.unpack_linear_weight(stored)
    assert torch.equal(rows, old)
    rows.copy_(new)  # what load_weight does to the unpacked parameter
    ops.repack_linear_weight(stored, rows)
    assert torch.equal(ops.unpack_linear_weight(stored), new)
    if address is not None:
        assert stored.data_ptr() == address  # captured graphs read the same storage
    x = torch.randn(3, 32, generator=gen).to(dtype)
    got = ops.kernel(x, stored, None) if layout.startswith("panel") else (
        ops.onednn(x, stored, None) if layout == "onednn" else x @ stored.T)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got.float(), (x.float() @ new.float().T), atol=tol, rtol=tol)


def update_gemma3(model: Path, new: dict[str, torch.Tensor], tp: int = 1, pp: int = 1
                  ) -> list[tuple[list[int], list[float]]]:
    """Gemma 3 at ``tp`` x ``pp`` (worker processes beyond one rank): the refusals, a level-2
    sleep and ``reload_weights`` on every rank (the checkpoint's outputs again), then ``new``
    by a module-level callable; the outputs with ``new``."""
    world = tp * pp
    llm = LLM(str(model), dtype="float32", tensor_parallel_size=tp, pipeline_parallel_size=pp,
              distributed_executor_backend="mp" if world > 1 else None,
              worker_extension_cls=EXTENSION, enable_sleep_mode=True, **ARGS)
    try:
        before = outputs(llm)
        assert llm.collective_rpc("rank_and_world") == [(r, world) for r in range(world)]
        # q: 4 heads of 256 split over the tp ranks; the one k/v head replicated on each
        assert llm.apply_model(qkv_rows) == [4 * 256 // tp + 2 * 256] * world
        # refused on every rank: the workers stay in step and running
        with pytest.raises(ValueError, match="unexpected weight 'model.nope.weight'"):
            llm.collective_rpc("update_weight", args=("model.nope.weight", torch.ones(1)))
        with pytest.raises(ValueError, match="'model.layers.99.mlp.up_proj.weight': the "
                                             "model has 18 layers"):
            llm.collective_rpc("update_weight", args=("model.layers.99.mlp.up_proj.weight",
                                                      torch.ones(1)))
        with pytest.raises(AttributeError, match="no method 'sync_weights'"):
            llm.collective_rpc("sync_weights")
        llm.sleep(2)
        with pytest.raises(ValueError, match="weights are asleep"):
            llm.collective_rpc("reload_weights")
        llm.wake_up(["weights"])
        llm.collective_rpc("reload_weights")
        llm.wake_up(["kv_cache"])
        llm.reset_prefix_cache()
        assert outputs(llm) == before
        assert llm.collective_rpc(load_weights_call, args=(list(new.items()),)) == \
            list(range(world))
        assert llm.collective_rpc("updates") == [0] * world  # the callable is no extension
        llm.reset_prefix_cache()
        after = outputs(llm)
        assert after != before
        return after
    finally:
        llm.shutdown()
        assert worker_pids(os.getpid()) == [], "a worker process outlived its engine"


@pytest.fixture(scope="module")
def gemma3_update(gemma3_dir: Path) -> tuple[Any, dict[str, torch.Tensor]]:
    return perturbed(gemma3_dir)


@pytest.fixture(scope="module")
def gemma3_one_rank(
    gemma3_dir: Path, gemma3_update: tuple[Any, dict[str, torch.Tensor]]
) -> list[tuple[list[int], list[float]]]:
    hf, new = gemma3_update
    after = update_gemma3(gemma3_dir, new)
    tokenizer = AutoTokenizer.from_pretrained(gemma3_dir)
    for prompt, (ids, logprobs) in zip(PROMPTS, after, strict=True):  # HF, same weights
        torch.testing.assert_close(torch.tensor(logprobs),
                                   torch.tensor(hf_logprobs(hf, tokenizer, prompt, ids)),
                                   atol=2e-3, rtol=0)
    return after


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_gemma3_split_workers_update_as_one_rank(
    gemma3_dir: Path, gemma3_update: tuple[Any, dict[str, torch.Tensor]],
    gemma3_one_rank: list[tuple[list[int], list[float]]], tp: int, pp: int,
) -> None:
    split = update_gemma3(gemma3_dir, gemma3_update[1], tp, pp)
    assert [ids for ids, _ in split] == [ids for ids, _ in gemma3_one_rank]
    torch.testing.assert_close(torch.tensor([lp for _, lps in split for lp in lps]),
                               torch.tensor([lp for _, lps in gemma3_one_rank for lp in lps]),
                               atol=1e-3, rtol=0)


def test_refusals(tiny_llama_dir: Path) -> None:
    llm = LLM(str(tiny_llama_dir), dtype="float32", **ARGS)
    before = outputs(llm)
    with pytest.raises(ValueError, match="unexpected weight 'model.nope.weight'"):
        llm.collective_rpc(load_weights_call, args=([("model.nope.weight", torch.ones(3))],))
    # refused by the tied head after it was unpacked: packed again, unchanged
    with pytest.raises(ValueError, match="checkpoint tensor 'lm_head.bias': ParallelLMHead "
                                         "has only 'weight'"):
        llm.collective_rpc(load_weights_call, args=([("lm_head.bias", torch.ones(3))],))
    with pytest.raises(ValueError, match="checkpoint tensor 'model.norm.weight'"):
        llm.collective_rpc(load_weights_call, args=([("model.norm.weight", torch.ones(3))],))
    with pytest.raises(ValueError, match="checkpoint tensor 'model.layers.0.mlp.up_proj.weight'"):
        llm.collective_rpc(load_weights_call,
                           args=([("model.layers.0.mlp.up_proj.weight", torch.ones(3, 64))],))
    assert outputs(llm) == before
    with pytest.raises(ValueError, match="timeout is not supported"):
        llm.collective_rpc("check_health", timeout=5.0)
    with pytest.raises(AttributeError, match="no method 'update_weights'"):
        llm.collective_rpc("update_weights")
    assert llm.collective_rpc("check_health") == [None]
    llm.shutdown()
    quantized = LLM(str(tiny_llama_dir), quantization="weight_only_int8", **ARGS)
    weight = torch.zeros(64, 64)
    with pytest.raises(ValueError, match="'weight_only_int8' cannot take new weights after "
                                         "loading"):
        quantized.collective_rpc(load_weights_call,
                                 args=([("model.layers.0.self_attn.o_proj.weight", weight)],))
    quantized.shutdown()
    with pytest.raises(ValueError, match=r"defines \['execute_model'\], which worker Worker"):
        LLM(str(tiny_llama_dir), worker_extension_cls="weight_sync.ClashingExtension", **ARGS)
    with pytest.raises(ValueError, match="has no class 'Missing'"):
        LLM(str(tiny_llama_dir), worker_extension_cls="weight_sync.Missing", **ARGS)

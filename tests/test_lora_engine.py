"""Multi-LoRA in the engine, on the tiny random Llama with random peft adapters: the scheduler's
max_loras rule, the prefix cache keyed by adapter, the engine's adapter cache (LRU over
max_cpu_loras, deferred removal), mixed batches (decode graphs and eager agree, and equal
one-adapter-at-a-time runs), and refusals of adapters that cannot run, with their reasons."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from ironlm import LLM, SamplingParams
from ironlm.sampling_params import BeamSearchParams
from ironlm.config import EngineConfig
from ironlm.engine.adapter_cache import AdapterCache
from ironlm.engine.block_manager import BlockManager
from ironlm.engine.request import Request, RequestStatus
from ironlm.engine.scheduler import Scheduler
from ironlm.interfaces.step import ModelOutput
from ironlm.lora.request import LoRARequest

GREEDY = SamplingParams(temperature=0.0, max_tokens=10)
PROMPTS = ["The capital of France is", "One two three four", "Hello there, how"]
# float32 whatever the CPU (auto is bf16 where the CPU has avx512_bf16): tokens are compared
ENGINE = dict(max_model_len=256, kv_cache_memory=32 << 20, device="cpu", dtype="float32")


def _peft_adapter(model_dir: Path, out: Path, seed: int, **spec: Any) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(init_lora_weights=False, **spec))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(100.0)  # peft's random B is tiny: make the adapter change the output
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def adapters(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-loras")
    all7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return {
        "a": _peft_adapter(tiny_llama_dir, root / "a", 1, r=8, lora_alpha=16,
                           target_modules=all7),
        "b": _peft_adapter(tiny_llama_dir, root / "b", 2, r=4, lora_alpha=4, use_rslora=True,
                           target_modules=["q_proj", "v_proj", "down_proj"]),
    }


@pytest.fixture(scope="module")
def llm(tiny_llama_dir: Path) -> LLM:
    with pytest.MonkeyPatch.context() as mp:  # the graphs need it: conftest.C_DECODE_ATTENTION
        mp.setenv("IRONLM_CPU_KERNELS", "decode_attention=c")
        return LLM(str(tiny_llama_dir), enable_lora=True, max_loras=2, max_cpu_loras=3, **ENGINE)


def _req(rid: str, tokens: list[int], lora_id: int = 0) -> Request:
    lora = LoRARequest(f"l{lora_id}", lora_id, "/x") if lora_id else None
    return Request(rid, tokens, SamplingParams(max_tokens=4), None, lora_request=lora)


# -- scheduler, block manager, adapter cache (no model) ----------------------------------------
def test_scheduler_runs_at_most_max_loras_adapters_and_keeps_queue_order() -> None:
    sched = Scheduler(BlockManager(64, 4, True), max_num_seqs=8, max_num_batched_tokens=512,
                      enable_chunked_prefill=True, max_loras=2)
    reqs = [_req("r0", [1, 2], 1), _req("r1", [3, 4], 2), _req("r2", [5, 6], 3),
            _req("r3", [7, 8], 0), _req("r4", [9, 10], 1)]
    for r in reqs:
        sched.add(r)
    plan = sched.schedule()
    assert [r.request_id for r, _ in plan.scheduled] == ["r0", "r1", "r3", "r4"]
    assert [r.request_id for r in sched.waiting] == ["r2"]  # adapter 3 waits its turn
    assert sched.lora_ids() == ({1, 2}, {3})
    sched.on_step_done(plan, ModelOutput())
    for r in (reqs[1],):  # adapter 2's only request finishes: adapter 3 may run
        sched.finish(r, RequestStatus.FINISHED_STOPPED)
    plan = sched.schedule()
    assert "r2" in [r.request_id for r, _ in plan.scheduled]
    assert len({r.lora_id for r in sched.running if r.lora_id}) <= 2


def test_prefix_cache_never_shares_blocks_across_adapters() -> None:
    bm = BlockManager(32, 4, True)
    tokens = list(range(1, 14))
    first = _req("a", tokens, 1)
    assert bm.allocate(first, len(tokens))
    assert bm.find_cached_prefix(_req("same-adapter", tokens, 1)) == bm.block_ids("a")[:3]
    assert bm.find_cached_prefix(_req("other-adapter", tokens, 2)) == []
    assert bm.find_cached_prefix(_req("base", tokens, 0)) == []


class _RecordingExecutor:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def collective_rpc(self, method: str, *args: Any) -> list[Any]:
        self.calls.append((method, args[0].lora_int_id if method != "remove_lora" else args[0]))
        return [True]


def test_adapter_cache_lru_busy_and_deferred_removal() -> None:
    ex = _RecordingExecutor()
    cache = AdapterCache(ex, capacity=2)  # type: ignore[arg-type]
    for i in (1, 2, 3, 4):
        cache.register(LoRARequest(f"l{i}", i, f"/p{i}"))
    cache.ensure({1}, set())
    cache.ensure({2}, set())
    cache.ensure({1}, set())  # 1 is now the most recently used
    cache.ensure({3}, set())  # evicts 2, the least recently used
    assert list(cache.loaded) == [1, 3]
    assert ("remove_lora", 2) in ex.calls
    cache.check(2, busy={1, 3})  # loaded once before: checked already, nothing to do
    cache.check(4, busy={1, 3})  # no room (both busy): read and checked only
    assert ex.calls[-1] == ("check_lora", 4) and list(cache.loaded) == [1, 3]
    with pytest.raises(ValueError, match="already names adapter"):
        cache.register(LoRARequest("other", 1, "/elsewhere"))
    assert cache.remove(3, in_use=True) and 3 in cache.loaded  # requests finish with it
    cache.collect(in_use={3})
    assert 3 in cache.loaded
    cache.collect(in_use=set())
    assert 3 not in cache.loaded and ex.calls[-1] == ("remove_lora", 3)


def test_lora_config_checks() -> None:
    with pytest.raises(ValueError, match=r"max_lora_rank \(7\) must be one of"):
        EngineConfig(model="m", max_lora_rank=7)
    with pytest.raises(ValueError, match=r"max_cpu_loras \(1\) must be >= max_loras \(2\)"):
        EngineConfig(model="m", max_loras=2, max_cpu_loras=1)
    with pytest.raises(ValueError, match="lora_dtype"):
        EngineConfig(model="m", lora_dtype="int8")
    assert EngineConfig(model="m", max_loras=3).max_cpu_loras == 3
    with pytest.raises(ValueError, match="enable_lora is not supported with pipeline"):
        EngineConfig(model="m", enable_lora=True, pipeline_parallel_size=2)
    with pytest.raises(ValueError, match="id must be > 0"):
        LoRARequest("x", 0, "/p")


# -- offline engine ------------------------------------------------------------------------------
def _ids(outs: list[Any]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def test_mixed_batch_equals_separate_runs_graphs_and_eager(
    llm: LLM, tiny_llama_dir: Path, adapters: dict[str, Path]
) -> None:
    a, b = LoRARequest("a", 1, str(adapters["a"])), LoRARequest("b", 2, str(adapters["b"]))
    plan = [(p, lora) for p in PROMPTS for lora in (None, a, b)]
    mixed = llm.generate([p for p, _ in plan], GREEDY, lora_request=[l for _, l in plan],
                         use_tqdm=False)
    assert [o.lora_request for o in mixed] == [l for _, l in plan]
    assert llm.engine.executor.collective_rpc("list_loras")[0] == {1, 2}
    separate = []
    for p, lora in plan:  # one request at a time: no batching at all
        separate += llm.generate([p], GREEDY, lora_request=lora, use_tqdm=False)
    assert _ids(mixed) == _ids(separate)
    by = {(p, l.lora_name if l else None): ids for (p, l), ids in zip(plan, _ids(mixed))}
    for p in PROMPTS:  # each adapter changes the greedy output
        assert len({tuple(by[(p, None)]), tuple(by[(p, "a")]), tuple(by[(p, "b")])}) == 3
    eager = LLM(str(tiny_llama_dir), enable_lora=True, max_loras=1, enforce_eager=True, **ENGINE)
    try:  # max_loras=1: the adapters' requests take turns; eager steps
        assert _ids(eager.generate([p for p, _ in plan], GREEDY,
                                   lora_request=[l for _, l in plan], use_tqdm=False)) \
            == _ids(mixed)
    finally:
        eager.shutdown()


def test_multi_step_and_ngram_speculation_keep_each_requests_adapter(
    llm: LLM, tiny_llama_dir: Path, adapters: dict[str, Path]
) -> None:
    """A multi-step window and a verified draft run every token with its request's adapter:
    greedy tokens equal the plain engine's (the ``llm`` fixture) for a mixed batch."""
    a, b = LoRARequest("a", 1, str(adapters["a"])), LoRARequest("b", 2, str(adapters["b"]))
    plan = [(p, lora) for p in PROMPTS for lora in (None, a, b)]
    prompts, loras = [p for p, _ in plan], [l for _, l in plan]
    plain = _ids(llm.generate(prompts, GREEDY, lora_request=loras, use_tqdm=False))
    for extra in ({"num_scheduler_steps": 4},
                  {"speculative_model": "[ngram]", "num_speculative_tokens": 3,
                   "ngram_prompt_lookup_max": 2}):
        other = LLM(str(tiny_llama_dir), enable_lora=True, max_loras=2, **ENGINE, **extra)
        try:
            assert _ids(other.generate(prompts, GREEDY, lora_request=loras, use_tqdm=False)) \
                == plain, extra
            stats = other.engine.stats()
            if "speculative_model" in extra:  # drafts were verified, some accepted
                assert stats["spec_decode_num_accepted_tokens"] > 0
        finally:
            other.shutdown()


def test_tensor_parallel_workers_run_their_adapter_shards(
    llm: LLM, tiny_llama_dir: Path, adapters: dict[str, Path]
) -> None:
    """tp=2 over worker processes (gloo): each rank holds its shard of every adapter (A's
    columns for row-parallel layers, B's rows for column-parallel ones); greedy tokens of a
    mixed batch equal one rank's."""
    a, b = LoRARequest("a", 1, str(adapters["a"])), LoRARequest("b", 2, str(adapters["b"]))
    plan = [(p, lora) for p in PROMPTS for lora in (None, a, b)]
    prompts, loras = [p for p, _ in plan], [l for _, l in plan]
    one = _ids(llm.generate(prompts, GREEDY, lora_request=loras, use_tqdm=False))
    tp = LLM(str(tiny_llama_dir), enable_lora=True, max_loras=2, tensor_parallel_size=2,
             distributed_executor_backend="mp", **ENGINE)
    try:
        assert _ids(tp.generate(prompts, GREEDY, lora_request=loras, use_tqdm=False)) == one
        assert tp.engine.executor.collective_rpc("list_loras") == [{1, 2}, {1, 2}]
    finally:
        tp.shutdown()


def test_beam_search_runs_every_beam_with_the_adapter(
    llm: LLM, adapters: dict[str, Path]
) -> None:
    """One beam is greedy decoding: with an adapter, its tokens are the adapter's greedy ones
    (and not the base model's), offline and through SamplingParams(use_beam_search=True)."""
    a = LoRARequest("a", 1, str(adapters["a"]))
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    greedy = llm.generate(PROMPTS[:1], params, lora_request=a, use_tqdm=False)[0]
    base = llm.generate(PROMPTS[:1], params, use_tqdm=False)[0]
    prompt_len = len(greedy.prompt_token_ids)
    beam = llm.beam_search(PROMPTS[:1], BeamSearchParams(beam_width=1, max_tokens=10,
                                                         ignore_eos=True), lora_request=a)
    assert beam[0].sequences[0].tokens[prompt_len:] == greedy.outputs[0].token_ids
    assert greedy.outputs[0].token_ids != base.outputs[0].token_ids
    wide = BeamSearchParams(beam_width=2, max_tokens=10, ignore_eos=True)
    beams = SamplingParams(use_beam_search=True, n=1, best_of=2, temperature=0.0,
                           max_tokens=10, ignore_eos=True)
    out = llm.generate(PROMPTS[:1], beams, lora_request=a, use_tqdm=False)[0]
    best = llm.beam_search(PROMPTS[:1], wide, lora_request=a)[0].sequences[0]
    assert out.outputs[0].token_ids == best.tokens[prompt_len:]
    assert best.tokens != llm.beam_search(PROMPTS[:1], wide)[0].sequences[0].tokens


def test_decode_graphs_replay_lora_steps(llm: LLM, adapters: dict[str, Path]) -> None:
    a = LoRARequest("a", 1, str(adapters["a"]))
    llm.generate(PROMPTS, GREEDY, lora_request=[a, None, a], use_tqdm=False)
    graphs = llm.engine.executor.worker.model_runner.graphs  # type: ignore[attr-defined]
    assert graphs is not None and graphs.disabled is None and graphs.graphs


def test_prefix_cache_per_adapter_in_the_engine(llm: LLM, adapters: dict[str, Path]) -> None:
    a, b = LoRARequest("a", 1, str(adapters["a"])), LoRARequest("b", 2, str(adapters["b"]))
    prompt = {"prompt_token_ids": list(range(100, 300))}  # a full 128-token block to share
    params = SamplingParams(temperature=0.0, max_tokens=2)
    first = llm.generate(prompt, params, lora_request=a, use_tqdm=False)[0]
    again = llm.generate(prompt, params, lora_request=a, use_tqdm=False)[0]
    other = llm.generate(prompt, params, lora_request=b, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0 and again.num_cached_tokens > 0
    assert other.num_cached_tokens == 0


def test_max_cpu_loras_evicts_least_recently_used_and_reloads(
    tiny_llama_dir: Path, adapters: dict[str, Path], llm: LLM
) -> None:
    a, b = LoRARequest("a", 1, str(adapters["a"])), LoRARequest("b", 2, str(adapters["b"]))
    expected = {n: _ids(llm.generate(PROMPTS[:1], GREEDY, lora_request=x, use_tqdm=False))
                for n, x in (("a", a), ("b", b))}
    small = LLM(str(tiny_llama_dir), enable_lora=True, max_loras=1, max_cpu_loras=1, **ENGINE)
    try:
        for name, lora in (("a", a), ("b", b), ("a", a)):
            got = _ids(small.generate(PROMPTS[:1], GREEDY, lora_request=lora, use_tqdm=False))
            assert got == expected[name]
            assert small.engine.list_loras() == {lora.lora_int_id}
    finally:
        small.shutdown()


def test_lora_request_needs_enable_lora(tiny_llama_dir: Path, adapters: dict[str, Path]) -> None:
    plain = LLM(str(tiny_llama_dir), **ENGINE)
    try:
        with pytest.raises(ValueError, match="LoRA is not enabled"):
            plain.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("a", 1,
                           str(adapters["a"])), use_tqdm=False)
        assert not plain.engine.has_unfinished_requests()
    finally:
        plain.shutdown()


def _bad_adapter(kind: str, good: Path, tmp: Path) -> Path:
    """A copy of ``good`` broken one way."""
    if kind == "missing":
        return tmp / "no-such-adapter"
    out = tmp / kind
    shutil.copytree(good, out)
    config = json.loads((out / "adapter_config.json").read_text())
    weights = out / "adapter_model.safetensors"
    if kind == "corrupt":
        weights.write_bytes(b"\x00garbage, not safetensors" * 10)
    elif kind in ("dora", "modules_to_save"):
        config["use_dora" if kind == "dora" else "modules_to_save"] = \
            True if kind == "dora" else ["lm_head"]
    elif kind in ("lacking_layer", "shape"):
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(weights))
        if kind == "lacking_layer":  # layer 7 of a 2-layer model
            tensors = {k.replace("layers.1.", "layers.7."): v for k, v in tensors.items()}
        else:  # built for a wider model
            tensors = {k: torch.cat([v, v], dim=1) if "lora_A" in k else v
                       for k, v in tensors.items()}
        save_file(tensors, str(weights))
    elif kind == "new_tokens":
        (out / "new_embeddings.safetensors").write_bytes(weights.read_bytes())
    if kind == "no_config":
        (out / "adapter_config.json").unlink()
    else:
        (out / "adapter_config.json").write_text(json.dumps(config))
    return out


BAD = {
    "missing": "no such folder",
    "no_config": "no adapter_config.json",
    "corrupt": "adapter_model.safetensors is unreadable",
    "dora": "DoRA",
    "modules_to_save": "modules_to_save",
    "lacking_layer": "which this model lacks",
    "shape": "does not fit the base model",
    "new_tokens": "adds tokens",
}


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_adapters_are_refused_with_the_reason(
    kind: str, llm: LLM, adapters: dict[str, Path], tmp_path: Path
) -> None:
    path = _bad_adapter(kind, adapters["a"], tmp_path)
    with pytest.raises(ValueError, match=BAD[kind]):
        llm.engine.add_lora(LoRARequest(f"bad-{kind}", 50 + list(BAD).index(kind), str(path)))
    assert llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def test_rank_above_max_lora_rank_is_refused(
    tiny_llama_dir: Path, adapters: dict[str, Path]
) -> None:
    small = LLM(str(tiny_llama_dir), enable_lora=True, max_lora_rank=1, **ENGINE)
    try:
        with pytest.raises(ValueError, match="LoRA rank 8 is greater than max_lora_rank 1"):
            small.engine.add_lora(LoRARequest("a", 1, str(adapters["a"])))
    finally:
        small.shutdown()


def test_adapter_gone_before_its_step_aborts_only_its_requests(
    tiny_llama_dir: Path, adapters: dict[str, Path], tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    shutil.copytree(adapters["a"], gone)
    small = LLM(str(tiny_llama_dir), enable_lora=True, max_loras=1, max_cpu_loras=1, **ENGINE)
    try:
        a, b = LoRARequest("a", 1, str(gone)), LoRARequest("b", 2, str(adapters["b"]))
        small.engine.add_lora(a)
        small.engine.add_lora(b)  # evicts a (idle); a stays registered and checked
        shutil.rmtree(gone)
        outs = small.generate(PROMPTS[:2], GREEDY, lora_request=[a, b], use_tqdm=False)
        assert outs[0].outputs[0].finish_reason == "abort"
        assert outs[1].outputs[0].finish_reason == "length"
    finally:
        small.shutdown()

"""Custom logits processors, vLLM's ``logits_processors`` / ``--logits-processors`` with the
requests' ``extra_args`` (the server's ``vllm_xargs``), on SmolLM2 (float32); the processors
are in logits_processors_examples.py, written against vLLM's interface.

What is checked: the batch indices a processor sees follow vLLM's persistent batch through
every change (requests finishing at different steps, chunked prefill, preemption by
recompute), shown by a processor that keeps per-index state from ``update_state`` alone and
forces each request to its own target token, while the requests without a target generate
what they generate without any processor; a request-level callable wrapped by
``AdapterLogitsProcessor`` gives HF transformers' tokens under the same rule
(``NoRepeatNGramLogitsProcessor(1)``); an argmax-invariant processor runs after the
temperature and not at all in an all-greedy step; ``validate_params`` refuses a request (a 400
on the server); what is refused at start-up (not a LogitsProcessor, a missing class,
speculative decoding); a plugin's processor selected by name; the server's ``vllm_xargs`` on
completions and chat; the tensor-parallel sampling rank alone building them (mp executor).
"""

from __future__ import annotations

import os
import random
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from logits_processors_examples import (
    NoRepeatProcessor,
    ProbeProcessor,
    TargetTokenProcessor,
    has_processors,
)
from parallel_utils import worker_pids
from real_prompts import PROMPTS
from server_utils import RemoteServer

from ironlm import LLM, SamplingParams
from ironlm.engine.logits_processors import validate_request
from ironlm.hookspecs import hookimpl
from ironlm.interfaces.logits_processor import BatchUpdate, LogitsProcessor, process_dict_updates
from ironlm.plugin_manager import PluginManager
from ironlm.worker.logits_batch import LogitsProcessorBatch

pytestmark = pytest.mark.real_model

# 12 blocks of 16 tokens for 8 sequences of up to ~55 tokens, a 24-token step budget:
# chunked prefill and preemption by recompute churn the batch
ARGS: dict[str, Any] = {
    "dtype": "float32", "max_model_len": 192, "num_kv_blocks": 12, "block_size": 16,
    "enable_chunked_prefill": True, "max_num_batched_tokens": 24, "swap_space": 0,
}
EXAMPLES = "logits_processors_examples"


def greedy(max_tokens: int, **extra: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                          extra_args=extra or None)


def tokens(outs: list[Any]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def llm(smollm2_dir: Path) -> Iterator[LLM]:
    engine = LLM(str(smollm2_dir), **ARGS, logits_processors=[
        f"{EXAMPLES}:TargetTokenProcessor", NoRepeatProcessor, f"{EXAMPLES}.ProbeProcessor"])
    yield engine
    engine.shutdown()


def _vllm_order(states: dict[int, int], update: BatchUpdate | None) -> None:
    """vLLM's own helper's order (added, then removed, then moved): right only when no index
    is both removed and added, as vLLM's BatchUpdateBuilder guarantees."""
    if update is None:
        return
    for index, params, _prompt, _out in update.added:
        states[index] = params.extra_args["tag"]
    for index in update.removed:
        states.pop(index, None)
    for a, b, _how in update.moved:
        states[b] = states.pop(a)


class _Recorder(LogitsProcessor):
    """Keeps index -> request tag from update_state alone (in both orders processors use);
    apply records what each row holds."""

    def __init__(self, config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.tags: dict[int, int] = {}
        self.tags_vllm_order: dict[int, int] = {}
        self.applied: list[tuple[dict[int, int], torch.Tensor]] = []

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.tags, batch_update,
                             lambda p, _prompt, _out: p.extra_args["tag"])
        _vllm_order(self.tags_vllm_order, batch_update)
        if batch_update is not None:
            assert not set(batch_update.removed) & {a[0] for a in batch_update.added}
            assert sorted(self.tags) == list(range(batch_update.batch_size))
        assert self.tags == self.tags_vllm_order

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        self.applied.append((dict(self.tags), logits[:, 0].clone()))
        return logits + 1.0  # a change the caller must see in its own row order


def _state(tag: int) -> Any:
    return types.SimpleNamespace(params=SamplingParams(extra_args={"tag": tag}),
                                 prompt_token_ids=[1], output_token_ids=[])


def test_batch_indices_follow_every_change_of_the_rows() -> None:
    rng = random.Random(7)
    batch = LogitsProcessorBatch([_Recorder], types.SimpleNamespace(), torch.device("cpu"))
    rec = batch.varying[0]
    assert isinstance(rec, _Recorder)
    live: list[Any] = []  # sampling states, as the runner keeps them across steps
    moves = reused = 0
    for _step in range(300):  # requests come, go, and change order, as the scheduler's do
        live = [s for s in live if rng.random() > 0.2]
        if rng.random() < 0.3:
            rng.shuffle(live)
        if live and rng.random() < 0.1:  # a finished request's tag back as a new request
            live[0] = _state(live[0].params.extra_args["tag"])
            reused += 1
        live += [_state(rng.randrange(10**6)) for _ in range(rng.randrange(4))]
        if not live:
            continue
        batch.begin_step(live)
        tags_in_rows = [s.params.extra_args["tag"] for s in live]
        x = torch.tensor(tags_in_rows, dtype=torch.float32).unsqueeze(1).repeat(1, 3)
        y = batch.apply(x, batch.varying)
        tags, seen = rec.applied[-1]
        # the processor's row k holds the request its own state puts at index k
        assert [int(v) for v in seen.tolist()] == [tags[k] for k in range(len(live))]
        torch.testing.assert_close(y, x + 1.0)  # back in the runner's order
        moves += not batch.in_order
    assert moves > 50 and reused > 10


def test_target_tokens_hold_through_chunking_and_preemption(
    llm: LLM, smollm2_dir: Path
) -> None:
    params = [greedy(20 + 3 * i, **({"target_token": 100 + i} if i % 2 else {}))
              for i in range(len(PROMPTS))]
    before = llm.engine.stats()["num_preemptions"]
    got = tokens(llm.generate(PROMPTS, params, use_tqdm=False))
    assert llm.engine.stats()["num_preemptions"] > before  # recomputed: re-added requests
    plain = LLM(str(smollm2_dir), **ARGS)
    try:
        want = tokens(plain.generate(PROMPTS, params, use_tqdm=False))
    finally:
        plain.shutdown()
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == ([100 + i] * (20 + 3 * i) if i % 2 else w), i


def test_request_level_callable_matches_hf_no_repeat(llm: LLM, smollm2_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        NoRepeatNGramLogitsProcessor,
    )

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    prompts = PROMPTS[:3]
    got = tokens(llm.generate(prompts, greedy(16, no_repeat=True), use_tqdm=False))
    for prompt, ours in zip(prompts, got):
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=16, pad_token_id=tok.eos_token_id,
                                 logits_processor=LogitsProcessorList(
                                     [NoRepeatNGramLogitsProcessor(1)]))
        assert ours == out[0, ids.shape[1]:].tolist()
        assert len(set(ours)) == len(ours) and not set(ours) & set(ids[0].tolist())


def probe(llm: LLM) -> ProbeProcessor:
    [found] = llm.collective_rpc(lambda w: w.model_runner.sampler.custom.invariant[0])
    assert isinstance(found, ProbeProcessor)
    return found


def test_argmax_invariant_processors_run_after_the_temperature(llm: LLM) -> None:
    prober = probe(llm)
    prober.seen.clear()
    llm.generate(PROMPTS[:2], greedy(4, probe=True), use_tqdm=False)
    assert prober.seen == []  # every row greedy: vLLM skips them
    # raw logits reported: what the probe saw is the step's logits over the temperature
    params = SamplingParams(temperature=0.5, seed=1, max_tokens=3, logprobs=5,
                            extra_args={"probe": True})
    out = llm.generate(PROMPTS[:1], params, use_tqdm=False)[0].outputs[0]
    assert len(prober.seen) == 3
    for step, top in enumerate(out.logprobs):
        ids = list(top)
        row = prober.seen[step][0]  # (vocab,) the probed request's row
        lp = torch.log_softmax(row * 0.5, dim=-1)  # the temperature undone: raw logprobs
        for t in ids:
            assert abs(float(lp[t]) - top[t].logprob) < 1e-4


class _Picky(TargetTokenProcessor):
    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        (sampling_params.extra_args or {})["needed"]  # a KeyError, not a ValueError


def test_what_is_refused(llm: LLM, smollm2_dir: Path) -> None:
    with pytest.raises(ValueError, match="target_token must be a non-negative integer"):
        llm.generate(PROMPTS[:1], greedy(2, target_token="x"), use_tqdm=False)
    with pytest.raises(ValueError, match=r"_Picky.validate_params refused .* KeyError"):
        validate_request([_Picky], SamplingParams())
    with pytest.raises(ValueError, match="is not a subclass of"):
        LLM(str(smollm2_dir), max_model_len=64, logits_processors=[dict])
    with pytest.raises(ValueError, match="has no class 'Missing'"):
        LLM(str(smollm2_dir), max_model_len=64, logits_processors=[f"{EXAMPLES}:Missing"])
    with pytest.raises(ValueError, match="not supported when speculative decoding"):
        LLM(str(smollm2_dir), max_model_len=64, logits_processors=[TargetTokenProcessor],
            speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                "prompt_lookup_max": 3})
    assert llm.engine.stats()["num_used_blocks"] == 0


def test_a_plugin_registers_a_processor_by_name(smollm2_dir: Path) -> None:
    plugin = types.SimpleNamespace(
        IRONLM_CONTRACT_VERSION="1.3",
        register_logits_processors=hookimpl(
            lambda register: register(TargetTokenProcessor)),
    )
    pm = PluginManager(plugins={"lp-example": plugin})
    names = pm.registries.logits_processors.names()
    assert "target_token" in names
    # two pipeline stages (mp executor): only the sampling rank builds and runs it
    llm = LLM(str(smollm2_dir), plugin_manager=pm, dtype="float32", max_model_len=64,
              kv_cache_memory=16 << 20, enforce_eager=True, logits_processors=["target_token"],
              pipeline_parallel_size=2, distributed_executor_backend="mp")
    try:
        got = tokens(llm.generate(PROMPTS[:2], [greedy(5, target_token=7), greedy(5)],
                                  use_tqdm=False))
        built = llm.collective_rpc(has_processors)
    finally:
        llm.shutdown()
    assert worker_pids(os.getpid()) == [], "a worker process outlived its engine"
    assert got[0] == [7] * 5 and got[1] != [7] * 5
    assert built == [False, True]
    with pytest.raises(ValueError, match="unknown logits_processors 'nope'"):
        LLM(str(smollm2_dir), plugin_manager=pm, max_model_len=64, logits_processors=["nope"])


def test_server_takes_vllm_xargs(smollm2_dir: Path) -> None:
    args = ["--dtype", "float32", "--max-model-len", "128", "--kv-cache-memory", "32MiB",
            "--logits-processors", f"{EXAMPLES}:TargetTokenProcessor"]
    with RemoteServer(smollm2_dir, args) as srv:
        client = srv.openai_client()
        model = client.models.list().data[0].id
        done = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=6,
                                         extra_body={"vllm_xargs": {"target_token": 7042},
                                                     "return_token_ids": True})
        assert done.choices[0].model_extra["token_ids"] == [7042] * 6
        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
            extra_body={"vllm_xargs": {"target_token": 28}})
        assert chat.choices[0].message.content == "," * 4
        plain = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=6,
                                          temperature=0.0)
        assert plain.choices[0].text != done.choices[0].text
        res = httpx.post(srv.url("/v1/completions"), timeout=60, json={
            "model": model, "prompt": "x", "max_tokens": 2,
            "vllm_xargs": {"target_token": "seven"}})
        assert res.status_code == 400, res.text
        assert "target_token must be a non-negative integer" in res.json()["error"]["message"]

"""KV transfer (vLLM's --kv-transfer-config): one engine stores the KV of the prompts it
computes, another loads it instead of computing it, on SmolLM2 (float32 and bfloat16), through
the offline API, a pipeline-parallel engine and two servers (prefill and decode instances).

The proof that loaded KV is used: a consumer's greedy tokens equal an engine's without a
connector, its outputs count the loaded tokens as cached, and a store whose blocks were
overwritten with zeros changes what it generates.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from ironlm import LLM, SamplingParams
from ironlm.config import EngineConfig
from ironlm.distributed.kv_store import ExampleConnector
from ironlm.engine.request import Request
from ironlm.interfaces.kv_connector import KVTransferConfig
from parallel_utils import worker_pids
from safetensors.torch import load_file, save_file
from server_utils import RemoteServer

# prompts of 49, 53 and 56 tokens: 3 full blocks of 16 each can be loaded (the last token of
# a prompt is always computed); the third's are the second's
PROMPTS = [
    "The capital of France is a city that " * 6,
    "Once upon a time, in a land far away, there lived " * 4,
    "Once upon a time, in a land far away, there lived " * 4 + "and a dragon who",
]
# float32: a prompt run whole and one run over loaded KV agree to summation order
ARGS: dict[str, Any] = {"device": "cpu", "dtype": "float32", "max_model_len": 512,
                        "kv_cache_memory": 64 << 20}
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=1)


def ktc(store: Path, role: str, **kw: Any) -> dict[str, Any]:
    return {"kv_connector": "ExampleConnector", "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": str(store)}, **kw}


def generate(model: Path, prompts: list[str] = PROMPTS, **kwargs: Any) -> tuple[list[Any], dict]:
    llm = LLM(str(model), **{**ARGS, **kwargs})
    try:
        return llm.generate(prompts, GREEDY, use_tqdm=False), llm.llm_engine.stats()
    finally:
        llm.shutdown()


def files(store: Path) -> list[Path]:
    return sorted(store.rglob("*.safetensors"))


@pytest.fixture(scope="module")
def reference(smollm2_dir: Path) -> list[Any]:
    return generate(smollm2_dir)[0]


# -- the config and the store --------------------------------------------------------------
def test_config_is_vllms() -> None:
    cfg = KVTransferConfig.of({"kv_connector": "ExampleConnector", "kv_role": "kv_both"})
    assert cfg.kv_load_failure_policy == "fail" and cfg.is_kv_producer and cfg.is_kv_consumer
    assert cfg.get_from_extra_config("shared_storage_path", "/tmp") == "/tmp"
    for bad, needle in [({"kv_connector": "ExampleConnector"}, "kv_role"),
                        ({"kv_role": "kv_both"}, "kv_connector"),
                        ({"kv_connector": "X", "kv_role": "kv_both", "kv_load_failure_policy":
                          "retry"}, "kv_load_failure_policy"),
                        ({"kv_connector": "X", "kv_role": "kv_both", "kv_buffer": 1}, "kv_buffer")]:
        with pytest.raises(ValueError, match=needle):
            KVTransferConfig.of(bad)
    with pytest.raises(ValueError, match="not supported with a speculative model"):
        EngineConfig("m", kv_transfer_config=cfg, speculative_model="/a/draft",
                     num_speculative_tokens=2)


def test_example_connector_stores_blocks_whole(tmp_path: Path) -> None:
    store = ExampleConnector(KVTransferConfig.of(ktc(tmp_path, "kv_both")))
    tensors = [torch.randn(2, 1, 16, 3, 64), torch.randn(2, 1, 16, 3, 64).bfloat16()]
    assert not store.contains("ab12.r0")
    store.put("ab12.r0", tensors)
    assert store.contains("ab12.r0")
    got = store.get("ab12.r0")
    assert [t.dtype for t in got] == [torch.float32, torch.bfloat16]
    assert all(torch.equal(a, b) for a, b in zip(got, tensors))
    assert [p.name for p in tmp_path.rglob("*")] == ["ab", "ab12.r0.safetensors"]  # no temp
    with pytest.raises(ValueError, match="not a file name"):
        store.contains("../etc/passwd")


def test_block_keys_name_the_prefix(tmp_path: Path, smollm2_dir: Path) -> None:
    from ironlm.engine.kv_transfer import KVTransfer

    cfg = KVTransferConfig.of(ktc(tmp_path, "kv_both"))
    transfer = KVTransfer(cfg, ExampleConnector(cfg), "m", ["layout"], 4)
    params = SamplingParams()

    def keys(tokens: list[int], salt: str | None = None, n: int = 2) -> list[str]:
        return transfer.block_keys(Request("r", tokens, params, None, cache_salt=salt), n)

    a = keys([1, 2, 3, 4, 5, 6, 7, 8])
    assert keys([1, 2, 3, 4, 5, 6, 7, 9]) == [a[0], keys([1, 2, 3, 4, 5, 6, 7, 9])[1]] != a
    assert keys([1, 2, 3, 5, 5, 6, 7, 8])[1] != a[1]  # a block's key names its whole prefix
    assert keys([1, 2, 3, 4, 5, 6, 7, 8], salt="s")[0] != a[0]
    other = KVTransfer(cfg, ExampleConnector(cfg), "m", ["another layout"], 4)
    assert other.block_keys(Request("r", [1, 2, 3, 4], params, None), 1)[0] != a[0]


# -- engines on the real model --------------------------------------------------------------
def test_consumer_loads_what_a_producer_stored(
    smollm2_dir: Path, reference: list[Any], tmp_path: Path
) -> None:
    produced, pstats = generate(smollm2_dir, kv_transfer_config=ktc(tmp_path, "kv_producer"))
    assert [o.outputs[0].token_ids for o in produced] == \
        [o.outputs[0].token_ids for o in reference]
    # 3 + 3 prompt blocks, one file each (the third prompt's are the second's)
    assert len(files(tmp_path)) == 3 + 3
    assert pstats["external_prefix_cache_hits"] == 0
    outs, stats = generate(smollm2_dir, kv_transfer_config=ktc(tmp_path, "kv_consumer"))
    for out, ref in zip(outs, reference):
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
        assert out.num_cached_tokens == (len(ref.prompt_token_ids) - 1) // 16 * 16
        got = [next(iter(d.values())).logprob for d in out.outputs[0].logprobs]
        want = [next(iter(d.values())).logprob for d in ref.outputs[0].logprobs]
        assert got == pytest.approx(want, abs=1e-4)
    # the third prompt found the second's blocks, loaded in the same step, in the engine's
    # own prefix cache
    assert stats["external_prefix_cache_hits"] == 48 + 48
    assert stats["external_prefix_cache_queries"] == sum(len(r.prompt_token_ids) for r in reference)
    assert stats["prefix_cache_hits"] == 48


def test_loaded_blocks_are_what_the_consumer_reads(
    smollm2_dir: Path, reference: list[Any], tmp_path: Path
) -> None:
    generate(smollm2_dir, PROMPTS[:2], kv_transfer_config=ktc(tmp_path, "kv_producer"))
    for path in files(tmp_path):
        save_file({k: torch.zeros_like(v) for k, v in load_file(path).items()}, path)
    outs, _ = generate(smollm2_dir, PROMPTS[:2], kv_transfer_config=ktc(tmp_path, "kv_consumer"))
    first = [next(iter(o.outputs[0].logprobs[0].values())).logprob for o in outs]
    want = [next(iter(r.outputs[0].logprobs[0].values())).logprob for r in reference[:2]]
    assert any(o.outputs[0].token_ids != r.outputs[0].token_ids for o, r in
               zip(outs, reference)) or max(abs(a - b) for a, b in zip(first, want)) > 0.1


def test_another_layout_reads_nothing(smollm2_dir: Path, tmp_path: Path) -> None:
    generate(smollm2_dir, PROMPTS[:1], kv_transfer_config=ktc(tmp_path, "kv_producer"))
    outs, stats = generate(smollm2_dir, PROMPTS[:1], dtype="bfloat16",
                           kv_transfer_config=ktc(tmp_path, "kv_both"))
    assert stats["external_prefix_cache_hits"] == 0 and outs[0].num_cached_tokens == 0
    assert len(files(tmp_path)) == 2 * 3  # the bfloat16 engine stored its own


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_load_failure_policy(
    smollm2_dir: Path, reference: list[Any], tmp_path: Path, policy: str
) -> None:
    generate(smollm2_dir, PROMPTS[:2], kv_transfer_config=ktc(tmp_path, "kv_producer"))
    cfg = ktc(tmp_path, "kv_consumer", kv_load_failure_policy=policy,
              kv_connector="UnreadableConnector", kv_connector_module_path="kv_connector_examples")
    outs, _ = generate(smollm2_dir, [*PROMPTS, "The three primary colors are"],
                       kv_transfer_config=cfg)
    if policy == "fail":  # the two whose blocks the store lists fail, and the third, which
        # shares those blocks (found in the prefix cache in the same step); the fourth runs
        assert [o.error is not None for o in outs] == [True, True, True, False]
        assert "kv_load_failure_policy 'fail'" in outs[0].error
        assert outs[0].outputs[0].finish_reason == "abort"
        assert len(outs[3].outputs[0].token_ids) == GREEDY.max_tokens
    else:  # computed instead, as without a connector
        assert [o.outputs[0].token_ids for o in outs[:3]] == \
            [o.outputs[0].token_ids for o in reference]
        assert all(o.error is None for o in outs)


def test_failed_load_leaves_no_uncomputed_block_cached(
    smollm2_dir: Path, reference: list[Any], tmp_path: Path
) -> None:
    """The store holds the prompt's first block only and fails to load it. The two requests
    that took it (the second through the prefix cache, in the same step) are computed again;
    blocks registered at admission for tokens that never ran must not serve the second when
    the first has recomputed only the first block (prefills capped at 24 tokens a step)."""
    generate(smollm2_dir, ["Once upon a time, in a land far away, there lived " * 2],
             kv_transfer_config=ktc(tmp_path, "kv_producer"))
    assert len(files(tmp_path)) == 1
    cfg = ktc(tmp_path, "kv_consumer", kv_load_failure_policy="recompute",
              kv_connector="UnreadableConnector", kv_connector_module_path="kv_connector_examples")
    outs, _ = generate(smollm2_dir, [PROMPTS[1], PROMPTS[1]], long_prefill_token_threshold=24,
                       kv_transfer_config=cfg)
    assert [o.outputs[0].token_ids for o in outs] == [reference[1].outputs[0].token_ids] * 2


def test_failed_load_finishes_the_whole_request(smollm2_dir: Path, tmp_path: Path) -> None:
    """kv_load_failure_policy fail, a request of n=2 without prefix caching: both sequences
    load the stored first block in one step, the second's load fails. The whole request ends
    (its first sequence, which loaded, does not run on) and the engine goes on."""
    generate(smollm2_dir, ["Once upon a time, in a land far away, there lived " * 2],
             kv_transfer_config=ktc(tmp_path, "kv_producer"))
    cfg = ktc(tmp_path, "kv_consumer", kv_connector="SecondGetFailsConnector",
              kv_connector_module_path="kv_connector_examples")
    llm = LLM(str(smollm2_dir), **{**ARGS, "max_num_batched_tokens": 40},
              enable_prefix_caching=False, kv_transfer_config=cfg)
    try:
        two = SamplingParams(n=2, temperature=0.8, seed=1, max_tokens=5)
        (out,) = llm.generate(PROMPTS[1:2], two, use_tqdm=False)
        assert out.error is not None and len(out.outputs) == 2
        (after,) = llm.generate(["The three primary colors are"], GREEDY, use_tqdm=False)
        assert after.error is None and len(after.outputs[0].token_ids) == GREEDY.max_tokens
        assert llm.llm_engine.stats()["num_used_blocks"] == 0
    finally:
        llm.shutdown()


def test_prompt_lookup_speculation_over_loaded_blocks(
    smollm2_dir: Path, reference: list[Any], tmp_path: Path
) -> None:
    """[ngram] speculation (no KV of its own) on a kv_both engine: the second run loads the
    prompts' blocks and verifies drafts over them; greedy tokens as without either."""
    ngram = {"speculative_model": "[ngram]", "num_speculative_tokens": 3,
             "ngram_prompt_lookup_max": 3}
    llm = LLM(str(smollm2_dir), **ARGS, **ngram, kv_transfer_config=ktc(tmp_path, "kv_both"))
    try:
        first = llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
        assert llm.reset_prefix_cache()
        again = llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
        stats = llm.llm_engine.stats()
    finally:
        llm.shutdown()
    assert [o.num_cached_tokens for o in again] == [48, 48]
    assert stats["spec_decode_num_draft_tokens"] > 0
    for outs in (first, again):
        assert [o.outputs[0].token_ids for o in outs] == \
            [o.outputs[0].token_ids for o in reference[:2]]


def test_third_party_store_through_the_interface(smollm2_dir: Path, reference: list[Any]) -> None:
    blocks: dict[str, list[torch.Tensor]] = {}
    cfg = {"kv_connector": "MemoryConnector", "kv_role": "kv_both",
           "kv_connector_module_path": "kv_connector_examples",
           "kv_connector_extra_config": {"blocks": blocks}}
    llm = LLM(str(smollm2_dir), **ARGS, kv_transfer_config=cfg)
    try:
        first = llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
        assert len(blocks) == 6 and {k[-3:] for k in blocks} == {".r0"}
        assert llm.reset_prefix_cache()
        again = llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
        assert [o.num_cached_tokens for o in again] == [48, 48]
        assert [o.outputs[0].token_ids for o in again] == \
            [o.outputs[0].token_ids for o in first] == \
            [o.outputs[0].token_ids for o in reference[:2]]
    finally:
        llm.shutdown()


def test_chunked_prefill_stores_every_block(
    smollm2_dir: Path, reference: list[Any], tmp_path: Path
) -> None:
    """Prompts prefilled 24 tokens a step (chunks end inside blocks) store each block once it
    is full, and a consumer prefilling the same way loads them."""
    chunked = {"max_num_batched_tokens": 24, "max_num_seqs": 4}
    produced, _ = generate(smollm2_dir, PROMPTS[:2], **chunked,
                           kv_transfer_config=ktc(tmp_path, "kv_producer"))
    assert len(files(tmp_path)) == 6
    outs, stats = generate(smollm2_dir, PROMPTS[:2], **chunked,
                           kv_transfer_config=ktc(tmp_path, "kv_consumer"))
    assert stats["external_prefix_cache_hits"] == 96
    assert [o.outputs[0].token_ids for o in outs] == \
        [o.outputs[0].token_ids for o in produced] == \
        [o.outputs[0].token_ids for o in reference[:2]]


def test_pipeline_stages_store_and_load_their_layers(
    smollm2_dir: Path, reference: list[Any], tmp_path: Path
) -> None:
    llm = LLM(str(smollm2_dir), **ARGS, pipeline_parallel_size=2,
              distributed_executor_backend="mp", kv_transfer_config=ktc(tmp_path, "kv_both"))
    try:
        llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
        assert llm.reset_prefix_cache()
        outs = llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    finally:
        llm.shutdown()
        assert worker_pids(os.getpid()) == [], "a worker process outlived its engine"
    assert [o.num_cached_tokens for o in outs] == [48, 48]
    assert [o.outputs[0].token_ids for o in outs] == \
        [o.outputs[0].token_ids for o in reference[:2]]
    stored = files(tmp_path)
    assert sorted({p.name.split(".")[1] for p in stored}) == ["r0", "r1"]
    assert {len(load_file(p)) for p in stored} == {15}  # 30 layers, half on each stage


# -- disaggregated prefill through two servers -----------------------------------------------
def test_prefill_and_decode_servers(
    smollm2_dir: Path, reference: list[Any], tmp_path: Path
) -> None:
    """vLLM's disaggregated-prefill recipe: the prefill instance runs each prompt for one
    token, then the decode instance answers it, loading the prompt's KV."""
    common = ["--dtype", "float32", "--max-model-len", "512", "--kv-cache-memory", "64MiB",
              "--enable-prompt-tokens-details"]
    prefill_cfg = json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_producer",
                              "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)}})
    # the decode instance's flags in vLLM's dotted form, one key each
    decode_flags = ["--kv-transfer-config.kv_connector", "ExampleConnector",
                    "--kv-transfer-config.kv_role", "kv_consumer",
                    "--kv-transfer-config.kv_connector_extra_config.shared_storage_path",
                    str(tmp_path)]
    with RemoteServer(smollm2_dir, [*common, "--kv-transfer-config", prefill_cfg]) as prefill, \
            RemoteServer(smollm2_dir, [*common, *decode_flags]) as decode:
        p, d = prefill.openai_client(), decode.openai_client()
        model = p.models.list().data[0].id
        for prompt, ref in zip(PROMPTS[:2], reference):
            p.completions.create(model=model, prompt=prompt, max_tokens=1)
            out = d.completions.create(model=model, prompt=prompt, max_tokens=10, temperature=0,
                                       extra_body={"ignore_eos": True})
            assert out.choices[0].text == ref.outputs[0].text
            assert out.usage.prompt_tokens_details.cached_tokens == 48
        metrics = httpx.get(decode.url("/metrics")).text
        assert "vllm:external_prefix_cache_hits_total" in metrics
        hits = [line for line in metrics.splitlines()
                if line.startswith("vllm:external_prefix_cache_hits_total")]
        assert float(hits[0].split()[-1]) == 96

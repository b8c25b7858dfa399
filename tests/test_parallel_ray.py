"""The ``ray`` executor on a Ray head started on 127.0.0.1 for this module (``ray start
--head``, reached through RAY_ADDRESS): SmolLM2 at tp=3 and pp=2 gives the greedy tokens of
one rank, through ``LLM`` and through ``ironlm serve`` with the openai client (streaming
included); ``collective_rpc`` through the actors (a lambda, weight updates over three ranks, a
refused call); prompt embeddings and a custom logits processor at tp=3; a killed Ray worker
makes the engine dead."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import torch
from parallel_utils import (
    ENGINE_ARGS,
    MAX_TOKENS,
    PROMPTS,
    RayHead,
    greedy_outputs,
    greedy_tokens,
    worker_pids,
)
from logits_processors_examples import TargetTokenProcessor, has_processors
from safetensors.torch import load_file
from server_utils import RemoteServer
from weight_sync import load_weights_call, perturbed

from ironlm import LLM, SamplingParams


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    head = RayHead()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("RAY_ADDRESS", head.address)
            mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
            yield head.address
    finally:
        head.close()


@pytest.fixture(scope="module")
def one_rank(smollm2_dir: Path) -> tuple[list[list[int]], list[str]]:
    llm = LLM(str(smollm2_dir), **ENGINE_ARGS)
    try:
        return greedy_outputs(llm)
    finally:
        llm.shutdown()


def _ray_llm(model: Path, **kwargs: Any) -> LLM:
    return LLM(str(model), **ENGINE_ARGS, distributed_executor_backend="ray", **kwargs)


def test_ray_tp3_matches_one_rank_and_a_dead_worker_kills_the_engine(
    ray_address: str, smollm2_dir: Path, one_rank: tuple[list[list[int]], list[str]]
) -> None:
    import ray

    llm = _ray_llm(smollm2_dir, tensor_parallel_size=3, enable_prompt_embeds=True,
                   logits_processors=[TargetTokenProcessor])
    try:
        assert greedy_tokens(llm) == one_rank[0]  # the processor configured, no request uses it
        # prompts as embedding rows (SmolLM2's table, unscaled) reach every rank through Ray
        table = load_file(smollm2_dir / "model.safetensors")["model.embed_tokens.weight"]
        rows = [{"prompt_embeds": table[llm.get_tokenizer()(p).input_ids]} for p in PROMPTS]
        greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        assert [o.outputs[0].token_ids for o in llm.generate(rows, greedy, use_tqdm=False)] \
            == one_rank[0]
        # the custom processor: built on the sampling rank only, its target held
        assert llm.collective_rpc(has_processors) == [True, False, False]
        forced = SamplingParams(temperature=0.0, max_tokens=4, extra_args={"target_token": 7})
        assert llm.generate(PROMPTS[:1], forced, use_tqdm=False)[0].outputs[0].token_ids \
            == [7] * 4
        # collective_rpc through the actors: a lambda (Ray pickles it by value), weight
        # updates sharded over the three ranks, a refused call that leaves them running
        assert llm.collective_rpc(lambda worker: worker.rank) == [0, 1, 2]
        with pytest.raises(ValueError, match="unexpected weight 'model.nope.weight'"):
            llm.collective_rpc(load_weights_call, args=([("model.nope.weight", torch.ones(1))],))
        _, new = perturbed(smollm2_dir)
        assert llm.collective_rpc(load_weights_call, args=(list(new.items()),)) == [0, 1, 2]
        llm.reset_prefix_cache()
        assert greedy_tokens(llm) != one_rank[0]
        original = load_file(smollm2_dir / "model.safetensors")
        llm.collective_rpc(load_weights_call, args=([(n, original[n]) for n in new],))
        llm.reset_prefix_cache()
        assert greedy_tokens(llm) == one_rank[0]
        executor = llm.engine.executor
        assert len(executor.actors) == 3
        ray.kill(executor.actors[1])  # one rank's process is gone
        with pytest.raises(RuntimeError, match="rank 1"):
            llm.generate(PROMPTS[:1], SamplingParams(max_tokens=4), use_tqdm=False)
        with pytest.raises(RuntimeError, match="rank 1"):
            llm.engine.check_health()
    finally:
        llm.shutdown()


def test_ray_pp2_server_matches_one_rank_streaming_included(
    ray_address: str, smollm2_dir: Path, one_rank: tuple[list[list[int]], list[str]]
) -> None:
    args = ["--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory", "32MiB",
            "--enforce-eager", "-pp", "2", "--distributed-executor-backend", "ray"]
    with RemoteServer(smollm2_dir, args, env={"RAY_ADDRESS": ray_address}) as server:
        client = server.openai_client()
        expected = one_rank[1]
        for prompt, text in zip(PROMPTS[:2], expected):
            out = client.completions.create(
                model=str(smollm2_dir), prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                extra_body={"ignore_eos": True},
            )
            assert out.choices[0].text == text
        stream = client.completions.create(
            model=str(smollm2_dir), prompt=PROMPTS[2], max_tokens=MAX_TOKENS, temperature=0,
            stream=True, extra_body={"ignore_eos": True},
        )
        assert "".join(c.choices[0].text for c in stream) == expected[2]
    assert server.proc.returncode is not None


def test_ray_dp2_server_matches_one_rank(
    ray_address: str, smollm2_dir: Path, one_rank: tuple[list[list[int]], list[str]]
) -> None:
    """-dp 2 -dpb ray: each data-parallel engine's worker a Ray actor."""
    args = ["--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory", "32MiB",
            "--enforce-eager", "-dp", "2", "-dpb", "ray"]
    env = {"RAY_ADDRESS": ray_address, "VLLM_SERVER_DEV_MODE": "1"}
    with RemoteServer(smollm2_dir, args, env=env) as server:
        assert worker_pids(server.proc.pid) == []  # no mp workers: the actors run them
        out = server.openai_client().completions.create(
            model=str(smollm2_dir), prompt=PROMPTS, max_tokens=MAX_TOKENS, temperature=0,
            extra_body={"ignore_eos": True})
        assert [c.text for c in sorted(out.choices, key=lambda c: c.index)] == one_rank[1]
        rpc = httpx.post(server.url("/collective_rpc"), json={"method": "check_health"},
                         timeout=60)
        assert rpc.json() == {"results": [None, None]}  # one actor per engine

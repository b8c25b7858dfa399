"""Speculative decoding and multi-step scheduling, the parts that need no model: flag checks,
n-gram lookup, the block manager's trim, the rejection sampler's exactness (chi-square against
the target distribution, fixed seeds), and proposers as a plugin kind."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
import torch

from ironlm.config import EngineConfig
from ironlm.engine.block_manager import BlockManager
from ironlm.engine.request import Request
from ironlm.entrypoints.openai.cli_args import engine_config_from_args, make_parser
from ironlm.hookspecs import hookimpl
from ironlm.interfaces.spec_decode import Proposal, ProposalRequest, SpeculativeProposer
from ironlm.plugin_manager import PluginManager
from ironlm.registry import UnknownNameError
from ironlm.sampling_params import SamplingParams
from ironlm.spec_decode.ngram import NgramIndex
from ironlm.worker.rejection_sampler import RejectionSampler, SpecRows
from ironlm.worker.sampler import Sampler, SamplingState


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of ``counts`` to ``probs`` (cells expecting < 5 pooled into one)."""
    n = counts.sum().item()
    expected = probs.double() * n
    small = expected < 5
    obs = torch.cat([counts[~small].double(), counts[small].double().sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = len(exp) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2))


# -- flags ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"speculative_model": "[ngram]", "num_speculative_tokens": 0,
          "ngram_prompt_lookup_max": 3}, "num_speculative_tokens must be at least 1"),
        ({"speculative_model": "[ngram]", "ngram_prompt_lookup_max": 3},
         "num_speculative_tokens must be provided"),
        ({"speculative_model": "[ngram]", "num_speculative_tokens": 3,
          "ngram_prompt_lookup_max": 2, "ngram_prompt_lookup_min": 3},
         r"ngram_prompt_lookup_min \(3\) cannot be larger than ngram_prompt_lookup_max \(2\)"),
        ({"speculative_model": "[ngram]", "num_speculative_tokens": 3},
         "ngram_prompt_lookup_max must be set"),
        ({"speculative_model": "/some/draft", "num_speculative_tokens": 3,
          "ngram_prompt_lookup_max": 3}, "only used with speculative_model '\\[ngram\\]'"),
        ({"num_speculative_tokens": 3}, "num_speculative_tokens given without speculative_model"),
        ({"num_scheduler_steps": 0}, "num_scheduler_steps must be at least 1"),
        ({"speculative_model": "[ngram]", "num_speculative_tokens": 2,
          "ngram_prompt_lookup_max": 2, "num_scheduler_steps": 4},
         "not supported with multi-step"),
        ({"speculative_model": "[ngram]", "num_speculative_tokens": 2,
          "ngram_prompt_lookup_max": 2, "speculative_disable_by_batch_size": 1},
         "speculative_disable_by_batch_size must be larger than 1"),
    ],
)
def test_bad_speculative_flags_are_clear_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(model="m", **kwargs)


def test_serve_flags_reach_the_config() -> None:
    args = make_parser().parse_args([
        "M", "--speculative-model", "[ngram]", "--num-speculative-tokens", "5",
        "--ngram-prompt-lookup-max", "4", "--speculative-disable-by-batch-size", "8",
        "--speculative-max-model-len", "1024",
    ])
    cfg = engine_config_from_args(args)
    assert (cfg.speculative_model, cfg.num_speculative_tokens, cfg.ngram_prompt_lookup_max,
            cfg.ngram_prompt_lookup_min, cfg.speculative_disable_by_batch_size,
            cfg.speculative_max_model_len) == ("[ngram]", 5, 4, 1, 8, 1024)
    cfg = engine_config_from_args(make_parser().parse_args(["M", "--num-scheduler-steps", "8"]))
    assert cfg.num_scheduler_steps == 8
    with pytest.raises(ValueError, match="num_scheduler_steps must be at least 1"):
        engine_config_from_args(make_parser().parse_args(["M", "--num-scheduler-steps", "0"]))
    assert isinstance(make_parser(), argparse.ArgumentParser)


# -- n-gram lookup ----------------------------------------------------------------------------
def test_ngram_lookup_prefers_the_longest_suffix_and_recent_context() -> None:
    idx = NgramIndex(1, 3)
    #         0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 8, 9, 1, 6, 7, 2, 6, 7]
    # suffix (6, 7) seen at 1..2 and 6..7 (latest): what followed the latest is [2, 6, 7]
    assert idx.lookup(tokens, 3) == [2, 6, 7]
    # a longer suffix wins over a more recent shorter one: (9, 1, 6) -> ...
    assert NgramIndex(1, 3).lookup([9, 1, 6, 4, 4, 9, 1, 6], 2) == [4, 4]
    assert NgramIndex(2, 3).lookup([1, 2, 3, 4], 2) == []  # nothing recurs
    # a run of one token: the latest occurrence has one token after it, the first has more
    assert NgramIndex(1, 2).lookup([3, 3, 3, 3, 3], 3) == [3, 3, 3]
    # incremental: tokens arriving after a lookup are indexed on the next one
    grow = NgramIndex(1, 2)
    seq = [1, 2, 3]
    assert grow.lookup(seq, 2) == []
    seq += [1, 2]
    assert grow.lookup(seq, 2) == [3, 1]


# -- block manager ----------------------------------------------------------------------------
def test_trim_returns_the_blocks_of_rejected_slots_only() -> None:
    bm = BlockManager(num_kv_blocks=8, block_size=4, enable_prefix_caching=True)
    req = Request("r", list(range(6)), SamplingParams(), None)
    assert bm.allocate(req, 6 + 7)  # the prompt, then room for drafts: 13 slots, 4 blocks
    assert len(bm.block_ids("r")) == 4
    bm.trim("r", 7)  # 7 slots kept: 2 blocks
    assert len(bm.block_ids("r")) == 2 and bm.num_free_blocks == 6
    bm.trim("r", 20)  # never grows
    assert len(bm.block_ids("r")) == 2
    bm.free("r")
    assert bm.num_free_blocks == 8


# -- rejection sampling -----------------------------------------------------------------------
V = 6


def test_rejection_sampling_keeps_the_target_distribution() -> None:
    """Fixed target rows p1, p2, p3 and draft distributions q1, q2 unlike them: the first
    emitted token is distributed as p1, and the token after an accepted first draft as p2
    (chi-square, fixed seeds: deterministic). Drafting from q itself or a point mass."""
    gen = torch.Generator().manual_seed(1234)
    logits = torch.randn(3, V, generator=gen) * 1.5  # (k + 1, V) target logits, k = 2
    p = torch.softmax(logits, dim=-1)
    q = torch.softmax(torch.randn(2, V, generator=gen) * 1.5, dim=-1)
    assert (p[:2] - q).abs().sum(dim=-1).min() > 0.3  # the draft is really different
    sampler = RejectionSampler(Sampler())
    n = 4000
    params = SamplingParams(temperature=1.0)
    draw_gen = torch.Generator().manual_seed(99)
    first = torch.zeros(V, dtype=torch.long)
    second = torch.zeros(V, dtype=torch.long)
    point_first = torch.zeros(V, dtype=torch.long)
    accepted = 0
    for start in range(0, n, 500):
        states = [SamplingState.create(_with_seed(params, start + i), None, [0], V,
                                       torch.device("cpu")) for i in range(500)]
        groups = []
        for s in states:
            d = [int(torch.multinomial(q[j], 1, generator=draw_gen)) for j in range(2)]
            groups.append(SpecRows(s, d, q.clone()))
        outs = sampler(logits.repeat(500, 1), groups)
        for g, out in zip(groups, outs):
            first[out[0].token_id] += 1
            if out[0].token_id == g.drafts[0] and len(out) > 1:
                accepted += 1
                second[out[1].token_id] += 1
        # point-mass drafts (n-gram): always the same two drafts
        states = [SamplingState.create(_with_seed(params, 10_000 + start + i), None, [0], V,
                                       torch.device("cpu")) for i in range(500)]
        outs = sampler(logits.repeat(500, 1), [SpecRows(s, [2, 3], None) for s in states])
        for out in outs:
            point_first[out[0].token_id] += 1
    assert 0.1 * n < accepted < 0.9 * n  # both accept and reject paths were taken
    assert chi_square_pvalue(first, p[0]) > 1e-3
    assert chi_square_pvalue(second, p[1]) > 1e-3
    assert chi_square_pvalue(point_first, p[0]) > 1e-3
    # the test has power: the drafts' own distribution is far from the target's
    assert chi_square_pvalue(first, q[0]) < 1e-6


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    p = params.clone()
    p.seed = seed
    return p


def test_greedy_verification_keeps_exactly_the_argmax_tokens() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 0.0, 0.0, 0.0],   # argmax 1
                           [0.0, 0.0, 0.0, 4.0, 0.0, 0.0],   # argmax 3
                           [5.0, 0.0, 0.0, 0.0, 0.0, 0.0]])  # argmax 0
    sampler = RejectionSampler(Sampler())
    greedy = SamplingParams(temperature=0.0, logprobs=2)

    def run(drafts: list[int]) -> list[int]:
        s = SamplingState.create(greedy, None, [0], V, torch.device("cpu"))
        return [t.token_id for t in sampler(logits, [SpecRows(s, drafts, None)])[0]]

    assert run([1, 3]) == [1, 3, 0]  # all kept, plus the bonus token
    assert run([1, 2]) == [1, 3]  # second rejected: the target's token there
    assert run([4, 3]) == [1]
    s = SamplingState.create(greedy, None, [0], V, torch.device("cpu"))
    out = sampler(logits, [SpecRows(s, [1, 3], None)])[0]
    raw = torch.log_softmax(logits, dim=-1)
    assert [round(t.logprob, 5) for t in out] == [round(float(raw[j, t.token_id]), 5)
                                                  for j, t in enumerate(out)]
    assert out[1].top_logprobs is not None and out[1].top_logprobs[0][0] == 3
    assert s.output_token_ids == [1, 3, 0]  # the sampler's state followed the tokens


def test_penalties_see_the_drafts_before_each_row() -> None:
    """A draft repeated under a repetition penalty: row 2 is processed as if draft 1 had been
    sampled (greedy, so the outcome is exact)."""
    logits = torch.tensor([[0.0, 2.0, 1.9, 0.0, 0.0, 0.0]] * 3)
    params = SamplingParams(temperature=0.0, presence_penalty=1.0)
    s = SamplingState.create(params, None, [0], V, torch.device("cpu"))
    out = RejectionSampler(Sampler())(logits, [SpecRows(s, [1, 1], None)])[0]
    # row 1: token 1 (2.0); row 2: token 1 penalised to 1.0 < 1.9 -> draft 2 (=1) rejected
    assert [t.token_id for t in out] == [1, 2]


# -- proposers are a plugin kind --------------------------------------------------------------
class EchoProposer(SpeculativeProposer):
    """Drafts the request's last token again (for the registry test)."""

    name = "echo"

    def propose(self, requests: list[ProposalRequest]) -> dict[str, Proposal]:
        return {r.request_id: Proposal([r.token_ids[-1]] * r.num_proposals) for r in requests}


class HeadsProposer(EchoProposer):
    name = "my_heads"
    needs_model = True
    model_types = ("my_medusa",)


class _Plugin:
    IRONLM_CONTRACT_VERSION = "1.0"

    @staticmethod
    @hookimpl
    def register_speculative_proposers(register: Any) -> None:
        register(EchoProposer)
        register(HeadsProposer)


def test_a_third_party_proposer_is_selected_by_name_and_model_type() -> None:
    pm = PluginManager(autoload=False, plugins={"echo_plugin": _Plugin()})
    assert pm.select_speculative_proposer("[echo]") is EchoProposer
    assert pm.select_speculative_proposer("[ngram]").name == "ngram"
    assert pm.select_speculative_proposer("/heads", "my_medusa") is HeadsProposer
    assert pm.select_speculative_proposer("/a/draft", "llama").name == "draft_model"
    with pytest.raises(UnknownNameError, match=r"\[echo\].*\[ngram\]"):
        pm.select_speculative_proposer("[medusa]")
    with pytest.raises(ValueError, match="loads a model"):
        pm.select_speculative_proposer("[draft_model]")
    rows = {r["plugin"]: r for r in pm.describe()}
    kinds = {(i["kind"], i["name"]) for i in rows["echo_plugin"]["registered"]}
    assert ("speculative proposer", "echo") in kinds
    assert ("speculative proposer", "ngram") in {
        (i["kind"], i["name"]) for i in rows["ironlm"]["registered"]}


def test_speculation_pauses_where_it_does_not_pay() -> None:
    from ironlm.engine.speculation import SpeculationPolicy

    cfg = EngineConfig(model="m", speculative_model="[ngram]", num_speculative_tokens=4,
                       ngram_prompt_lookup_max=2, speculative_max_model_len=100)
    policy = SpeculationPolicy(cfg, max_model_len=200, lookahead=lambda k: 0)
    req = Request("r", list(range(10)), SamplingParams(max_tokens=50), None)
    req.output_token_ids = [1, 2]
    assert policy.plan_proposals(req, 0) == 4
    for _ in range(SpeculationPolicy.HISTORY - 1):
        policy.on_verified(req, 4, 1)  # nothing kept
    assert req.spec_paused_steps == 0
    policy.on_verified(req, 4, 1)
    assert req.spec_paused_steps == SpeculationPolicy.PAUSE_STEPS
    assert [policy.plan_proposals(req, 0) for _ in range(SpeculationPolicy.PAUSE_STEPS)] == [
        0] * SpeculationPolicy.PAUSE_STEPS
    assert policy.plan_proposals(req, 0) == 4  # then it tries again
    # limits: max_tokens, max_model_len and speculative_max_model_len cap the drafts
    req.output_token_ids = list(range(46))  # 4 more may come: this step 1, then 3 at most
    assert policy.plan_proposals(req, 0) == 2
    req.spec_token_ids = [5, 6, 7, 8]
    assert policy.drafts(req, budget=3) == [5, 6]  # the step's token budget
    long = Request("l", list(range(97)), SamplingParams(max_tokens=50), None)
    assert policy.plan_proposals(long, 0) == 3  # drafts up to position 100
    st = policy.stats
    assert (st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens) == (8, 32, 0)
    assert st.mean_accepted_length == 1.0 and st.acceptance_rate == 0.0

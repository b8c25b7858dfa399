"""Beam search on top of the engine, as vLLM's ``LLM.beam_search`` does it.

Each step runs every live beam for one token with ``2 * beam_width`` logprobs. Beams of one
prompt share their common prefix's full KV blocks through the prefix cache (the blocks are
reference-counted, never copied); only a beam's last partial block is its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ironlm.sampling_params import BeamSearchParams, SamplingParams

if TYPE_CHECKING:
    from ironlm.entrypoints.llm import LLM


@dataclass
class BeamSearchSequence:
    tokens: list[int]  # prompt + generated
    logprobs: list[float] = field(default_factory=list)  # of each generated token
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]


def beam_score(seq: BeamSearchSequence, eos_token_id: int | None, length_penalty: float) -> float:
    """cum_logprob / len ** length_penalty, len counting prompt + generated minus a final EOS."""
    n = len(seq.tokens)
    if eos_token_id is not None and seq.tokens and seq.tokens[-1] == eos_token_id:
        n -= 1
    return seq.cum_logprob / (n**length_penalty)


def run_beam_search(
    llm: LLM, prompts: list[Any], params: BeamSearchParams
) -> list[BeamSearchOutput]:
    if params.temperature != 0:
        raise ValueError(
            "temperature must be 0 for beam search: beams are ranked by the model's raw "
            "log-probabilities"
        )
    tok = llm.get_tokenizer()
    eos = tok.eos_token_id
    width = params.beam_width
    step_params = SamplingParams(max_tokens=1, logprobs=2 * width, temperature=0.0)
    starts = []
    for p in prompts:
        processed = llm.engine.inputs.process(p, step_params.clone())
        starts.append(processed.token_ids)
    live = [[BeamSearchSequence(list(ids))] for ids in starts]
    done: list[list[BeamSearchSequence]] = [[] for _ in prompts]
    for _ in range(params.max_tokens):
        flat = [(i, b) for i, beams in enumerate(live) for b in beams]
        if not flat:
            break
        outs = llm.generate([b.tokens for _, b in flat], step_params, use_tqdm=False)
        candidates: list[list[BeamSearchSequence]] = [[] for _ in prompts]
        for (i, beam), out in zip(flat, outs):
            for tid, lp in (out.outputs[0].logprobs or [{}])[0].items():
                candidates[i].append(
                    BeamSearchSequence(
                        beam.tokens + [tid], beam.logprobs + [lp.logprob],
                        beam.cum_logprob + lp.logprob,
                    )
                )
        for i, cands in enumerate(candidates):
            cands.sort(key=lambda s: -s.cum_logprob)
            keep: list[BeamSearchSequence] = []
            for c in cands[:width]:
                if c.tokens[-1] == eos and not params.ignore_eos:
                    c.finish_reason = "stop"
                    done[i].append(c)
                else:
                    keep.append(c)
            live[i] = keep
    results = []
    for i, prompt_ids in enumerate(starts):
        for b in live[i]:
            b.finish_reason = "length"
        pool = done[i] + live[i]
        pool.sort(key=lambda s: -beam_score(s, eos, params.length_penalty))
        best = pool[:width]
        for s in best:
            s.text = tok.decode(s.tokens[len(prompt_ids):], skip_special_tokens=True)
        results.append(BeamSearchOutput(best))
    return results

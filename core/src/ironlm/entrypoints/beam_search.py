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


class BeamSearch:
    """The beams of one batch of prompts, advanced one token per step by whoever runs the
    model (``run_beam_search`` offline, the server's async driver over HTTP)."""

    def __init__(self, starts: list[list[int]], params: BeamSearchParams, eos: int | None) -> None:
        if params.temperature != 0:
            raise ValueError(
                "temperature must be 0 for beam search: beams are ranked by the model's raw "
                "log-probabilities"
            )
        self.params = params
        self.eos = eos
        self.starts = starts
        self.live = [[BeamSearchSequence(list(ids))] for ids in starts]
        self.done: list[list[BeamSearchSequence]] = [[] for _ in starts]
        self.steps = 0
        # each beam asks for its 2 * width most likely next tokens
        self.step_params = SamplingParams(max_tokens=1, logprobs=2 * params.beam_width,
                                          temperature=0.0)

    def pending(self) -> list[tuple[int, BeamSearchSequence]]:
        """(prompt index, beam) of every beam to extend this step; [] when finished."""
        if self.steps >= self.params.max_tokens:
            return []
        return [(i, b) for i, beams in enumerate(self.live) for b in beams]

    def advance(self, flat: list[tuple[int, BeamSearchSequence]], outs: list[Any]) -> None:
        """Extend each beam of ``flat`` by the candidates its step output holds; keep the
        ``beam_width`` best per prompt."""
        width = self.params.beam_width
        candidates: list[list[BeamSearchSequence]] = [[] for _ in self.starts]
        for (i, beam), out in zip(flat, outs):
            for tid, lp in (out.outputs[0].logprobs or [{}])[0].items():
                candidates[i].append(BeamSearchSequence(
                    beam.tokens + [tid], beam.logprobs + [lp.logprob],
                    beam.cum_logprob + lp.logprob,
                ))
        for i, cands in enumerate(candidates):
            cands.sort(key=lambda s: -s.cum_logprob)
            keep: list[BeamSearchSequence] = []
            for c in cands[:width]:
                if c.tokens[-1] == self.eos and not self.params.ignore_eos:
                    c.finish_reason = "stop"
                    self.done[i].append(c)
                else:
                    keep.append(c)
            self.live[i] = keep
        self.steps += 1

    def results(self, tokenizer: Any) -> list[BeamSearchOutput]:
        """Per prompt, the ``beam_width`` best beams by length-penalised score."""
        out = []
        for i, prompt_ids in enumerate(self.starts):
            for b in self.live[i]:
                b.finish_reason = "length"
            pool = self.done[i] + self.live[i]
            pool.sort(key=lambda s: -beam_score(s, self.eos, self.params.length_penalty))
            best = pool[: self.params.beam_width]
            for s in best:  # as vLLM's LLM.beam_search: the prompt's text and the beam's
                s.text = tokenizer.decode(s.tokens)
            out.append(BeamSearchOutput(best))
        return out


def completion_text(tokenizer: Any, seq: BeamSearchSequence, prompt_len: int) -> str:
    """A beam's generated text alone, special tokens skipped (``generate`` with
    ``use_beam_search`` and the server's beam search answer with it)."""
    return tokenizer.decode(seq.tokens[prompt_len:], skip_special_tokens=True)


def run_beam_search(
    llm: LLM, prompts: list[Any], params: BeamSearchParams, lora_request: Any = None
) -> list[BeamSearchOutput]:
    """Every beam of every prompt runs with ``lora_request`` (a LoRARequest, or None)."""
    tok = llm.engine.tokenizer
    if tok is None:
        raise ValueError("beam_search needs the tokenizer (the beams' text), and "
                         "`skip_tokenizer_init` is True")
    probe = SamplingParams(max_tokens=1, temperature=0.0)
    processed = [llm.engine.inputs.process(p, probe.clone()) for p in prompts]
    if any(p.embeds is not None for p in processed):  # the beams are token prompts
        raise ValueError("beam search takes text or token prompts, not prompt_embeds")
    search = BeamSearch([p.token_ids for p in processed], params, tok.eos_token_id)
    while flat := search.pending():
        # each beam keeps its prompt's cache_salt: its blocks stay that salt's
        steps = [{"prompt_token_ids": b.tokens, "cache_salt": processed[i].cache_salt}
                 for i, b in flat]
        outs = llm.generate(steps, search.step_params, use_tqdm=False,
                            lora_request=lora_request)
        search.advance(flat, outs)
    return search.results(tok)

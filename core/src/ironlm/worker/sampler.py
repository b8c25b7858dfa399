"""Sampler: logits of the sampling rows -> next tokens, as tensor ops over the whole batch.

Order (vLLM's): raw logprobs are taken from the model's logits; then min_tokens, logit_bias,
custom logits processors that can change the argmax, allowed ids / bad words / guided masks,
repetition / frequency / presence penalties, temperature, argmax-invariant custom processors,
top-k, top-p, min-p; then a draw. Seeded rows draw their uniforms from their own
generator, so a seeded request samples the same tokens alone or in any batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ironlm.interfaces.platform import LayerOps
from ironlm.interfaces.step import SampledToken
from ironlm.sampling_params import SamplingParams
from ironlm.worker.draw_inputs import limit_tensors, truncates, uniforms
from ironlm.worker.logits_batch import LogitsProcessorBatch
from ironlm.worker.penalties import apply_penalties

_NEG_INF = float("-inf")
# (logits, (B, 1) scale): what the draw reads, the temperature applied as the scale
Tempered = tuple[torch.Tensor, torch.Tensor]


@dataclass
class SamplingState:
    """A request's sampling state on the worker."""

    params: SamplingParams
    eos_token_id: int | None
    prompt_token_ids: list[int] | None  # None: a prompt given as embeddings
    generator: torch.Generator | None  # set when params.seed is not None
    output_counts: torch.Tensor | None = None  # (vocab,) int32, when penalties need them
    prompt_mask: torch.Tensor | None = None  # (vocab,) bool, for repetition_penalty
    output_token_ids: list[int] | None = None  # for bad_words matching
    pooling: bool = False  # embedding request: no sampling
    pool_every_row: bool = False  # a token pooling task: every prompt row

    @classmethod
    def create(
        cls,
        params: SamplingParams,
        eos_token_id: int | None,
        prompt_token_ids: list[int] | None,
        vocab_size: int,
        device: torch.device,
    ) -> SamplingState:
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=device)
            gen.manual_seed(params.seed & 0xFFFF_FFFF_FFFF_FFFF)
        st = cls(params, eos_token_id, prompt_token_ids, gen, output_token_ids=[])
        if params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1:
            st.output_counts = torch.zeros(vocab_size, dtype=torch.int32, device=device)
        if params.repetition_penalty != 1.0:
            st.prompt_mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            ids = torch.tensor(prompt_token_ids or [], dtype=torch.long, device=device)
            st.prompt_mask[ids.clamp(max=vocab_size - 1)] = True
        return st

    def record(self, token_id: int) -> None:
        if self.output_counts is not None:
            self.output_counts[token_id] += 1
        if self.output_token_ids is not None:
            self.output_token_ids.append(token_id)

    def extended(self, tokens: list[int]) -> SamplingState:
        """This state as if ``tokens`` had been sampled too (what penalties, min_tokens and
        bad words see at a draft's position); ``self`` when no rule reads the history."""
        p = self.params
        if not tokens or (
            self.output_counts is None and p.min_tokens == 0 and not p._bad_words_token_ids
        ):
            return self
        counts = self.output_counts
        if counts is not None:
            counts = counts.clone()
            ids = torch.tensor(tokens, dtype=torch.long, device=counts.device)
            counts.index_add_(0, ids, torch.ones_like(ids, dtype=counts.dtype))
        return replace(self, output_counts=counts,
                       output_token_ids=list(self.output_token_ids or []) + tokens)


class Sampler:
    """Draws each row's next token; the per-row passes over the whole vocabulary run through
    the platform's ops: the log-normaliser and the argmax (``LayerOps.logsumexp_argmax``), the
    draw at a temperature (``LayerOps.categorical``), with top-k / top-p / min-p
    (``LayerOps.truncated_categorical``)."""

    def __init__(
        self, ops: LayerOps | None = None, logprobs_mode: str = "raw_logprobs",
        custom: LogitsProcessorBatch | None = None,
    ) -> None:  # fmt: skip
        self.ops = ops if ops is not None else LayerOps()
        # vLLM's logprobs_mode: what logprobs report (config.LOGPROBS_MODES): raw_logprobs
        # (the model's distribution), raw_logits, or processed_logprobs / processed_logits
        # (what the draw used: after penalties, bans, temperature, top-k / top-p / min-p)
        self.logprobs_mode = logprobs_mode
        self.custom = custom  # vLLM's --logits-processors (only the sampling rank has them)

    def __call__(
        self,
        logits: torch.Tensor,  # (B, V) float32, one row per sampling request
        states: list[SamplingState],
        allowed_mask: torch.Tensor | None = None,  # (B, V) bool from guided decoding
    ) -> list[SampledToken]:
        # Log-probabilities under the raw distribution: all of them when a request asks for top
        # logprobs, else only each sampled token's, as x[t] - logsumexp(x) (no (B, V) tensor),
        # and none when no request reports them (SamplingParams.reports_logprobs)
        if self.custom is not None:  # their batch indices, before anything reads the rows
            self.custom.begin_step(states)
        want_top = any(s.params.logprobs is not None for s in states)
        want_lp = any(s.params.reports_logprobs for s in states)
        # every rule and processor copies before it writes: x is logits when none applied;
        # temperature and truncation come with the draw (greedy rows take the argmax of x)
        if allowed_mask is not None:  # vLLM's: the grammar's mask comes before the sampler,
            logits = logits.masked_fill(~allowed_mask, _NEG_INF)  # so raw values see it too
        x = self._process(logits, states, None)
        greedy = [s.params.sampling_type_greedy for s in states]
        # (logits, scale) the draw reads, made once (argmax-invariant processors run on it)
        tempered = None if all(greedy) else self._tempered(x, states, greedy)
        # (B, V) what the logprobs report, when the top ones are wanted or the mode is not
        # raw_logprobs (whose sampled tokens' values need no (B, V) tensor)
        reported = None
        if want_top or (want_lp and self.logprobs_mode != "raw_logprobs"):
            reported = self._reported(logits, x, states, greedy, tempered)
        raw_greedy = x is logits and any(greedy)  # the argmax of the raw logits is wanted
        log_norm, raw_argmax = None, None
        if reported is None and (want_lp or raw_greedy):
            log_norm, raw_argmax = self.ops.logsumexp_argmax(
                logits, argmax=raw_greedy, logsumexp=want_lp)
        tokens = None
        if any(greedy):  # the argmax of the processed logits (the raw ones' when unchanged)
            tokens = raw_argmax if x is logits and raw_argmax is not None else x.argmax(dim=-1)
        if tempered is not None:
            drawn = self._draw(tempered, states)
            tokens = drawn if tokens is None else torch.where(
                torch.tensor(greedy, device=x.device), tokens, drawn)
        assert tokens is not None
        chosen_lp = None
        if reported is not None:
            chosen_lp = reported.gather(1, tokens.unsqueeze(1)).squeeze(1)  # (B,)
        elif want_lp:
            assert log_norm is not None
            chosen_lp = logits.gather(1, tokens.unsqueeze(1)).squeeze(1) - log_norm
        out: list[SampledToken] = []
        tok_list = tokens.tolist()
        lp_list = chosen_lp.tolist() if chosen_lp is not None else [None] * len(states)
        for i, s in enumerate(states):
            top = None
            if s.params.logprobs is not None and reported is not None:
                top = top_logprobs(reported[i], tok_list[i], s.params.logprobs)
            lp = lp_list[i] if s.params.reports_logprobs else None
            out.append(SampledToken(tok_list[i], lp, top))
            s.record(tok_list[i])
        return out

    def _draw(self, tempered: Tempered, states: list[SamplingState]) -> torch.Tensor:
        """(B,) a draw per row from the processed logits at each row's temperature (greedy
        rows' draws are discarded): through the platform's ``LayerOps.categorical``, or its
        ``LayerOps.truncated_categorical`` when a row has a top-k, top-p or min-p."""
        x, scale = tempered
        u = uniforms(states, x.device)
        if truncates(states):
            top_k, top_p, min_p = limit_tensors(states, x.shape[1], x.device)
            return self.ops.truncated_categorical(x, scale, top_k, top_p, min_p, u)
        return self.ops.categorical(x, scale, u)

    def _tempered(
        self, x: torch.Tensor, states: list[SamplingState], greedy: list[bool]
    ) -> Tempered:
        """(logits, (B, 1) scale) for the draw: the processed logits and 1 / temperature, or
        with argmax-invariant custom processors (vLLM's order: after the temperature) the
        scaled logits they made and a scale of 1."""
        scale = 1.0 / self._temperatures(x, states, greedy)
        if self.custom is None or not self.custom.invariant:
            return x, scale
        return self.custom.apply(x * scale, self.custom.invariant), torch.ones_like(scale)

    @staticmethod
    def _temperatures(
        x: torch.Tensor, states: list[SamplingState], greedy: list[bool]
    ) -> torch.Tensor:
        """(B, 1) each row's temperature in x's dtype (1 for greedy rows)."""
        return torch.tensor(
            [1.0 if g else s.params.temperature for g, s in zip(greedy, states)],
            device=x.device, dtype=x.dtype,
        ).unsqueeze(1)

    def _reported(
        self, logits: torch.Tensor, x: torch.Tensor, states: list[SamplingState],
        greedy: list[bool], tempered: Tempered | None,
    ) -> torch.Tensor:  # fmt: skip
        """(B, V) the values logprobs report under ``logprobs_mode``: from the raw ``logits``
        or the processed ``x`` as the draw sees it (``_finish``)."""
        mode = self.logprobs_mode
        if mode.startswith("raw_"):
            return logits if mode == "raw_logits" else torch.log_softmax(logits, dim=-1)
        final = self._finish(x, states, greedy, tempered)
        return final if mode == "processed_logits" else torch.log_softmax(final, dim=-1)

    def final_logits(
        self, logits: torch.Tensor, states: list[SamplingState], allowed: torch.Tensor | None
    ) -> torch.Tensor:
        """(B, V) logits after every processor; sampling draws from softmax of these (greedy
        rows take the argmax; their temperature / top-k / top-p / min-p are not applied)."""
        x = self._process(logits, states, allowed)  # copies before any in-place change
        return self._finish(x, states, [s.params.sampling_type_greedy for s in states])

    def _finish(
        self, x: torch.Tensor, states: list[SamplingState], greedy: list[bool],
        tempered: Tempered | None = None,  # the draw's, when already made
    ) -> torch.Tensor:  # fmt: skip
        """The processed logits ``x`` at each row's temperature, truncated by its top-k / top-p
        / min-p (greedy rows as they are)."""
        if all(greedy):
            return x
        x, scale = tempered if tempered is not None else self._tempered(x, states, greedy)
        if not truncates(states):
            return x * scale
        top_k, top_p, min_p = limit_tensors(states, x.shape[1], x.device)
        return self.ops.truncated_logits(x, scale, top_k, top_p, min_p)

    def _process(
        self, x: torch.Tensor, states: list[SamplingState], allowed: torch.Tensor | None
    ) -> torch.Tensor:
        # Gather every per-request rule into index lists first, then apply each kind as one
        # tensor op over the batch (plain requests add nothing to the lists).
        bias_rows: list[int] = []
        bias_cols: list[int] = []
        bias_vals: list[float] = []
        ban_rows: list[int] = []  # (row, token) pairs that must not be sampled
        ban_cols: list[int] = []
        keep_rows: list[int] = []  # rows restricted to allowed_token_ids
        for i, s in enumerate(states):
            p = s.params
            outs = s.output_token_ids or []
            if len(outs) < p.min_tokens:
                stop_ids = list(p.stop_token_ids or [])
                if s.eos_token_id is not None and not p.ignore_eos:
                    stop_ids.append(s.eos_token_id)
                ban_rows += [i] * len(stop_ids)
                ban_cols += stop_ids
            if p.logit_bias:
                bias_rows += [i] * len(p.logit_bias)
                bias_cols += list(p.logit_bias)
                bias_vals += list(p.logit_bias.values())
            if p.allowed_token_ids is not None:
                keep_rows.append(i)
            for word in p._bad_words_token_ids:
                prefix = word[:-1]
                if not prefix or outs[len(outs) - len(prefix):] == prefix:
                    ban_rows.append(i)
                    ban_cols.append(word[-1])
        if bias_rows or keep_rows or ban_rows or any(s.output_counts is not None for s in states):
            x = x.clone()  # the rules below write in place; the caller's logits stay raw
        if bias_rows:
            x.index_put_(
                (torch.tensor(bias_rows), torch.tensor(bias_cols)),
                torch.tensor(bias_vals, dtype=x.dtype),
                accumulate=True,
            )
        if self.custom is not None and self.custom.varying:  # vLLM's: before the penalties
            x = self.custom.apply(x, self.custom.varying)
        x = apply_penalties(x, states)
        if keep_rows:
            keep = torch.zeros((len(keep_rows), x.shape[1]), dtype=torch.bool, device=x.device)
            for j, i in enumerate(keep_rows):
                keep[j, states[i].params.allowed_token_ids] = True
            rows = torch.tensor(keep_rows, device=x.device)
            x[rows] = x[rows].masked_fill(~keep, _NEG_INF)
        if ban_rows:
            x[torch.tensor(ban_rows), torch.tensor(ban_cols)] = _NEG_INF
        if allowed is not None:
            x = x.masked_fill(~allowed, _NEG_INF)
        return x


def top_logprobs(row: torch.Tensor, token_id: int, k: int) -> list[tuple[int, float, int]]:
    """[(token_id, logprob, rank)]: the given token first, then the k most likely tokens.
    row: (V,) log-probabilities."""
    lp = float(row[token_id])
    rank = int((row > row[token_id]).sum()) + 1
    entries = [(token_id, lp, rank)]
    if k > 0:
        vals, ids = row.topk(k)
        for r, (v, t) in enumerate(zip(vals.tolist(), ids.tolist()), start=1):
            entries.append((t, v, r))
    return entries

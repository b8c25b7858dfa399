"""OutputProcessor: sampled tokens -> detokenized text, stop checks, RequestOutputs.

A group is what the user submitted (one request id); its children are the n / best_of
sequences. Outputs are cumulative (the whole text so far: streaming layers take deltas) unless
the request's ``output_kind`` asks for deltas or for its final output only (no RequestOutput
is built on the other steps: ~0.5 ms a step for 64 requests).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ironlm.engine.detokenizer import IncrementalDetokenizer, WholeDetokenizer
from ironlm.engine.guided_manager import mark_dead_end
from ironlm.engine.request import Request, RequestStatus
from ironlm.engine.scheduler import Scheduler
from ironlm.interfaces.step import ModelOutput, SampledToken
from ironlm.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput
from ironlm.sampling_params import RequestOutputKind, SamplingParams


@dataclass
class Group:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None  # None: a prompt given as embeddings
    params: SamplingParams
    children: list[Request]
    detoks: list[IncrementalDetokenizer | None]
    prompt_logprobs: list[PositionLogprobs | None] = field(default_factory=lambda: [None])
    arrival: float = field(default_factory=time.monotonic)
    # pooling requests: the pooled vector; for a token task a (num_prompt_tokens, ...) tensor
    embedding: list[float] | torch.Tensor | None = None
    error: str | None = None  # why the request failed (a guided backend's dead end)
    # DELTA outputs: per child, the tokens, text characters and logprob entries sent so far
    sent: list[tuple[int, int, int]] = field(default_factory=list)
    # per child, its tokens and whether it had finished at the group's last output (None: no
    # output yet; stream_interval)
    streamed: list[tuple[int, bool]] | None = None


class OutputProcessor:
    def __init__(self, tokenizer: Any, max_model_len: int, stream_interval: int = 1) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.stream_interval = stream_interval  # DELTA outputs: at most one per this many tokens
        self.groups: dict[str, Group] = {}
        self._child_group: dict[str, Group] = {}

    def add_group(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int] | None,
        params: SamplingParams,
        children: list[Request],
    ) -> None:
        # no detokenizer without a tokenizer (skip_tokenizer_init): text stays ""
        wants_text = params.detokenize and self.tokenizer is not None
        detoks = [self._detokenizer(params, prompt_token_ids or []) if wants_text else None
                  for _ in children]
        group = Group(request_id, prompt, prompt_token_ids, params, children, detoks)
        group.sent = [(0, 0, 0)] * len(children)
        self.groups[request_id] = group
        for c in children:
            self._child_group[c.request_id] = group

    def _detokenizer(
        self, params: SamplingParams, prompt_token_ids: list[int]
    ) -> IncrementalDetokenizer:
        """One decode at the end where only the final output is read and no stop string is
        looked for; else token by token."""
        if params.output_kind == RequestOutputKind.FINAL_ONLY and not params.stop:
            return WholeDetokenizer(self.tokenizer, params.skip_special_tokens,
                                    params.spaces_between_special_tokens)
        return IncrementalDetokenizer(
            self.tokenizer, prompt_token_ids, list(params.stop or []),
            params.include_stop_str_in_output, params.skip_special_tokens,
            params.spaces_between_special_tokens,
        )  # fmt: skip

    def children(self, request_id: str) -> list[Request]:
        group = self.groups.get(request_id)
        return group.children if group else []

    def drop_group(self, request_id: str) -> None:
        group = self.groups.pop(request_id, None)
        for c in group.children if group else []:
            self._child_group.pop(c.request_id, None)

    def abort(self, reqs: list[Request], scheduler: Scheduler,
              error: str | None = None) -> list[RequestOutput]:  # fmt: skip
        """Finish ``reqs`` as aborted by the engine itself (not by their caller): their groups'
        final outputs, so that whoever waits on them hears of it (of ``error`` when given:
        the request failed)."""
        groups: dict[str, Group] = {}
        for req in reqs:
            group = self._child_group.get(req.request_id)
            if not req.is_finished:
                scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
            if group is not None:
                groups[group.request_id] = group
                group.error = group.error or error
        results = []
        for group in groups.values():
            for c in group.children:
                if not c.is_finished:
                    scheduler.finish(c, RequestStatus.FINISHED_ABORTED)
            out = self._request_output(group)
            if out is not None:
                results.append(out)
            self.drop_group(group.request_id)
        return results

    # -- per step --------------------------------------------------------------------------
    def update(
        self,
        scheduled: list[tuple[Request, int]],
        output: ModelOutput,
        scheduler: Scheduler,
        per_step: bool = False,
    ) -> list[RequestOutput]:
        """Append each request's sampled tokens (several with speculative decoding or
        multi-step), stopping at its finish; outputs after every request's tokens, or, with
        ``per_step`` (a multi-step run), after each step's token, as one step per plan would."""
        results: list[RequestOutput] = []
        touched: dict[str, Group] = {}
        now = time.monotonic()
        pending: list[tuple[Group, Request, list[SampledToken]]] = []
        for req, n in scheduled:
            group = self._child_group.get(req.request_id)
            if group is None or req.is_finished:
                continue
            plp = output.prompt_logprobs.get(req.request_id)
            if plp and group.children[0] is req:
                self._add_prompt_logprobs(group, req.num_computed_tokens - n, plp)
            emb = output.embeddings.get(req.request_id)
            if emb is not None:
                if req.pools_every_row and tuple(emb.shape[:1]) != (req.num_prompt_tokens,):
                    self._fail_group(group, f"the workers returned {tuple(emb.shape)} for a "
                                     f"token pooling task over {req.num_prompt_tokens} "
                                     "prompt tokens (a row per token expected)", scheduler)
                else:  # a token task's rows stay a tensor (lists of lists are slow and big)
                    group.embedding = emb if req.pools_every_row else emb.tolist()
                    scheduler.finish(req, RequestStatus.FINISHED_STOPPED)
                touched[group.request_id] = group
                continue
            toks = output.sampled.get(req.request_id)
            if not toks:
                continue
            req.first_token_time = req.first_token_time or now
            req.last_token_time = now
            pending.append((group, req, toks))
        rounds = max((len(t) for _, _, t in pending), default=1) if per_step else 1
        for step in range(rounds):
            for group, req, toks in pending:
                todo = toks[step : step + 1] if per_step else toks
                if todo and not req.is_finished:
                    touched[group.request_id] = group
                for tok in todo:
                    if req.is_finished:
                        break  # tokens past a stop are dropped, as if never sampled
                    self._append(group, req, tok, scheduler)
                    if req.grammar_error is not None and group.error is None:
                        self._fail_group(group, req.grammar_error, scheduler)
            results += self._flush(touched)
            touched = {}
        return results

    def _flush(self, touched: dict[str, Group]) -> list[RequestOutput]:
        results = []
        for group in touched.values():
            finished = all(c.is_finished for c in group.children)
            out = self._request_output(group, finished)
            if out is not None:
                results.append(out)
            if finished:
                self.drop_group(group.request_id)
        return results

    def _add_prompt_logprobs(self, group: Group, start: int, entries: list[Any]) -> None:
        # entries cover positions start+1, start+2, ...; positions already recorded (a
        # preempted request recomputes its prompt) are skipped. Index in the list = position.
        for j, entry in enumerate(entries):
            if start + 1 + j == len(group.prompt_logprobs):
                group.prompt_logprobs.append(self._logprob_dict(entry))

    def _logprob_dict(self, entries: list[tuple[int, float, int]]) -> PositionLogprobs:
        return {
            tid: Logprob(lp, rank,
                         self.tokenizer.decode([tid]) if self.tokenizer is not None else None)
            for tid, lp, rank in entries
        }

    def _fail_group(self, group: Group, error: str, scheduler: Scheduler) -> None:
        """One sequence failed: the whole request ends with ``error`` (siblings aborted)."""
        group.error = error
        for child in group.children:
            if not child.is_finished:
                scheduler.finish(child, RequestStatus.FINISHED_ABORTED)

    def _advance_grammar(self, req: Request, token_id: int) -> None:
        """Feed the sampled token to the request's Grammar; a failure is a dead end."""
        if req.grammar is None or req.grammar_error is not None:
            return
        try:
            if not req.grammar.accept_token(token_id):
                raise RuntimeError(f"the backend refused the sampled token {token_id}")
        except Exception as exc:
            mark_dead_end(req, exc)

    def _grammar_done(self, req: Request) -> bool:
        if req.grammar is None or req.grammar_error is not None:
            return False
        try:
            return bool(req.grammar.is_terminated())
        except Exception as exc:
            mark_dead_end(req, exc)
            return False

    def _append(self, group: Group, req: Request, tok: SampledToken, scheduler: Scheduler) -> None:
        p = req.sampling_params
        detok = group.detoks[group.children.index(req)]
        self._advance_grammar(req, tok.token_id)
        if req.grammar_error is not None:  # a dead end: the token is not kept
            if detok is not None:
                detok.flush()
            scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
            return
        req.output_token_ids.append(tok.token_id)
        if tok.logprob is not None:
            req.cumulative_logprob += tok.logprob
        if tok.top_logprobs is not None:
            req.logprobs.append(self._logprob_dict(tok.top_logprobs))
        status: RequestStatus | None = None
        n_out = len(req.output_token_ids)
        # As vLLM: an EOS or stop token id ends the request without its text (unless
        # include_stop_str_in_output), and neither it nor stop strings count within min_tokens
        eos = not p.ignore_eos and tok.token_id == req.eos_token_id
        stop_token = n_out >= p.min_tokens and (eos or tok.token_id in (p.stop_token_ids or []))
        stop_str = None
        if detok is not None and not (stop_token and not p.include_stop_str_in_output):
            stop_str = detok.add_token(tok.token_id, not stop_token and n_out > p.min_tokens)
        if stop_str is not None:
            status, req.stop_reason = RequestStatus.FINISHED_STOPPED, stop_str
        elif stop_token:
            status = RequestStatus.FINISHED_STOPPED
            if not eos:
                req.stop_reason = tok.token_id
        elif self._grammar_done(req):
            status = RequestStatus.FINISHED_STOPPED
        elif req.grammar_error is not None:
            status = RequestStatus.FINISHED_ABORTED
        elif p.max_tokens is not None and n_out >= p.max_tokens:
            status = RequestStatus.FINISHED_LENGTH
        elif req.num_tokens >= self.max_model_len:
            status = RequestStatus.FINISHED_LENGTH
        if status == RequestStatus.FINISHED_STOPPED and req.stop_reason is None \
                and req.closing is not None and req.closing.plan is not None:
            status = RequestStatus.FINISHED_LENGTH  # closed for its budget (guided_closing)
        if status is not None:
            if detok is not None and stop_str is None:
                detok.flush()
            scheduler.finish(req, status)

    def _completion(self, group: Group, i: int, req: Request) -> CompletionOutput:
        detok = group.detoks[i]
        text = detok.visible_text(req.is_finished) if detok is not None else ""
        tokens, logprobs = req.output_token_ids, req.logprobs
        if group.params.output_kind == RequestOutputKind.DELTA:  # what is new since last time
            t0, c0, l0 = group.sent[i]
            group.sent[i] = (len(tokens), len(text), len(logprobs))
            tokens, text, logprobs = tokens[t0:], text[c0:], logprobs[l0:]
        return CompletionOutput(
            index=i,
            text=text,
            token_ids=list(tokens),
            cumulative_logprob=req.cumulative_logprob if req.sampling_params.reports_logprobs
            else None,
            logprobs=list(logprobs) if req.sampling_params.logprobs is not None else None,
            finish_reason=req.status.finish_reason,
            stop_reason=req.stop_reason,
        )

    def _holds_back(self, group: Group) -> bool:
        """Whether an unfinished group's next output waits (vLLM's stream_interval): it had
        an output already, no child finished since, and none has stream_interval new tokens
        (vLLM decides per choice; a choice that ends goes out at once here too). vLLM applies
        it to DELTA outputs, which its server streams; IronLM's server streams CUMULATIVE
        ones, so it applies to both."""
        if self.stream_interval == 1 or group.streamed is None:
            return False
        return all(len(c.output_token_ids) - tokens < self.stream_interval
                   and c.is_finished == finished
                   for c, (tokens, finished) in zip(group.children, group.streamed))  # fmt: skip

    def _request_output(self, group: Group, finished: bool | None = None) -> RequestOutput | None:
        if finished is None:
            finished = all(c.is_finished for c in group.children)
        n, best_of = group.params.n, group.params.best_of or 1
        if best_of > n and not finished:
            return None  # best_of picks among complete sequences only
        kind = group.params.output_kind
        if kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        if not finished and self._holds_back(group):
            return None
        group.streamed = [(len(c.output_token_ids), c.is_finished) for c in group.children]
        # the prompt's logprobs go with the first output only when outputs are deltas
        with_prompt_lps = group.params.prompt_logprobs is not None and (
            kind != RequestOutputKind.DELTA or all(s == (0, 0, 0) for s in group.sent))
        outs = [self._completion(group, i, c) for i, c in enumerate(group.children)]
        if best_of > n:
            outs = sorted(outs, key=lambda o: -(o.cumulative_logprob or 0.0))[:n]
            for i, o in enumerate(outs):
                o.index = i
        first = [c.first_token_time for c in group.children if c.first_token_time]
        last = [c.last_token_time for c in group.children if c.last_token_time]
        metrics = {"arrival_time": group.arrival}
        scheduled = [c.first_scheduled_time for c in group.children if c.first_scheduled_time]
        if scheduled:
            metrics["first_scheduled_time"] = min(scheduled)
        if first:
            metrics["first_token_time"] = min(first)
        if last:
            metrics["last_token_time"] = max(last)
        return RequestOutput(
            request_id=group.request_id,
            prompt=group.prompt,
            prompt_token_ids=group.prompt_token_ids,
            outputs=outs,
            finished=finished,
            prompt_logprobs=group.prompt_logprobs if with_prompt_lps else None,
            num_cached_tokens=group.children[0].num_cached_tokens,
            metrics=metrics,
            embedding=group.embedding,
            error=group.error,
            lora_request=group.children[0].lora_request,
            num_prompt_embeds=0 if group.prompt_token_ids is not None
            else group.children[0].num_prompt_tokens,
        )

"""Multi-step scheduling on the worker: several decode steps per engine plan, back to back.

The engine plans once (every sequence a decode with its blocks allocated for ``num_steps``
tokens) and the runner runs step after step without going back to it: each step's sampled
token is the next step's input, a sequence drops out after its ``num_steps``. What the engine
would do between steps is either done here the same way (the sampler's state follows every
token, so penalties, min_tokens and seeded draws are as with one step per plan) or cannot
change the outputs: a request that stops inside the window (EOS, stop string) has its later
tokens dropped by the engine, and guided requests get one step (their masks come from the
engine, one token at a time). Pure decode steps go through the decode graphs like any other.
On the cpu platform the device is the host: a sampled id feeds the next step in place.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ironlm.interfaces.step import ModelInput, ModelOutput

if TYPE_CHECKING:  # the runner calls in with itself
    from ironlm.worker.model_runner import ModelRunner


def run_window(runner: ModelRunner, mi: ModelInput, out: ModelOutput) -> ModelOutput:
    """Run every sequence of ``mi`` (one decode token each) for its ``num_steps`` steps."""
    for s in mi.seqs:
        if len(s.token_ids) != 1 or not s.sample or s.spec_token_ids or s.want_prompt_logprobs:
            raise ValueError(
                f"request {s.request_id}: multi-step runs pure decode steps only (one token, "
                "sampling, no drafts or prompt logprobs)"
            )
    seqs = list(mi.seqs)
    for step in range(max(s.num_steps for s in seqs)):
        live = [s for s in seqs if s.num_steps > step]
        if step:  # the token sampled last step, one position further
            live = [replace(s, token_ids=[out.sampled[s.request_id][-1].token_id],
                            start_pos=s.start_pos + step) for s in live]  # fmt: skip
        logits = runner.decode_logits(live)  # (len(live), V)
        states = [runner.states[s.request_id] for s in live]
        mask = mi.allowed_mask if step == 0 else None
        for s, tok in zip(live, runner.sampler(logits, states, mask)):
            out.sampled.setdefault(s.request_id, []).append(tok)
    return out

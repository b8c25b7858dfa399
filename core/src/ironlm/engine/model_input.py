"""The workers' input for one scheduler plan (``LLMEngine.step``): each scheduled request's
token slice, positions and KV blocks, which of them sample, and the guided-decoding masks."""

from __future__ import annotations

from ironlm.engine.block_manager import BlockManager
from ironlm.engine.guided_manager import GuidedManager
from ironlm.engine.request import Request, RequestStatus
from ironlm.engine.scheduler import SchedulerOutput
from ironlm.interfaces.step import ModelInput, NewRequestData, ScheduledSeq


def model_input(
    plan: SchedulerOutput, blocks: BlockManager, guided: GuidedManager,
    new_requests: list[NewRequestData],
) -> ModelInput:  # fmt: skip
    """``new_requests``: the requests the workers have not seen yet (their sampling params)."""
    seqs = []
    sampling: list[Request] = []
    drafts: list[list[int]] = []
    for req, n in plan.scheduled:
        rid = req.request_id
        start = req.num_computed_tokens
        spec = plan.spec_tokens.get(rid, [])
        real = n - len(spec)
        sample = start + real == req.num_tokens
        seqs.append(
            ScheduledSeq(
                request_id=rid,
                token_ids=req.token_slice(start, start + real),
                start_pos=start,
                block_ids=blocks.block_ids(rid),
                sample=sample,
                num_output_tokens=len(req.output_token_ids),
                want_prompt_logprobs=req.sampling_params.prompt_logprobs is not None
                and start < req.num_prompt_tokens,
                spec_token_ids=spec,
                num_proposals=plan.num_proposals.get(rid, 0),
                num_steps=plan.num_steps.get(rid, 1),
                lora_id=req.lora_id,
                prompt_embeds=req.embeds_slice(start, start + real),
            )
        )
        if sample:
            sampling.append(req)
            drafts.append(spec)
    return ModelInput(
        seqs=seqs,
        new_requests=new_requests,
        finished_ids=plan.finished_ids,
        allowed_mask=guided.build_mask(sampling, drafts),
        blocks_to_swap_out=plan.blocks_to_swap_out,
        blocks_to_swap_in=plan.blocks_to_swap_in,
        preempted_ids=recomputed(plan),
    )


def recomputed(plan: SchedulerOutput) -> list[str]:
    """Requests preempted by this plan whose KV is gone (the swapped ones keep theirs)."""
    return [r.request_id for r in plan.preempted if r.status != RequestStatus.SWAPPED]

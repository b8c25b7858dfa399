"""The runner's side of prompt embeddings (vLLM's prompt_embeds; ``engine/prompt_embeds.py``):
a step's input rows, each request's given rows in place of those of its placeholder ids."""

from __future__ import annotations

import torch

from ironlm.interfaces.model import ModelArchitecture
from ironlm.interfaces.step import ScheduledSeq


def spliced_embeds(
    model: ModelArchitecture, seqs: list[ScheduledSeq], input_ids: torch.Tensor
) -> torch.Tensor:
    """(T, hidden) rows of a step's flattened tokens (each sequence's tokens, then its drafts):
    embedded from their ids, each sequence's given prompt rows in place of its placeholders'."""
    rows = model.embed_input_ids(input_ids)  # (T, hidden) in the model dtype
    at: list[int] = []
    given: list[torch.Tensor] = []
    offset = 0
    for s in seqs:
        if s.prompt_embeds is not None:  # the rows of its first k tokens
            at.extend(range(offset, offset + len(s.prompt_embeds)))
            given.append(s.prompt_embeds)
        offset += len(s.token_ids) + len(s.spec_token_ids)
    index = torch.tensor(at, dtype=torch.long, device=rows.device)
    return rows.index_copy(0, index, torch.cat(given).to(rows.device, rows.dtype))

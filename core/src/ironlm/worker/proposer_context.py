"""WorkerProposerContext: what a speculative proposer gets from the worker it runs in."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ironlm.config import EngineConfig
from ironlm.interfaces.model import ModelArchitecture
from ironlm.interfaces.spec_decode import DraftModel, ProposerContext
from ironlm.worker.sampler import Sampler, SamplingState
from ironlm.worker.draw_inputs import draw


class WorkerProposerContext(ProposerContext):
    def __init__(
        self,
        config: EngineConfig,
        target: ModelArchitecture,
        device: torch.device,
        dtype: torch.dtype,
        vocab_size: int,
        sampler: Sampler,
        states: dict[str, SamplingState],  # the model runner's, by request id
        draft_loader: Callable[[str], DraftModel],
    ) -> None:
        self.config = config
        self.target = target
        self.device = device
        self.dtype = dtype
        self.vocab_size = vocab_size
        self.sampler = sampler
        self.states = states
        self._load = draft_loader

    def load_draft_model(self, model: str) -> DraftModel:
        draft = self._load(model)
        if draft.vocab_size != self.vocab_size:
            raise ValueError(
                f"draft model {model!r} has {draft.vocab_size} vocabulary rows, the target "
                f"{self.config.model!r} {self.vocab_size}: they must share the tokenizer"
            )
        return draft

    def sample(self, logits: torch.Tensor, request_ids: list[str]) -> tuple[list[int], torch.Tensor]:
        states = [self.states[rid] for rid in request_ids]
        x = self.sampler.final_logits(logits.float(), states, None)  # (B, V)
        greedy = torch.tensor([s.params.sampling_type_greedy for s in states], device=x.device)
        probs = torch.softmax(x, dim=-1)
        tokens = x.argmax(dim=-1)
        if not bool(greedy.all()):
            tokens = torch.where(greedy, tokens, draw(probs, states))
        if bool(greedy.any()):  # greedy rows: the point mass actually drawn from
            one_hot = torch.nn.functional.one_hot(tokens, probs.shape[1]).to(probs.dtype)
            probs = torch.where(greedy.unsqueeze(1), one_hot, probs)
        return tokens.tolist(), probs

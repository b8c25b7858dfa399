"""The engine's start-up checks that read only the config and the model's source: the token
budget against the context, the speculative proposer's checks and policy, the
end-of-sequence id. Each failure is a ValueError naming the option, before any worker loads."""

from __future__ import annotations

from typing import Any

from ironlm.config import EngineConfig
from ironlm.engine.speculation import SpeculationPolicy
from ironlm.model_loader import HubOptions, ModelSource, resolve_model
from ironlm.plugin_manager import PluginManager


def check_budget(config: EngineConfig, max_model_len: int) -> None:
    """Without chunked prefill every prompt runs in one step: the budget must hold the
    longest."""
    budget = config.max_num_batched_tokens
    assert budget is not None
    if not config.enable_chunked_prefill and budget < max_model_len:
        raise ValueError(
            f"max_num_batched_tokens ({budget}) is smaller than max_model_len "
            f"({max_model_len}) without chunked prefill; enable chunked prefill or "
            "raise max_num_batched_tokens"
        )


def speculation_policy(
    pm: PluginManager, config: EngineConfig, max_model_len: int, tokenizer: Any,
    vocab_size: int,
) -> SpeculationPolicy | None:  # fmt: skip
    """The speculative proposer's start-up checks, and the policy the scheduler follows; None
    without speculative decoding."""
    spec = config.speculative_model
    if spec is None:
        return None
    model_type = None
    if config.speculative_proposer_name is None:
        draft = resolve_model(spec, config.trust_remote_code, None, HubOptions.cache_of(config))
        model_type = getattr(draft.hf_config, "model_type", None)
    proposer_cls = pm.select_speculative_proposer(spec, model_type)
    limit = config.speculative_max_model_len
    if limit is not None and limit > max_model_len:
        raise ValueError(
            f"speculative_max_model_len ({limit}) is larger than max_model_len "
            f"({max_model_len})"
        )
    proposer_cls.validate(config, tokenizer, vocab_size)
    return SpeculationPolicy(config, max_model_len, proposer_cls.lookahead_slots)


def eos_token_id(tokenizer: Any, source: ModelSource, gen_eos: list[int]) -> int | None:
    """The tokenizer's end-of-sequence id; without a tokenizer (skip_tokenizer_init), the
    generation config's first, else the model config's. (vLLM has none then and stops only
    at the generation config's ids: a model without a generation config would run on to
    max_tokens there.)"""
    if tokenizer is not None:
        return tokenizer.eos_token_id
    if gen_eos:
        return gen_eos[0]
    eos = getattr(source.hf_config, "eos_token_id", None)
    return eos[0] if isinstance(eos, list) and eos else eos

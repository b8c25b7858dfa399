"""Closing a constrained output within max_tokens (engine/guided_closing.py): the search over a
real backend's grammar, and the engine on SmolLM2, where a tool-call-shaped schema that the
token limit would cut comes back complete and valid with finish_reason "length"."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

from ironlm import LLM, SamplingParams
from ironlm.engine.guided_closing import TokenRanks, closing_rank, shortest_closing
from ironlm.engine.guided_manager import GuidedManager
from ironlm.interfaces.guided import GuidedSpec
from ironlm.plugin_manager import PluginManager

INVOICE = {
    "type": "object",
    "properties": {
        "customer_id": {"type": "string"},
        "amount": {"type": "number"},
        "items": {"type": "array", "items": {
            "type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
            "required": ["sku", "qty"]}},
    },
    "required": ["customer_id", "amount", "items"],
}  # fmt: skip
ASK = "Create an invoice for customer 12345678901234567890 for 3 widgets"
# an array of objects (tool_choice "required"'s shape): SmolLM2 keeps appending items
BASKET = {"type": "array", "minItems": 1, "items": {
    "type": "object", "properties": {"name": {"type": "string"}, "qty": {"type": "integer"}},
    "required": ["name", "qty"]}}  # fmt: skip
LIST_ASK = "List the fruits in a basket with their counts."


def _spec(close: bool, schema: dict = INVOICE) -> GuidedSpec:  # type: ignore[type-arg]
    return GuidedSpec("json", json.dumps(schema), disable_any_whitespace=True,
                      close_at_budget=close)


def test_closing_rank_order() -> None:
    order = ['"', '"}', "}", "}]", ",", "0", "false", "amount", "a", " "]
    ranks = [closing_rank(t) for t in order]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)


def _backends() -> list[str]:
    reg = PluginManager().registries.guided_backends
    return [n for n in ("xgrammar", "outlines", "lm-format-enforcer")
            if n in reg and reg.get(n).is_available().available]  # fmt: skip


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("partial", ['{"customer_id":"1234', '{"customer_id":"x","amount":100000',
                                     '{"customer_id":"x","amount":1,"items":[{"sku":"ab'])
def test_shortest_closing_completes_and_restores(smollm2_tokenizer, backend: str,  # type: ignore[no-untyped-def]
                                                 partial: str) -> None:
    """From a cut-off prefix: the path ends where EOS is allowed, the text then parses and
    validates, and the grammar is back where it was (the same mask)."""
    tok = smollm2_tokenizer
    manager = GuidedManager(PluginManager(), tok, len(tok), backend)
    grammar, _ = manager.grammar(_spec(True), backend)
    prefix = tok.encode(partial, add_special_tokens=False)
    for t in prefix:
        assert grammar.accept_token(t)
    before = torch.zeros(len(tok), dtype=torch.bool)
    grammar.fill_mask(before)
    ranks = TokenRanks(tok, len(tok)).ranks
    path = shortest_closing(grammar, tok.eos_token_id, ranks, 40)
    assert path is not None and len(path) <= 20
    after = torch.zeros(len(tok), dtype=torch.bool)
    grammar.fill_mask(after)
    assert torch.equal(before, after)
    for t in path:
        assert grammar.accept_token(t)
    mask = torch.zeros(len(tok), dtype=torch.bool)
    grammar.fill_mask(mask)
    assert bool(mask[tok.eos_token_id])
    jsonschema.validate(json.loads(tok.decode(prefix + path)), INVOICE)
    assert shortest_closing(grammar, tok.eos_token_id, ranks, 0) == []  # already complete


@pytest.mark.real_model
def test_engine_closes_within_max_tokens(smollm2_dir: Path) -> None:
    """SmolLM2 copies the 20-digit customer id into the string: at 24 and 40 tokens the call
    is cut without closing and complete, valid and "length" with it; 10 tokens cannot hold
    the shortest complete object (the request is cut, as without closing)."""
    llm = LLM(str(smollm2_dir), device="cpu", dtype="float32", max_model_len=512,
              kv_cache_memory=64 << 20)
    for max_tokens in (10, 24, 40):
        outs = {}
        for close in (False, True):
            params = SamplingParams(max_tokens=max_tokens, temperature=0,
                                    guided_decoding=_spec(close))
            outs[close] = llm.generate([ASK], params, use_tqdm=False)[0].outputs[0]
        assert outs[False].finish_reason == "length" and len(outs[False].token_ids) == max_tokens
        with pytest.raises(ValueError):
            json.loads(outs[False].text)
        closed = outs[True]
        assert closed.finish_reason == "length" and len(closed.token_ids) <= max_tokens
        if max_tokens == 10:
            assert closed.token_ids == outs[False].token_ids
            continue
        jsonschema.validate(json.loads(closed.text), INVOICE)


@pytest.mark.real_model
def test_engine_stops_opening_items_it_cannot_close(smollm2_dir: Path) -> None:
    """An array of required-field objects that SmolLM2 keeps extending (Banana, Apple, ...):
    near the limit the ',' of one more item is masked out once that item could not be closed
    in time, so the array ends complete with the model's own items (without closing it is
    cut inside an item)."""
    llm = LLM(str(smollm2_dir), device="cpu", dtype="float32", max_model_len=512,
              kv_cache_memory=64 << 20)
    tok = llm.get_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": LIST_ASK}], tokenize=False,
                                     add_generation_prompt=True)
    outs = [llm.generate([prompt], SamplingParams(
        max_tokens=64, temperature=0, guided_decoding=_spec(close, BASKET)),
        use_tqdm=False)[0].outputs[0] for close in (False, True)]  # fmt: skip
    with pytest.raises(ValueError):
        json.loads(outs[0].text)
    assert outs[1].finish_reason == "length"  # the budget ended the array, not the model
    items = json.loads(outs[1].text)
    jsonschema.validate(items, BASKET)
    assert len(items) >= 3 and all(item["name"] for item in items)  # the model's own items
    assert outs[0].text.startswith(outs[1].text[:-1])  # the same items up to the ']'

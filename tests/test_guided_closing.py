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
def test_shortest_closing_completes_and_restores(  # type: ignore[no-untyped-def]
    smollm2_tokenizer, backend: str, partial: str
) -> None:
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
    in time, so the model ends the array with its own items (without closing it is cut
    inside an item)."""
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
    # the model ended the array itself once ',' was masked out (no path was forced)
    assert outs[1].finish_reason == "stop" and len(outs[1].token_ids) < 64
    items = json.loads(outs[1].text)
    jsonschema.validate(items, BASKET)
    assert len(items) >= 3 and all(item["name"] for item in items)  # the model's own items
    assert outs[0].text.startswith(outs[1].text[:-1])  # the same items up to the ']'


def _walk(manager: GuidedManager, req, prefer: list[int]) -> list[int]:  # type: ignore[no-untyped-def]
    """Drive ``req`` step by step as the engine does, with a "model" that takes the first of
    ``prefer`` its row allows (a loop: digits, then letters), else the lowest allowed id."""
    eos = req.eos_token_id
    while len(req.output_token_ids) < req.sampling_params.max_tokens:
        row = manager.build_mask([req])[0]
        allowed = [t for t in prefer if row[t]]
        token = allowed[0] if allowed else int(row.nonzero()[0])
        if token == eos:
            break
        assert req.grammar.accept_token(token)
        req.output_token_ids.append(token)
        if req.grammar.is_terminated():
            break
    return req.output_token_ids


@pytest.mark.parametrize("min_tokens", [0, 24])
def test_closer_budget_arithmetic(smollm2_tokenizer, min_tokens: int) -> None:  # type: ignore[no-untyped-def]
    """Without a model: a "model" that writes digits forever inside "amount" is closed within
    max_tokens (never past it), the text validates, and a forced EOS never comes before
    min_tokens."""
    from ironlm.engine.request import Request

    tok = smollm2_tokenizer
    manager = GuidedManager(PluginManager(), tok, len(tok), "xgrammar", max_model_len=512)
    grammar, _ = manager.grammar(_spec(True), "xgrammar")
    prefix = tok.encode('{"customer_id":"x","amount":1', add_special_tokens=False)
    for t in prefix:
        assert grammar.accept_token(t)
    params = SamplingParams(max_tokens=30, min_tokens=min_tokens, guided_decoding=_spec(True))
    req = Request("r", [1, 2, 3], params, tok.eos_token_id, grammar=grammar)
    req.output_token_ids = list(prefix)
    digits = [tok.convert_tokens_to_ids(d) for d in "0123456789"]
    out = _walk(manager, req, digits)
    assert len(out) <= 30 and req.closing is not None and req.closing.plan is not None
    assert len(out) >= min_tokens
    jsonschema.validate(json.loads(tok.decode(out)), INVOICE)

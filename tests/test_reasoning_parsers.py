"""Reasoning parsers (hook ``register_reasoning_parsers``, ironlm-toolparsers' deepseek_r1 and
qwen3) and the engine's gate that holds a structured-output grammar back while the model
reasons (engine/reasoning_gate.py), on SmolLM2's real tokenizer and real guided backends."""

from __future__ import annotations

import json
import random

import pytest
import torch

from ironlm.config import EngineConfig
from ironlm.engine.guided_manager import GuidedManager
from ironlm.engine.reasoning_gate import ReasoningGate
from ironlm.entrypoints.openai.chat_prompt import template_kwargs
from ironlm.entrypoints.openai.state import ServerOptions
from ironlm.hookspecs import CONTRACT_VERSION
from ironlm.interfaces.guided import Grammar, GuidedSpec
from ironlm.interfaces.reasoning_parser import ReasoningParser
from ironlm.plugin_manager import PluginManager
from ironlm.registry import UnknownNameError

PM = PluginManager()
R1 = PM.select_reasoning_parser("deepseek_r1")
QWEN3 = PM.select_reasoning_parser("qwen3")


def test_parsers_registered_by_the_toolparsers_plugin() -> None:
    reg = PM.registries.reasoning_parsers
    assert {"deepseek_r1", "qwen3"} <= set(reg.names())
    assert reg.entry("qwen3").provenance.distribution == "ironlm-toolparsers"
    import ironlm_toolparsers.plugin as plugin

    assert plugin.IRONLM_CONTRACT_VERSION == CONTRACT_VERSION == "1.1"
    with pytest.raises(UnknownNameError, match=r"reasoning_parser 'nope'.*deepseek_r1, qwen3"):
        PM.select_reasoning_parser("nope")


@pytest.mark.parametrize(("text", "expected"), [
    ("<think>a plan</think>The answer.", ("a plan", "The answer.")),
    ("a plan</think>The answer.", ("a plan", "The answer.")),  # the template opened it
    ("a plan</think>", ("a plan", None)),
    ("</think>The answer.", ("", "The answer.")),  # vLLM: empty reasoning stays text
    ("still thinking", ("still thinking", None)),  # cut off while thinking: all reasoning
    ("", ("", None)),
    ("x</think>y</think>z", ("x", "y</think>z")),  # only the first end marker splits
    ("<think>a<think>b</think>c", ("a<think>b", "c")),  # only the first start is dropped
])
def test_think_tags_extract(text: str, expected: tuple[str | None, str | None]) -> None:
    assert R1(None).extract(text) == expected
    assert QWEN3(None).extract(text) == expected


def test_qwen3_not_thinking_is_all_answer() -> None:
    parser = QWEN3(None, {"enable_thinking": False})
    assert parser.extract("plain</think> answer") == (None, "plain</think> answer")
    assert parser.extract_streaming("<think>x").content == "<think>x"


def _stream(parser: ReasoningParser, pieces: list[str]) -> tuple[str | None, str | None]:
    reasoning = content = ""
    for piece in pieces:
        got = parser.extract_streaming(piece)
        reasoning += got.reasoning or ""
        content += got.content or ""
    tail = parser.finish_streaming()
    return reasoning + (tail.reasoning or ""), content + (tail.content or "")


@pytest.mark.parametrize("text", [
    "<think>hmm </thin </think> x</think>ans", "plan <th ink </think>\n\nanswer <think>",
    "never closed </thi", "<think></think>", "</think>", "a</", "<thin",
])
def test_streaming_matches_extract(text: str) -> None:
    """Any split of the text, down to one character per piece: the streamed reasoning and
    content concatenate to what extract returns (a marker cut between pieces is held back,
    never leaked into either part)."""
    rng = random.Random(text)
    splits = [[text[i:i + 1] for i in range(len(text))]]
    for _ in range(40):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 6))))
        splits.append([text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])])
    reasoning, content = R1(None).extract(text)
    for pieces in splits:
        assert _stream(R1(None), pieces) == (reasoning or "", content or "")


def _chat(tok, messages, **kwargs) -> str:  # type: ignore[no-untyped-def]
    return tok.apply_chat_template(messages, tokenize=False, **kwargs)


def test_prompt_ends_reasoning_ignores_earlier_replies(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A think block in an earlier reply does not close this reply's reasoning (a turn
    boundary, SmolLM2's <|im_start|>, follows it); one in the prompt's own reply does."""
    tok = smollm2_tokenizer
    parser = R1(tok)
    history = [{"role": "user", "content": "1+1?"},
               {"role": "assistant", "content": "<think>1 plus 1 is 2.</think>2."},
               {"role": "user", "content": "2+2?"}]
    assert not parser.prompt_ends_reasoning(_chat(tok, history, add_generation_prompt=True))
    closed = history + [{"role": "assistant", "content": "<think>2 plus 2 is 4.</think>The"}]
    assert parser.prompt_ends_reasoning(_chat(tok, closed, continue_final_message=True))
    opened = history + [{"role": "assistant", "content": "<think>2 plus"}]
    assert not parser.prompt_ends_reasoning(_chat(tok, opened, continue_final_message=True))
    # Qwen3's template with enable_thinking false ends the prompt with an empty block
    assert parser.prompt_ends_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not parser.prompt_ends_reasoning("<|im_start|>assistant\n<think>\n")  # R1's


def _backends() -> list[str]:
    reg = PM.registries.guided_backends
    return [n for n in ("xgrammar", "outlines", "lm-format-enforcer")
            if n in reg and reg.get(n).is_available().available]  # fmt: skip


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
          "additionalProperties": False}


def _mask(grammar: Grammar, size: int) -> torch.Tensor:
    mask = torch.zeros(size, dtype=torch.bool)
    grammar.fill_mask(mask)
    return mask


@pytest.mark.parametrize("backend", _backends())
def test_gate_opens_after_the_end_marker(smollm2_tokenizer, backend: str) -> None:  # type: ignore[no-untyped-def]
    """Closed: every token allowed, the grammar untouched (reasoning is free text, "</" and
    "think" included). The token completing "</think>" (three tokens in SmolLM2) opens it:
    then the backend's own mask applies, a JSON object ends it, and rollback across the
    opening closes the gate again."""
    tok = smollm2_tokenizer
    size = len(tok)
    manager = GuidedManager(PM, tok, size, backend)
    spec = GuidedSpec("json", json.dumps(SCHEMA), disable_any_whitespace=True)
    inner, _ = manager.grammar(spec, backend)
    fresh = _mask(manager.grammar(spec, backend)[0], size)
    gate = ReasoningGate(inner, "</think>", tok, opened=False)
    thought = tok.encode("I count: 4 </ think 2</think>", add_special_tokens=False)
    for t in thought:
        assert not gate.open and not gate.is_terminated()
        assert bool(_mask(gate, size).all())
        assert gate.accept_token(t)
    assert gate.open
    assert torch.equal(_mask(gate, size), fresh)
    answer = tok.encode('{"n":42}', add_special_tokens=False)
    for t in answer:
        assert gate.accept_token(t)
    assert bool(_mask(gate, size)[tok.eos_token_id])
    gate.rollback(len(answer))
    assert gate.open and torch.equal(_mask(gate, size), fresh)
    gate.rollback(2)  # "think", ">": the marker is no longer complete
    assert not gate.open and bool(_mask(gate, size).all())
    for t in thought[-2:] + answer:  # and it opens again at the same token
        assert gate.accept_token(t)
    assert gate.open and bool(_mask(gate, size)[tok.eos_token_id])
    assert not gate.accept_token(tok.encode("x", add_special_tokens=False)[0])  # open: checked


@pytest.mark.parametrize("backend", _backends())
def test_gate_opened_by_the_prompt_constrains_at_once(smollm2_tokenizer, backend: str) -> None:  # type: ignore[no-untyped-def]
    tok = smollm2_tokenizer
    manager = GuidedManager(PM, tok, len(tok), backend)
    spec = GuidedSpec("json", json.dumps(SCHEMA), disable_any_whitespace=True)
    gate = ReasoningGate(manager.grammar(spec, backend)[0], "</think>", tok, opened=True)
    mask = _mask(gate, len(tok))
    assert not bool(mask.all()) and not bool(mask[tok.encode("I", add_special_tokens=False)[0]])
    gate.rollback(0)
    assert gate.open


def test_structured_outputs_config_takes_the_reasoning_options() -> None:
    cfg = EngineConfig(model="m", structured_outputs_config={
        "backend": "outlines", "reasoning_parser": "qwen3", "enable_in_reasoning": True})
    assert (cfg.guided_decoding_backend, cfg.reasoning_parser,
            cfg.structured_outputs_enable_in_reasoning) == ("outlines", "qwen3", True)
    assert EngineConfig(model="m", reasoning_parser="qwen3", structured_outputs_config={
        "reasoning_parser": "qwen3"}).reasoning_parser == "qwen3"
    with pytest.raises(ValueError, match="different parsers"):
        EngineConfig(model="m", reasoning_parser="deepseek_r1",
                     structured_outputs_config={"reasoning_parser": "qwen3"})
    with pytest.raises(ValueError, match="enable_in_reasoning must be true or false"):
        EngineConfig(model="m", structured_outputs_config={"enable_in_reasoning": "yes"})
    assert EngineConfig(model="m", structured_outputs_config={"reasoning_parser": ""}) \
        .reasoning_parser is None  # vLLM's default "" is none


def test_reasoning_effort_reaches_the_template() -> None:
    options = ServerOptions(served_model_names=["m"],
                            default_chat_template_kwargs={"enable_thinking": True, "x": 1})
    assert template_kwargs(options, None, "none") == {
        "enable_thinking": False, "x": 1, "reasoning_effort": "none"}
    assert template_kwargs(options, {"enable_thinking": True}, "none")["enable_thinking"]
    assert template_kwargs(options, {"x": None}, "high") == {
        "enable_thinking": True, "x": 1, "reasoning_effort": "high"}
    assert template_kwargs(options, {"x": 2}) == {"enable_thinking": True, "x": 2}


@pytest.mark.real_model
@pytest.mark.skipif("outlines" not in _backends(), reason="guided backend outlines missing")
def test_engine_gates_the_grammar_offline(smollm2_dir) -> None:  # type: ignore[no-untyped-def]
    """LLM(reasoning_parser=...): the schema applies after the model's own "</think>" (its
    reasoning is the free run's); structured_outputs_config enable_in_reasoning applies it
    from the first token, as without a parser."""
    from ironlm import LLM, SamplingParams, StructuredOutputsParams

    shots = [("What is 2+3?", "<think>2 plus 3 is 5.</think>The answer is 5."),
             ("What is 4+4?", "<think>4 plus 4 is 8.</think>The answer is 8.")]
    chat = [m for q, a in shots for m in ({"role": "user", "content": q},
                                          {"role": "assistant", "content": a})]
    chat.append({"role": "user", "content": "What is 3+3?"})
    free = SamplingParams(max_tokens=30, temperature=0)
    schema = SamplingParams(max_tokens=60, temperature=0, structured_outputs=StructuredOutputsParams(
        json=SCHEMA, disable_any_whitespace=True))
    base = dict(dtype="float32", max_model_len=512, kv_cache_memory=64 * 2**20,
                guided_decoding_backend="outlines")
    llm = LLM(str(smollm2_dir), reasoning_parser="deepseek_r1", **base)
    thought = llm.chat(chat, free, use_tqdm=False)[0].outputs[0].text
    assert thought.startswith("<think>") and "</think>" in thought
    text = llm.chat(chat, schema, use_tqdm=False)[0].outputs[0].text
    head, _, answer = text.partition("</think>")
    assert head == thought.partition("</think>")[0]
    value = json.loads(answer)
    assert set(value) == {"n"} and isinstance(value["n"], int)
    del llm
    llm = LLM(str(smollm2_dir), structured_outputs_config={
        "reasoning_parser": "deepseek_r1", "enable_in_reasoning": True}, **base)
    assert json.loads(llm.chat(chat, schema, use_tqdm=False)[0].outputs[0].text).keys() == {"n"}

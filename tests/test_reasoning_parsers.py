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
from ironlm.engine.reasoning_gate import MarkerTokens, ReasoningGate
from ironlm.entrypoints.chat_utils import reply_part
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

    assert plugin.IRONLM_CONTRACT_VERSION == "1.1"  # written for 1.1, loaded by 1.1 and later
    assert CONTRACT_VERSION >= "1.1"
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


HISTORY = [{"role": "user", "content": "1+1?"},
           {"role": "assistant", "content": "<think>1 plus 1 is 2.</think>2."},
           {"role": "user", "content": "2+2?"}]
PLAIN_TURNS = ("{% for m in messages %}### {{ m.role }}: {{ m.content }}\n{% endfor %}"
               "{% if add_generation_prompt %}### assistant:{% endif %}")


@pytest.mark.parametrize("template", [None, PLAIN_TURNS])
def test_the_reply_part_leaves_earlier_replies_out(smollm2_tokenizer, template) -> None:  # type: ignore[no-untyped-def]
    """The prompt's reply part (chat_utils.reply_part) holds what the template appended for
    this reply: a think block of an earlier reply is not in it, whether the turns are special
    tokens (SmolLM2's ChatML) or plain text; a continued prefix is."""
    tok = smollm2_tokenizer
    parser = R1(tok)

    def render(conv, **kwargs) -> str:  # type: ignore[no-untyped-def]
        return _chat(tok, conv, chat_template=template, **kwargs)

    def history(conv):  # type: ignore[no-untyped-def]
        return render(conv, add_generation_prompt=False)

    prompt = render(HISTORY, add_generation_prompt=True)
    assert parser.prompt_ends_reasoning(prompt)  # the whole prompt would mislead
    reply = reply_part(prompt, history, HISTORY, False)
    assert reply and "think" not in reply and not parser.prompt_ends_reasoning(reply)
    for prefix, closed in (("<think>2 plus 2 is 4.</think>The", True), ("<think>2 plus", False)):
        conv = HISTORY + [{"role": "assistant", "content": prefix}]
        text = render(conv, continue_final_message=True)
        assert parser.prompt_ends_reasoning(reply_part(text, history, conv, True)) is closed
    # a template that ends a conversation without a generation prompt otherwise (Phi-3's
    # EOS): the reply is what follows the common start
    eos = "{{ bos_token }}" + PLAIN_TURNS.replace("{% endif %}", "{% else %}<eos>{% endif %}")
    phi = _chat(tok, HISTORY, chat_template=eos, add_generation_prompt=True)
    assert reply_part(phi, lambda conv: _chat(tok, conv, chat_template=eos), HISTORY, False) \
        == "### assistant:"
    # Qwen3's template with enable_thinking false appends an empty block; R1's opens one
    assert parser.prompt_ends_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not parser.prompt_ends_reasoning("<|im_start|>assistant\n<think>\n")


def test_qwen3_without_thinking_starts_in_the_answer() -> None:
    assert QWEN3(None, {"enable_thinking": False}).prompt_ends_reasoning("")
    assert not QWEN3(None, {"enable_thinking": True}).prompt_ends_reasoning("")


def test_parsers_are_checked_when_selected() -> None:
    from ironlm import hookimpl

    class NoEnd(ReasoningParser):
        name = "no_end"

        def extract(self, model_output):  # type: ignore[no-untyped-def]
            return None, model_output

        def extract_streaming(self, delta_text):  # type: ignore[no-untyped-def]
            raise NotImplementedError

        def finish_streaming(self):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    class EmptyEnd(NoEnd):
        name = "empty_end"
        end_marker = ""

    class Plugin:
        @hookimpl
        def register_reasoning_parsers(self, register):  # type: ignore[no-untyped-def]
            register(NoEnd)
            register(EmptyEnd)

    pm = PluginManager(plugins={"bad": Plugin()})
    for name in ("no_end", "empty_end"):
        with pytest.raises(ValueError, match=f"{name}.*nonempty end_marker"):
            pm.select_reasoning_parser(name)


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


@pytest.fixture(scope="module")
def think_marker(smollm2_tokenizer) -> MarkerTokens:  # type: ignore[no-untyped-def]
    return MarkerTokens(smollm2_tokenizer, "</think>")


def _ids(tok, text: str) -> list[int]:  # type: ignore[no-untyped-def]
    return tok.encode(text, add_special_tokens=False)


def _gate(tok, backend: str, markers: MarkerTokens, opened: bool = False,  # type: ignore[no-untyped-def]
          manager: GuidedManager | None = None):
    manager = manager or GuidedManager(PM, tok, len(tok), backend)  # one compiles once
    spec = GuidedSpec("json", json.dumps(SCHEMA), disable_any_whitespace=True)
    fresh = _mask(manager.grammar(spec, backend)[0], len(tok))
    return ReasoningGate(manager.grammar(spec, backend)[0], markers, opened), fresh


@pytest.mark.parametrize("backend", _backends())
def test_gate_opens_after_the_end_marker(smollm2_tokenizer, think_marker, backend: str) -> None:  # type: ignore[no-untyped-def]
    """Closed: every token allowed (but those below), the grammar untouched (reasoning is
    free text, "</" and "think" included). The token completing "</think>" (three tokens in
    SmolLM2) opens it: then the backend's own mask applies, a JSON object ends it, and
    rollback across the opening closes the gate again."""
    tok = smollm2_tokenizer
    size = len(tok)
    gate, fresh = _gate(tok, backend, think_marker)
    thought = _ids(tok, "I count: 4 </ think 2</think>")
    for t in thought:
        assert not gate.constraining and not gate.is_terminated()
        assert bool(_mask(gate, size)[t])
        assert gate.accept_token(t)
    assert gate.constraining
    assert torch.equal(_mask(gate, size), fresh)
    answer = _ids(tok, '{"n":42}')
    for t in answer:
        assert gate.accept_token(t)
    assert bool(_mask(gate, size)[tok.eos_token_id])
    gate.rollback(len(answer))
    assert gate.constraining and torch.equal(_mask(gate, size), fresh)
    gate.rollback(2)  # "think", ">": the marker is no longer complete
    assert not gate.constraining and bool(_mask(gate, size)[tok.eos_token_id])
    for t in thought[-2:] + answer:  # and it opens again at the same token
        assert gate.accept_token(t)
    assert gate.constraining and bool(_mask(gate, size)[tok.eos_token_id])
    assert not gate.accept_token(_ids(tok, "x")[0])  # open: checked
    with pytest.raises(ValueError, match="cannot roll back"):
        gate.rollback(len(thought) + len(answer) + 1)


@pytest.mark.parametrize("backend", _backends())
def test_a_token_that_closes_and_goes_on(smollm2_tokenizer, think_marker, backend: str) -> None:  # type: ignore[no-untyped-def]
    """SmolLM2 has 16 tokens that finish "</think>" and carry the answer's first text, such as
    "><" and '>"': after "</think" (the answer here a JSON string) those the grammar refuses
    are masked ("><"), those it takes are allowed ('>"'), and the '"' goes to the grammar when
    the gate opens."""
    tok = smollm2_tokenizer
    manager = GuidedManager(PM, tok, len(tok), backend)
    spec = GuidedSpec("json", json.dumps({"type": "string", "maxLength": 5}))
    fresh = _mask(manager.grammar(spec, backend)[0], len(tok))
    gate = ReasoningGate(manager.grammar(spec, backend)[0], think_marker, False)
    [lt], [quote] = tok.convert_tokens_to_ids(["><"]), tok.convert_tokens_to_ids(['>"'])
    for t in _ids(tok, "hmm </") + tok.convert_tokens_to_ids(["think"]):
        assert gate.accept_token(t)
    mask = _mask(gate, len(tok))
    assert not bool(mask[lt]) and bool(mask[quote]) and bool(mask[_ids(tok, "x")[0]])
    assert not gate.accept_token(lt) and not gate.constraining  # refused, state unchanged
    assert gate.accept_token(quote) and gate.constraining
    for t in _ids(tok, 'ok"'):
        assert gate.accept_token(t)
    assert bool(_mask(gate, len(tok))[tok.eos_token_id])
    gate.rollback(len(_ids(tok, 'ok"')) + 1)  # the string and the opening token with its '"'
    assert not gate.constraining
    assert gate.accept_token(tok.convert_tokens_to_ids([">"])[0])
    assert torch.equal(_mask(gate, len(tok)), fresh)


@pytest.mark.parametrize("backend", _backends()[:1])
def test_a_marker_of_many_byte_pieces(smollm2_tokenizer, backend: str) -> None:  # type: ignore[no-untyped-def]
    """A marker beyond ASCII takes a token per byte or so (12 for this one in SmolLM2): the
    gate's window counts bytes, so it still opens."""
    tok = smollm2_tokenizer
    marker = "【思考结束】"
    gate, _ = _gate(tok, backend, MarkerTokens(tok, marker))
    for t in _ids(tok, "plan " + marker):
        assert gate.accept_token(t)
    assert gate.constraining


@pytest.mark.parametrize("backend", _backends()[:1])
def test_gate_accept_and_rollback_fuzz(smollm2_tokenizer, think_marker, backend: str) -> None:  # type: ignore[no-untyped-def]
    """Random accepts and rollbacks, across the opening and back: the gate's mask always
    equals that of a gate fed the same surviving tokens from scratch."""
    tok = smollm2_tokenizer
    rng = random.Random(7)
    script = _ids(tok, "a </think") + tok.convert_tokens_to_ids([">"]) + _ids(tok, '{"n":12}')
    manager = GuidedManager(PM, tok, len(tok), backend)
    gate, _ = _gate(tok, backend, think_marker, manager=manager)
    kept: list[int] = []
    for _ in range(40):
        if kept and rng.random() < 0.4:
            n = rng.randint(0, len(kept))
            gate.rollback(n)
            del kept[len(kept) - n:]
        else:
            nxt = script[len(kept)] if len(kept) < len(script) else None
            if nxt is None:
                continue
            assert gate.accept_token(nxt)
            kept.append(nxt)
        replay, _ = _gate(tok, backend, think_marker, manager=manager)
        for t in kept:
            assert replay.accept_token(t)
        assert gate.constraining == replay.constraining
        assert torch.equal(_mask(gate, len(tok)), _mask(replay, len(tok)))


@pytest.mark.parametrize("backend", _backends())
def test_gate_opened_by_the_prompt_constrains_at_once(smollm2_tokenizer, think_marker,  # type: ignore[no-untyped-def]
                                                      backend: str) -> None:
    tok = smollm2_tokenizer
    gate, fresh = _gate(tok, backend, think_marker, opened=True)
    assert torch.equal(_mask(gate, len(tok)), fresh)
    gate.rollback(0)
    assert gate.constraining


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
    assert EngineConfig(model="m", structured_outputs_enable_in_reasoning=True,
                        structured_outputs_config={"backend": "outlines"}
                        ).structured_outputs_enable_in_reasoning  # not reset by the JSON
    with pytest.raises(ValueError, match="use one form"):
        EngineConfig(model="m", structured_outputs_enable_in_reasoning=True,
                     structured_outputs_config={"enable_in_reasoning": False})
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
    """LLM(reasoning_parser=...).chat: the schema applies after the model's own "</think>"
    (its reasoning is the free run's); without thinking, to a plain prompt, or with
    structured_outputs_config enable_in_reasoning, from the first token."""
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
    llm = LLM(str(smollm2_dir), reasoning_parser="qwen3", **base)
    thought = llm.chat(chat, free, use_tqdm=False)[0].outputs[0].text
    assert thought.startswith("<think>") and "</think>" in thought
    text = llm.chat(chat, schema, use_tqdm=False)[0].outputs[0].text
    head, _, answer = text.partition("</think>")
    assert head == thought.partition("</think>")[0]
    value = json.loads(answer)
    assert set(value) == {"n"} and isinstance(value["n"], int)
    # Qwen3 told not to think: constrained from the first token, though SmolLM2's template
    # writes no empty think block for it
    plain = llm.chat(chat, schema, use_tqdm=False,
                     chat_template_kwargs={"enable_thinking": False})[0].outputs[0].text
    assert set(json.loads(plain)) == {"n"}
    assert llm.generate("The answer as JSON:", schema, use_tqdm=False)[0].outputs[0].text \
        .lstrip().startswith("{")  # a plain prompt: nothing to wait for
    del llm
    llm = LLM(str(smollm2_dir), structured_outputs_config={
        "reasoning_parser": "deepseek_r1", "enable_in_reasoning": True}, **base)
    assert json.loads(llm.chat(chat, schema, use_tqdm=False)[0].outputs[0].text).keys() == {"n"}

"""Guided decoding end to end on the real model, for every installed backend: what the engine
returns satisfies the constraint it accepted (unless it stopped for length)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from test_guided_cases import GRAMMARS, REGEXES, SCHEMAS, check_grammar_text

from ironlm import LLM, GuidedDecodingParams, SamplingParams, StructuredOutputsParams
from ironlm.plugin_manager import PluginManager
from ironlm.registry import UnknownNameError

pytestmark = pytest.mark.real_model

BACKENDS = ["outlines", "lm-format-enforcer", "xgrammar"]


@pytest.fixture(scope="module", params=BACKENDS)
def guided_llm(request: pytest.FixtureRequest, smollm2_dir: Path) -> tuple[str, LLM]:
    name = request.param
    cls = PluginManager().registries.guided_backends.get(name)
    status = cls.is_available()
    if not status.available:
        pytest.skip(f"{name}: {status.reason}")
    llm = LLM(str(smollm2_dir), max_model_len=1024, kv_cache_memory=96 << 20,
              guided_decoding_backend=name, max_num_seqs=32)
    return name, llm


def _chat_prompt(llm: LLM, ask: str) -> dict:  # type: ignore[type-arg]
    tok = llm.get_tokenizer()
    text = tok.apply_chat_template([{"role": "user", "content": ask}], tokenize=False,
                                   add_generation_prompt=True)
    return {"prompt": text, "prompt_token_ids": tok(text, add_special_tokens=False).input_ids}


def test_json_schemas_validate(guided_llm: tuple[str, LLM]) -> None:
    name, llm = guided_llm
    cases = [(cid, schema) for cid, schema, refuse in SCHEMAS if name not in refuse]
    assert len(cases) >= 20
    prompts = [_chat_prompt(llm, f"Reply with a JSON object for this schema: {json.dumps(s)}")
               for _, s in cases]
    params = [SamplingParams(temperature=0.7, seed=i, max_tokens=160,
                             guided_decoding=GuidedDecodingParams(json=s))
              for i, (_, s) in enumerate(cases)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    finished = 0
    for (cid, schema), out in zip(cases, outs):
        o = out.outputs[0]
        if o.finish_reason == "length":
            continue
        assert o.finish_reason == "stop", (cid, o.finish_reason)
        jsonschema.validate(json.loads(o.text), schema)
        finished += 1
    assert finished >= 0.75 * len(cases)
    assert llm.engine.block_manager.num_used_blocks == 0


def test_regex_choice_and_n3(guided_llm: tuple[str, LLM]) -> None:
    name, llm = guided_llm
    prompts = [_chat_prompt(llm, "Give an example matching " + r) for r in REGEXES]
    outs = llm.generate(prompts, [SamplingParams(temperature=0.8, seed=i, max_tokens=48,
                                                 guided_decoding=GuidedDecodingParams(regex=r))
                                  for i, r in enumerate(REGEXES)], use_tqdm=False)
    for r, out in zip(REGEXES, outs):
        o = out.outputs[0]
        if o.finish_reason != "length":
            assert re.fullmatch(r, o.text), (r, o.text)
    choices = ["positive", "negative", "neutral"]
    out = llm.generate(_chat_prompt(llm, "Sentiment of: I love this!"),
                       SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=8,
                                      structured_outputs=StructuredOutputsParams(choice=choices)),
                       use_tqdm=False)[0]
    assert len(out.outputs) == 3 and all(o.text in choices for o in out.outputs)


def test_grammars_where_supported(guided_llm: tuple[str, LLM]) -> None:
    name, llm = guided_llm
    backend_cls = PluginManager().registries.guided_backends.get(name)
    if "grammar" not in backend_cls.supported_kinds:
        with pytest.raises(ValueError, match="does not support 'grammar'"):
            llm.generate("x", SamplingParams(guided_decoding=GuidedDecodingParams(
                grammar=GRAMMARS[0][1])))
        return
    for gid, grammar, _ in GRAMMARS:
        out = llm.generate(_chat_prompt(llm, "Write an example."),
                           SamplingParams(temperature=0.8, seed=1, max_tokens=40,
                                          guided_decoding=GuidedDecodingParams(grammar=grammar)),
                           use_tqdm=False)[0].outputs[0]
        if out.finish_reason != "length":
            assert check_grammar_text(gid, out.text), (gid, out.text)


def test_invalid_constraints_are_value_errors(guided_llm: tuple[str, LLM]) -> None:
    _, llm = guided_llm
    with pytest.raises(ValueError):
        llm.generate("x", SamplingParams(guided_decoding=GuidedDecodingParams(regex="(unclosed")))
    with pytest.raises(ValueError, match="more than one"):
        SamplingParams(guided_decoding=GuidedDecodingParams(regex="a+", choice=["a"]))
    assert llm.engine.block_manager.num_used_blocks == 0


def test_without_the_plugin_guided_requests_name_the_package(smollm2_dir: Path) -> None:
    pm = PluginManager(autoload=True, allow=["cpu"])
    llm = LLM(str(smollm2_dir), max_model_len=256, kv_cache_memory=16 << 20, plugin_manager=pm)
    with pytest.raises(UnknownNameError, match="ironlm-guided"):
        llm.generate("x", SamplingParams(guided_decoding=GuidedDecodingParams(regex="a+")))

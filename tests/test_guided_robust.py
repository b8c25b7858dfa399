"""Guided decoding that cannot fail the server (issue 22): ``auto`` picks xgrammar first and
falls back per request only for features it lacks; structured_outputs options are enforced;
a backend that dead-ends ends only its own request, with an error, on the real model."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import jsonschema
import pytest

from ironlm import LLM, GuidedDecodingParams, SamplingParams
from ironlm.engine.guided_manager import GuidedManager
from ironlm.guided_spec import close_objects, spec_from_request
from ironlm.interfaces.guided import GuidedSpec
from ironlm.plugin_manager import PluginManager

DEADEND_DIR = Path(__file__).parent / "plugins" / "deadend"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0,
                                                   "maximum": 120}},
          "required": ["name", "age"]}
# what every backend enforces (lm-format-enforcer has no numeric bounds)
PLAIN = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                          "pet": {"enum": ["cat", "dog"]},
                                          "ages": {"type": "array", "items": {"type": "integer"},
                                                   "maxItems": 3}},
         "required": ["name", "pet", "ages"]}


def deadend_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ironlm_test_deadend",
                                                  DEADEND_DIR / "ironlm_test_deadend.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _installed(*names: str) -> bool:
    reg = PluginManager().registries.guided_backends
    return all(n in reg and reg.get(n).is_available().available for n in names)


needs_all = pytest.mark.skipif(not _installed("xgrammar", "outlines", "lm-format-enforcer"),
                               reason="needs ironlm-guided with the xgrammar extra")


@needs_all
def test_auto_order_is_by_priority() -> None:
    names = [c.name for c in PluginManager().guided_backend_candidates("auto")]
    assert names[:3] == ["xgrammar", "outlines", "lm-format-enforcer"]
    assert PluginManager().select_guided_backend("auto").name == "xgrammar"


@pytest.fixture(scope="module")
def manager(smollm2_tokenizer) -> GuidedManager:  # type: ignore[no-untyped-def]
    return GuidedManager(PluginManager(), smollm2_tokenizer, 49152, "auto")


@needs_all
def test_auto_falls_back_only_for_missing_features(manager: GuidedManager) -> None:
    schema = GuidedSpec("json", json.dumps(PERSON))
    assert manager.compile(schema, None)[0].name == "xgrammar"
    # xgrammar has no whitespace patterns: this request alone goes to outlines
    ws = GuidedSpec("json", json.dumps(PERSON), whitespace_pattern=r"[ ]{0,2}")
    assert manager.compile(ws, None)[0].name == "outlines"
    assert manager.compile(schema, "auto")[0].name == "xgrammar"  # the next one is unaffected
    with pytest.raises(ValueError, match="xgrammar.*whitespace"):
        manager.compile(GuidedSpec("json", json.dumps(PERSON), whitespace_pattern=r"[ ]?",
                                   disable_fallback=True), None)
    # a feature no backend enforces: every refusal is listed
    with pytest.raises(ValueError, match="no guided decoding backend") as err:
        manager.compile(GuidedSpec("json", '{"type": "array", "uniqueItems": true}'), None)
    for name in ("xgrammar", "outlines", "lm-format-enforcer"):
        assert name in str(err.value)
    # an invalid schema is refused at once, not handed from backend to backend
    with pytest.raises(ValueError, match="invalid JSON schema") as err:
        manager.compile(GuidedSpec("json", '{"type": 5}'), None)
    assert "no guided decoding backend" not in str(err.value)
    # a named backend never falls back
    with pytest.raises(ValueError, match="lm-format-enforcer"):
        manager.compile(GuidedSpec("json", json.dumps(PERSON)), "lm-format-enforcer")


def test_structured_outputs_options_are_enforced() -> None:
    spec = spec_from_request(structured_outputs={
        "json": {"type": "object", "properties": {"a": {"type": "object"}}},
        "disable_any_whitespace": True, "disable_fallback": True,
        "disable_additional_properties": True,
    })
    assert spec is not None and spec.disable_any_whitespace and spec.disable_fallback
    schema = json.loads(spec.value)
    assert schema["additionalProperties"] is False
    assert schema["properties"]["a"]["additionalProperties"] is False
    assert close_objects({"type": "object", "additionalProperties": True}) == \
        {"type": "object", "additionalProperties": True}  # an explicit choice stays
    with pytest.raises(ValueError, match="disable_fallback"):
        spec_from_request(structured_outputs={"regex": "a", "disable_fallback": "yes"})
    offline = GuidedDecodingParams(json=PERSON, disable_any_whitespace=True).to_spec()
    assert offline.disable_any_whitespace


@pytest.fixture(scope="module")
def llm(smollm2_dir: Path) -> LLM:
    pm = PluginManager(plugins={"test_deadend": deadend_module()})
    return LLM(str(smollm2_dir), max_model_len=512, kv_cache_memory=48 << 20, max_num_seqs=8,
               plugin_manager=pm)


@needs_all
@pytest.mark.real_model
@pytest.mark.parametrize("backend", ["xgrammar", "outlines", "lm-format-enforcer"])
def test_compact_json_has_no_whitespace(llm: LLM, backend: str) -> None:
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=60, guided_decoding=(
        GuidedDecodingParams(json=PLAIN, backend=backend, disable_any_whitespace=True)))
    outs = llm.generate(["A person as JSON: "] * 3, params, use_tqdm=False)
    for out in outs:
        o = out.outputs[0]
        assert o.finish_reason == "stop", o
        value = json.loads(o.text)
        jsonschema.validate(value, PLAIN)
        assert o.text == json.dumps(value, separators=(",", ":"), ensure_ascii=False), o.text


@pytest.mark.real_model
@pytest.mark.parametrize("mode", ["0 raise", "3 raise", "3 empty", "3 accept", "0 accept"])
def test_dead_end_ends_only_its_request(llm: LLM, mode: str) -> None:
    plain = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    stuck = SamplingParams(temperature=0, max_tokens=12, guided_decoding=GuidedDecodingParams(
        regex=mode, backend="deadend"), n=2)
    outs = llm.generate(["Once upon a time", "Hello there", "The sky is"],
                        [plain, stuck, plain], use_tqdm=False)
    for out in (outs[0], outs[2]):  # the others ran to the end
        assert out.error is None and len(out.outputs[0].token_ids) == 12
    failed = outs[1]
    assert failed.error is not None and "'deadend' reached a dead end" in failed.error
    steps = int(mode.split()[0])
    for o in failed.outputs:  # never more text than the grammar allowed
        assert o.finish_reason == "abort" and len(o.token_ids) <= steps
    assert llm.engine.block_manager.num_used_blocks == 0
    assert not llm.engine.has_unfinished_requests()

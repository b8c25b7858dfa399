"""Every guided backend, driven token by token over the real SmolLM2 tokenizer.

A seeded random walk picks uniformly among the allowed tokens (biased towards EOS and closing
tokens so walks end within the cap); whatever it produces must satisfy the constraint: JSON
validates with ``jsonschema`` (formats checked too), regexes ``re.fullmatch``, choices are one
of the choices, grammars parse. The mask never allows padding ids past the tokenizer, nor
special tokens other than EOS.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch

from test_guided_cases import GRAMMARS, REGEXES, SCHEMAS, check_grammar_text
from ironlm.interfaces.guided import Grammar, GuidedBackend, GuidedSpec

pytestmark = pytest.mark.real_model

BACKENDS = ["outlines", "lm-format-enforcer", "xgrammar"]
PAD = 64  # the model's logits are wider than the tokenizer (padded vocab)
CAP = 320  # tokens per walk


class Walker:
    """Token-level random walks over one backend, with the tokenizer's facts precomputed."""

    def __init__(self, backend: GuidedBackend, tokenizer: Any, pieces: list[str]) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.n_tok = len(tokenizer)
        self.vocab = backend.vocab_size
        self.eos = tokenizer.eos_token_id
        added = tokenizer.added_tokens_decoder  # id -> AddedToken
        special = set(tokenizer.all_special_ids) | {i for i, t in added.items() if t.special}
        self.special = sorted(special - {self.eos})
        # numpy for the walk's own bookkeeping: tiny torch ops pay thread-pool latency on a
        # busy CPU that would dominate the test's run time
        self.short = np.array([len(p) == 1 for p in pieces] + [False] * PAD)
        closers = [bool(p.strip()) and set(p) <= set('"}]) ') for p in pieces]
        self.closer = np.array(closers + [False] * PAD)

    def mask(self, grammar: Grammar) -> torch.Tensor:
        mask = torch.from_numpy(np.zeros(self.vocab, dtype=np.bool_))
        grammar.fill_mask(mask)
        m = mask.numpy()
        assert not m[self.n_tok :].any(), "a padding id past the tokenizer was allowed"
        assert not m[self.special].any(), "a special token other than EOS was allowed"
        assert m.any(), "no token allowed"
        return mask

    def pick(self, mask: torch.Tensor, rng: random.Random, step: int) -> int:
        m = mask.numpy()
        if m[self.eos] and rng.random() < 0.4:
            return self.eos
        for pool, p in ((m & self.closer, min(0.9, 0.15 + 1.5 * step / CAP)),
                        (m & self.short, 0.5)):
            if pool.any() and rng.random() < p:
                ids = np.flatnonzero(pool)
                return int(ids[rng.randrange(len(ids))])
        ids = np.flatnonzero(m)
        return int(ids[rng.randrange(len(ids))])

    def walk(self, grammar: Grammar, seed: int) -> tuple[str, bool]:
        """(text, ended with EOS) of one walk; checks the Grammar's contract on the way."""
        rng = random.Random(seed)
        ids: list[int] = []
        for step in range(CAP):
            mask = self.mask(grammar)
            if rng.random() < 0.2:  # a token outside the mask is refused, state unchanged
                refused = np.flatnonzero(~mask.numpy())
                assert not grammar.accept_token(int(refused[rng.randrange(len(refused))]))
            token = self.pick(mask, rng, step)
            assert grammar.accept_token(token)
            if token == self.eos:
                assert grammar.is_terminated()
                return self.text(ids), True
            ids.append(token)
        return self.text(ids), False

    def text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, clean_up_tokenization_spaces=False)


@pytest.fixture(scope="module")
def walkers(smollm2_tokenizer: Any) -> dict[str, Walker]:
    from ironlm_guided.lmfe_backend import LMFormatEnforcerBackend
    from ironlm_guided.outlines_backend import OutlinesBackend
    from ironlm_guided.xgrammar_backend import XGrammarBackend

    vocab = len(smollm2_tokenizer) + PAD
    pieces = smollm2_tokenizer.batch_decode([[i] for i in range(len(smollm2_tokenizer))])
    classes = (OutlinesBackend, LMFormatEnforcerBackend, XGrammarBackend)
    return {c.name: Walker(c(smollm2_tokenizer, vocab), smollm2_tokenizer, pieces)
            for c in classes if c.is_available().available}


@pytest.fixture(autouse=True)
def _needs_backend(request: pytest.FixtureRequest) -> None:
    """Skip a backend's cases when its library is not installed (xgrammar is optional)."""
    callspec = getattr(request.node, "callspec", None)
    name = callspec.params.get("backend") if callspec else None
    if name is not None and name not in request.getfixturevalue("walkers"):
        pytest.skip(f"{name} is not installed")


def _walk_all(walker: Walker, spec: GuidedSpec, seeds: range) -> list[str]:
    compiled = walker.backend.compile(spec)
    texts = []
    for seed in seeds:
        text, ended = walker.walk(walker.backend.new_grammar(compiled), seed)
        assert ended, f"walk {seed} hit the {CAP}-token cap: {text[:200]!r}"
        texts.append(text)
    return texts


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", SCHEMAS, ids=[c[0] for c in SCHEMAS])
def test_json_schema_walks_validate(walkers: dict[str, Walker], backend: str, case: tuple) -> None:
    name, schema, refused_by = case
    walker = walkers[backend]
    spec = GuidedSpec("json", json.dumps(schema))
    if backend in refused_by:
        with pytest.raises(ValueError, match=refused_by[backend]):
            walker.backend.compile(spec)
        return
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    for text in _walk_all(walker, spec, range(4)):
        validator.validate(json.loads(text))


@pytest.mark.parametrize("backend", BACKENDS)
def test_json_object_walks_are_objects(walkers: dict[str, Walker], backend: str) -> None:
    for text in _walk_all(walkers[backend], GuidedSpec("json_object"), range(4)):
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("regex", REGEXES)
def test_regex_walks_fullmatch(walkers: dict[str, Walker], backend: str, regex: str) -> None:
    for text in _walk_all(walkers[backend], GuidedSpec("regex", regex), range(4)):
        assert re.fullmatch(regex, text), (regex, text)


CHOICES = ("yes", "no", "New York", "a|b (c)*", 'say "hi"', "üñí", "two\nlines", "")


@pytest.mark.parametrize("backend", BACKENDS)
def test_choice_walks_pick_a_choice(walkers: dict[str, Walker], backend: str) -> None:
    seen = set()
    for text in _walk_all(walkers[backend], GuidedSpec("choice", choices=CHOICES), range(24)):
        assert text in CHOICES
        seen.add(text)
    assert len(seen) >= 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_choice_spelled_only_with_partial_characters(walkers: dict[str, Walker],
                                                     backend: str) -> None:
    # SmolLM2 has no token holding a whole snowman: only byte-level backends can spell it
    spec = GuidedSpec("choice", choices=("snow \u2603", "rain"))
    if backend == "lm-format-enforcer":
        with pytest.raises(ValueError, match="cannot be spelled"):
            walkers[backend].backend.compile(spec)
        return
    assert set(_walk_all(walkers[backend], spec, range(12))) == {"snow \u2603", "rain"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", GRAMMARS, ids=[g[0] for g in GRAMMARS])
def test_grammar_walks_parse(walkers: dict[str, Walker], backend: str, case: tuple) -> None:
    name, grammar, _ = case
    walker = walkers[backend]
    spec = GuidedSpec("grammar", grammar)
    if "grammar" not in walker.backend.supported_kinds:
        with pytest.raises(ValueError, match="grammar"):
            walker.backend.compile(spec)
        return
    for text in _walk_all(walker, spec, range(4)):
        assert check_grammar_text(name, text), text


@pytest.mark.parametrize("backend", BACKENDS)
def test_rollback_restores_masks(walkers: dict[str, Walker], backend: str) -> None:
    walker = walkers[backend]
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {
        "type": "string", "maxLength": 6}, "maxItems": 4}}, "required": ["tags"]}
    compiled = walker.backend.compile(GuidedSpec("json", json.dumps(schema)))
    grammar = walker.backend.new_grammar(compiled)
    rng = random.Random(7)
    masks, tokens = [], []
    while True:
        mask = walker.mask(grammar)
        masks.append(mask)
        token = walker.pick(mask, rng, len(tokens))
        assert grammar.accept_token(token)
        tokens.append(token)
        if token == walker.eos:
            break
    assert grammar.is_terminated() and len(tokens) > 4
    for back in (1, 3, len(tokens) - 1):  # EOS included; then all the way to the start
        grammar.rollback(back)
        mask = walker.mask(grammar)
        assert torch.equal(mask, masks[len(tokens) - back])
        # terminated again only where EOS is the one token left
        assert grammar.is_terminated() == (mask.sum() == 1 and bool(mask[walker.eos]))
        for token in tokens[len(tokens) - back :]:
            assert grammar.accept_token(token)
    assert grammar.is_terminated()
    with pytest.raises(ValueError):
        grammar.rollback(len(tokens) + 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_is_shared_and_compile_deterministic(walkers: dict[str, Walker],
                                                      backend: str) -> None:
    walker = walkers[backend]
    spec = GuidedSpec("regex", r"(cat|dog)s? [0-9]{2}")
    compiled = walker.backend.compile(spec)
    first, second = walker.backend.new_grammar(compiled), walker.backend.new_grammar(compiled)
    start = walker.mask(second)
    text_ids = walker.tokenizer.encode("dogs 42", add_special_tokens=False)
    for token in text_ids:
        assert first.accept_token(token)
    assert first.accept_token(walker.eos) and first.is_terminated()
    assert torch.equal(walker.mask(second), start)  # untouched by the other request
    assert not second.is_terminated()
    again = walker.backend.new_grammar(walker.backend.compile(spec))
    assert torch.equal(walker.mask(again), start)


@pytest.mark.parametrize("backend", BACKENDS)
def test_eos_only_when_complete(walkers: dict[str, Walker], backend: str) -> None:
    walker = walkers[backend]
    grammar = walker.backend.new_grammar(walker.backend.compile(GuidedSpec("regex", "ab+")))
    assert not walker.mask(grammar)[walker.eos]
    assert not grammar.accept_token(walker.eos)
    for token in walker.tokenizer.encode("ab", add_special_tokens=False):
        assert grammar.accept_token(token)
    mask = walker.mask(grammar)
    assert mask[walker.eos] and mask.sum() > 1  # complete, and "b" may still follow
    grammar = walker.backend.new_grammar(walker.backend.compile(GuidedSpec("regex", "abc")))
    for token in walker.tokenizer.encode("abc", add_special_tokens=False):
        assert grammar.accept_token(token)
    mask = walker.mask(grammar)
    assert mask[walker.eos] and mask.sum() == 1  # nothing else may follow: EOS only
    assert grammar.is_terminated()
    assert grammar.accept_token(walker.eos) and not grammar.accept_token(walker.eos)


INVALID = [
    (GuidedSpec("regex", "a("), "regex"),
    (GuidedSpec("regex", r"(a)\1"), "regex"),
    (GuidedSpec("json", '{"type": "foo"}'), "invalid JSON schema"),
    (GuidedSpec("json", '{"type": "object"'), "not valid JSON"),
    (GuidedSpec("json", '{"type": "array", "uniqueItems": true}'), "uniqueItems"),
    (GuidedSpec("json", '{"not": {"type": "string"}}'), "'not'"),
    (GuidedSpec("json", '{"type": "integer", "minimum": 5, "maximum": 2}'), "no integer"),
    (GuidedSpec("json", '{"oneOf": [{"type": "integer"}, {"type": "number"}]}'), "oneOf"),
    (GuidedSpec("json", '{"$ref": "http://example.com/s.json"}'), "not local"),
    (GuidedSpec("json", '{"type": "object", "required": ["x"]}'), "not listed"),
    (GuidedSpec("choice", choices=()), "at least one choice"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec, message", INVALID, ids=[str(i) for i in range(len(INVALID))])
def test_invalid_inputs_raise_value_error(walkers: dict[str, Walker], backend: str,
                                          spec: GuidedSpec, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        walkers[backend].backend.compile(spec)


@pytest.mark.parametrize("backend", BACKENDS)
def test_whitespace_pattern(walkers: dict[str, Walker], backend: str) -> None:
    walker = walkers[backend]
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}},
                         "required": ["a"]})
    spec = GuidedSpec("json", schema, whitespace_pattern=r"[\n ]{0,2}")
    if backend != "outlines":
        with pytest.raises(ValueError, match="whitespace"):
            walker.backend.compile(spec)
        return
    for text in _walk_all(walker, spec, range(4)):
        assert json.loads(text)["a"] is not None and "  " * 2 not in text
    with pytest.raises(ValueError, match="other than JSON whitespace"):
        walker.backend.compile(GuidedSpec("json", schema, whitespace_pattern=r"[ x]?"))


def test_registered_by_the_plugin_hook() -> None:
    from ironlm.plugin_manager import PluginManager
    from ironlm_guided import plugin

    pm = PluginManager(autoload=False, plugins={"guided": plugin})
    names = pm.registries.guided_backends.names()
    assert names == ["lm-format-enforcer", "outlines", "xgrammar"]
    for name in names:
        cls = pm.registries.guided_backends.entry(name).obj
        availability = cls.is_available()
        assert cls.name == name
        assert availability.available or "pip install" in availability.reason
    kinds = {n: pm.registries.guided_backends.entry(n).obj.supported_kinds for n in names}
    assert "grammar" not in kinds["outlines"] and "grammar" not in kinds["lm-format-enforcer"]
    assert kinds["xgrammar"] == {"json", "json_object", "regex", "choice", "grammar"}


@pytest.mark.parametrize("lo,hi", [(0, 300), (2, 129), (130, 300), (0, 256), (200, None), (3, 100)])
def test_xgrammar_string_bounds_above_128_compile_exactly(
    walkers: dict[str, Walker], lo: int, hi: int | None
) -> None:
    """xgrammar's regex compiler fails on repetition bounds above 128 (send_email's
    maxLength 300 made `auto` fall back to outlines, or refuse the request): the backend builds
    long bounds from 128-character chunks, accepting exactly the lengths lo..hi."""
    if "xgrammar" not in walkers:
        pytest.skip("xgrammar is not installed")
    import xgrammar as xg
    from ironlm_guided.xgrammar_backend import _length_body

    body = _length_body(lo, hi)
    top = (hi if hi is not None else lo + 200) + 2
    assert [n for n in range(top) if re.fullmatch(body, "a" * n)] == \
        list(range(lo, (hi + 1) if hi is not None else top))
    bounds = {"minLength": lo, **({"maxLength": hi} if hi is not None else {})}
    schema = {"type": "object", "properties": {"s": {"type": "string", **bounds}},
              "required": ["s"]}
    compiled = walkers["xgrammar"].backend.compile(GuidedSpec("json", json.dumps(schema),
                                                              disable_any_whitespace=True))
    for n in sorted({0, lo - 1, lo, 127, 128, 129, top - 3, top - 2} - {-1}):
        matcher = xg.GrammarMatcher(compiled.compiled)
        fits = lo <= n and (hi is None or n <= hi)
        assert matcher.accept_string('{"s":"' + "a" * n + '"}') == fits, n


@pytest.mark.parametrize("backend, schema, message", [
    ("outlines", {"type": "object", "properties": {'foo"bar': {"type": "integer"}},
                  "required": ['foo"bar']}, "needs JSON escaping"),
    ("lm-format-enforcer", {"type": "array", "items": False}, "maxItems 0"),
])
def test_what_a_backend_would_not_enforce_is_refused(
    walkers: dict[str, Walker], backend: str, schema: dict, message: str
) -> None:
    """Found by tests/json_schema_suite.py: outlines-core wrote escaped property names into its
    regex unescaped, lm-format-enforcer read maxItems 0 as no bound."""
    from ironlm.interfaces.guided import UnsupportedFeatureError

    with pytest.raises(UnsupportedFeatureError, match=message):
        walkers[backend].backend.compile(GuidedSpec("json", json.dumps(schema)))

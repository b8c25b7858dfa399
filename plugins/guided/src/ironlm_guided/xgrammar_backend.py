"""The ``xgrammar`` backend: pushdown automata compiled by xgrammar's GrammarCompiler.

One ``TokenizerInfo`` and one ``GrammarCompiler`` (with its own compile cache) per backend
instance; one ``GrammarMatcher`` per request. The TokenizerInfo is built from the shared
TokenTable's exact token bytes (a raw vocabulary of the model's logits width), so special tokens
and logits padding are empty entries xgrammar never allows; its own tokenizer detection would
treat added special tokens such as ``<|endoftext|>`` as plain text. Supports every kind:
JSON schemas (after normal-form checking), ``json_object``, regexes, choices (as an EBNF
alternation of string literals) and grammars in GBNF / EBNF (``root ::= ...``) or Lark
(``start: ...``), the two forms vLLM accepts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ironlm.interfaces.guided import Grammar, GuidedBackend, GuidedSpec, UnsupportedFeatureError
from ironlm.interfaces.platform import Availability
from ironlm_guided.bitmask import BitmaskUnpacker
from ironlm_guided.regex_check import check_python_regex, full_match_body
from ironlm_guided.schema_normalize import SchemaSupport, normalize_schema
from ironlm_guided.vocab import TokenTable

XGRAMMAR_SUPPORT = SchemaSupport(
    backend="xgrammar",
    numeric_bounds=True,
    multiple_of=True,
    formats=frozenset({"uuid", "email", "ipv4"}),
    pattern=True,
)
_MAX_WHITESPACE = 12  # whitespace run between JSON tokens (unbounded runs let a model stall)
_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: (Check failed: .*? is false: )?")


def _clean(error: Exception) -> str:
    """xgrammar's C++ messages without the log-line prefix."""
    return _LOG_PREFIX.sub("", str(error).strip())


def ebnf_literal(text: str) -> str:
    """``text`` as an EBNF (GBNF) string literal."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif ord(c) < 0x20:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


@dataclass(frozen=True)
class XGrammarCompiled:
    compiled: Any  # xgrammar.CompiledGrammar (immutable, shareable)
    eos_token_id: int


class XGrammarBackend(GuidedBackend):
    name: ClassVar[str] = "xgrammar"
    priority: ClassVar[int] = 30  # vLLM's first choice
    supported_kinds: ClassVar[frozenset[str]] = frozenset(
        {"json", "json_object", "regex", "choice", "grammar"}
    )

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        super().__init__(tokenizer, vocab_size)
        import xgrammar as xg

        table = TokenTable.from_tokenizer(tokenizer, vocab_size)
        self.eos_token_id = table.eos_token_id
        self.info = xg.TokenizerInfo(
            [raw or b"" for raw in table.token_bytes],
            xg.VocabType.RAW,
            vocab_size=vocab_size,
            stop_token_ids=[self.eos_token_id],
            add_prefix_space=False,
        )
        self.compiler = xg.GrammarCompiler(self.info, cache_enabled=True)
        self.unpacker = BitmaskUnpacker(vocab_size)

    @classmethod
    def is_available(cls) -> Availability:
        try:
            import xgrammar  # noqa: F401
        except ImportError as e:
            return Availability.no(f"xgrammar is not installed ({e}); pip install xgrammar")
        return Availability.yes()

    def compile(self, spec: GuidedSpec) -> XGrammarCompiled:
        if spec.whitespace_pattern is not None:
            raise UnsupportedFeatureError(
                "guided_whitespace_pattern is not supported by the 'xgrammar' backend "
                "(use the 'outlines' backend)"
            )
        try:
            compiled = self._compile(spec)
        except RuntimeError as e:
            # a grammar xgrammar cannot read is invalid (no other backend reads grammars);
            # a schema or regex it cannot compile uses something it lacks
            error = ValueError if spec.kind == "grammar" else UnsupportedFeatureError
            raise error(f"xgrammar cannot compile the {spec.kind}: {_clean(e)}") from None
        return XGrammarCompiled(compiled, self.eos_token_id)

    def _compile(self, spec: GuidedSpec) -> Any:
        compact = spec.disable_any_whitespace
        if spec.kind == "json":
            schema = _xgrammar_schema(normalize_schema(spec.value, XGRAMMAR_SUPPORT))
            return self._json(json.dumps(schema), compact)
        if spec.kind == "json_object":
            return self._json('{"type": "object"}', compact)
        if spec.kind == "regex":
            check_python_regex(spec.value, "guided regex")
            return self.compiler.compile_regex(spec.value)
        if spec.kind == "choice":
            if not spec.choices:
                raise ValueError("guided choice needs at least one choice")
            return self.compiler.compile_grammar(
                "root ::= " + " | ".join(ebnf_literal(c) for c in spec.choices)
            )
        if spec.kind == "grammar":
            return self._grammar(spec.value)
        raise ValueError(f"the xgrammar backend does not support {spec.kind!r} constraints")

    def _json(self, schema: str, compact: bool) -> Any:
        # compact: no whitespace at all (xgrammar's own default puts a space after , and :)
        return self.compiler.compile_json_schema(
            schema, any_whitespace=not compact, max_whitespace_cnt=_MAX_WHITESPACE,
            separators=(",", ":") if compact else None, strict_mode=True,
        )

    def _grammar(self, text: str) -> Any:
        if "::=" in text:  # GBNF / EBNF; vLLM's root rule is "root", Lark habits say "start"
            has_root = re.search(r"^\s*root\s*::=", text, re.M) is not None
            has_start = re.search(r"^\s*start\s*::=", text, re.M) is not None
            root = "start" if has_start and not has_root else "root"
            return self.compiler.compile_grammar(text, root_rule_name=root)
        return self.compiler.compile_lark(text)

    def new_grammar(self, compiled: XGrammarCompiled) -> XGrammarGrammar:
        return XGrammarGrammar(compiled, self.unpacker)


# characters a JSON string holds unescaped (what a length-bounded string is spelled with)
_PLAIN_CHAR = r'[^"\\\x00-\x1f]'
_MAX_REPEAT = 128  # the largest repetition bound xgrammar's regex compiler takes


def _xgrammar_schema(node: Any) -> Any:
    """The normal form as xgrammar should see it: patterns anchored explicitly (inner anchors
    refused), and length-bounded strings as patterns, because xgrammar's own rule for them lets
    raw control characters into the string (invalid JSON)."""
    if isinstance(node, dict):
        out = {k: _xgrammar_schema(v) for k, v in node.items() if k != "enum"}
        if "enum" in node:
            out["enum"] = node["enum"]
        if node.get("type") == "string" and "pattern" in node:
            body = full_match_body(node["pattern"], "JSON schema pattern")
            out["pattern"] = f"^(?:{body})$"
        elif node.get("type") == "string" and ("minLength" in node or "maxLength" in node):
            body = _length_body(int(node.get("minLength", 0)), node.get("maxLength"))
            out = {"type": "string", "pattern": f"^{body}$"}
        return out
    if isinstance(node, list):
        return [_xgrammar_schema(v) for v in node]
    return node


def _length_body(lo: int, hi: int | None) -> str:
    """A regex body matching lo..hi (None: no upper bound) plain string characters. xgrammar
    (0.2.8) fails on repetition bounds above 128, so longer runs are built from 128-character
    chunks: lo as whole chunks plus a rest, then 0..(hi - lo) more as "fewer than q chunks and
    up to 127" or "q chunks and up to r" (hi - lo = 128 q + r)."""
    c, n = _PLAIN_CHAR, _MAX_REPEAT
    if hi is not None and hi <= n:
        return f"{c}{{{lo},{hi}}}"
    whole, rest = divmod(lo, n)
    head = (f"(?:{c}{{{n}}}){{{whole}}}" if whole else "") + (f"{c}{{{rest}}}" if rest else "")
    if hi is None:
        return f"{head}{c}*"
    q, r = divmod(int(hi) - lo, n)
    if q == 0:
        return f"{head}{c}{{0,{r}}}"
    fewer = (f"(?:{c}{{{n}}}){{0,{q - 1}}}" if q > 1 else "") + f"{c}{{0,{n - 1}}}"
    return f"{head}(?:{fewer}|(?:{c}{{{n}}}){{{q}}}{c}{{0,{r}}})"


class XGrammarGrammar(Grammar):
    """One request's GrammarMatcher."""

    def __init__(self, compiled: XGrammarCompiled, unpacker: BitmaskUnpacker) -> None:
        import xgrammar as xg

        self.compiled = compiled
        self._matcher = xg.GrammarMatcher(compiled.compiled)
        self._unpacker = unpacker
        self._packed = torch.zeros((1, unpacker.words), dtype=torch.int32)  # (1, words)
        self._packed_valid = False  # _packed holds the mask for the current state
        self._steps = 0

    def _fill_packed(self) -> torch.Tensor:
        if not self._packed_valid:
            self._matcher.fill_next_token_bitmask(self._packed)
            self._packed_valid = True
        return self._packed[0]

    def fill_mask(self, mask: torch.Tensor) -> None:
        if self._matcher.is_terminated():
            mask[self.compiled.eos_token_id] = True
            return
        self._unpacker.fill(self._fill_packed(), mask)

    def accept_token(self, token_id: int) -> bool:
        if not 0 <= token_id < self._unpacker.vocab_size:
            return False
        if not self._matcher.accept_token(token_id):
            return False
        self._steps += 1
        self._packed_valid = False
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens < 0 or num_tokens > self._steps:
            raise ValueError(f"cannot roll back {num_tokens} tokens ({self._steps} accepted)")
        if num_tokens:
            self._matcher.rollback(num_tokens)
            self._steps -= num_tokens
            self._packed_valid = False

    def is_terminated(self) -> bool:
        if self._matcher.is_terminated():
            return True
        if not self._matcher.is_completed():
            return False
        packed = self._fill_packed()
        eos = self.compiled.eos_token_id
        word = int(packed[eos >> 5])
        others = int(torch.count_nonzero(packed)) - (1 if word else 0)
        return others == 0 and word == (1 << (eos & 31)) - (1 << 32 if (eos & 31) == 31 else 0)

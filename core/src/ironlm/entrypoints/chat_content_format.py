"""How a message's content reaches the chat template (vLLM's --chat-template-content-format).

- "string": the text of the message (its text parts joined by newlines): what templates that
  concatenate ``message['content']`` expect.
- "openai": a list of parts, ``[{"type": "text", "text": ...}]`` (a string content becomes one
  part): what templates that loop over a message's content expect (multimodal models').
- "auto" (the default, as vLLM's): "openai" when the template loops over the content of a
  message it iterates, else "string". A template that does not parse here is taken as
  "string" (it fails later, at rendering, with its own error).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.parser import Parser

CONTENT_FORMATS = ("auto", "string", "openai")
log = logging.getLogger("ironlm.chat")


def resolve_content_format(requested: str, template: Any) -> str:
    """``requested`` ("auto", "string" or "openai") for ``template`` (the Jinja text the
    conversation renders with; anything else reads as "string")."""
    if requested not in CONTENT_FORMATS:
        raise ValueError(f"chat_template_content_format must be one of {CONTENT_FORMATS}, got "
                         f"{requested!r}")
    if requested != "auto":
        return requested
    return detect_content_format(template) if isinstance(template, str) else "string"


@functools.lru_cache(maxsize=32)  # a pure function of the text: parsed once per template
def detect_content_format(template: str) -> str:
    """"openai" when the template has a loop over ``X['content']`` / ``X.content`` (through
    filters, tests or slices) where X is a loop variable over the messages, or a name set from
    one; else "string"."""
    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols", _GenerationBlocks])
    try:
        tree = env.parse(template)
    except jinja2.TemplateSyntaxError as exc:
        log.warning("chat template does not parse (%s): its content format is taken as "
                    "'string'", exc)
        return "string"
    lists = _names_bound_to(tree, {"messages"}, key=None)
    items = {loop.target.name for loop in tree.find_all(nodes.For)
             if isinstance(loop.target, nodes.Name) and _reads(loop.iter, lists, None)}
    items |= _names_bound_to(tree, items, key=None) - lists
    contents = _names_bound_to(tree, items, key="content")
    for loop in tree.find_all(nodes.For):
        if _reads(loop.iter, items, "content") or _reads(loop.iter, contents, None):
            return "openai"
    return "string"


def _names_bound_to(tree: nodes.Template, names: set[str], key: str | None) -> set[str]:
    """``names`` and every name ``{% set %}`` binds to one of them (``key``: to its item
    ``key``), followed through chains of assignments."""
    bound = set(names) if key is None else set()
    while True:
        more = {a.target.name for a in tree.find_all(nodes.Assign)
                if isinstance(a.target, nodes.Name) and a.target.name not in bound
                and (_reads(a.node, names, key) or _reads(a.node, bound, None))}
        if not more:
            return bound
        bound |= more


def _reads(node: nodes.Node, names: set[str], key: str | None) -> bool:
    """``node`` is one of ``names`` (``key``: its item / attribute ``key``), possibly through
    filters, tests and slices."""
    while isinstance(node, (nodes.Filter, nodes.Test)) or (
            isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice)):
        if node.node is None:
            return False
        node = node.node
    if key is not None:
        if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) \
                and node.arg.value == key:
            return _reads(node.node, names, None)
        if isinstance(node, nodes.Getattr) and node.attr == key:
            return _reads(node.node, names, None)
        return False
    return isinstance(node, nodes.Name) and node.name in names


class _GenerationBlocks(Extension):
    """Hugging Face's ``{% generation %}...{% endgeneration %}`` (it marks the assistant's
    tokens for training masks): parsed as its body, so such templates are read too."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)

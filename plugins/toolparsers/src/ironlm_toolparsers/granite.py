"""granite: IBM Granite 3.x calls.

A marker, then a JSON list of call objects::

    <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Boston"}}]

Granite 3.0 writes the special token ``<|tool_call|>``; Granite 3.1 and later write the plain
string ``<tool_call>``. Both are accepted. Unlike vLLM, a bare list without a marker is content
(a model answering with a JSON list is not calling tools), and text before the marker is kept as
content.
"""

from __future__ import annotations

from ironlm_toolparsers.json_list import JsonListToolParser


class GraniteToolParser(JsonListToolParser):
    name = "granite"
    markers = ("<|tool_call|>", "<tool_call>")

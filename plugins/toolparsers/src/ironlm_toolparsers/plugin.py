"""Entry point of ironlm-toolparsers: registers tool-call parsers and reasoning parsers.

Importing this module costs nothing: the parser modules are imported inside the hook.
"""

from __future__ import annotations

from typing import Callable

from ironlm import hookimpl

IRONLM_CONTRACT_VERSION = "1.1"  # the plugin contract this module is written against


@hookimpl
def register_tool_parsers(register: Callable[[type], None]) -> None:
    from ironlm_toolparsers.granite import GraniteToolParser
    from ironlm_toolparsers.hermes import HermesToolParser
    from ironlm_toolparsers.llama3_json import Llama3JsonToolParser
    from ironlm_toolparsers.mistral import MistralToolParser
    from ironlm_toolparsers.pythonic import PythonicToolParser

    for parser in (
        HermesToolParser,
        MistralToolParser,
        Llama3JsonToolParser,
        PythonicToolParser,
        GraniteToolParser,
    ):
        register(parser)


@hookimpl
def register_reasoning_parsers(register: Callable[[type], None]) -> None:
    from ironlm_toolparsers.think_tags import DeepSeekR1ReasoningParser, Qwen3ReasoningParser

    for parser in (DeepSeekR1ReasoningParser, Qwen3ReasoningParser):
        register(parser)

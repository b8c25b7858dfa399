"""ironlm-toolparsers: tool-call parsers for IronLM, registered through ``register_tool_parsers``.

Parsers (the ``--tool-call-parser`` names, as in vLLM): ``hermes``, ``mistral``, ``llama3_json``,
``pythonic``, ``granite``. Each reads a finished generation (``extract``) or a stream
(``extract_streaming`` / ``finish_streaming``) with the same scanner, so both agree; see
:mod:`ironlm_toolparsers.base` for the shared rules and :mod:`ironlm_toolparsers.testing` for
helpers that check any parser's streaming against its one-shot result.
"""

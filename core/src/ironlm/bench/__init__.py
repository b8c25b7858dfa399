"""``ironlm bench``: offline throughput and latency, online serving, baselines, machine limits.

One module per command (``throughput``, ``latency``, ``serve``, ``profile``), each with
``add_cli_args(parser)`` and ``main(args) -> int``; shared helpers beside them:

- ``machine``: machine description and its measured limits (read bandwidth, fp32 matmul).
- ``prompts``: seeded random token-id prompts or a prompts file.
- ``runners``: the timed IronLM runner and the ``BatchTiming`` every runner returns.
- ``baselines``: HF transformers ``generate`` and llama-cpp-python, timed the same way.
- ``worker``: runs one engine in its own subprocess, so peak RSS is per engine.
- ``results``: summaries, ratio tables and JSON files under benchmarks/results/.
"""

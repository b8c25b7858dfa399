"""``ironlm bench`` (distribution ironlm-bench): offline throughput and latency, online serving,
baselines, machine limits. Installed beside ``ironlm``, it adds the ``bench`` command to the
``ironlm`` CLI through the entry-point group ``ironlm.commands`` (``cli.add_parser``).

One module per command (``throughput``, ``latency``, ``serve``, ``profile``, ``specdec``,
``plot``), each with ``add_cli_args(parser)`` and ``main(args) -> int``; shared helpers beside
them:

- ``common``: what throughput and latency share: flags, runner specs, the machine context, and
  the run of every engine with its report.
- ``machine``: machine description and its measured limits (read bandwidth, fp32 matmul).
- ``prompts``: seeded random token-id prompts or a prompts file.
- ``runners``: the timed IronLM runner and the ``BatchTiming`` every runner returns.
- ``baselines``: HF transformers ``generate`` and llama-cpp-python, timed the same way.
- ``worker``: runs one engine in its own subprocess, so peak RSS is per engine.
- ``results``: summaries, ratio tables and JSON files under benchmarks/results/.
"""

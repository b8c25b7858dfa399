"""Decode-graph batch sizes as vLLM sets them: its default pattern (1, 2, 4, then every 8th
size to 256, every 16th beyond), ``cudagraph_capture_sizes`` / ``max_cudagraph_capture_size``
and their ``compilation_config`` JSON form, and the engine padding a batch to the next size
(on the cpu platform's graphs, the tokens equal to eager steps')."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ironlm import LLM, SamplingParams
from ironlm.config import EngineConfig
from ironlm.entrypoints.openai.argv_expansion import expand_argv
from ironlm.entrypoints.openai.cli_args import engine_config_from_args, make_parser
from ironlm.worker.decode_graphs import capture_sizes

PROMPTS = ["The capital of France is", "def fib(n):", "Once upon a time", "1, 2, 3,", "Hi"]


def test_default_pattern_and_requested_sizes() -> None:
    assert capture_sizes(None, None, 64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    cuda = capture_sizes(None, None, 256)
    assert cuda[:5] == [1, 2, 4, 8, 16] and cuda[-2:] == [248, 256] and len(cuda) == 35
    assert capture_sizes(None, 512, 256)[-3:] == [480, 496, 512]  # every 16th past 256
    assert capture_sizes(None, 20, 256) == [1, 2, 4, 8, 16]
    assert capture_sizes([8, 1, 4, 4], 8, 64) == [1, 4, 8]  # sorted, unique
    # vLLM's default largest size: twice the tokens a decode step of max_num_seqs takes
    assert capture_sizes(None, None, 256, max_num_seqs=8) == [1, 2, 4, 8, 16]
    assert capture_sizes(None, None, 256, max_num_seqs=4, num_speculative_tokens=2) == [
        1, 2, 4, 8, 16, 24]
    assert capture_sizes(None, None, 64, max_num_seqs=256)[-1] == 64  # the platform's cap


def _config(**kwargs: object) -> EngineConfig:
    return EngineConfig(model="m", **kwargs)  # type: ignore[arg-type]


def test_compilation_config_sets_the_graph_fields(caplog: pytest.LogCaptureFixture) -> None:
    cfg = _config(compilation_config={"cudagraph_capture_sizes": [1, 2, 3],
                                      "max_cudagraph_capture_size": 3})  # fmt: skip
    assert (cfg.cudagraph_capture_sizes, cfg.max_cudagraph_capture_size) == ([1, 2, 3], 3)
    assert cfg.compilation_config is None and not cfg.enforce_eager
    assert _config(compilation_config={"cudagraph_mode": "none"}).enforce_eager
    assert not _config(compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE"}).enforce_eager
    assert _config(compilation_config={"cudagraph_mode": 0}).enforce_eager  # the enum's value
    assert not _config(compilation_config={"cudagraph_mode": 2}).enforce_eager
    _config(compilation_config={"compile_ranges_split_points": [8], "compile_mm_encoder": False})
    with caplog.at_level(logging.WARNING, logger="ironlm.config"):
        _config(compilation_config={"level": 3, "custom_ops": ["all"]})
    assert "['custom_ops', 'level'] unused" in caplog.text
    for bad, message in (({"cudagraph_mode": "SOMETIMES"}, "cudagraph_mode"),
                         ({"splitting": 1}, "not supported"),
                         ({"cudagraph_capture_sizes": 8}, "must be a list"),
                         ({"cudagraph_capture_sizes": [0, 2]}, "positive integers"),
                         ({"cudagraph_capture_sizes": []}, "is empty"),
                         # vLLM's: a given largest size is the largest listed one
                         ({"cudagraph_capture_sizes": [128], "max_cudagraph_capture_size": 64},
                          "should be the largest"),
                         ({"cudagraph_capture_sizes": [1, 2, 4], "max_cudagraph_capture_size": 8},
                          "should be the largest")):
        with pytest.raises(ValueError, match=message):
            _config(compilation_config=bad)
    with pytest.raises(ValueError, match="use one form"):
        _config(max_cudagraph_capture_size=8, compilation_config={"max_cudagraph_capture_size": 4})


def test_flags(tmp_path: Path) -> None:
    parser = make_parser()

    def config(*argv: str) -> EngineConfig:
        return engine_config_from_args(parser.parse_args(expand_argv(["m", *argv], parser)))

    cfg = config("--cudagraph-capture-sizes", "1", "2", "4", "--max-cudagraph-capture-size", "4")
    assert (cfg.cudagraph_capture_sizes, cfg.max_cudagraph_capture_size) == ([1, 2, 4], 4)
    cfg = config("--compilation-config", '{"cudagraph_capture_sizes": [2, 6]}')
    assert cfg.cudagraph_capture_sizes == [2, 6]
    # vLLM's -cc and its dotted keys, laid over the flag's own JSON
    cfg = config("-cc", '{"cudagraph_capture_sizes": [2, 6]}', "-cc.max_cudagraph_capture_size=6")
    assert (cfg.cudagraph_capture_sizes, cfg.max_cudagraph_capture_size) == ([2, 6], 6)
    cfg = config("--compilation_config.cudagraph_capture_sizes", "[1, 3]",
                 "--compilation-config.cudagraph_mode", "NONE")  # fmt: skip
    assert cfg.cudagraph_capture_sizes == [1, 3] and cfg.enforce_eager
    cfg = config("--speculative-config.method", "ngram",
                 "--speculative-config.num_speculative_tokens", "3",
                 "--hf-overrides.rope_parameters.factor", "2.0")  # fmt: skip
    assert (cfg.speculative_proposer_name, cfg.num_speculative_tokens) == ("ngram", 3)
    assert cfg.hf_overrides == {"rope_parameters": {"factor": 2.0}}
    # the flag's JSON written with "=", and a --config YAML's own JSON and dotted keys
    cfg = config('--compilation-config={"cudagraph_capture_sizes": [1, 2]}',
                 "-cc.cudagraph_mode=NONE")
    assert cfg.cudagraph_capture_sizes == [1, 2] and cfg.enforce_eager
    yaml_file = tmp_path / "flags.yaml"
    yaml_file.write_text("compilation-config: {cudagraph_capture_sizes: [1, 2]}\n"
                         "compilation_config.max_cudagraph_capture_size: 2\n")
    cfg = config("--config", str(yaml_file), "-cc.cudagraph_mode=NONE")
    assert (cfg.cudagraph_capture_sizes, cfg.max_cudagraph_capture_size) == ([1, 2], 2)
    assert cfg.enforce_eager
    # a key without a value is true; a negative number is a value, a short flag is not
    assert parser.parse_args(expand_argv(["m", "-cc.use_inductor", "-tp", "2"], parser)
                             ).compilation_config == {"use_inductor": True}  # fmt: skip
    assert config("--hf-overrides.bias", "-1").hf_overrides == {"bias": -1}
    with pytest.raises(ValueError, match="expected a JSON object"):
        expand_argv(["m", "--compilation-config", "[1]", "-cc.x=1"], parser)


def _tokens(llm: LLM, n: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS[:n], params,
                                                              use_tqdm=False)]  # fmt: skip


@pytest.mark.usefixtures("c_decode_attention")  # conftest: the cpu graphs need it
def test_engine_pads_to_the_configured_sizes(tiny_llama_dir: Path) -> None:
    def engine(**kwargs: object) -> LLM:
        return LLM(str(tiny_llama_dir), device="cpu", dtype="float32", max_model_len=128,
                   kv_cache_memory=16 << 20, **kwargs)  # type: ignore[arg-type]

    want = _tokens(engine(enforce_eager=True), 5)
    sized = engine(cudagraph_capture_sizes=[3, 6])
    assert _tokens(sized, 5) == want
    graphs = sized.engine.executor.worker.model_runner.graphs
    assert graphs.disabled is None and sorted(graphs.graphs) == [6]  # 5 rows padded to 6
    capped = engine(compilation_config={"max_cudagraph_capture_size": 4})
    assert _tokens(capped, 5) == want
    assert not capped.engine.executor.worker.model_runner.graphs.graphs  # 5 > 4: eager steps
    assert engine(compilation_config={"cudagraph_mode": "NONE"}) \
        .engine.executor.worker.model_runner.graphs is None

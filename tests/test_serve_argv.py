"""vLLM's command-line conventions on ``ironlm serve``: ``--snake_case`` flags and
``--config FILE.yaml`` (the command line's own flags win), applied before parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from ironlm.cli import Cli
from ironlm.config import EngineConfig
from ironlm.entrypoints.openai.argv_expansion import expand_argv
from ironlm.entrypoints.openai.cli_args import engine_config_from_args, make_parser


def _parse(argv: list[str]):  # type: ignore[no-untyped-def]
    parser = make_parser()
    return parser.parse_args(expand_argv(argv, parser))


def test_snake_case_flags_are_kebab_case_flags() -> None:
    args = _parse(["m", "--max_model_len", "300", "--max_num_seqs=7", "--enforce_eager"])
    config = engine_config_from_args(args)
    assert (config.max_model_len, config.max_num_seqs, config.enforce_eager) == (300, 7, True)
    # values keep their underscores
    assert _parse(["m", "--served_model_name", "a_b"]).served_model_name == ["a_b"]


def test_config_file_gives_flags_the_command_line_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_model_len: 300\nmax-num-seqs: 9\nenforce-eager: true\n"
                   "enable-prefix-caching: false\nserved-model-name: [a, b]\n"
                   "disable-log-stats: false\n")
    args = _parse(["m", "--config", str(cfg), "--max-num-seqs", "4"])
    config = engine_config_from_args(args)
    assert (config.max_model_len, config.max_num_seqs) == (300, 4)
    assert config.enforce_eager and not config.enable_prefix_caching
    assert args.served_model_name == ["a", "b"] and not args.disable_log_stats
    assert _parse([f"--config={cfg}", "m"]).served_model_name == ["a", "b"]


def test_config_file_dotted_json_keys_take_any_yaml_value(tmp_path: Path) -> None:
    # one key of a JSON flag: false, a list, a string or an object, as the YAML gives it
    cfg = tmp_path / "c.yaml"
    cfg.write_text("compilation_config.use_inductor: false\n"
                   "compilation-config.cudagraph_capture_sizes: [1, 2, 4]\n"
                   "compilation_config.cudagraph_mode: NONE\n"
                   "hf-overrides.rope_parameters: {factor: 2.0}\n")
    args = _parse(["m", "--config", str(cfg)])
    assert args.compilation_config == {"use_inductor": False, "cudagraph_mode": "NONE",
                                       "cudagraph_capture_sizes": [1, 2, 4]}  # fmt: skip
    assert args.hf_overrides == {"rope_parameters": {"factor": 2.0}}


def test_a_bad_config_is_a_usage_error(tmp_path: Path) -> None:
    cfg = tmp_path / "list.yaml"
    cfg.write_text("- 1\n- 2\n")
    for bad in (str(cfg), str(tmp_path / "missing.yaml")):
        with pytest.raises(SystemExit) as exit_info:
            Cli().run(["serve", "m", "--config", bad])
        assert exit_info.value.code == 2


def test_vllm_short_flags_and_human_readable_integers() -> None:
    config = engine_config_from_args(_parse(
        ["m", "-q", "awq", "--max-model-len", "2k", "--max-num-batched-tokens", "4K"]))
    assert (config.quantization, config.max_model_len, config.max_num_batched_tokens) == \
        ("awq", 2000, 4096)
    assert engine_config_from_args(_parse(["m", "--max-model-len", "25.6k"])).max_model_len \
        == 25600
    for bad in ("1.5K", "lots"):  # vLLM: no decimals with a binary suffix
        with pytest.raises(SystemExit):
            _parse(["m", "--max-model-len", bad])


def test_kv_cache_memory_bytes_is_vllms_name_of_the_budget() -> None:
    config = engine_config_from_args(_parse(["m", "--kv-cache-memory-bytes", "2G"]))
    assert (config.kv_cache_memory, config.kv_cache_memory_bytes) == (2 << 30, None)
    assert engine_config_from_args(
        _parse(["m", "--kv-cache-memory-bytes", "2g"])).kv_cache_memory == 2 * 10**9
    with pytest.raises(ValueError, match="not both"):
        engine_config_from_args(_parse(["m", "--kv-cache-memory", "1GiB",
                                        "--kv-cache-memory-bytes", "1G"]))


def test_speculative_config_json_becomes_the_speculative_fields() -> None:
    def spec(text: str) -> EngineConfig:
        return engine_config_from_args(_parse(["m", "--speculative-config", text]))

    ngram = spec('{"method": "ngram", "num_speculative_tokens": 4}')
    assert (ngram.speculative_model, ngram.num_speculative_tokens, ngram.ngram_prompt_lookup_min,
            ngram.ngram_prompt_lookup_max, ngram.speculative_config) == ("[ngram]", 4, 5, 5, None)
    one = spec('{"model": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_max": 3}')
    assert (one.ngram_prompt_lookup_min, one.ngram_prompt_lookup_max) == (3, 3)  # vLLM's rule
    draft = spec('{"model": "/d", "num_speculative_tokens": 3, "max_model_len": 256, '
                 '"disable_by_batch_size": 4}')
    assert (draft.speculative_model, draft.speculative_max_model_len,
            draft.speculative_disable_by_batch_size) == ("/d", 256, 4)
    assert spec('{"method": "eagle", "num_speculative_tokens": 2}').speculative_model \
        == "[eagle]"  # a proposer plugin by name: the engine refuses one it lacks
    for bad, match in (('{"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_'
                        'parallel_size": 1}', "draft_tensor_parallel_size"),
                       ('{"method": "draft_model", "num_speculative_tokens": 2}', "draft 'model'"),
                       ('{"method": "ngram"}', "num_speculative_tokens")):
        with pytest.raises(ValueError, match=match):
            spec(bad)
    with pytest.raises(ValueError, match="use one form"):
        engine_config_from_args(_parse(["m", "--speculative-model", "[ngram]",
                                        "--speculative-config", '{"method": "ngram"}']))


def test_frontend_flags_of_vllm() -> None:
    args = _parse(["m", "--api-key", "k1", "k2", "--enable-log-requests",
                   "--enable-prompt-tokens-details", "--disable-uvicorn-access-log",
                   "--tokenizer-mode", "hf", "--hf-overrides", '{"rope_theta": 1.0}'])
    assert args.api_key == ["k1", "k2"] and args.enable_log_requests
    assert args.enable_prompt_tokens_details and args.disable_uvicorn_access_log
    config = engine_config_from_args(args)
    assert (config.tokenizer_mode, config.hf_overrides) == ("hf", {"rope_theta": 1.0})
    assert not _parse(["m"]).enable_log_requests  # vLLM's default since 0.10: not logged
    assert engine_config_from_args(_parse(["m", "-O0"])).enforce_eager
    assert not engine_config_from_args(_parse(["m", "-O3"])).enforce_eager
    assert engine_config_from_args(_parse(["m", "-dp", "2"])).data_parallel_size == 2
    with pytest.raises(ValueError, match="Hugging Face tokenizers only"):
        engine_config_from_args(_parse(["m", "--tokenizer-mode", "mistral"]))
    with pytest.raises(ValueError, match="transformers 5"):  # it would ignore use_fast=False
        engine_config_from_args(_parse(["m", "--tokenizer-mode", "slow"]))


def test_structured_outputs_config_names_the_backend() -> None:
    config = engine_config_from_args(_parse(
        ["m", "--structured-outputs-config", '{"backend": "outlines"}']))
    assert (config.guided_decoding_backend, config.structured_outputs_config) == ("outlines", None)
    for bad in ('{"backend": "xgrammar", "disable_any_whitespace": true}',
                '{"reasoning_backend": "deepseek_r1"}'):
        with pytest.raises(ValueError, match="not supported"):
            engine_config_from_args(_parse(["m", "--structured-outputs-config", bad]))
    config = engine_config_from_args(_parse(
        ["m", "--structured-outputs-config",
         '{"reasoning_parser": "deepseek_r1", "enable_in_reasoning": true}']))
    assert (config.reasoning_parser, config.structured_outputs_enable_in_reasoning) == (
        "deepseek_r1", True)
    assert engine_config_from_args(_parse(["m", "--reasoning-parser", "qwen3"])) \
        .reasoning_parser == "qwen3"
    with pytest.raises(SystemExit):  # set through the JSON only, as in vLLM
        _parse(["m", "--structured-outputs-enable-in-reasoning"])


def test_max_model_len_auto() -> None:
    for text in ("auto", "-1"):
        assert engine_config_from_args(_parse(["m", "--max-model-len", text])).max_model_len == -1
    with pytest.raises(ValueError, match="at least 1, or -1"):
        engine_config_from_args(_parse(["m", "--max-model-len", "0"]))


def test_model_source_flags_of_vllm() -> None:
    # a Hub repository id as the model (tests/test_hub_models.py serves one); the sliding
    # window flag (tests/test_sliding_window_flag.py)
    args = _parse(["Qwen/Qwen3-0.6B", "--revision", "v2", "--tokenizer-revision", "abc123",
                   "--download-dir", "/models/hf", "--hf-token", "hf_secret",
                   "--disable-sliding-window", "--logprobs-mode", "processed_logits"])
    config = engine_config_from_args(args)
    assert config.model == "Qwen/Qwen3-0.6B"
    assert (config.revision, config.tokenizer_revision) == ("v2", "abc123")
    assert (config.download_dir, config.hf_token) == ("/models/hf", "hf_secret")
    assert "hf_secret" not in repr(config)  # the token is kept out of logs
    assert config.logprobs_mode == "processed_logits"  # tests/test_logprobs_mode.py
    assert config.disable_sliding_window and not engine_config_from_args(
        _parse(["m"])).disable_sliding_window


def test_version_flag_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from ironlm import __version__

    with pytest.raises(SystemExit) as exit_info:
        Cli().run(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == __version__


def test_front_end_switches_take_vllms_no_forms(tmp_path: Path) -> None:
    # vLLM's front-end booleans are --flag / --no-flag pairs; a --config false becomes --no-
    config = tmp_path / "c.yaml"
    config.write_text("enable-auto-tool-choice: false\nallow-credentials: true\n")
    args = _parse(["m", "--enable-auto-tool-choice", "--config", str(config),
                   "--no-disable-fastapi-docs", "--no-enable-log-outputs"])
    assert args.enable_auto_tool_choice is True  # the command line's own flag wins
    assert args.allow_credentials is True
    assert args.disable_fastapi_docs is False and args.enable_log_outputs is False
    args = _parse(["m", "--config", str(config)])
    assert args.enable_auto_tool_choice is False

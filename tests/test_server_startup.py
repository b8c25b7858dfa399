"""``ironlm serve`` start-up: flags are grouped in --help, and a flag the engine cannot honour is
rejected before the model loads, with exit status 2 and a message naming what is installed.
No model is loaded here (the failures come first)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from ironlm.cli import build_parser
from ironlm.config import EngineConfig
from ironlm.entrypoints.engine_args import NO_FLAG_FIELDS
from ironlm.entrypoints.openai.api_server import main as api_server_main
from ironlm.entrypoints.openai.cli_args import engine_config_from_args, parse_size

pytestmark = pytest.mark.server

MODEL = "/nonexistent/model"  # never loaded: every case fails earlier


def _serve(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    args = build_parser().parse_args(["serve", *argv])
    rc = args.func(args)
    return rc, capsys.readouterr().err


def test_help_lists_every_flag_grouped(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    for group in ("server:", "CORS:", "OpenAI API:", "tool calling:", "logging:", "engine:"):
        assert group in text
    for f in fields(EngineConfig):
        flag = "--" + f.name.replace("_", "-")
        assert (flag in text) != (f.name in NO_FLAG_FIELDS), f.name
    for flag in ("--api-key", "--served-model-name", "--chat-template", "--response-role",
                 "--ssl-keyfile", "--ssl-cert-reqs", "--root-path", "--middleware",
                 "--return-tokens-as-token-ids", "--max-log-len", "--disable-log-requests",
                 "--allowed-origins", "--allow-credentials", "--enable-auto-tool-choice",
                 "--tool-call-parser", "--tool-parser-plugin", "--reasoning-parser",
                 "--reasoning-parser-plugin", "--uvicorn-log-level"):
        assert flag in text


def test_engine_flags_map_onto_engine_config() -> None:
    args = build_parser().parse_args([
        "serve", "m", "--max-model-len", "512", "--kv-cache-memory", "64MiB",
        "--no-enable-prefix-caching", "--dtype", "float32", "--max-num-seqs", "4",
        "--attention-backend-options", '{"x": 1}',
    ])
    config = engine_config_from_args(args)
    assert (config.model, config.max_model_len, config.kv_cache_memory) == ("m", 512, 64 << 20)
    assert config.enable_prefix_caching is False and config.max_num_seqs == 4
    assert config.attention_backend_options == {"x": 1}
    assert args.port == 8000 and args.response_role == "assistant" and not args.disable_log_stats
    assert parse_size("2GiB") == 2 << 30 and parse_size("1000") == 1000


def test_no_platform_names_plugins(monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("IRONLM_DISABLE_PLUGIN_AUTOLOAD", "1")
    rc, err = _serve([MODEL], capsys)
    assert rc == 2 and "ironlm-cpu" in err and "ironlm-cuda" in err


@pytest.mark.parametrize(("flags", "needles"), [
    (["--device", "nope"], ["device 'nope'", "cpu"]),
    (["--tool-call-parser", "nope"], ["tool_call_parser 'nope'", "hermes"]),
    (["--enable-auto-tool-choice"], ["--tool-call-parser"]),
    (["--tensor-parallel-size", "2", "--distributed-executor-backend", "uni"],
     ["--tensor-parallel-size 2"]),
    (["--tensor-parallel-size", "2", "--distributed-executor-backend", "nope"],
     ["distributed_executor_backend 'nope'", "mp", "ray", "uni"]),
    (["--quantization", "nope"], ["quantization 'nope'"]),
    (["--attention-backend", "nope"], ["attention_backend 'nope'"]),
    (["--guided-decoding-backend", "nope"], ["guided_decoding_backend 'nope'"]),
    (["--swap-space", "-1"], ["swap_space"]),
    (["--kv-cache-dtype", "fp8"], ["--kv-cache-dtype fp8", "platform 'cpu'"]),
    (["--dtype", "int3"], ["dtype 'int3'"]),
    (["--chat-template", "no-such-file-and-no-braces"], ["chat template"]),
    (["--tool-parser-plugin", "/no/such/plugin.py"], ["--tool-parser-plugin"]),
    (["--reasoning-parser", "nope"], ["reasoning_parser 'nope'", "deepseek_r1, qwen3"]),
    (["--structured-outputs-config", '{"reasoning_parser": "nope"}'],
     ["reasoning_parser 'nope'"]),
    (["--reasoning-parser-plugin", "/no/such/plugin.py"], ["--reasoning-parser-plugin"]),
    (["--tokenizer-extension-path", "/no/such/ext.py"],
     ["--tokenizer-extension-path", "is not a file"]),
    (["--api-key", ""], ["--api-key must not be empty"]),  # it would admit an empty bearer
    (["--api-key", "k", " "], ["--api-key must not be empty"]),
    (["--default-chat-template-kwargs", '{"add_generation_prompt": false}'],
     ["--default-chat-template-kwargs", "add_generation_prompt"]),
    (["-dp", "2", "--distributed-executor-backend", "uni"],
     ["data_parallel_size > 1", "'uni'"]),
])
def test_unhonourable_flags_fail_at_start(flags: list[str], needles: list[str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _serve(["--device", "cpu", MODEL, *flags] if "--device" not in flags
                     else [MODEL, *flags], capsys)
    assert rc == 2, err
    for needle in needles:
        assert needle in err


TOOL_PARSER = (  # a one-file tool parser plugin's parser
    "from ironlm.interfaces.tool_parser import ExtractedToolCalls, StreamDelta, ToolParser\n"
    "class Tools(ToolParser):\n"
    "    name = '{name}'\n"
    "    def extract(self, text): return ExtractedToolCalls(False, [], text)\n"
    "    def extract_streaming(self, delta): return StreamDelta(content=delta)\n"
    "    def finish_streaming(self): return StreamDelta()\n"
    "@hookimpl\n"
    "def register_tool_parsers(register):\n"
    "    register(Tools)\n"
)
REASONING_PARSER = (  # a one-file reasoning parser plugin's parser
    "from ironlm.interfaces.reasoning_parser import ReasoningDelta, ReasoningParser\n"
    "class Thoughts(ReasoningParser):\n"
    "    name = '{name}'\n"
    "    end_marker = '[/THINK]'\n"
    "    def extract(self, text): return None, text\n"
    "    def extract_streaming(self, delta): return ReasoningDelta(content=delta)\n"
    "    def finish_streaming(self): return ReasoningDelta()\n"
    "@hookimpl\n"
    "def register_reasoning_parsers(register):\n"
    "    register(Thoughts)\n"
)


def _plugin_file(path: Path, *parts: str) -> Path:
    path.write_text("from ironlm import hookimpl\n" + "".join(parts))
    return path


def test_tool_parser_plugin_file_registers(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    plugin = _plugin_file(tmp_path / "my_parser.py", TOOL_PARSER.format(name="mine"))
    # The plugin's parser is selectable; start-up then stops at the next bad flag.
    rc, err = _serve(["--device", "cpu", MODEL, "--tool-parser-plugin", str(plugin),
                      "--tool-call-parser", "mine", "--quantization", "nope"], capsys)
    assert rc == 2 and "quantization 'nope'" in err and "tool_call_parser" not in err


def test_reasoning_parser_plugin_file_registers(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A single-file reasoning parser (vLLM's --reasoning-parser-plugin) is selectable by
    --reasoning-parser; a file without the hook is refused, naming it."""
    plugin = _plugin_file(tmp_path / "my_reasoner.py", REASONING_PARSER.format(name="mine"))
    rc, err = _serve(["--device", "cpu", MODEL, "--reasoning-parser-plugin", str(plugin),
                      "--reasoning-parser", "mine", "--quantization", "nope"], capsys)
    assert rc == 2 and "quantization 'nope'" in err and "reasoning_parser" not in err
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    rc, err = _serve(["--device", "cpu", MODEL, "--reasoning-parser-plugin", str(empty)], capsys)
    assert rc == 2 and "defines no register_reasoning_parsers hook" in err


def test_one_plugin_file_for_both_parser_flags(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM users share one file between --tool-parser-plugin and --reasoning-parser-plugin:
    it registers once, and both its parsers are selectable."""
    plugin = _plugin_file(tmp_path / "both.py", TOOL_PARSER.format(name="both_tools"),
                          REASONING_PARSER.format(name="both_thoughts"))
    rc, err = _serve(["--device", "cpu", MODEL, "--tool-parser-plugin", str(plugin),
                      "--reasoning-parser-plugin", str(plugin), "--tool-call-parser",
                      "both_tools", "--reasoning-parser", "both_thoughts", "--quantization",
                      "nope"], capsys)
    assert rc == 2 and "quantization 'nope'" in err and "registered twice" not in err


def test_module_entry_point(monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("IRONLM_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert api_server_main([MODEL]) == 2
    assert "platform" in capsys.readouterr().err


def test_a_port_in_use_fails_before_the_model_loads(
    smollm2_dir: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The server binds its port before the engine starts (so no worker's process group can
    take it first): a port in use is a start-up error, exit status 2, before any loading."""
    import logging
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level(logging.INFO):
            rc, err = _serve(["--device", "cpu", str(smollm2_dir), "--host", "127.0.0.1",
                              "--port", str(port)], capsys)
    assert rc == 2, err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "in use" in err, err
    assert "loading" not in caplog.text


@pytest.mark.parametrize("env", ["IRONLM_API_KEY", "VLLM_API_KEY"])
def test_a_blank_key_variable_fails_at_start(env: str, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # a secret mount of "\n" would otherwise serve with no key at all
    monkeypatch.setenv(env, " \n")
    rc, err = _serve(["--device", "cpu", MODEL], capsys)
    assert rc == 2 and env in err

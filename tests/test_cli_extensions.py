"""Commands from other distributions (entry-point group ``ironlm.commands``): ``ironlm bench``
comes from ironlm-bench this way; a missing or broken one explains itself and leaves the
core's commands alone. Fake distributions are 'installed' as pip leaves them: a module and a
dist-info with an entry point, on sys.path."""

from __future__ import annotations

from pathlib import Path

import pytest
from ironlm.cli import Cli

HELLO = '''
def add_parser(sub):
    p = sub.add_parser("hello", help="say hello")
    p.add_argument("--name", default="world")
    p.set_defaults(func=lambda args: print(f"hello {args.name}") or 0)
'''
BROKEN = '''
def add_parser(sub):
    sub.add_parser("broken", help="half built")  # fails half-way
    raise RuntimeError("boom")
'''


@pytest.fixture()
def fake_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    prefix = "cmd_" + "".join(c if c.isalnum() else "_" for c in tmp_path.name)
    (tmp_path / f"{prefix}_hello.py").write_text(HELLO)
    (tmp_path / f"{prefix}_broken.py").write_text(BROKEN)
    info = tmp_path / "ironlm_fakecmds-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ironlm-fakecmds\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(
        f"[ironlm.commands]\nhello = {prefix}_hello:add_parser\n"
        f"broken = {prefix}_broken:add_parser\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_bench_comes_from_its_distribution() -> None:
    cli = Cli()
    assert "bench" not in cli.unavailable
    assert "benchmark IronLM" in cli.parser.format_help()
    args = cli.parser.parse_args(["bench", "latency", "--model", "m", "--batch-size", "2"])
    assert args.func.__module__ == "ironlm_bench.latency" and args.batch_size == 2


def test_missing_bench_says_how_to_install(capsys: pytest.CaptureFixture[str]) -> None:
    cli = Cli(commands=[])  # as with the core alone: no ironlm-bench entry point
    assert "bench" in cli.parser.format_help()  # still listed, with the hint
    assert cli.run(["bench", "throughput", "--model", "m", "--num-prompts", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ironlm bench: not installed") and "pip install ./benchmarks" in err
    assert cli.run(["bench", "--help"]) == 2


def test_extension_command_runs(fake_commands: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli = Cli()
    assert "say hello" in cli.parser.format_help()
    assert cli.run(["hello", "--name", "ironlm"]) == 0
    assert capsys.readouterr().out == "hello ironlm\n"


def test_broken_extension_is_refused_and_leaves_serve_working(
        fake_commands: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli = Cli()
    assert cli.run(["broken", "x"]) == 2
    err = capsys.readouterr().err
    assert "ironlm-fakecmds is installed but broken" in err and "RuntimeError: boom" in err
    assert "half built" not in cli.parser.format_help()  # nothing left from the failed attempt
    args = cli.parser.parse_args(["serve", "m", "--kv-cache-memory", "8MiB"])
    assert args.model_tag == "m" and args.kv_cache_memory == 8 << 20
    assert "bench" not in cli.unavailable and cli.run(["hello"]) == 0

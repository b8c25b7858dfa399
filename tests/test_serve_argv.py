"""vLLM's command-line conventions on ``ironlm serve``: ``--snake_case`` flags and
``--config FILE.yaml`` (the command line's own flags win), applied before parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from ironlm.cli import Cli
from ironlm.entrypoints.openai.cli_args import engine_config_from_args, expand_argv, make_parser


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


def test_a_bad_config_is_a_usage_error(tmp_path: Path) -> None:
    cfg = tmp_path / "list.yaml"
    cfg.write_text("- 1\n- 2\n")
    for bad in (str(cfg), str(tmp_path / "missing.yaml")):
        with pytest.raises(SystemExit) as exit_info:
            Cli().run(["serve", "m", "--config", bad])
        assert exit_info.value.code == 2

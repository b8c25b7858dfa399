"""ironlm.model_loader.downloads and ``ironlm download-test-model``: the cached HF folders of the real test
models, their tokenizers and chat templates, the CLI, and concurrent first use."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open
from transformers import AutoTokenizer

from ironlm.cli import main as cli_main
from ironlm.model_loader.downloads import cache_root, ensure_test_gguf, ensure_test_model

pytestmark = pytest.mark.real_model

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.mark.parametrize(
    "name, architecture, eos",
    [("smollm2", "LlamaForCausalLM", 2), ("gemma3", "Gemma3ForCausalLM", [1, 106])],
)
def test_folder_contents(name: str, architecture: str, eos: object) -> None:
    folder = ensure_test_model(name)
    assert folder == cache_root() / "models" / name
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [architecture]
    assert "quantization_config" not in config
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == eos
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        name0 = next(iter(f.keys()))
        assert str(f.get_tensor(name0).dtype) == "torch.float32"
    assert ensure_test_gguf(name).suffix == ".gguf"
    # cached: a second call returns at once without rebuilding
    mtime = (folder / "model.safetensors").stat().st_mtime
    assert ensure_test_model(name) == folder
    assert (folder / "model.safetensors").stat().st_mtime == mtime


def test_chat_templates() -> None:
    smol = AutoTokenizer.from_pretrained(ensure_test_model("smollm2"))
    assert smol.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
        "What is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    gemma = AutoTokenizer.from_pretrained(ensure_test_model("gemma3"))
    text = gemma.apply_chat_template(
        MESSAGES
        + [{"role": "assistant", "content": "Paris."}, {"role": "user", "content": "Why?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nWhat is the capital of France?<end_of_turn>\n"
        "<start_of_turn>model\nParis.<end_of_turn>\n<start_of_turn>user\nWhy?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    # the rendered prompt starts with exactly one <bos> when tokenized without specials
    assert gemma(text, add_special_tokens=False).input_ids[:2] == [2, 105]


def test_unknown_name() -> None:
    with pytest.raises(ValueError, match="known: \\['gemma3', 'smollm2'\\]"):
        ensure_test_model("llama-70b")  # type: ignore[arg-type]


def test_cache_dir_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IRONLM_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path
    assert cache_root(tmp_path / "x") == tmp_path / "x"


def test_cli_prints_paths(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["download-test-model", "smollm2"]) == 0
    assert capsys.readouterr().out.strip() == str(ensure_test_model("smollm2"))
    assert cli_main(["download-test-model", "gemma3", "--gguf"]) == 0
    assert capsys.readouterr().out.strip() == str(ensure_test_gguf("gemma3"))
    with pytest.raises(SystemExit):
        cli_main(["download-test-model", "nope"])


def test_concurrent_first_use_builds_once(tmp_path: Path) -> None:
    """Two processes converting into an empty cache at once: one builds under the lock, the
    other waits and reuses it; no temporary folder is left behind. (The GGUF is seeded from the
    shared cache so that the test does not download.)"""
    (tmp_path / "gguf").mkdir()
    source = ensure_test_gguf("smollm2")
    target = tmp_path / "gguf" / source.name
    try:
        os.link(source, target)
    except OSError:
        shutil.copy(source, target)
    code = (
        "import sys; from pathlib import Path; from ironlm.model_loader.downloads import ensure_test_model; "
        "print(ensure_test_model('smollm2', Path(sys.argv[1])))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=900)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs == [str(tmp_path / "models" / "smollm2")] * 2
    leftovers = [p.name for p in (tmp_path / "models").iterdir() if "build" in p.name]
    assert leftovers == []
    assert (tmp_path / "models" / "smollm2" / "chat_template.jinja").is_file()

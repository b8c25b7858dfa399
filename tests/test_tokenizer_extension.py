"""--tokenizer-extension-path / LLM(tokenizer_extension_path=...): a Python file defining
extend_tokenizer(tokenizer) -> tokenizer, called once after the tokenizer loads; a broken
file stops start-up with an error naming the flag (before any worker starts)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ironlm import LLM, SamplingParams

# A chat template that marks every message, so the test sees the extension took effect
EXTENSION = '''
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\\nEXTENDED: {{ m['content'] }}"
    "<|im_end|>\\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}"
)


def extend_tokenizer(tokenizer):
    tokenizer.chat_template = TEMPLATE
    tokenizer.extension_calls = getattr(tokenizer, "extension_calls", 0) + 1
    return tokenizer
'''


def test_extension_customises_the_tokenizer_on_the_real_model(smollm2_dir: Path,
                                                              tmp_path: Path) -> None:
    ext = tmp_path / "my_tokenizer_ext.py"
    ext.write_text(EXTENSION)
    llm = LLM(str(smollm2_dir), max_model_len=256, kv_cache_memory=16 << 20,
              tokenizer_extension_path=str(ext))
    tok = llm.get_tokenizer()
    assert tok.extension_calls == 1  # called once, and its result is the engine's tokenizer
    out = llm.chat([{"role": "user", "content": "Say hi."}],
                   SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert out[0].prompt == "<|im_start|>user\nEXTENDED: Say hi.<|im_end|>\n<|im_start|>assistant\n"
    assert len(out[0].outputs[0].token_ids) == 3


@pytest.mark.parametrize(("source", "needle"), [
    (None, "is not a file"),
    ("def other(tokenizer):\n    return tokenizer\n", "defines no function extend_tokenizer"),
    ("import no_such_module_here\n", "failed to import: ModuleNotFoundError"),
    ("def extend_tokenizer(tokenizer):\n    raise RuntimeError('boom')\n",
     "extend_tokenizer raised RuntimeError: boom"),
    ("def extend_tokenizer(tokenizer):\n    tokenizer.x = 1\n", "must return the tokenizer"),
])
def test_broken_extension_is_a_start_up_error(smollm2_dir: Path, tmp_path: Path,
                                              source: str | None, needle: str) -> None:
    ext = tmp_path / "ext.py"
    if source is not None:
        ext.write_text(source)
    with pytest.raises(ValueError, match="--tokenizer-extension-path") as err:
        LLM(str(smollm2_dir), tokenizer_extension_path=str(ext))
    assert needle in str(err.value)

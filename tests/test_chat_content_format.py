"""--chat-template-content-format (entrypoints/chat_content_format.py): which form of message
content a template gets, detected from the template as vLLM's "auto", and what SmolLM2
generates through a template that reads content as a list of parts."""

from __future__ import annotations

from pathlib import Path

import pytest

from ironlm.entrypoints.chat_content_format import detect_content_format, resolve_content_format
from ironlm.entrypoints.chat_utils import normalize_messages

LOOP = "{% for message in messages %}{% for part in message['content'] %}{{ part.text }}" \
       "{% endfor %}{% endfor %}"


@pytest.mark.parametrize(("template", "expected"), [
    (LOOP, "openai"),
    # through a sliced copy of the messages, attribute access and a filter
    ("{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% if m.content is "
     "string %}{{ m.content }}{% else %}{% for c in m.content | selectattr('type', 'equalto', "
     "'text') %}{{ c.text }}{% endfor %}{% endif %}{% endfor %}", "openai"),
    # a name set from the content
    ("{% for m in messages %}{% set c = m['content'] %}{% for p in c %}{{ p }}{% endfor %}"
     "{% endfor %}", "openai"),
    # Hugging Face's generation blocks parse
    ("{% for m in messages %}{% generation %}{% for p in m.content %}{{ p.text }}{% endfor %}"
     "{% endgeneration %}{% endfor %}", "openai"),
    # loops over other fields, or over a content that is not a message's
    ("{% for m in messages %}{% for x in m.tool_calls %}{{ x }}{% endfor %}{{ m.content }}"
     "{% endfor %}", "string"),
    ("{% for x in content %}{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}",
     "string"),
    ("{% if %}", "string"),  # does not parse: rendering will say why
])
def test_detect(template: str, expected: str) -> None:
    assert detect_content_format(template) == expected


@pytest.mark.real_model
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_real_templates_take_text(model: str, request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(f"{model}_dir")
    assert detect_content_format((folder / "chat_template.jinja").read_text()) == "string"


def test_resolve() -> None:
    assert resolve_content_format("openai", "{{ x }}") == "openai"
    assert resolve_content_format("auto", LOOP) == "openai"
    assert resolve_content_format("auto", {"default": LOOP}) == "string"  # not one template
    with pytest.raises(ValueError, match="chat_template_content_format"):
        resolve_content_format("parts", LOOP)


def test_normalize_both_forms() -> None:
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": []},
                {"role": "user", "content": [{"type": "text", "text": "a"},
                                             {"type": "refusal", "refusal": "b"}]}]
    assert [m["content"] for m in normalize_messages(messages)] == ["hi", "", "a\nb"]
    assert [m["content"] for m in normalize_messages(messages, "openai")] == [
        [{"type": "text", "text": "hi"}], [],
        [{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "b"}]]
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    for fmt in ("string", "openai"):
        with pytest.raises(ValueError, match="image_url"):
            normalize_messages(image, fmt)


@pytest.mark.real_model
def test_smollm2_through_a_parts_template(smollm2_dir: Path) -> None:
    """SmolLM2's own ChatML written to loop over content parts: with auto it renders the
    prompt of SmolLM2's template and generates the same greedy reply; held to "string" the
    loop walks the characters of each text and the prompt loses them."""
    from ironlm import LLM, SamplingParams

    parts = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% for p in m.content %}"
             "{{ p.text }}{% endfor %}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    chat = [{"role": "system", "content": "You are a helpful AI assistant named SmolLM, "
             "trained by Hugging Face"}, {"role": "user", "content": "Name a color."}]
    llm = LLM(str(smollm2_dir), dtype="float32", max_model_len=256,
              kv_cache_memory=32 * 2**20)
    greedy = SamplingParams(max_tokens=8, temperature=0)
    own = llm.chat(chat, greedy, use_tqdm=False)[0]
    auto = llm.chat(chat, greedy, use_tqdm=False, chat_template=parts)[0]
    assert auto.prompt_token_ids == own.prompt_token_ids
    assert auto.outputs[0].text == own.outputs[0].text
    held = llm.chat(chat, greedy, use_tqdm=False, chat_template=parts,
                    chat_template_content_format="string")[0]
    assert "Name a color" not in (held.prompt or "")

"""Default sampling parameters from the model's generation config (vLLM's --generation-config,
--override-generation-config): the source rules, the offline API and the server on the real
model."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest
from transformers import GenerationConfig

from ironlm import LLM, SamplingParams
from ironlm.engine.sampling_defaults import default_sampling
from ironlm.entrypoints.openai.cli_args import engine_config_from_args, make_parser
from ironlm.entrypoints.openai.protocol import ChatCompletionRequest
from ironlm.entrypoints.openai.request_inputs import check_context_length, sampling_params
from server_utils import RemoteServer

MAKER = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05,
         "repetition_penalty": 1.1, "max_new_tokens": 64, "do_sample": True,
         "eos_token_id": 2, "bos_token_id": 1}


def _folder(tmp_path: Path, values: dict[str, object]) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "generation_config.json").write_text(json.dumps(values))
    return tmp_path


def test_auto_takes_the_model_makers_sampling_fields(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ironlm.engine"):
        out = default_sampling("auto", GenerationConfig(**MAKER), {})
    assert out == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05,
                   "repetition_penalty": 1.1, "max_tokens": 64}
    assert "--generation-config vllm" in caplog.text  # the start-up notice names the way out
    assert default_sampling("auto", None, {}) == {}  # no file (a GGUF): SamplingParams' own


def test_vllm_reads_none_and_a_folder_is_read_instead(tmp_path: Path) -> None:
    assert default_sampling("vllm", GenerationConfig(**MAKER), {}) == {}
    other = _folder(tmp_path / "other", {"temperature": 0.3, "top_k": 0})
    # a folder replaces the model's file; transformers' top_k 0 ("none") is SamplingParams' -1
    assert default_sampling(str(other), GenerationConfig(**MAKER), {}) == {
        "temperature": 0.3, "top_k": -1}
    with pytest.raises(ValueError, match="generation_config .*no generation_config.json"):
        default_sampling(str(tmp_path / "missing"), None, {})


def test_the_override_is_laid_over_and_names_what_it_may_set() -> None:
    out = default_sampling("auto", GenerationConfig(**MAKER),
                           {"temperature": 0.9, "max_new_tokens": 8})
    assert out["temperature"] == 0.9 and out["max_tokens"] == 8 and out["top_k"] == 20
    assert default_sampling("vllm", None, {"top_p": 0.5}) == {"top_p": 0.5}
    with pytest.raises(ValueError, match=r"override_generation_config: \['do_sample'\]"):
        default_sampling("auto", None, {"do_sample": True})
    with pytest.raises(ValueError, match="temperature"):  # SamplingParams' own check
        default_sampling("vllm", None, {"temperature": -1.0})


def test_values_are_numbers_of_the_field_s_kind() -> None:
    # JSON has no int / float distinction worth trusting: 20.0 is top-k 20, 2.5 is refused
    assert default_sampling("vllm", None, {"top_k": 20.0, "max_new_tokens": 8.0,
                                           "temperature": 1}) == {
        "top_k": 20, "max_tokens": 8, "temperature": 1.0}
    assert isinstance(default_sampling("vllm", None, {"top_k": 20.0})["top_k"], int)
    for bad in ({"top_k": 2.5}, {"temperature": "0.5"}, {"top_p": True}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))} must be"):
            default_sampling("vllm", None, bad)
    # a value the model's own file holds that SamplingParams refuses names the way out
    with pytest.raises(ValueError, match="--generation-config vllm"):
        default_sampling("auto", GenerationConfig(repetition_penalty=-1.0), {})


def test_flags_parse_into_the_engine_config() -> None:
    args = make_parser().parse_args(
        ["m", "--generation-config", "vllm", "--override-generation-config", '{"top_k": 5}'])
    config = engine_config_from_args(args)
    assert config.generation_config == "vllm" and config.override_generation_config == {"top_k": 5}
    config = engine_config_from_args(make_parser().parse_args(["m"]))
    assert config.generation_config == "auto" and config.override_generation_config == {}


def test_unset_request_fields_take_the_defaults_and_set_ones_win() -> None:
    defaults = default_sampling("auto", GenerationConfig(**MAKER), {})
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], top_p=0.5)
    params = sampling_params(req, max_tokens=10, logprobs=None, defaults=defaults)
    assert (params.temperature, params.top_p, params.top_k, params.min_p,
            params.repetition_penalty) == (0.6, 0.5, 20, 0.05, 1.1)
    plain = sampling_params(req, max_tokens=10, logprobs=None)
    assert (plain.temperature, plain.top_k) == (1.0, -1)
    # max_new_tokens caps the output: what is left of the context, and what a request asks
    assert check_context_length(100, None, 512, 64) == 64
    assert check_context_length(100, 300, 512, 64) == 64
    assert check_context_length(100, 30, 512, 64) == 30


@pytest.fixture(scope="module")
def maker_model(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 whose generation_config.json recommends top-k 1 (so its default sampling is
    greedy whatever the temperature) and at most 5 new tokens."""
    out = tmp_path_factory.mktemp("smollm2-maker-defaults")
    for f in smollm2_dir.iterdir():
        if f.name != "generation_config.json":
            (out / f.name).symlink_to(f)
    values = json.loads((smollm2_dir / "generation_config.json").read_text())
    values.update({"temperature": 0.9, "top_k": 1, "max_new_tokens": 5, "do_sample": True})
    (out / "generation_config.json").write_text(json.dumps(values))
    return out


PROMPT = "Write a short poem about the moon and the stars:"


@pytest.mark.real_model
def test_offline_generate_without_params_uses_the_model_makers(maker_model: Path) -> None:
    llm = LLM(str(maker_model), max_model_len=256, kv_cache_memory=32 << 20, dtype="float32")
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_k, defaults.max_tokens) == (0.9, 1, 5)
    greedy = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=5),
                          use_tqdm=False)[0].outputs[0].token_ids
    for _ in range(2):  # top-k 1 at temperature 0.9: the greedy tokens, 5 of them
        out = llm.generate(PROMPT, use_tqdm=False)[0].outputs[0]
        assert out.token_ids == greedy and out.finish_reason == "length"
    # SamplingParams given: theirs alone (16 tokens by default, sampled from the whole row)
    assert len(llm.generate(PROMPT, SamplingParams(ignore_eos=True), use_tqdm=False)[0]
               .outputs[0].token_ids) == 16


@pytest.mark.real_model
def test_server_requests_take_the_defaults_and_the_cap(maker_model: Path) -> None:
    args = ["--max-model-len", "256", "--kv-cache-memory", "32MiB", "--dtype", "float32",
            "--served-model-name", "m", "--override-generation-config",
            '{"max_new_tokens": 4}']
    with RemoteServer(maker_model, args) as server:
        client = server.openai_client()
        messages = [{"role": "user", "content": PROMPT}]
        greedy = client.chat.completions.create(model="m", messages=messages, temperature=0)
        assert greedy.usage.completion_tokens == 4  # the override's cap, max_tokens unset
        for seed in (1, 2):  # unset temperature / top_k: the file's (top-k 1: greedy)
            r = client.chat.completions.create(model="m", messages=messages, seed=seed,
                                               max_tokens=50)
            assert r.choices[0].message.content == greedy.choices[0].message.content
            assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length"
        # a request's own top_k wins over the file's: at temperature 2 over the whole row
        drawn = {client.completions.create(model="m", prompt=PROMPT, seed=s, temperature=2.0,
                                           max_tokens=4, extra_body={"top_k": -1}).choices[0].text
                 for s in (1, 2, 3)}
        text = client.completions.create(model="m", prompt=PROMPT, temperature=0,
                                         max_tokens=4).choices[0].text
        assert drawn != {text}
        assert "generation config" in server.log_text()
        r = httpx.post(server.url("/v1/completions"), json={
            "model": "m", "prompt": PROMPT, "temperature": 0, "max_tokens": 3})
        assert r.json()["usage"]["completion_tokens"] == 3  # below the cap: as asked


def test_a_refused_override_stops_the_engine_naming_it(smollm2_dir: Path) -> None:
    with pytest.raises(ValueError, match="override_generation_config"):
        LLM(str(smollm2_dir), override_generation_config={"num_beams": 4})

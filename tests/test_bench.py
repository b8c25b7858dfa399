"""``ironlm bench``: the commands end to end on the tiny model, and their pieces.

No timed assertions: these check that every engine made exactly the tokens asked for, that the
figures are consistent with the timings, and that the JSON results hold what they promise.
"""

from __future__ import annotations

import importlib.util
import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from ironlm.cli import main as ironlm_main
from ironlm_bench.results import batch_figures, comparison_table, write_result
from ironlm_bench.runners import BatchTiming
from ironlm_bench.stats import summarize

ENGINE = ["--kv-cache-memory", "16MiB", "--threads", "1"]


def _only_json(folder: Path) -> dict[str, Any]:
    files = list(folder.glob("*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


# -- pieces ----------------------------------------------------------------------------------
def test_summarize_percentiles() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0])
    assert s["mean"] == pytest.approx(2.5)
    assert s["p50"] == pytest.approx(2.5)
    assert s["p99"] == pytest.approx(3.97)
    assert all(math.isnan(v) for v in summarize([]).values())  # no samples: NaN


def test_batch_figures_from_timing() -> None:
    t = BatchTiming(ttft=[0.5, 1.0], e2e=[2.0, 4.0], prompt_tokens=[8, 8], output_tokens=[5, 5])
    f = batch_figures(t)
    assert f["elapsed_s"] == 4.0
    assert f["requests_per_s"] == pytest.approx(0.5)
    assert f["output_tok_s"] == pytest.approx(2.5)
    assert f["total_tok_s"] == pytest.approx(6.5)
    assert f["ttft_batch_s"] == 1.0 and f["ttft_mean_s"] == 0.75
    assert t.decode_tok_s() == pytest.approx([4 / 1.5, 4 / 3.0])


def test_comparison_table_ratios_ours_over_baseline() -> None:
    engines = {"ironlm": {"tok": 30.0, "ttft": 1.0}, "hf": {"tok": 10.0, "ttft": 4.0}}
    table, ratios = comparison_table([("tok", "tok/s", True), ("ttft", "TTFT", False)], engines)
    assert ratios == {"hf": {"tok": 3.0, "ttft": 0.25}}
    assert "3.00x" in table and "ironlm/hf" in table


def test_result_files_are_strict_json(tmp_path: Path) -> None:
    path = write_result(tmp_path / "r.json", {"a": float("nan"), "b": [float("inf"), 1.5]})
    assert json.loads(path.read_text()) == {"a": None, "b": [None, 1.5]}


def test_random_prompts_are_seeded_and_skip_special_tokens(tiny_llama_dir: Path) -> None:
    from ironlm_bench.prompts import load_tokenizer, random_token_prompts

    tok = load_tokenizer(str(tiny_llama_dir))
    a = random_token_prompts(3, 16, tok, seed=7)
    assert a == random_token_prompts(3, 16, tok, seed=7)
    assert a != random_token_prompts(3, 16, tok, seed=8)
    assert all(len(p) == 16 for p in a)
    assert not set().union(*a) & set(tok.all_special_ids)


def test_machine_limits_and_model_cost(tiny_llama_dir: Path) -> None:
    from ironlm_bench.machine import bounds, describe_machine, measure_limits, model_cost
    from ironlm.model_loader import resolve_model

    machine = describe_machine(1)
    assert machine["logical_cores"] >= 1 and len(machine["load_average_at_start"]) == 3
    limits = measure_limits(1, tensor_bytes=16 * 1024**2, matmul_n=128, repeats=1)
    assert limits.read_bandwidth_gbs > 0 and limits.matmul_gflops > 0
    assert limits.matmul_bf16_gflops > 0
    cost = model_cost(resolve_model(str(tiny_llama_dir)).hf_config, 4)
    # tied embeddings: the 49152 x 64 table is read once per token, as the LM head
    assert cost.params == cost.params_per_token > 49152 * 64
    b = bounds(limits, cost, "float32")
    assert b["decode_bandwidth_bound_tok_s"] > 0
    assert b["batch_compute_bound_tok_s"] == limits.matmul_gflops * 1e9 / cost.flops_per_token
    # a bf16 engine is bounded by the bf16 matmul peak
    b16 = bounds(limits, model_cost(resolve_model(str(tiny_llama_dir)).hf_config, 2), "bfloat16")
    assert b16["batch_compute_bound_tok_s"] == pytest.approx(
        limits.matmul_bf16_gflops * 1e9 / cost.flops_per_token)
    assert b16["decode_bandwidth_bound_tok_s"] == pytest.approx(
        2 * b["decode_bandwidth_bound_tok_s"])


def test_roofline_prices_each_step_at_the_slower_of_its_flops_and_bytes() -> None:
    from ironlm_bench.machine import ModelCost
    from ironlm_bench.roofline import KvCost, batch_bound_tok_s, batch_seconds

    cost = ModelCost(params=1000, params_per_token=1000, bytes_per_param=2, head_params=100)
    kv = KvCost(layer_bytes=10, full_layers=2, window_layers=0, window=0)
    # 1000 FLOP/s and 1000 B/s. Prefill: 8 prompt tokens through the layers (1800 FLOPs each)
    # and one head row per prompt (200) = 14800 FLOPs (14.8 s) against 2000 weight bytes (2 s).
    # Decode step 1: the first request alone (2 outputs): 2000 FLOPs (2 s) against the weights
    # and its 4 tokens of KV in 2 layers: 2000 + 4 * 2 * 10 = 2080 bytes (2.08 s).
    seconds = batch_seconds([3, 5], [2, 1], cost, kv, 1e-6, 1e-6, 2000)
    assert seconds == pytest.approx(14.8 + 2.08)
    assert batch_bound_tok_s([3, 5], [2, 1], cost, kv, 1e-6, 1e-6, 2000) == pytest.approx(
        11 / (14.8 + 2.08))
    # fewer bytes read (a quantized engine's weights): the compute side prices decode
    assert batch_seconds([3, 5], [2, 1], cost, kv, 1e-6, 1e-6, 1000) == pytest.approx(14.8 + 2.0)
    # sliding-window layers read at most their window
    windowed = KvCost(layer_bytes=10, full_layers=1, window_layers=5, window=4)
    assert windowed.bytes_for(10) == 10 * (10 + 5 * 4)
    assert windowed.bytes_for(3) == 10 * 6 * 3


def test_roofline_of_the_real_models(smollm2_dir: Path, gemma3_dir: Path) -> None:
    from ironlm_bench.machine import model_cost
    from ironlm_bench.roofline import KvCost, batch_bound_tok_s, kv_cost
    from ironlm.model_loader import resolve_model

    smollm2 = resolve_model(str(smollm2_dir)).hf_config
    # 30 layers, 3 KV heads of 64: K and V in bf16
    assert kv_cost(smollm2, 2) == KvCost(2 * 3 * 64 * 2, 30, 0, 0)
    # Gemma 3 270M: 18 layers, 1 KV head of 256, five sliding layers (512 tokens) to one full
    assert kv_cost(resolve_model(str(gemma3_dir)).hf_config, 4) == KvCost(2 * 256 * 4, 3, 15, 512)
    cost = model_cost(smollm2, 2)
    assert cost.head_params == 49152 * 576  # tied: the embedding table is the head
    kv = kv_cost(smollm2, 2)
    batch = ([64] * 64, [128] * 64)
    # the bench's batch at a 2 TFLOP/s bf16 reading and 20 GB/s: bytes bound every decode step,
    # so the roofline sits well below the compute bound (the AMX Xeon of issue #16)
    roof = batch_bound_tok_s(*batch, cost, kv, 2000.0, 20.0, cost.weight_bytes_per_token)
    assert roof < 0.75 * 2000e9 / cost.flops_per_token
    # at a low peak the FLOPs bound it, and only the head rows prefill skips lift it above
    roof = batch_bound_tok_s(*batch, cost, kv, 100.0, 20.0, cost.weight_bytes_per_token)
    assert 100e9 / cost.flops_per_token < roof < 1.2 * 100e9 / cost.flops_per_token


# -- commands end to end ---------------------------------------------------------------------
def test_bench_throughput_with_hf_baseline(tiny_llama_dir: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    rc = ironlm_main([
        "bench", "throughput", "--model", str(tiny_llama_dir), "--num-prompts", "3",
        "--input-len", "8", "--output-len", "5", "--baseline", "hf",
        "--result-dir", str(tmp_path), *ENGINE,
    ])
    out = capsys.readouterr().out
    assert rc == 0
    assert "ironlm/hf" in out and "total tok/s" in out
    data = _only_json(tmp_path)
    assert data["kind"] == "throughput"
    assert set(data["engines"]) == {"ironlm", "hf"}
    for fig in data["engines"].values():
        assert fig["num_requests"] == 3
        assert fig["output_tokens"] == 15  # EOS ignored: exactly --output-len each
        assert fig["prompt_tokens"] == 24
        assert fig["ttft_batch_s"] <= fig["elapsed_s"]
        assert fig["peak_rss_mib"] > 0
        assert fig["single_decode_tok_s"] > 0
        assert fig["compute_bound_fraction"] > 0
        assert fig["roofline_bound_fraction"] > 0
    assert data["kv_cost"]["full_layers"] == 2  # the tiny Llama's layers
    assert data["engines"]["ironlm"]["kv_cache_mib"] == pytest.approx(16, rel=0.05)
    assert data["ratios"]["hf"]["output_tok_s"] > 0
    assert data["machine"]["threads"] == 1 and data["limits"]["read_bandwidth_gbs"] > 0
    assert data["args"]["num_prompts"] == 3


def test_bench_throughput_dataset_file(tiny_llama_dir: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello there\n\nWhat is the capital of France?\n")
    out = tmp_path / "result.json"
    rc = ironlm_main([
        "bench", "throughput", "--model", str(tiny_llama_dir), "--dataset", str(prompts),
        "--num-prompts", "3", "--output-len", "3", "--no-single-stream",
        "--skip-machine-limits", "--result-file", str(out), *ENGINE,
        "--lora-counts", "2", "--lora-rank", "8", "--lora-merged-baseline",
        "--temperature", "0.8",  # every engine samples (HF + peft merged: do_sample)
    ])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["args"]["temperature"] == 0.8
    fig = data["engines"]["ironlm"]
    assert fig["num_requests"] == 3 and fig["output_tokens"] == 9
    assert "single_decode_tok_s" not in fig
    # --lora-counts: the batch again over 2 random rank-8 adapters, IronLM and HF + peft merged
    lora = data["extra"]["lora"]
    assert set(lora) == {"ironlm-lora2", "hf-merged-lora2"}
    assert lora["ironlm-lora2"]["info"]["lora_adapters"] == 2
    assert all(f["output_tokens"] == 9 for f in lora.values())


def test_bench_latency(tiny_llama_dir: Path, tmp_path: Path,
                       capsys: pytest.CaptureFixture[str]) -> None:
    rc = ironlm_main([
        "bench", "latency", "--model", str(tiny_llama_dir), "--batch-size", "1",
        "--input-len", "8", "--output-len", "4", "--num-iters", "3", "--num-iters-warmup", "1",
        "--skip-machine-limits", "--result-dir", str(tmp_path), *ENGINE,
    ])
    assert rc == 0
    assert "latency p99" in capsys.readouterr().out
    data = _only_json(tmp_path)
    fig = data["engines"]["ironlm"]
    assert data["kind"] == "latency" and fig["iterations"] == 3
    assert len(fig["latencies_s"]) == 3
    assert min(fig["latencies_s"]) <= fig["latency_p50_s"] <= fig["latency_p99_s"]
    assert fig["decode_tok_s"] > 0


def test_bench_latency_unquantized_baseline_and_weight_bytes(
        tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--baseline unquantized runs IronLM again without --quantization; both report the bytes
    of weights they hold."""
    args = ["bench", "latency", "--model", str(tiny_llama_dir), "--batch-size", "1",
            "--input-len", "8", "--output-len", "4", "--num-iters", "2", "--num-iters-warmup",
            "1", "--skip-machine-limits", "--result-dir", str(tmp_path), *ENGINE,
            "--dtype", "float32"]  # fmt: skip  (float32 whatever the CPU's auto dtype)
    assert ironlm_main([*args, "--baseline", "unquantized"]) == 2
    assert "--baseline unquantized" in capsys.readouterr().err
    rc = ironlm_main([*args, "--baseline", "unquantized", "--quantization", "weight_only_int8"])
    assert rc == 0
    assert "ironlm/unquantized" in capsys.readouterr().out
    data = _only_json(tmp_path)
    ours, base = data["engines"]["ironlm"], data["engines"]["unquantized"]
    assert ours["info"]["quantization"] == "weight_only_int8"
    assert base["info"]["quantization"] is None
    # tiny Llama's linears: 2 layers x (128x64 qkv, 64x64 o, 256x64 gate_up, 64x128 down) =
    # 73728 weights, float32 -> int8 plus a float32 scale per output row (1024 rows); the
    # float embedding and norms are the same in both
    saved = (base["weight_mib"] - ours["weight_mib"]) * 2**20
    assert saved == pytest.approx(73728 * 4 - 73728 - 1024 * 4)
    assert data["ratios"]["unquantized"]["decode_tok_s"] > 0


def test_bench_throughput_refuses_a_negative_temperature(
        tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = ironlm_main(["bench", "throughput", "--model", str(tiny_llama_dir), "--temperature",
                      "-1", "--skip-machine-limits", "--result-dir", str(tmp_path), *ENGINE])
    assert rc == 2 and "--temperature must be at least 0" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))


def test_bench_llama_cpp_baseline_missing_is_explained(
        tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("llama_cpp") is not None:
        pytest.skip("llama-cpp-python is installed: the baseline runs instead")
    rc = ironlm_main([
        "bench", "latency", "--model", str(tiny_llama_dir), "--baseline", "llama-cpp",
        "--gguf", str(tmp_path / "x.gguf"), "--result-dir", str(tmp_path), *ENGINE,
    ])
    err = capsys.readouterr().err
    assert rc == 2
    assert "llama-cpp-python is not installed" in err and "pip install" in err
    assert not list(tmp_path.glob("*.json"))


def test_bench_hf_overrides_with_a_baseline_is_refused(
        tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the baseline would load the model without the overrides: two different models
    rc = ironlm_main([
        "bench", "latency", "--model", str(tiny_llama_dir), "--baseline", "hf",
        "--hf-overrides", '{"rope_theta": 5.0}', "--result-dir", str(tmp_path), *ENGINE,
    ])
    assert rc == 2 and "--hf-overrides" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize("batched", [False, True])
def test_bench_real_llama_cpp_both_modes(
        smollm2_dir: Path, tmp_path: Path, batched: bool) -> None:
    """Both llama.cpp modes (one prompt after another; all prompts in one batch) on SmolLM2's
    GGUF. llama-cpp-python is an optional extra (a 16-minute compile), so CI skips this."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (optional extra)")
    from ironlm.model_loader.downloads import ensure_test_gguf

    rc = ironlm_main([
        "bench", "throughput", "--model", str(smollm2_dir), "--num-prompts", "3",
        "--input-len", "8", "--output-len", "6", "--baseline", "llama-cpp",
        "--gguf", str(ensure_test_gguf("smollm2")), "--no-single-stream",
        *(["--llama-cpp-batched"] if batched else []), "--result-dir", str(tmp_path),
        "--max-model-len", "128", *ENGINE,
    ])
    assert rc == 0
    data = _only_json(tmp_path)
    fig = data["engines"]["llama-cpp"]
    assert fig["output_tokens"] == 18 and fig["prompt_tokens"] == 24
    assert 0 < fig["ttft_batch_s"] <= fig["elapsed_s"]
    assert data["ratios"]["llama-cpp"]["output_tok_s"] > 0


def test_bench_profile(tiny_llama_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    rc = ironlm_main([
        "bench", "profile", "--model", str(tiny_llama_dir), "--batch-sizes", "1,2",
        "--input-len", "4", "--steps", "2", "--warmup-steps", "1", "--result-file", str(out),
        *ENGINE,
    ])
    assert rc == 0
    batches = json.loads(out.read_text())["batches"]
    assert [b["batch_size"] for b in batches] == [1, 2]
    assert all(b["top_ops"] and b["python"] and b["step_ms_mean"] > 0 for b in batches)
    functions = [p["function"] for b in batches for p in b["python"]]
    assert all(f.startswith("ironlm") and not f.startswith("ironlm_bench/") for f in functions)
    assert any(f.startswith("ironlm/engine/") for f in functions), functions


def test_bench_plot(tmp_path: Path) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed (pip install matplotlib)")
    for n in (1, 4):
        write_result(tmp_path / f"t{n}.json", {"kind": "throughput", "machine": {}, "engines": {
            "ironlm": {"num_requests": n, "output_tok_s": 10.0 * n},
            "hf": {"num_requests": n, "output_tok_s": 5.0 * n}}})
    png = tmp_path / "plot.png"
    assert ironlm_main(["bench", "plot", *map(str, tmp_path.glob("t*.json")),
                        "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- serve -----------------------------------------------------------------------------------
@pytest.mark.server
def test_bench_serve_against_ironlm_server(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from server_utils import RemoteServer

    out = tmp_path / "serve.json"
    with RemoteServer(tiny_llama_dir, ["--kv-cache-memory", "16MiB"]) as server:
        rc = ironlm_main([
            "bench", "serve", "--base-url", server.base_url, "--model", str(tiny_llama_dir),
            "--num-prompts", "6", "--input-len", "8", "--output-len", "5",
            "--max-concurrency", "3", "--result-file", str(out),
        ])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["completed"] == 6 and data["errors"] == 0
    assert data["total_output_tokens"] == 30  # ignore_eos: every request makes 5 tokens
    assert data["total_prompt_tokens"] == 48  # token-id prompts: exact lengths
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(data[key]) == {"mean", "p50", "p90", "p99"}
    assert data["ttft_ms"]["p50"] <= data["e2e_ms"]["p50"]


class _ForeignHandler(BaseHTTPRequestHandler):
    """A minimal OpenAI-style completions server (not IronLM): streams one character per
    chunk, sends no usage chunk, answers 500 to the prompt 'fail'."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["prompt"] == "fail":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b'{"error": "boom"}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(body["max_tokens"]):
            chunk = {"choices": [{"index": 0, "text": "a", "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def foreign_server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _ForeignHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_bench_serve_against_another_server(foreign_server: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\nfail\nworld\n")
    out = tmp_path / "serve.json"
    rc = ironlm_main([
        "bench", "serve", "--base-url", foreign_server, "--model", "other", "--dataset",
        str(prompts), "--num-prompts", "6", "--output-len", "4", "--request-rate", "50",
        "--result-file", str(out),
    ])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["completed"] == 4 and data["errors"] == 2
    assert "HTTP 500" in data["error_messages"][0]
    assert data["total_output_tokens"] == 16  # no usage chunk: one token per content chunk
    assert "failed requests:          2" in capsys.readouterr().out


# -- llama-cpp baseline through a stand-in package -------------------------------------------
_FAKE_LLAMA_CPP = '''
"""Stand-in for llama-cpp-python's high-level API (Llama.reset / Llama.generate)."""


class Llama:
    def __init__(self, model_path, **kwargs):
        self.kwargs = kwargs

    def reset(self):
        pass

    def generate(self, tokens, top_k=40, top_p=0.95, min_p=0.05, temp=0.8,
                 repeat_penalty=1.0, reset=True):
        assert temp == 0.0 and len(tokens) > 0
        while True:
            yield 7
'''


def test_bench_llama_cpp_baseline_runs_when_installed(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """The llama-cpp path end to end, with a stand-in package on PYTHONPATH (the real one
    compiles for ~16 minutes); it checks the plumbing, not llama.cpp."""
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("llama_cpp") is not None:
        pytest.skip("the real llama-cpp-python is installed")
    fake = tmp_path / "site" / "llama_cpp"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(_FAKE_LLAMA_CPP)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "result.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.run(
        [sys.executable, "-m", "ironlm.cli", "bench", "throughput", "--model",
         str(tiny_llama_dir), "--num-prompts", "2", "--input-len", "4", "--output-len", "3",
         "--baseline", "llama-cpp", "--gguf", str(gguf), "--skip-machine-limits",
         "--result-file", str(out), *ENGINE],
        check=False, capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ironlm/llama-cpp" in proc.stdout
    fig = json.loads(out.read_text())["engines"]["llama-cpp"]
    assert fig["output_tokens"] == 6 and fig["info"]["batching"] == "sequential"

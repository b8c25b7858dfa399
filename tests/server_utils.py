"""Start the real ``ironlm serve`` in a subprocess on 127.0.0.1 (a free port) and wait for it.

    with RemoteServer(model_dir, ["--max-model-len", "1024"]) as server:
        client = server.openai_client()
        httpx.get(server.url("/health"))

The server's output goes to a log file (``server.log_text()``), shown when start-up fails.
Also holds a small HTTP middleware used by the --middleware test.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import httpx

TESTS_DIR = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RemoteServer:
    def __init__(
        self,
        model: str | os.PathLike[str],
        args: list[str],
        env: dict[str, str] | None = None,
        start_timeout: float = 300.0,
        api_key: str | None = None,
        key_env: str | None = None,  # pass api_key in this environment variable, not --api-key
        more_keys: tuple[str, ...] = (),  # --api-key takes these too (vLLM: several keys)
        scheme: str = "http",  # https: the args give --ssl-keyfile / --ssl-certfile
    ) -> None:
        self.port = free_port()
        self.scheme = scheme
        self.api_key = api_key
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed in close())
            prefix="ironlm-server-", suffix=".log", delete=False
        )
        full_env = dict(os.environ)
        # The tests folder is importable in the server (for --middleware server_utils.X).
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(TESTS_DIR), full_env.get("PYTHONPATH", "")) if p
        )
        full_env.update(env or {})
        if api_key is not None and key_env is not None:
            full_env[key_env] = api_key
        cmd = [
            sys.executable, "-m", "ironlm.entrypoints.openai.api_server", str(model),
            "--host", "127.0.0.1", "--port", str(self.port), *args,
        ]
        if api_key is not None and key_env is None:
            cmd += ["--api-key", api_key, *more_keys]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=full_env)
        try:
            self._wait_ready(start_timeout)
        except BaseException:
            self.close()
            raise

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def openai_client(self, **kwargs: Any) -> Any:
        import openai

        return openai.OpenAI(base_url=self.url("/v1"), api_key=self.api_key or "EMPTY",
                             max_retries=0, **kwargs)

    def async_openai_client(self, **kwargs: Any) -> Any:
        import openai

        return openai.AsyncOpenAI(base_url=self.url("/v1"), api_key=self.api_key or "EMPTY",
                                  max_retries=0, **kwargs)

    def log_text(self) -> str:
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}"
                )
            try:
                # a test's self-signed certificate: not verified
                if httpx.get(self.url("/health"), timeout=1.0, verify=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server not healthy after {timeout}s:\n{self.log_text()[-4000:]}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
        os.unlink(self._log.name)

    def __enter__(self) -> RemoteServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_serve_cli(args: list[str], env: dict[str, str] | None = None,
                  timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``ironlm serve ARGS`` to completion (start-up failures), output captured."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "ironlm.cli", "serve", *args], capture_output=True, text=True,
        env=full_env, timeout=timeout,
    )


async def header_middleware(request: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """An HTTP middleware for ``--middleware server_utils.header_middleware``."""
    response = await call_next(request)
    response.headers["x-ironlm-test-middleware"] = "1"
    return response


def outlines_available() -> bool:
    """The outlines guided backend is installed and usable (the server tests' constrained
    cases run on it: compact JSON, so short outputs)."""
    from ironlm.plugin_manager import PluginManager

    reg = PluginManager().registries.guided_backends
    return "outlines" in reg and reg.get("outlines").is_available().available


def smollm2_args(*extra: str) -> list[str]:
    """Flags of the SmolLM2 test servers that run guided cases: a small float32 engine
    (streamed == non-streamed whatever the CPU's auto dtype), quiet logs, outlines when it
    is installed, then ``extra``."""
    args = ["--max-model-len", "1024", "--kv-cache-memory", "128MiB",
            "--served-model-name", "smollm2", "--disable-log-stats",
            "--disable-uvicorn-access-log", "--dtype", "float32", *extra]
    if outlines_available():
        args += ["--guided-decoding-backend", "outlines"]
    return args

"""TLS on the real server: --ssl-keyfile / --ssl-certfile serve HTTPS, and vLLM's
--enable-ssl-refresh picks up a renewed certificate without a restart (new connections get
it), skipping a half-written pair until the key matches. Certificates are made with the
openssl command."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from server_utils import RemoteServer, run_serve_cli

pytestmark = [pytest.mark.server,
              pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")]


def _certificate(folder: Path, name: str) -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return key, cert


def _served_certificate(port: int) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def _der(cert: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


def test_renewed_certificate_is_served_without_a_restart(tiny_llama_dir: Path,
                                                         tmp_path: Path) -> None:
    first_key, first_cert = _certificate(tmp_path, "first")
    second_key, second_cert = _certificate(tmp_path, "second")
    key, cert = tmp_path / "tls.key", tmp_path / "tls.pem"
    shutil.copy(first_key, key)
    shutil.copy(first_cert, cert)
    args = ["--max-model-len", "128", "--kv-cache-memory", "16MiB", "--disable-log-stats",
            "--ssl-keyfile", str(key), "--ssl-certfile", str(cert), "--enable-ssl-refresh"]
    with RemoteServer(tiny_llama_dir, args, scheme="https") as server:
        assert _served_certificate(server.port) == _der(first_cert)
        assert httpx.get(server.url("/v1/models"), verify=False).status_code == 200
        shutil.copy(second_cert, cert)  # the certificate first: no valid pair yet
        time.sleep(2.5)
        assert _served_certificate(server.port) == _der(first_cert)
        assert "do not load yet" in server.log_text()
        shutil.copy(second_key, key)
        deadline = time.monotonic() + 20
        while _served_certificate(server.port) != _der(second_cert):
            assert time.monotonic() < deadline, server.log_text()[-2000:]
            time.sleep(0.3)
        assert httpx.get(server.url("/v1/models"), verify=False).status_code == 200


def test_ssl_refresh_without_certificate_files_is_refused(tiny_llama_dir: Path) -> None:
    proc = run_serve_cli([str(tiny_llama_dir), "--enable-ssl-refresh"])
    assert proc.returncode == 2
    assert "--enable-ssl-refresh needs --ssl-keyfile and --ssl-certfile" in proc.stderr

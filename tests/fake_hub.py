"""A loopback stand-in for the Hugging Face Hub's HTTP API, the three calls huggingface_hub
makes to fetch a model: model info (``/api/models/{repo}[/revision/{rev}]``: commit and
file list), the tree listing (``/api/models/{repo}/tree/{rev}``) and file downloads (HEAD and GET
``/{repo}/resolve/{rev}/{path}``, with the X-Repo-Commit and ETag headers it reads). Errors
carry the Hub's X-Error-Code, so huggingface_hub raises its own exception classes. Every GET
of a file is recorded, so a test can say exactly what was downloaded.

Point a process at it with ``HF_ENDPOINT=<url>`` (read when huggingface_hub is imported)."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from urllib.parse import unquote, urlsplit

# repo id -> ref (branch or tag) -> file path in the repository -> content; or an HTTP
# status every call about the repository answers with (403: no permission, 503: down)
Repos = dict[str, dict[str, dict[str, Path | bytes]] | int]


def commit_hash(repo_id: str, ref: str) -> str:
    return hashlib.sha1(f"{repo_id}@{ref}".encode()).hexdigest()


class FakeHub:
    def __init__(self, repos: Repos) -> None:
        self.repos = repos
        self.downloads: list[str] = []  # "repo_id/path" of each file GET
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self._server.shutdown()
        self._server.server_close()

    def lookup(self, repo_id: str,
               revision: str) -> tuple[str, dict[str, Path | bytes]] | str | int:  # fmt: skip
        """(commit, files) of ``revision`` (a ref or a commit), or the Hub's error code, or
        the repository's fixed status."""
        refs = self.repos.get(repo_id)
        if refs is None:
            return "RepoNotFound"
        if isinstance(refs, int):
            return refs
        for ref, files in refs.items():
            if revision in (ref, commit_hash(repo_id, ref)):
                return commit_hash(repo_id, ref), files
        return "RevisionNotFound"


def _content(value: Path | bytes) -> bytes:
    return value.read_bytes() if isinstance(value, Path) else value


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
            if parts[:2] == ["api", "models"] and len(parts) == 4:  # the default branch's info
                self._api("/".join(parts[2:4]), "revision", "main", body)
            elif parts[:2] == ["api", "models"] and len(parts) >= 6:
                # api/models/owner/name/{revision|tree}/rev[/path...]
                self._api("/".join(parts[2:4]), parts[4], parts[5], body)
            elif len(parts) >= 5 and parts[2] == "resolve":  # owner/name/resolve/rev/path...
                self._file("/".join(parts[:2]), parts[3], "/".join(parts[4:]), body)
            else:
                self._error(404, "RepoNotFound")

        def _found(self, repo_id: str,
                   revision: str) -> tuple[str, dict[str, Path | bytes]] | None:  # fmt: skip
            """(commit, files), or None with the error answered."""
            found = hub.lookup(repo_id, revision)
            if isinstance(found, int):
                self._error(found, "")
            elif isinstance(found, str):
                self._error(404, found)
            else:
                return found
            return None

        def _api(self, repo_id: str, kind: str, revision: str, body: bool) -> None:
            found = self._found(repo_id, revision)
            if found is None:
                return
            commit, files = found
            if kind == "revision":
                data: object = {"id": repo_id, "sha": commit, "private": False,
                                "siblings": [{"rfilename": name} for name in sorted(files)]}
            else:
                data = [{"type": "file", "path": name, "size": len(_content(value)),
                         "oid": hashlib.sha1(_content(value)).hexdigest()}
                        for name, value in sorted(files.items())]  # fmt: skip
            self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"},
                       body)  # fmt: skip

        def _file(self, repo_id: str, revision: str, name: str, body: bool) -> None:
            found = self._found(repo_id, revision)
            if found is None:
                return
            commit, files = found
            if name not in files:
                return self._error(404, "EntryNotFound")
            data = _content(files[name])
            if body:
                hub.downloads.append(f"{repo_id}/{name}")
            self._send(200, data, {"X-Repo-Commit": commit,
                                   "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}, body)

        def _error(self, status: int, code: str) -> None:
            headers = {"X-Error-Code": code} if code else {}
            self._send(status, json.dumps({"error": code or f"status {status}"}).encode(),
                       headers, True)  # fmt: skip

        def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(key, value)
            self.end_headers()
            if body:
                self.wfile.write(data)

    return Handler

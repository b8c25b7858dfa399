"""The OpenAI batch file format of ``ironlm run-batch`` (vLLM's ``run-batch``, OpenAI's Batch
API): one JSON request per input line, one JSON result per output line, in input order.

Input line::

    {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

Output line (``response.body`` the endpoint's JSON answer; for a request the endpoint refused,
``response.body`` is null and ``error`` holds its OpenAI error object)::

    {"id": "ironlm-...", "custom_id": "q1", "error": null,
     "response": {"status_code": 200, "request_id": "ironlm-batch-...", "body": {...}}}

Input and output are local paths or http(s) URLs (read with GET; written with PUT once the
batch has finished, from a file in ``--output-tmp-dir``).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from ironlm.entrypoints.openai.state import random_id

log = logging.getLogger("ironlm.run_batch")

_UPLOAD_ATTEMPTS = 3
_UPLOAD_RETRY_DELAY_S = 2.0
_HTTP_TIMEOUT_S = 300.0


class BatchFileError(ValueError):
    """An input file that is not a batch file (the message names the line)."""


class BatchLine(BaseModel):
    """One input line: the request ``body`` for the endpoint ``url``, answered under
    ``custom_id`` (unique in the file, as OpenAI's Batch API requires)."""

    model_config = ConfigDict(extra="ignore")

    custom_id: str
    method: str
    url: str
    body: dict[str, Any]


def is_url(path_or_url: str) -> bool:
    return path_or_url.startswith(("http://", "https://"))


def read_batch_file(path_or_url: str) -> list[BatchLine]:
    """Every request of the input file, checked before the model loads: a line that is not
    JSON, lacks a field, or repeats an earlier ``custom_id`` is a BatchFileError naming it;
    blank lines are skipped. OSError when the file cannot be read."""
    if is_url(path_or_url):
        try:
            resp = httpx.get(path_or_url, timeout=_HTTP_TIMEOUT_S, follow_redirects=True)
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise OSError(f"cannot read the batch input {path_or_url}: {exc}") from exc
        text = resp.text
    else:
        text = Path(path_or_url).read_text(encoding="utf-8")
    lines: list[BatchLine] = []
    seen: dict[str, int] = {}  # custom_id -> its line number
    # "\n" ends a line (as vLLM's): a JSON string may hold U+2028 or U+0085 unescaped
    for number, raw in enumerate(text.split("\n"), start=1):
        raw = raw.removesuffix("\r")
        if not raw.strip():
            continue
        where = f"{path_or_url} line {number}"
        try:
            line = BatchLine.model_validate_json(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or "line"
            raise BatchFileError(f"{where}: {field}: {first['msg']}") from None
        if line.custom_id in seen:
            raise BatchFileError(f"{where}: custom_id {line.custom_id!r} is also the custom_id "
                                 f"of line {seen[line.custom_id]} (each must be unique)")
        seen[line.custom_id] = number
        lines.append(line)
    return lines


def result_line(custom_id: str, request_id: str, status: int, body: Any) -> dict[str, Any]:
    """The output line of a request the endpoint answered with ``status`` and JSON ``body``."""
    ok = 200 <= status < 300
    return {
        "id": random_id("ironlm"),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id,
                     "body": body if ok else None},
        "error": None if ok else body,
    }


class BatchOutput:
    """The output file, written line by line in input order: a result that finishes before
    those above it waits in memory until they are written (as vLLM's: a slow early line holds
    the results after it). The lines go to a local file first, created before the model loads
    (an output that cannot be written fails in a second): a local output's is a hidden file in
    the same folder, renamed over the output by ``close`` (an existing output is replaced only
    by a finished batch); a URL output's is in ``tmp_dir``, uploaded by ``close``."""

    def __init__(self, path_or_url: str, tmp_dir: str | None = None) -> None:
        self.target = path_or_url
        if is_url(path_or_url):
            fd, local = tempfile.mkstemp(prefix="ironlm-batch-output-", suffix=".jsonl",
                                         dir=tmp_dir)
            self.local = Path(local)
            self._file: TextIO = os.fdopen(fd, "w", encoding="utf-8")
        else:  # a new file, with the permissions the umask gives (mkstemp's are 0600)
            out = Path(path_or_url)
            self.local = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.partial")
            self._file = self.local.open("x", encoding="utf-8")
        self._next = 0  # index of the next line to write
        self._pending: dict[int, dict[str, Any]] = {}  # finished early, waiting their turn
        self.written = 0

    def add(self, index: int, line: dict[str, Any]) -> None:
        self._pending[index] = line
        while self._next in self._pending:
            self._file.write(json.dumps(self._pending.pop(self._next), ensure_ascii=False))
            self._file.write("\n")
            self._next += 1
            self.written += 1
        self._file.flush()

    def discard(self) -> None:
        """The batch did not finish: remove the local file."""
        self._file.close()
        self.local.unlink(missing_ok=True)

    def close(self) -> None:
        """Finish the file: a local output is renamed into place, a URL output is uploaded
        (OSError naming the local copy, which is kept, when every attempt fails)."""
        self._file.close()
        if not is_url(self.target):
            os.replace(self.local, self.target)
            return
        last: str = ""
        for attempt in range(1, _UPLOAD_ATTEMPTS + 1):
            try:
                with self.local.open("rb") as f:
                    resp = httpx.put(self.target, content=f, timeout=_HTTP_TIMEOUT_S)
                if resp.is_success:
                    self.local.unlink()
                    log.info("uploaded %d results to %s", self.written, self.target)
                    return
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
            except httpx.HTTPError as exc:
                last = str(exc)
            log.warning("upload of the batch output to %s failed (attempt %d of %d): %s",
                        self.target, attempt, _UPLOAD_ATTEMPTS, last)
            if attempt < _UPLOAD_ATTEMPTS:
                time.sleep(_UPLOAD_RETRY_DELAY_S)
        raise OSError(f"cannot upload the batch output to {self.target} ({last}); the results "
                      f"are kept in {self.local}")

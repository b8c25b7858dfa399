"""JSON-Schema-Test-Suite acceptance per guided-decoding backend (a measurement, not a test).

    pip download --no-deps --no-binary :all: jsonschema && tar xzf jsonschema-*.tar.gz
    python tests/json_schema_suite.py jsonschema-*/json/tests/draft2020-12 [--walks 3]

The suite's test groups (one schema each, with instances that must or must not validate) are
read from every ``*.json`` file of the folder (``optional/`` excluded). A group counts when at
least one of its instances is valid: the schema can be met ("valid-schema group"). Per backend
(each in its own worker process, so that a compile running past ``--timeout`` seconds can be
killed and counted), each schema is compiled as a ``response_format`` would be; an accepted
schema then gets ``--walks`` random walks through the backend's token masks on SmolLM2's
tokenizer (the Walker of tests/test_guided_backends.py: any allowed token, EOS when allowed),
and every finished walk's text must parse and validate against the schema (jsonschema,
Draft 2020-12). Printed per file and in total: groups, accepted, refused, timed out, walks
finished, and outputs violating an accepted schema (the constraint's own failures).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

BACKENDS = ("xgrammar", "outlines", "lm-format-enforcer")


def groups(folder: Path) -> list[tuple[str, str, Any]]:
    """(file stem, group description, schema) of every valid-schema group."""
    out = []
    for path in sorted(folder.glob("*.json")):
        for group in json.loads(path.read_text()):
            if any(t["valid"] for t in group["tests"]):
                out.append((path.stem, group["description"], group["schema"]))
    return out


def _worker(backend_name: str, model: str, walks: int, conn: Connection) -> None:
    """Compile and walk the schemas the parent sends, one at a time."""
    import jsonschema
    from test_guided_backends import Walker
    from transformers import AutoTokenizer

    from ironlm.interfaces.guided import GuidedSpec, UnsupportedFeatureError
    from ironlm_guided.lmfe_backend import LMFormatEnforcerBackend
    from ironlm_guided.outlines_backend import OutlinesBackend
    from ironlm_guided.xgrammar_backend import XGrammarBackend

    cls = {c.name: c for c in (OutlinesBackend, LMFormatEnforcerBackend, XGrammarBackend)}
    tok = AutoTokenizer.from_pretrained(model)
    pieces = tok.batch_decode([[i] for i in range(len(tok))])
    walker = Walker(cls[backend_name](tok, len(tok) + 64), tok, pieces)
    conn.send("ready")
    while (schema := conn.recv()) is not None:
        try:
            compiled = walker.backend.compile(GuidedSpec("json", json.dumps(schema)))
        except (UnsupportedFeatureError, ValueError) as exc:
            conn.send(("refused", str(exc)[:200], 0, 0))
            continue
        except Exception as exc:  # a library failure is a refusal too, but says so
            conn.send(("error", f"{type(exc).__name__}: {str(exc)[:200]}", 0, 0))
            continue
        finished = invalid = 0
        detail = ""
        for seed in range(walks):
            try:
                text, ended = walker.walk(walker.backend.new_grammar(compiled), seed)
            except Exception as exc:  # a dead end (the request would fail) or a wrong mask
                invalid += 1
                detail = f"walk {seed}: {type(exc).__name__}: {str(exc)[:160]}"
                continue
            if not ended:
                continue
            finished += 1
            try:
                jsonschema.Draft202012Validator(schema).validate(json.loads(text))
            except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
                invalid += 1
                detail = f"walk {seed}: {text[:120]!r}: {str(exc)[:120]}"
            except jsonschema.exceptions.RefResolutionError:  # the suite's remote refs
                finished -= 1
        conn.send(("accepted", detail, finished, invalid))


class Runner:
    """One backend's worker process, restarted after a timeout."""

    def __init__(self, name: str, model: str, walks: int) -> None:
        self.name, self.model, self.walks = name, model, walks
        self._start()

    def _start(self) -> None:
        self.conn, child = mp.Pipe()
        self.proc = mp.Process(target=_worker, args=(self.name, self.model, self.walks, child),
                               daemon=True)
        self.proc.start()
        if not self.conn.poll(300) or self.conn.recv() != "ready":
            raise RuntimeError(f"{self.name}: worker did not start")

    def run(self, schema: Any, timeout: float) -> tuple[str, str, int, int]:
        self.conn.send(schema)
        if self.conn.poll(timeout):
            try:
                return self.conn.recv()
            except EOFError:  # the worker died (a library crash): restart, count it
                self.proc.join()
                code = self.proc.exitcode
                self._start()
                return ("error", f"worker died (exit {code})", 0, 0)
        self.proc.kill()
        self.proc.join()
        self._start()
        return ("timeout", f"over {timeout:.0f} s", 0, 0)

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, help="the suite's tests/draft2020-12 folder")
    parser.add_argument("--model", default=None, help="tokenizer folder (default: SmolLM2)")
    parser.add_argument("--walks", type=int, default=3, help="random walks per schema")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per compile+walks")
    parser.add_argument("--backend", action="append", choices=BACKENDS, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the table's data here")
    args = parser.parse_args()
    model = args.model
    if model is None:
        from ironlm.model_loader.downloads import ensure_test_model

        model = str(ensure_test_model("smollm2"))
    cases = groups(args.folder)
    results: dict[str, dict[str, Counter[str]]] = {}
    failures: list[str] = []
    for name in args.backend or BACKENDS:
        runner = Runner(name, model, args.walks)
        per_file: dict[str, Counter[str]] = {}
        start = time.perf_counter()
        for stem, desc, schema in cases:
            status, detail, finished, invalid = runner.run(schema, args.timeout)
            c = per_file.setdefault(stem, Counter())
            c["groups"] += 1
            c[status] += 1
            c["walks"] += finished
            c["invalid"] += invalid
            if invalid:
                failures.append(f"{name} {stem} / {desc}: {detail}")
        runner.close()
        results[name] = per_file
        print(f"{name}: {len(cases)} groups in {time.perf_counter() - start:.0f} s",
              file=sys.stderr)
    _print(results)
    for line in failures:
        print("violation:", line)
    if args.json:
        args.json.write_text(json.dumps({b: {f: dict(c) for f, c in r.items()}
                                         for b, r in results.items()}, indent=1))
    return 0


def _print(results: dict[str, dict[str, Counter[str]]]) -> None:
    cols = ("groups", "accepted", "refused", "error", "timeout", "walks", "invalid")
    print("| backend | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, per_file in results.items():
        total: Counter[str] = Counter()
        for c in per_file.values():
            total.update(c)
        print(f"| {name} | " + " | ".join(str(total[k]) for k in cols) + " |")


if __name__ == "__main__":
    raise SystemExit(main())

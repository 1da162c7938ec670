"""The embedded rollout server started with SGLang's command line: the CPU stand-in for
``python -m sglang.launch_server`` behind ``rollout.backend=sglang``.

    python -m loongsage.engines.embedded_rollout.sglang_compat --model-path DIR --host H --port P ...

It reads the flags ``engines.sglang.engine`` passes (``--model-path``, ``--host``, ``--port``,
``--tp-size``, ``--mem-fraction-static``, ``--max-running-requests``, ``--weight-version``,
``--context-length``, ``--skip-server-warmup``, ``--enable-return-routed-experts``,
``--enable-memory-saver``, ``--disable-radix-cache``: no prefix cache), refuses any other (so a flag the launcher starts passing is
noticed here, not ignored), and serves the embedded engine, whose HTTP API already follows
SGLang's (``/generate``, ``/health``, ``/init_weights_update_group``,
``/update_weights_from_distributed``...), until SIGTERM. ``--tp-size`` above 1 is refused:
the embedded engine has no tensor parallelism.
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Sequence


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sglang_compat", description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--mem-fraction-static", type=float, default=0.9)
    parser.add_argument("--max-running-requests", type=int, default=64)
    parser.add_argument("--weight-version", type=int, default=0)
    parser.add_argument("--context-length", type=int, default=None)
    parser.add_argument("--skip-server-warmup", action="store_true")
    parser.add_argument("--enable-return-routed-experts", action="store_true")
    parser.add_argument("--enable-memory-saver", action="store_true")
    parser.add_argument("--disable-radix-cache", action="store_true")
    args = parser.parse_args(argv)
    if args.tp_size != 1:
        parser.error(f"--tp-size {args.tp_size}: the embedded engine serves on one device (tp 1)")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    from loongsage.engines.embedded_rollout.engine import EmbeddedRolloutEngine

    args = parse_args(argv)
    engine = EmbeddedRolloutEngine(args.model_path, max_running_requests=args.max_running_requests,
                                   weight_version=args.weight_version,
                                   **({"prefix_cache_gb": 0.0} if args.disable_radix_cache else {}))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"serving {engine.start(args.host, args.port)}", flush=True)
    stop.wait()
    engine.stop()


if __name__ == "__main__":
    main()

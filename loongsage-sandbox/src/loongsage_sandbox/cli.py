"""``loongsage sandbox ...``: check a sandbox setup, run the sandbox service, clean up.

* ``loongsage sandbox run [--type T] [--timeout S] [--memory M] [--disk M] -- CMD ...``
  runs one command in a fresh sandbox, prints its output, and exits with its status
  (124 on timeout, 128+N when killed by signal N, like coreutils ``timeout``).
* ``loongsage sandbox serve [--backend bwrap] [--host 127.0.0.1] [--port 8765] [--token T]``
  runs the service that ``remote`` sandboxes talk to (token from ``--token`` or
  ``$LOONGSAGE_SANDBOX_TOKEN``; a random one is generated and printed if neither is set).
* ``loongsage sandbox cleanup`` removes what crashed runs left behind.

Registered as the ``sandbox`` command through the ``loongsage_register_commands`` hook:
core's ``loongsage`` command calls ``main(argv, registries)`` with the loaded registries, in
which the sandbox backends (``--type``, ``--backend``) are looked up.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import shutil
import sys
from typing import Any, Sequence

from loongsage.plugin import ConfigError, LoongSageError


def _size_mb(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)[bB]?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected a size like 256, 256M or 1G, got {text!r}")
    value, unit = int(m.group(1)), m.group(2).lower()
    return {"k": max(1, value // 1024), "": value, "m": value, "g": value * 1024}[unit]


def default_type() -> str:
    """``bwrap`` where bubblewrap is installed, else ``process`` (trusted commands only)."""
    return "bwrap" if shutil.which("bwrap") else "process"


def _limit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=float, help="wall-time limit in seconds (default 10)")
    p.add_argument("--memory", type=_size_mb, help="address-space limit per process, e.g. 256M")
    p.add_argument("--disk", type=_size_mb, help="size of the work dir, e.g. 64M")
    p.add_argument("--cpu-time", type=int, help="CPU seconds per process (default 2)")
    p.add_argument("--max-processes", type=int, help="process limit (default 64)")


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    pairs = {"timeout_s": args.timeout, "memory_mb": args.memory, "disk_mb": args.disk,
             "cpu_time_s": args.cpu_time, "max_processes": args.max_processes}
    return {k: v for k, v in pairs.items() if v is not None}


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="loongsage sandbox", description="LoongSage sandboxes")
    sub = parser.add_subparsers(dest="sandbox_command", required=True)
    run = sub.add_parser("run", help="run one command in a fresh sandbox")
    run.add_argument("--type", default=None, help="registered sandbox type (default: bwrap if installed, else process)")
    _limit_args(run)
    run.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                     help="other backend parameter, e.g. --param url=http://host:8765")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command and arguments")
    serve = sub.add_parser("serve", help="serve sandboxes to remote clients over HTTP")
    serve.add_argument("--backend", default="bwrap", help="registered sandbox type the service runs")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765, help="0 picks a free port (printed)")
    serve.add_argument("--token", default=None, help="bearer token (default $LOONGSAGE_SANDBOX_TOKEN)")
    serve.add_argument("--idle-ttl", type=float, default=600.0, help="close sandboxes idle this long (s)")
    serve.add_argument("--max-sandboxes", type=int, default=64)
    _limit_args(serve)
    sub.add_parser("cleanup", help="remove leftovers of crashed runs")
    return parser


def add_subcommands(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``sandbox`` to an argparse subparsers object; dispatch with ``run_parsed(args)``."""
    parser = subparsers.add_parser("sandbox", help="sandboxes: run, serve, cleanup")
    build_parser(parser)
    parser.set_defaults(handler=run_parsed)
    return parser


def _parse_param(item: str) -> tuple[str, Any]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ConfigError("--param", f"expected KEY=VALUE, got {item!r}")
    import yaml

    return key, yaml.safe_load(value)


async def _run(args: argparse.Namespace, registries: Any) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise ConfigError("sandbox run", "no command given; usage: loongsage sandbox run [options] -- CMD ...")
    kind = args.type or default_type()
    factory = registries.sandbox.get(kind, key="--type")
    params = {**dict(_parse_param(p) for p in args.param), **_limits(args)}
    async with factory(params, untrusted=False, key="sandbox") as sb:
        print(f"[sandbox: {sb.describe()}]", file=sys.stderr)
        result = await sb.exec(cmd)
    sys.stdout.buffer.write(result.stdout)
    sys.stdout.flush()
    sys.stderr.buffer.write(result.stderr)
    notes = [f"{result.duration_s:.3f} s"]
    notes += ["timed out, process tree killed"] if result.timed_out else []
    notes += ["stdout truncated"] if result.stdout_truncated else []
    notes += ["stderr truncated"] if result.stderr_truncated else []
    status = f"signal {result.signal}" if result.signal else f"exit {result.exit_code}"
    print(f"[sandbox: {status}; {', '.join(notes)}]", file=sys.stderr)
    if result.timed_out:
        return 124
    return 128 + result.signal if result.signal else int(result.exit_code or 0)


def _serve(args: argparse.Namespace, registries: Any) -> int:
    from loongsage_sandbox.server import serve

    backend = registries.sandbox.get(args.backend, key="--backend")
    token = args.token or os.environ.get("LOONGSAGE_SANDBOX_TOKEN")
    if not token:
        token = secrets.token_urlsafe(24)
        print(f"generated token (give it to clients as LOONGSAGE_SANDBOX_TOKEN): {token}", flush=True)

    def ready(url: str) -> None:
        print(f"serving {args.backend} sandboxes on {url}", flush=True)

    serve(backend, token, args.host, args.port, _limits(args), idle_ttl_s=args.idle_ttl,
          max_sandboxes=args.max_sandboxes, ready=ready)
    return 0


def _cleanup(_args: argparse.Namespace, _registries: Any) -> int:
    from loongsage_sandbox.leftovers import cleanup_leftovers

    counts = cleanup_leftovers()
    print("removed {sandboxes} leftover sandbox(es), killed {processes} process(es), "
          "removed {containers} container(s)".format(**counts))
    return 0


def run_parsed(args: argparse.Namespace, registries: Any) -> int:
    handlers = {"run": lambda a, r: asyncio.run(_run(a, r)), "serve": _serve, "cleanup": _cleanup}
    try:
        return handlers[args.sandbox_command](args, registries)
    except LoongSageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def main(argv: Sequence[str], registries: Any) -> int:
    """``loongsage sandbox ARGS`` (``argv`` excludes the word ``sandbox``)."""
    return run_parsed(build_parser().parse_args(list(argv)), registries)

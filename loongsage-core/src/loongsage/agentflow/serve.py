"""Serve the router by hand (``loongsage serve``): any key opens a trajectory, URLs are printed.

The CLI starts the engine(s) and hands their URLs to :func:`serve`; a user then points any
agent at the printed base URLs and inspects what was recorded under ``/v1/trajectories``.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO

from loongsage.agentflow.server import Router


def describe(router: Router, example: str = "demo") -> str:
    """The base URL of each wire format, ready-made agent settings, and where to inspect."""
    urls = router.base_urls(example, "0")
    root = f"{router.url}/{{trajectory_id}}/{{attempt_id}}"
    return "\n".join([
        f"AgentFlow router on {router.url} (models: {', '.join(router.settings.served_model_names)})",
        f"  OpenAI Chat Completions  POST {root}/v1/chat/completions",
        f"  OpenAI Responses         POST {root}/v1/responses",
        f"  Anthropic Messages       POST {root}/v1/messages",
        f"  e.g. OPENAI_BASE_URL={urls['openai']} ANTHROPIC_BASE_URL={urls['anthropic']}",
        f"  trajectories: GET {router.url}/v1/trajectories  (one: /v1/trajectories/{example})",
    ])


def serve(cfg: Any, engine_urls: list[str], *, block: bool = True, out: TextIO = sys.stdout,
          **settings: Any) -> Router:
    """Start a router for ``cfg`` over ``engine_urls`` that opens trajectories on first use and
    accepts any model name; print its endpoints; block until interrupted unless ``block=False``."""
    options = {"auto_create_trajectories": True, "accept_any_model": True, **settings}
    router = Router.from_config(cfg, engine_urls, **options)
    router.start()
    print(describe(router), file=out, flush=True)
    if block:
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
        finally:
            router.stop()
    return router

"""Serve the router by hand (``loongsage serve``): any key opens a trajectory, URLs are printed.

The CLI starts the engine(s) and hands their URLs to :func:`serve`; a user then points any
agent at the printed base URLs and inspects what was recorded under ``/v1/trajectories``.
``run_serve`` is the command itself: ``rollout.num_engines`` embedded engines in this process
(``model.path`` resolved, built-ins included), or the running engines given with
``--engine-url`` (an SGLang server or a LoongSage engine), then the router.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO

from loongsage.agentflow.server import Router
from loongsage.agentflow.settings import RouterSettings
from loongsage.config.validate import RunConfig


def describe(router: Router, example: str = "demo") -> str:
    """The base URL of each wire format, ready-made agent settings, and where to inspect.

    With an API key (``agentflow.api_key``) the example URLs carry a token issued for the
    example trajectory, and any other trajectory is reached with the key as ``Authorization:
    Bearer``, which the listings need too (``agentflow.access``)."""
    if router.tokens.required:
        router.tokens.issue(example, "0")
    urls = router.base_urls(example, "0")
    root = f"{router.url}/{{trajectory_id}}/{{attempt_id}}"
    header = router.settings.session_header
    sessions = [f"  a request with header {header}: S goes to trajectory '<trajectory_id>.S'"] if header else []
    keyed = ["  with agentflow.api_key: send 'Authorization: Bearer <key>' (or x-api-key) to reach any "
             "trajectory by its id and to list them"] if router.tokens.required else []
    return "\n".join([
        f"AgentFlow router on {router.url} (models: {', '.join(router.settings.served_model_names)})",
        f"  OpenAI Chat Completions  POST {root}/v1/chat/completions",
        f"  OpenAI Responses         POST {root}/v1/responses",
        f"  Anthropic Messages       POST {root}/v1/messages",
        f"  e.g. OPENAI_BASE_URL={urls['openai']} ANTHROPIC_BASE_URL={urls['anthropic']}",
        *keyed, *sessions,
        f"  trajectories: GET {router.url}/v1/trajectories  (one: /v1/trajectories/{example})",
    ])


def serve(run: RunConfig, engine_urls: list[str], *, block: bool = True, out: TextIO = sys.stdout,
          **settings: Any) -> Router:
    """Start a router for ``run`` (its ``agentflow`` section, the model's tokenizer) over
    ``engine_urls`` that opens trajectories on first use and accepts any model name; print its
    endpoints; block until interrupted unless ``block=False``."""
    from transformers import AutoTokenizer

    from loongsage.engines.client import EngineClient

    model = run.cfg.model
    tokenizer = AutoTokenizer.from_pretrained(model.tokenizer_path or model.path,
                                              trust_remote_code=model.trust_remote_code)
    options = {"auto_create_trajectories": True, "accept_any_model": True, **settings}
    router_settings = RouterSettings.from_config(run.cfg.agentflow, run.router, **options)
    router = Router([EngineClient(u) for u in engine_urls], tokenizer, router_settings)
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


def start_embedded_engines(cfg: Any) -> list[Any]:
    """``rollout.num_engines`` embedded rollout engines for ``cfg``, started, in this process."""
    from loongsage.engines.embedded_rollout import EmbeddedRolloutEngine

    count = int(cfg.rollout.num_engines) if "rollout" in cfg else 1
    engines = []
    for _ in range(max(1, count)):
        engine = EmbeddedRolloutEngine.from_config(cfg)
        engine.start()
        engines.append(engine)
    return engines


def run_serve(config_name: str, overrides: list[str], config_dir: str | None = None,
              engine_urls: list[str] | None = None, *, block: bool = True,
              out: TextIO = sys.stdout, registries: Any = None,
              session_header: str | None = None) -> tuple[Router, list[Any]]:
    """``loongsage serve``: load the recipe, start (or reach) the engines, serve the router.

    ``session_header`` (``--session-header``) splits each key's requests into one trajectory per
    value of that header (``RouterSettings.session_header``). Returns the router and the embedded
    engines it started (empty with ``engine_urls``); with ``block`` it returns only after
    Ctrl-C, everything stopped. ``registries``: the installed plugins when the caller has loaded
    them (the CLI)."""
    from loongsage.config.compose import load_config
    from loongsage.models.resolve import resolve_model_path

    run = load_config(config_name, overrides, config_dir, registries=registries)
    run.cfg.model.path = str(resolve_model_path(run.cfg.model.path))
    engines = [] if engine_urls else start_embedded_engines(run.cfg)
    urls = list(engine_urls or [e.url for e in engines])
    print(f"engines: {', '.join(urls)}", file=out, flush=True)
    try:
        router = serve(run, urls, block=block, out=out, session_header=session_header)
    finally:
        if block:
            for engine in engines:
                engine.stop()
    return router, engines

"""``opencode`` launcher: OpenCode (opencode-ai) run offline with ``opencode run --format json``.

As the agent behaves (docs/agents.md): an ``opencode.json`` (given as ``OPENCODE_CONFIG``) declares
one
``@ai-sdk/openai-compatible`` provider whose ``baseURL`` is the trajectory's ``/v1`` URL and
whose key is the trajectory key; ``XDG_*`` dirs are private, the models.dev fetch, autoupdate
and sharing are off. OpenCode's separate title call is skipped by giving ``--title``; its
``small_model`` is still pointed at a model named ``"{model}-title"``, which the launcher's
router serves untrained (add that name to ``untrained_models`` of a shared router).
``params.prompt`` replaces the build agent's system prompt; ``params.tools`` switches tools
on and off (``{"*": false, "bash": true}`` keeps only the shell). OpenCode re-serialises tool-call arguments compactly; the router compares them
parsed. The answer is the text parts of the JSON event stream.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loongsage_agents.agents.router_params import OpenCodeParams
from loongsage_agents.launchers.cli import find_binary, json_lines
from loongsage_agents.launchers.command import CommandAgent, router_env
from loongsage_agents.launchers.process import ProcessResult


def title_model(model: str) -> str:
    return f"{model}-title"


class OpenCodeAgent(CommandAgent):
    params_type = OpenCodeParams

    def router_settings(self, base: Any = None) -> Any:
        settings = super().router_settings(base)
        settings.untrained_models = list(settings.untrained_models) + [title_model(self.params.model)]
        return settings

    def config(self, urls: dict[str, str], key: str) -> dict[str, Any]:
        p = self.params
        limit = {"context": int(p.context_window), "output": int(p.max_output_tokens)}
        model = {"tool_call": True, "reasoning": False, "limit": limit}
        config: dict[str, Any] = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {"loongsage": {
                "npm": "@ai-sdk/openai-compatible", "name": "LoongSage router",
                "options": {"baseURL": urls["openai"], "apiKey": key},
                "models": {p.model: model, title_model(p.model): model}}},
            "model": f"loongsage/{p.model}",
            "small_model": f"loongsage/{title_model(p.model)}",
            "autoupdate": False, "share": "disabled",
        }
        agent: dict[str, Any] = {}
        if p.prompt is not None:
            agent["prompt"] = p.prompt
        if p.tools:
            agent["tools"] = dict(p.tools)
        if agent:
            config["agent"] = {"build": agent}
        return config

    def prepare(self, task: str, urls: dict[str, str], key: str, workdir: Path,
                home: Path) -> tuple[list[str], dict[str, str]]:
        p = self.params
        path = home / "opencode.json"
        path.write_text(json.dumps(self.config(urls, key), indent=2))
        env = router_env(urls, key, home, task)
        for name in ("CONFIG", "DATA", "CACHE", "STATE"):
            (home / name.lower()).mkdir()
            env[f"XDG_{name}_HOME"] = str(home / name.lower())
        env.update({"OPENCODE_CONFIG": str(path), "OPENCODE_DISABLE_MODELS_FETCH": "1",
                    "OPENCODE_DISABLE_AUTOUPDATE": "1"})
        env.update(p.env)
        argv = [find_binary("opencode", p.bin_dir), "run", "--format", "json", "--auto",
                "--title", "loongsage", "--model", f"loongsage/{p.model}", *p.extra_args, task]
        return argv, env

    def answer(self, result: ProcessResult, workdir: Path) -> str:
        parts = []
        for event in json_lines(result.stdout):
            part = event.get("part")
            if event.get("type") == "text" and isinstance(part, dict):
                parts.append(str(part.get("text", "")))
        return "".join(parts)

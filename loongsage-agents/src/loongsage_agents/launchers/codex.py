"""``codex`` launcher: the Codex CLI (@openai/codex) run offline with ``codex exec --json``.

As the agent behaves (docs/agents.md): ``CODEX_HOME`` is a private dir holding ``config.toml`` with
a model provider whose ``base_url`` is the trajectory's ``/v1`` URL, ``wire_api = "responses"``
(Codex speaks only the Responses API; ``"chat"`` is rejected) and the key read from
``LOONGSAGE_ROUTER_KEY`` (sent as Bearer); approvals off, full access inside the work dir,
no analytics, update checks or web search. ``params.instructions`` replaces Codex's own
~17 K-character system prompt (``model_instructions_file``), which matters for small models.
The answer is the text of the last ``agent_message`` item of the JSON-lines output.
"""

from __future__ import annotations

import json
from pathlib import Path

from loongsage_agents.agents.router_params import CodexParams
from loongsage_agents.launchers.cli import find_binary, json_lines
from loongsage_agents.launchers.command import CommandAgent, router_env
from loongsage_agents.launchers.process import ProcessResult


def toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


class CodexAgent(CommandAgent):
    params_type = CodexParams

    def prepare(self, task: str, urls: dict[str, str], key: str, workdir: Path,
                home: Path) -> tuple[list[str], dict[str, str]]:
        p = self.params
        codex_home = home / ".codex"
        codex_home.mkdir()
        lines = [
            f"model = {toml_str(p.model)}",
            'model_provider = "loongsage"',
            'approval_policy = "never"',
            'sandbox_mode = "danger-full-access"',
            f"model_context_window = {int(p.context_window)}",
        ]
        if p.instructions is not None:
            path = codex_home / "instructions.md"
            path.write_text(p.instructions)
            lines.append(f"model_instructions_file = {toml_str(str(path))}")
        lines += [
            "",
            "[model_providers.loongsage]",
            'name = "LoongSage router"',
            f"base_url = {toml_str(urls['openai'])}",
            'env_key = "LOONGSAGE_ROUTER_KEY"',
            'wire_api = "responses"',
            "request_max_retries = 0",
            "stream_max_retries = 0",
        ]
        (codex_home / "config.toml").write_text("\n".join(lines) + "\n")
        env = router_env(urls, key, home, task)
        env.update({"CODEX_HOME": str(codex_home), "LOONGSAGE_ROUTER_KEY": key})
        env.update(p.env)
        argv = [find_binary("codex", p.bin_dir), "exec", "--json", "--skip-git-repo-check",
                "-C", str(workdir), "-c", "analytics.enabled=false",
                "-c", "check_for_update_on_startup=false", "-c", 'web_search="disabled"',
                *p.extra_args, task]
        return argv, env

    def answer(self, result: ProcessResult, workdir: Path) -> str:
        texts = [e["item"].get("text", "") for e in json_lines(result.stdout)
                 if e.get("type") == "item.completed" and isinstance(e.get("item"), dict)
                 and e["item"].get("type") == "agent_message"]
        return texts[-1] if texts else ""

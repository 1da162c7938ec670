"""``claude_code`` launcher: Claude Code (@anthropic-ai/claude-code) run offline with ``claude -p``.

As the agent behaves (docs/agents.md): ``ANTHROPIC_BASE_URL`` is the trajectory's root (no ``/v1``;
Claude Code adds ``/v1/messages?beta=true``), ``ANTHROPIC_API_KEY`` the trajectory key (sent as
``x-api-key``), ``CLAUDE_CONFIG_DIR`` a private dir, ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC``
(no telemetry or update lookups offline), experimental betas off, both the main and the
small/fast model set to ``params.model``. Run as ``claude -p TASK --output-format json`` with
only ``params.tools`` available and allowed, permissions skipped (``IS_SANDBOX=1`` lets that
run as root). ``params.system_prompt`` replaces Claude Code's own prompt (smaller for small
models). The answer is the ``result`` field of the JSON output.
"""

from __future__ import annotations

import json
from pathlib import Path

from loongsage_agents.agents.router_params import ClaudeCodeParams
from loongsage_agents.launchers.cli import find_binary
from loongsage_agents.launchers.command import CommandAgent, router_env
from loongsage_agents.launchers.process import ProcessResult


class ClaudeCodeAgent(CommandAgent):
    params_type = ClaudeCodeParams

    def prepare(self, task: str, urls: dict[str, str], key: str, workdir: Path,
                home: Path) -> tuple[list[str], dict[str, str]]:
        p = self.params
        config = home / ".claude"
        config.mkdir()
        env = router_env(urls, key, home, task)
        env.pop("ANTHROPIC_AUTH_TOKEN", None)  # would be sent as Bearer instead of our key
        env.update({
            "CLAUDE_CONFIG_DIR": str(config),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1",
            "DISABLE_AUTOUPDATER": "1",
            "ANTHROPIC_MODEL": p.model,
            "ANTHROPIC_SMALL_FAST_MODEL": p.model,
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(int(p.max_output_tokens)),
            "IS_SANDBOX": "1",
        })
        env.update(p.env)
        tools = ",".join(p.tools)
        argv = [find_binary("claude", p.bin_dir), "-p", task, "--output-format", "json",
                "--model", p.model, "--tools", tools, "--allowedTools", tools,
                "--dangerously-skip-permissions"]
        if p.system_prompt is not None:
            argv += ["--system-prompt", p.system_prompt]
        return argv + list(p.extra_args), env

    def answer(self, result: ProcessResult, workdir: Path) -> str:
        try:
            out = json.loads(result.stdout)
        except json.JSONDecodeError:
            return ""
        return str(out.get("result") or "") if isinstance(out, dict) else ""

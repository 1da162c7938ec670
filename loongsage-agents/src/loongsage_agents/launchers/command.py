"""Black-box ``command`` agent: run any program against the router, one work dir per trajectory.

The program gets the router through the environment every OpenAI/Anthropic client reads:
``OPENAI_BASE_URL`` (ends in ``/v1``), ``ANTHROPIC_BASE_URL``, and the per-trajectory key
``"{trajectory_id}:{attempt_id}"`` as ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY`` (the base
URLs already carry the trajectory in their path; the key names it again for clients that
drop the path). ``LOONGSAGE_TASK`` holds the task, ``HOME`` a private home dir, ``NO_PROXY``
covers loopback. ``argv`` may use ``{task}``, ``{workdir}`` and ``{home}``.

Launchers for real CLIs subclass ``CommandAgent`` and override ``prepare`` (write the tool's
own config, build its argv and env) and ``answer`` (read the final answer from its output).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from loongsage.data.types import Prompt

from loongsage_agents.agents.router_base import Outcome, RouterAgentBase, prompt_task
from loongsage_agents.agents.router_params import CommandParams
from loongsage_agents.launchers.process import ProcessResult, run_process


def router_env(urls: dict[str, str], key: str, home: Path, task: str) -> dict[str, str]:
    """The environment every black-box agent gets: the inherited one plus the router's."""
    env = dict(os.environ)
    env.update({
        "OPENAI_BASE_URL": urls["openai"], "OPENAI_API_KEY": key,
        "ANTHROPIC_BASE_URL": urls["anthropic"], "ANTHROPIC_API_KEY": key,
        "HOME": str(home), "LOONGSAGE_TASK": task,
        "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
    })
    return env


class CommandAgent(RouterAgentBase):
    """Run ``params.argv`` once per trajectory; its stdout is the answer."""

    params_type = CommandParams

    def prepare(self, task: str, urls: dict[str, str], key: str, workdir: Path,
                home: Path) -> tuple[list[str], dict[str, str]]:
        """The argv and environment of one run (subclasses write their config files here)."""
        fields = {"task": task, "workdir": str(workdir), "home": str(home)}
        argv = [a.format(**fields) for a in self.params.argv]
        env = router_env(urls, key, home, task)
        env.update({k: v.format(**fields) for k, v in self.params.env.items()})
        return argv, env

    def answer(self, result: ProcessResult, workdir: Path) -> str:
        """The agent's final answer, scored by the data source's reward."""
        return result.stdout.strip()

    def _dirs(self, key: str) -> Path:
        root = self.params.workdir_root
        if root is not None:
            Path(root).mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=key.replace(":", "-") + "-", dir=root))

    async def run_trajectory(self, prompt: Prompt, urls: dict[str, str], key: str,
                             sampling_params: dict[str, Any]) -> Outcome:
        p = self.params
        base = self._dirs(key)
        workdir, home = base / "work", base / "home"
        workdir.mkdir()
        home.mkdir()
        try:
            for name, content in p.files.items():
                path = workdir / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
            argv, env = self.prepare(prompt_task(prompt), urls, key, workdir, home)
            result = await run_process(argv, env, str(workdir), p.timeout_s, p.kill_grace_s)
            text = self.answer(result, workdir)
        finally:
            if not p.keep_workdir:
                shutil.rmtree(base, ignore_errors=True)
        keep = p.max_output_chars
        return Outcome(text=text, info={
            "exit_code": result.exit_code, "timed_out": result.timed_out,
            "duration_s": round(result.duration_s, 3), "stdout": result.stdout[-keep:],
            "stderr": result.stderr[-keep:], "workdir": str(workdir) if p.keep_workdir else None})

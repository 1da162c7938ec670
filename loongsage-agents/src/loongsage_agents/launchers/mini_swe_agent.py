"""``mini_swe_agent`` launcher: mini-swe-agent (``mini``) run offline, non-interactively.

Checked against the installed 2.4.6 source (``minisweagent/run/mini.py``,
``config/__init__.py``, ``agents/interactive.py``, ``models/litellm_model.py``):

* mini is installed in a venv of its own (``launchers.cli.ensure_mini_swe_agent``): it pulls
  litellm and many dependencies that must not meet the project's pinned ones.
* ``mini -y -m openai/MODEL --task=TASK -c BASE -c HOME/mini.yaml -o HOME/traj.json
  --exit-immediately``: ``-y`` = yolo mode (no confirmations), ``--exit-immediately`` =
  ``agent.confirm_exit: false``. Any ``-c`` drops mini's default config, so ``params.base_config``
  (mini's own ``mini.yaml``, found by name) comes first and LoongSage's settings are merged onto
  it from ``HOME/mini.yaml``. Those settings live in a YAML file rather than in
  ``-c key=value`` arguments, which mini parses as JSON (a key such as ``"12"`` would become a
  number) and which would put the trajectory key on the command line: ``model.model_kwargs``
  ``api_base`` (the trajectory's ``/v1``), ``api_key`` (the trajectory key), ``max_tokens``;
  ``agent.step_limit``, ``max_consecutive_format_errors``, ``mode: yolo``, ``confirm_exit``;
  ``environment.cwd`` (the work dir) and ``timeout``; optional template overrides.
* Environment: ``MSWEA_GLOBAL_CONFIG_DIR`` (private; mini writes a ``.env`` there),
  ``MSWEA_CONFIGURED=true`` (skips the first-run setup prompt), ``MSWEA_COST_TRACKING=
  ignore_errors`` (an unknown model has no price), ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (no
  download of litellm's price list), ``MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT`` (mini retries a
  failed call 10 times with up to 60 s back-off by default), ``MSWEA_SILENT_STARTUP``.

mini's base config is resolved as ``./mini.yaml`` in the work dir before mini's built-in one,
so a file of that name (``params.files`` or the task's files) is refused. mini sends
``model, messages, tools`` (one ``bash`` tool) without streaming; a reply without a tool call
is dropped from the history and answered by a "Tool call error" user turn, which the router
records as a fork (``compact`` segment, see ``loongsage.agentflow.tito``). The answer is the
submission in ``traj.json`` (the output after ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``),
else the last assistant content; with ``submit_file`` it is that file as mini left it
(``CommandAgent``), and mini's own answer goes to ``reward_info["agent_answer"]``.
"""

from __future__ import annotations

import contextvars
import json
from pathlib import Path
from typing import Any

import yaml

from loongsage.plugin import Prompt

from loongsage_agents.agents.router_base import Outcome
from loongsage_agents.agents.router_params import MiniSweAgentParams
from loongsage_agents.launchers.cli import find_binary
from loongsage_agents.launchers.command import CommandAgent, router_env
from loongsage_agents.launchers.process import ProcessResult

TRAJ_FILE = "traj.json"
# what ``answer`` read from traj.json, for this trajectory's task only (one context per task)
_RUN_INFO: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("mini_run_info")


class MiniSweAgent(CommandAgent):
    params_type = MiniSweAgentParams

    def config(self, urls: dict[str, str], key: str, workdir: Path) -> dict[str, Any]:
        """LoongSage's settings, merged by mini onto ``params.base_config``."""
        p = self.params
        agent: dict[str, Any] = {"mode": "yolo", "confirm_exit": False,
                                 "step_limit": int(p.step_limit), "cost_limit": 0,
                                 "max_consecutive_format_errors": int(p.max_consecutive_format_errors)}
        if p.system_template is not None:
            agent["system_template"] = p.system_template
        if p.instance_template is not None:
            agent["instance_template"] = p.instance_template
        return {
            "agent": agent,
            "model": {"model_name": f"openai/{p.model}",
                      "model_kwargs": {"api_base": urls["openai"], "api_key": key,
                                       "max_tokens": int(p.max_output_tokens)}},
            "environment": {"cwd": str(workdir), "timeout": int(p.command_timeout_s)},
        }

    def prepare(self, task: str, urls: dict[str, str], key: str, workdir: Path,
                home: Path) -> tuple[list[str], dict[str, str]]:
        p = self.params
        if "mini.yaml" in p.files or (workdir / "mini.yaml").exists():
            raise ValueError("agent.params.files: a work-dir file 'mini.yaml' (in params.files or "
                             "the task's files) would replace mini-swe-agent's own config (mini "
                             "looks in its working directory first); rename it")
        if p.step_limit < 1:
            raise ValueError(f"agent.params.step_limit: expected >= 1, got {p.step_limit} "
                             "(mini's 0 = unlimited is refused: a trajectory must end)")
        config_dir = home / "mini-swe-agent"
        config_dir.mkdir()
        path = home / "mini.yaml"
        if "=" in str(path):
            raise ValueError(f"agent.params.workdir_root: mini reads a '-c' argument holding '=' "
                             f"as key=value, so its config path {path} (work dir root and "
                             "trajectory id) must not contain '='")
        path.write_text(yaml.safe_dump(self.config(urls, key, workdir), sort_keys=False))
        env = router_env(urls, key, home, task)
        env.update({
            "MSWEA_GLOBAL_CONFIG_DIR": str(config_dir), "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(max(int(p.model_retries), 1)),
            "MSWEA_SILENT_STARTUP": "1", "PYTHONUNBUFFERED": "1",
        })
        env.update(p.env)
        argv = [find_binary("mini", p.bin_dir), "-y", "-m", f"openai/{p.model}", f"--task={task}",
                "-c", p.base_config, "-c", str(path), "-o", str(home / TRAJ_FILE),
                "--exit-immediately", *p.extra_args]
        return argv, env

    async def run_trajectory(self, prompt: Prompt, urls: dict[str, str], key: str,
                             sampling_params: dict[str, Any]) -> Outcome:
        box: dict[str, Any] = {}
        token = _RUN_INFO.set(box)
        try:
            outcome = await super().run_trajectory(prompt, urls, key, sampling_params)
        finally:
            _RUN_INFO.reset(token)
        outcome.info.update(box)
        return outcome

    def answer(self, result: ProcessResult, workdir: Path) -> str:
        """The submission, else the last assistant content; mini's exit status and call count
        go to ``reward_info`` (``mini_exit_status``, ``mini_api_calls``)."""
        try:  # the home dir is the work dir's sibling (CommandAgent's layout)
            data = json.loads((workdir.parent / "home" / TRAJ_FILE).read_text())
        except (OSError, json.JSONDecodeError):
            data = {}
        data = data if isinstance(data, dict) else {}
        info = data.get("info") or {}
        box = _RUN_INFO.get(None)
        if box is not None:
            box.update({"mini_exit_status": info.get("exit_status"),
                        "mini_api_calls": (info.get("model_stats") or {}).get("api_calls")})
        if info.get("exit_status") == "Submitted":
            return str(info.get("submission") or "")
        for message in reversed(data.get("messages") or []):
            if isinstance(message, dict) and message.get("role") == "assistant":
                return str(message.get("content") or "")
        return ""

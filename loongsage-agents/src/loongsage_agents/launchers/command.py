"""Black-box ``command`` agent: run any program against the router, one work dir per trajectory.

The program gets the router through the environment every OpenAI/Anthropic client reads:
``OPENAI_BASE_URL`` (ends in ``/v1``), ``ANTHROPIC_BASE_URL``, and the per-trajectory key
``"{trajectory_id}:{attempt_id}"`` as ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY`` (the base
URLs already carry the trajectory in their path; the key names it again for clients that
drop the path). ``LOONGSAGE_TASK`` holds the task, ``HOME`` a private home dir, ``NO_PROXY``
covers loopback. ``argv`` may use ``{task}``, ``{workdir}`` and ``{home}``.

Launchers for real CLIs subclass ``CommandAgent`` and override ``prepare`` (write the tool's
own config, build its argv and env) and ``answer`` (read the final answer from its output).

A coding task's repository (the prompt's ``metadata["files"]``, ``agents.task_files``) is
written into the work dir beside ``params.files`` (a name in both is refused). With
``submit_file`` set, the answer is that file as the program left it, fenced by
``task_files.submission``, so the ``code_exec`` reward runs the hidden tests on it; a missing
or empty file gives an empty answer and ``reward_info["submit_error"]`` says which (the
program's own answer stays in ``reward_info["agent_answer"]``).

What is isolated: the scoring. The hidden tests live only in the prompt's ``ground_truth``,
never in the work dir, and the reward runs them in a fresh sandbox holding nothing but the
submitted file, so nothing the program did to its work dir or machine reaches the score. What
is not: the program itself. It runs as a plain subprocess of the rollout worker (its own
process group, work dir and ``HOME``, killed with its children at ``timeout_s``) with the
worker's user, file system and network; so do the shell commands an agent such as
mini-swe-agent runs in its work dir. That suits trusted agent programs and generated tasks;
a task repository from an untrusted source wants the program inside a sandbox, which this
agent does not do.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from loongsage.plugin import Prompt

from loongsage_agents.agents.router_base import Outcome, RouterAgentBase, prompt_task
from loongsage_agents.agents.router_params import CommandParams
from loongsage_agents.agents.task_files import submission, task_files
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

    def work_files(self, prompt: Prompt) -> dict[str, str]:
        """What goes into each work dir: the prompt's task files, then ``params.files``."""
        files = task_files(prompt) if "files" in prompt.metadata else {}
        clash = sorted(set(files) & set(self.params.files))
        if clash:
            raise ValueError(f"agent.params.files: {clash} would overwrite the task files of prompt "
                             f"{prompt.source}#{prompt.index}; rename them")
        return {**files, **self.params.files}

    def submit_path(self, workdir: Path) -> Path:
        """Where ``submit_file`` is read from; refused (before the program runs) outside ``workdir``."""
        name = self.params.submit_file
        path = (workdir / name).resolve()
        if not name or not path.is_relative_to(workdir.resolve()):
            raise ValueError(f"agent.params.submit_file: {name!r} is not a file path inside the work dir")
        return path

    def submitted(self, path: Path, info: dict[str, Any]) -> str:
        """The answer under ``submit_file``: that file fenced for the reward, else "" and why."""
        name = self.params.submit_file
        try:
            content = path.read_text()
        except (OSError, UnicodeDecodeError) as err:
            info["submit_error"] = (f"submit_file {name!r} could not be read after the program exited: "
                                    f"{getattr(err, 'strerror', None) or err}")
            return ""
        if not content.strip():
            info["submit_error"] = f"submit_file {name!r} is empty after the program exited"
            return ""
        return submission(content)

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
        keep = p.max_output_chars
        try:
            submit = self.submit_path(workdir) if p.submit_file is not None else None
            for name, content in self.work_files(prompt).items():
                path = workdir / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
            argv, env = self.prepare(prompt_task(prompt), urls, key, workdir, home)
            result = await run_process(argv, env, str(workdir), p.timeout_s, p.kill_grace_s)
            text = self.answer(result, workdir)
            info: dict[str, Any] = {
                "exit_code": result.exit_code, "timed_out": result.timed_out,
                "duration_s": round(result.duration_s, 3), "stdout": result.stdout[-keep:],
                "stderr": result.stderr[-keep:], "workdir": str(workdir) if p.keep_workdir else None}
            if submit is not None:
                info["agent_answer"] = text[-keep:]
                text = self.submitted(submit, info)
        finally:
            if not p.keep_workdir:
                shutil.rmtree(base, ignore_errors=True)
        return Outcome(text=text, info=info)

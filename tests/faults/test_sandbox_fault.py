"""Fault injection in a tool recipe: a sandbox's supervisor SIGKILLed while it runs a tool call.

Real processes: the CLI in a subprocess (its own session and Ray cluster) on ``tiny/tool_calculator``
with the ``bash`` tool: every rollout is a ``tool_loop`` conversation through the run's router,
its tool calls run in a bubblewrap sandbox. The random tiny model never writes a well-formed
tool call, so the run's tool parser is ``always_bash`` from the config-local plugin module
``fault_plugins.py``: it reads every reply as one ``bash`` call of ``sleep 1; echo tool-ran``,
long enough for the test to find a supervisor with a command running (its child process) and
kill the supervisor alone. The call it was running must come back to the model as an error
(as the tool's message, in the tokens of the next turn), the trajectory must be marked
(``sandbox_failed``, a failed trajectory: reward 0 under the default
``rollout.failed_trajectory=zero_reward``) and counted (``rollout/sandbox_failed_mean``), the
run must reach its last step, and nothing the sandboxes ran may outlive the run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time

import pytest

from loongsage.controller.engine_health import process_state

pytestmark = [pytest.mark.slow, pytest.mark.serial]

STEPS, PROMPTS, N = 3, 2, 2


class SupervisorKiller:
    """Kills the first sandbox supervisor of the run seen running a command; notes every
    sandbox id the run creates (its state directories) for the leak check."""

    def __init__(self, run, state) -> None:
        self.run, self.state = run, state
        self.killed: tuple[int, list[int], float] | None = None  # (pid, its children, time)
        self.ids: set[str] = set()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        from loongsage_sandbox.testing import supervisor_processes

        while self.run.proc.poll() is None:
            self.ids.update(path.name for path in self.state.iterdir())
            if self.killed is None:
                busy = {pid: kids for pid, kids in supervisor_processes(self.run.proc.pid).items() if kids}
                if busy:
                    pid, kids = next(iter(busy.items()))
                    os.kill(pid, signal.SIGKILL)
                    self.killed = (pid, kids, time.time())
            time.sleep(0.02)


def tool_messages(sample: dict) -> list[str]:
    return [m["content"] for m in sample["reward_info"]["messages"] if m["role"] == "tool"]


def test_a_sandbox_supervisor_killed_mid_exec_is_a_tool_error_and_the_run_goes_on(tmp_path, runs, watched,
                                                                                   leftovers):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (the recipe's sandbox)")
    from loongsage_sandbox.leftovers import tagged_processes

    state = tmp_path / "sandboxes"  # this run's sandboxes only, apart from any other on the machine
    state.mkdir(mode=0o711)
    run_dir = tmp_path / "run"
    run = watched(run_dir, "plugins=[fault_plugins]", "agentflow.tool_parser=always_bash",
                  "data_sources.0.agent.tools=[bash]", "data_sources.0.agent.max_turns=2",
                  f"trainer.steps={STEPS}", "trainer.sft.steps=0", f"rollout.prompts_per_step={PROMPTS}",
                  f"rollout.n_samples_per_prompt={N}", "rollout.max_new_tokens=8", "checkpoint.interval=0",
                  f"logging.samples_per_step={PROMPTS * N}", config="tiny/tool_calculator",
                  env={"LOONGSAGE_SANDBOX_STATE_DIR": str(state)})
    killer = SupervisorKiller(run, state)
    run.proc.wait(timeout=300)
    assert run.proc.returncode == 0, run.text[-4000:]
    assert leftovers(run.proc.pid) == []
    assert killer.killed is not None, "no supervisor was seen running a command"
    pid, running, _ = killer.killed
    assert running and process_state(pid) == "gone"
    assert killer.ids and tagged_processes(killer.ids) == []  # nothing any sandbox ran is left
    assert list(state.iterdir()) == []  # every sandbox removed its state, the killed one too

    rows = runs.metrics(run_dir)
    assert [row["step"] for row in rows] == list(range(STEPS))
    assert sum(row["rollout/sandbox_failed_mean"] * row["rollout/num_samples"] for row in rows) == 1
    assert sum(row["rollout/failed_trajectories"] for row in rows) == 1
    saved = [s for step in range(STEPS) for s in runs.read_jsonl(run_dir / "samples" / f"step_{step:06d}.jsonl")]
    assert len(saved) == STEPS * PROMPTS * N  # every trajectory trained, the marked one included
    [marked] = [s for s in saved if s["reward_info"]["sandbox_failed"]]
    crashed, closed = tool_messages(marked)
    assert crashed.startswith("error: bash did not run: bwrap sandbox supervisor died while exec")
    assert closed == "error: bash did not run: bwrap sandbox is closed"
    assert crashed in marked["prompt"] + marked["response"]  # the model's second turn read it
    info = marked["reward_info"]
    assert info["failed"] == f"its sandbox could not run a tool call: {info['sandbox_error']}"
    assert marked["reward"] == 0.0
    for sample in saved:
        if sample is not marked:
            assert tool_messages(sample) == ["tool-ran", "tool-ran"], sample["reward_info"]
    print(json.dumps({"marked_trajectories": 1, "sandboxes": len(killer.ids)}))

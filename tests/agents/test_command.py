"""The black-box ``command`` agent: a real program (a Python script using the openai SDK
configured only by environment variables) runs against a real router and embedded engine, in
its own work dir; timeouts kill its whole process group."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time

import pytest

from loongsage.data.types import Prompt
from loongsage.engines.client import EngineClient

from loongsage_agents.agents.router_params import CommandParams
from loongsage_agents.launchers.command import CommandAgent

PROGRAM = """
import json, os, openai
client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
messages = [{"role": "user", "content": os.environ["LOONGSAGE_TASK"]}]
for question in ("go on", None):
    reply = client.chat.completions.create(model="any-name", messages=messages, max_tokens=8)
    messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    if question:
        messages.append({"role": "user", "content": question})
open("answer.txt", "w").write(messages[-1]["content"])
print(json.dumps({"key": os.environ["OPENAI_API_KEY"], "cwd": os.getcwd(), "home": os.environ["HOME"],
                  "anthropic": os.environ["ANTHROPIC_BASE_URL"], "answer": messages[-1]["content"]}))
"""


def test_command_agent_runs_a_program_against_the_router(recording_router, check_trajectories, agent_context,
                                                         long_context, tmp_path):
    agent = CommandAgent(CommandParams(argv=[sys.executable, "agent.py"], files={"agent.py": PROGRAM},
                                       timeout_s=120, max_context=long_context,
                                       workdir_root=str(tmp_path), keep_workdir=True), agent_context())
    recorder = recording_router(agent)
    prompt = Prompt("cmd", 7, [{"role": "user", "content": "Say something."}])
    samples = asyncio.run(agent.run_group(prompt, 2, EngineClient("http://unused"), {"sampling_seed": 7}))
    assert len(samples) == 2  # two trajectories, each one root segment (two turns)
    for s in samples:
        out = json.loads(s.text)
        tid = s.reward_info["trajectory_id"]
        assert s.reward_info["exit_code"] == 0 and not s.reward_info["timed_out"]
        assert out["key"] == f"{tid}:0" and out["anthropic"].endswith(f"/{tid}/0")
        assert out["cwd"] == s.reward_info["workdir"] and out["home"] != os.environ.get("HOME")
        assert open(os.path.join(out["cwd"], "answer.txt")).read() == out["answer"]
        assert s.reward_info["origin"] == "root"
    assert len(recorder.turns) == 4
    check_trajectories(samples, recorder)


def test_timeout_kills_the_whole_process_group(tmp_path, agent_context):
    pidfile = tmp_path / "child.pid"
    script = f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); " \
             f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    agent = CommandAgent(CommandParams(argv=[sys.executable, "-c", script], timeout_s=1.5,
                                       kill_grace_s=0.5), agent_context())
    engine = object()  # never called: the program does not reach the model
    router = _started_router(agent, engine)
    agent.use_router(router)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="none of the 1 trajectories .*'timed_out': True"):
        asyncio.run(agent.run_group(Prompt("cmd", 0, [{"role": "user", "content": "x"}]), 1, engine, {}))
    assert time.monotonic() - started < 30
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the program's child survived the timeout"
    router.stop()


def _started_router(agent, engine):
    from loongsage.agentflow.server import Router

    router = Router([engine], agent.tokenizer, agent.router_settings())
    router.start()
    return router


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_empty_command_is_refused(agent_context):
    agent = CommandAgent(CommandParams(argv=[]), agent_context())
    router = _started_router(agent, object())
    agent.use_router(router)
    try:
        with pytest.raises(ValueError, match="agent.params.argv"):
            asyncio.run(agent.run_group(Prompt("cmd", 0, [{"role": "user", "content": "x"}]), 1,
                                        object(), {}))
    finally:
        router.stop()


SAMPLING_PROGRAM = """
import openai
client = openai.OpenAI(max_retries=0)
for _ in range(2):
    client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}],
                                   temperature=0.2, top_p=0.5, max_tokens=500)
"""


@pytest.mark.parametrize("enforce", [True, False])
def test_router_enforces_the_rollout_sampling_on_a_black_box_agent(enforce, scripted_engine,
                                                                   tmp_path, agent_context):
    """A program asking for its own temperature/top_p/max_tokens gets the rollout's instead
    (the engine is scripted only to see what reaches it; router and program are real)."""
    engine = scripted_engine(["one", "two"])
    params = CommandParams(argv=[sys.executable, "agent.py"], files={"agent.py": SAMPLING_PROGRAM},
                           timeout_s=60, workdir_root=str(tmp_path), enforce_sampling=enforce)
    agent = CommandAgent(params, agent_context())
    rollout = {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 16}
    try:
        samples = asyncio.run(agent.run_group(Prompt("s", 0, [{"role": "user", "content": "x"}]),
                                              1, engine, rollout))
    finally:
        agent.close()
    seen = [(s["temperature"], s["top_p"], s["max_new_tokens"]) for s in engine.sampling_seen]
    if enforce:
        assert seen == [(1.0, 0.9, 16)] * 2
    else:
        assert seen == [(0.2, 0.5, 500)] * 2
    # two separate requests (two segments of the trajectory): the count is per trajectory
    assert [s.reward_info["sampling_overridden_turns"] for s in samples] == [2 * enforce] * 2


# ---- coding tasks: the prompt's repository in the work dir, the edited file as the answer ----

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
REPAIR_TASK = Prompt("repair", 3, [{"role": "user", "content": "Fix add in solution.py."}],
                     ground_truth={"tests": ["assert add(1, 2) == 3", "assert add(2, 0) == 2"]},
                     metadata={"files": {"solution.py": BUGGY,
                                         "test_solution.py": "from solution import add\nassert add(1, 2) == 3\n"}})
# calls the model once (the trajectory then holds sampled tokens), then does ACTION to solution.py
REPAIR_PROGRAM = """
import json, os, sys, openai
openai.OpenAI(max_retries=0).chat.completions.create(
    model="policy", messages=[{"role": "user", "content": os.environ["LOONGSAGE_TASK"]}], max_tokens=4)
action = sys.argv[1]
if action == "fix":
    open("solution.py", "w").write(FIXED)
elif action == "delete":
    os.remove("solution.py")
elif action == "empty":
    open("solution.py", "w").close()
print(json.dumps({"files": sorted(os.listdir(".")), "tests": open("test_solution.py").read()}))
"""


@pytest.mark.parametrize("action, score, submit_error", [
    ("fix", 1.0, None), ("keep", 0.0, None),
    ("delete", 0.0, "submit_file 'solution.py' could not be read after the program exited: No such file or directory"),
    ("empty", 0.0, "submit_file 'solution.py' is empty after the program exited")])
def test_the_submitted_file_is_what_code_exec_scores(action, score, submit_error, recording_router,
                                                     check_trajectories, agent_context, long_context):
    """A program (real, through the real router and engine) finds the task's files next to its
    own, edits ``solution.py`` or not; the answer is that file as it left it, and the real
    ``code_exec`` reward runs the hidden tests on it in a fresh bubblewrap sandbox."""
    from loongsage_agents.agents.task_files import submission
    from loongsage_agents.rewards.code_exec import code_exec_reward_async

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (the reward's sandbox)")
    context = agent_context(sandbox={"type": "bwrap"})
    program = REPAIR_PROGRAM.replace("FIXED", repr(FIXED))
    agent = CommandAgent(CommandParams(argv=[sys.executable, "agent.py", action], files={"agent.py": program},
                                       timeout_s=120, max_context=long_context, submit_file="solution.py"),
                         context)
    recorder = recording_router(agent)
    [sample] = asyncio.run(agent.run_group(REPAIR_TASK, 1, EngineClient("http://unused"), {}))
    seen = json.loads(sample.reward_info["agent_answer"])
    assert seen["tests"] == REPAIR_TASK.metadata["files"]["test_solution.py"]
    expected_files = {"agent.py", "test_solution.py"} | ({"solution.py"} if action != "delete" else set())
    assert set(seen["files"]) == expected_files
    assert sample.reward_info.get("submit_error") == submit_error
    assert sample.text == {"fix": submission(FIXED), "keep": submission(BUGGY)}.get(action, "")
    reward = asyncio.run(code_exec_reward_async(sample.text, REPAIR_TASK.ground_truth, None,
                                                sandbox=context.sandbox))
    assert reward["score"] == score and reward["has_code"] == (action in ("fix", "keep"))
    assert reward["passed"] == {"fix": 2, "keep": 1}.get(action, 0)
    check_trajectories([sample], recorder)


def test_task_files_and_submit_file_refuse_what_would_break_the_task(agent_context, tmp_path):
    """A program file named like a task file, or a submit_file outside the work dir, is refused
    before the program runs, naming the field; the trajectory's dirs are removed."""
    root = str(tmp_path / "work")
    for params, field in ((CommandParams(argv=["true"], files={"solution.py": "x"}), "agent.params.files"),
                          (CommandParams(argv=["true"], submit_file="../solution.py"), "agent.params.submit_file")):
        params.workdir_root = root
        agent = CommandAgent(params, agent_context())
        router = _started_router(agent, object())
        agent.use_router(router)
        try:
            with pytest.raises(ValueError, match=field):
                asyncio.run(agent.run_group(REPAIR_TASK, 1, object(), {}))
        finally:
            router.stop()
        assert os.listdir(root) == []

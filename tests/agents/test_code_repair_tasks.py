"""The ``code_repair`` tasks and the task-file convention, checked in real bubblewrap sandboxes.

Every bug family's bug fails the task's tests and its fix passes them: the task's own
demonstration is replayed command by command with the real ``bash`` tool in a bwrap sandbox
holding the task's files (each tool result must equal the demonstration's), and the file it
leaves is scored by the real ``code_exec`` reward in a fresh sandbox, as is the buggy file.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from loongsage.data.types import Prompt
from loongsage.errors import ConfigError

from loongsage_agents.agents.task_files import submission, task_files
from loongsage_agents.agents.tool_loop import run_tool
from loongsage_agents.agents.tools import TOOLS
from loongsage_agents.datasets.code_repair import CodeRepairDataset, split_of
from loongsage_agents.datasets.code_repair_families import FAMILIES
from loongsage_agents.datasets.params import CodeRepairParams
from loongsage_agents.rewards.code_exec import code_exec_reward_async, extract_code


# the recipes' sandbox: stress tasks need more than the default 2 CPU s on a slow core
SANDBOX = {"type": "bwrap", "cpu_time_s": 20}

def tasks(split: str = "train", n: int = 300, seed: int = 0, **params) -> list[Prompt]:
    data = CodeRepairDataset(CodeRepairParams(size=n, split=split, **params), seed=seed)
    return [data.get(i) for i in range(n)]


def test_tasks_are_a_pure_function_of_seed_split_and_index():
    first, again = tasks(n=40), tasks(n=40)
    assert [(p.messages, p.ground_truth, p.metadata) for p in first] == \
        [(p.messages, p.ground_truth, p.metadata) for p in again]
    other_seed = tasks(n=40, seed=1)
    assert sum(a.metadata["files"] != b.metadata["files"] for a, b in zip(first, other_seed)) >= 35
    # tasks differ from each other: sources, test counts and stress rounds vary
    assert len({p.metadata["files"]["solution.py"] for p in first}) >= 30
    assert len({len(p.ground_truth["tests"]) for p in first}) >= 5
    assert {p.metadata["stress_rounds"] > 1 for p in first} == {True, False}


def test_heldout_functions_never_occur_in_train_and_both_splits_cover_every_family():
    train, heldout = tasks("train"), tasks("heldout")
    sources = {s: {p.metadata["files"]["solution.py"] for p in ps} for s, ps in
               (("train", train), ("heldout", heldout))}
    assert not sources["train"] & sources["heldout"]
    assert len(sources["heldout"]) >= 100
    for split, prompts in (("train", train), ("heldout", heldout)):
        assert {p.metadata["family"] for p in prompts} == set(FAMILIES)
        assert all(p.metadata["split"] == split for p in prompts)
    # the split is the fix's hash cut, so a reference (not only a bug) never crosses either
    fixes = {s: {_demo_fix(p) for p in ps} for s, ps in (("train", train), ("heldout", heldout))}
    assert not fixes["train"] & fixes["heldout"]
    assert all(split_of(f, 0.2) == "heldout" for f in fixes["heldout"])


def test_bad_dataset_params_name_their_key():
    with pytest.raises(ConfigError, match=r"^dataset\.split: expected one of \['train', 'heldout'\]"):
        CodeRepairDataset(CodeRepairParams(split="test"))
    with pytest.raises(ConfigError, match=r"^dataset\.families: unknown bug famil\(ies\) \['typo'\]"):
        CodeRepairDataset(CodeRepairParams(families=["typo"]))
    with pytest.raises(ConfigError, match=r"^dataset\.max_tests: need 1 <= min_tests <= max_tests"):
        CodeRepairDataset(CodeRepairParams(min_tests=4, max_tests=2))
    with pytest.raises(IndexError, match=r"code_repair: index 5 out of range \(0\.\.4\)"):
        CodeRepairDataset(CodeRepairParams(size=5)).get(5)


def _demo_fix(prompt: Prompt) -> str:
    """The file the demonstration's here-document writes."""
    commands = [json.loads(c["function"]["arguments"])["command"]
                for m in prompt.metadata["demonstration"] if m["role"] == "assistant"
                for c in m.get("tool_calls", [])]
    [fix] = [re.fullmatch(r"cat > solution\.py << 'EOF'\n(.*)EOF", c, re.DOTALL).group(1)
             for c in commands if c.startswith("cat >")]
    return fix


async def _replay(prompt: Prompt, factory) -> dict:
    """Run the demonstration's commands where the agent would; score the bug and the result."""
    bash = TOOLS["bash"]
    async with factory(files=task_files(prompt)) as sandbox:
        before = await sandbox.exec(["python3", "test_solution.py"], timeout=30)
        outputs, expected = [], []
        for m in prompt.metadata["demonstration"]:
            if m["role"] == "assistant":
                for call in m.get("tool_calls", []):
                    outputs.append((await run_tool(sandbox, bash, call["function"]["arguments"], 30, 100000)).text)
            elif m["role"] == "tool":
                expected.append(m["content"])
        submitted = submission((await sandbox.read_file("solution.py")).decode())
    gt = prompt.ground_truth
    fixed = await code_exec_reward_async(submitted, gt, {"exec_timeout_s": 30}, sandbox=factory)
    buggy = await code_exec_reward_async(submission(prompt.metadata["files"]["solution.py"]), gt,
                                         {"exec_timeout_s": 30, "partial_credit": True}, sandbox=factory)
    return {"before": before, "outputs": outputs, "expected": expected, "fixed": fixed, "buggy": buggy}


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_every_familys_bug_fails_the_hidden_tests_and_its_fix_passes_them_in_bwrap(split, agent_context):
    factory = agent_context(SANDBOX).sandbox
    prompts = [CodeRepairDataset(CodeRepairParams(size=1, split=split, families=[f])).get(0)
               for f in sorted(FAMILIES)]

    async def all_tasks():
        return await asyncio.gather(*(_replay(p, factory) for p in prompts))

    for prompt, got in zip(prompts, asyncio.run(all_tasks())):
        family, total = prompt.metadata["family"], len(prompt.ground_truth["tests"])
        before = got["before"]
        summary = before.text.strip().splitlines()[-1]
        assert before.exit_code == 1 and "FAIL: " in before.text, (family, before.text)
        passed, shown = map(int, re.fullmatch(r"(\d+)/(\d+) tests passed", summary).groups())
        assert passed < shown, family
        assert got["outputs"] == got["expected"], family  # the demonstration shows real results
        assert got["fixed"]["score"] == 1.0 and got["fixed"]["passed"] == total, (family, got["fixed"])
        buggy = got["buggy"]
        assert buggy["has_code"] and buggy["error"] is None, (family, buggy)
        assert buggy["passed"] < total and buggy["score"] < 1.0, (family, buggy)


def test_task_files_name_the_bad_field_and_submission_reads_back_exactly():
    good = Prompt("code_repair", 3, [], metadata={"files": {"solution.py": "x = 1\n", "pkg/a.py": ""}})
    assert task_files(good) == {"solution.py": "x = 1\n", "pkg/a.py": ""}
    cases = [({}, r"prompt code_repair#3: metadata\['files'\] must be a non-empty mapping .* got NoneType"),
             ({"files": {"../x.py": "1"}}, r"'\.\./x\.py' is not a relative path inside the work dir"),
             ({"files": {"/etc/x": "1"}}, r"'/etc/x' is not a relative path"),
             ({"files": {"a.py": b"1"}}, r"metadata\['files'\]\['a\.py'\] must be the file's text \(str\), got bytes")]
    for metadata, message in cases:
        with pytest.raises(ValueError, match=message):
            task_files(Prompt("code_repair", 3, [], metadata=metadata))
    for code in ["def f():\n    return 1\n", "x = 1", "", "\n\n", "s = '``'\n",
                 "a = 1\n\n\n"]:
        assert extract_code(submission(code)) == code


def _bash_reply(command: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "\n</tool_call>"


def test_tool_loop_works_on_the_task_files_and_submits_the_edited_file(scripted_engine, agent_context):
    """The agent's sandbox holds the task's files; with ``submit_file`` the answer is that file
    after the loop, which ``code_exec`` scores 1, while a deleted file is marked, not lost.
    Tool calls come from a scripted engine (the random tiny model never makes one); router,
    agent, bwrap sandbox and reward are real."""
    from loongsage_agents.agents.router_params import ToolLoopParams
    from loongsage_agents.agents.tool_loop import ToolLoopAgent

    prompt = CodeRepairDataset(CodeRepairParams(size=1, families=["off_by_one_range"])).get(0)
    fix = _demo_fix(prompt)
    context = agent_context(SANDBOX)
    params = ToolLoopParams(tools=["bash"], max_turns=4, submit_file="solution.py")
    replies = [_bash_reply("ls"), _bash_reply(f"cat > solution.py << 'EOF'\n{fix}EOF"),
               _bash_reply("python3 test_solution.py"), "Done."]
    agent = ToolLoopAgent(params, context)
    try:
        [sample] = asyncio.run(agent.run_group(prompt, 1, scripted_engine(replies), {}))
        deleted = ToolLoopAgent(params, context)
        [gone] = asyncio.run(deleted.run_group(prompt, 1, scripted_engine([_bash_reply("rm solution.py"), "ok"]), {}))
    finally:
        agent.close()
        deleted.close()
    tool_outputs = [m["content"] for m in sample.reward_info["messages"] if m["role"] == "tool"]
    assert tool_outputs[0].split() == ["solution.py", "test_solution.py"]
    assert re.fullmatch(r"(\d+)/\1 tests passed", tool_outputs[2])
    assert tool_outputs[2] == prompt.metadata["demonstration"][-2]["content"]
    assert sample.text == submission(fix) and extract_code(sample.text) == fix
    reward = asyncio.run(code_exec_reward_async(sample.text, prompt.ground_truth, None, sandbox=context.sandbox))
    assert reward["score"] == 1.0 and reward["passed"] == len(prompt.ground_truth["tests"])
    assert gone.text == "" and "submit_file 'solution.py' could not be read" in gone.reward_info["submit_error"]
    reward = asyncio.run(code_exec_reward_async(gone.text, prompt.ground_truth, None, sandbox=context.sandbox))
    assert reward["score"] == 0.0 and not reward["has_code"]

"""The ``verifiers`` environment: config errors, and episodes run by verifiers' own env server
(verifiers 0.4.0, a real child process) through a real router.

The environment is the example ``examples/verifiers-adder`` (installed by
requirements-dev.txt: one MCP tool ``add``, reward ``correct``), played by verifiers' ``null``
harness (its chat loop, a ``uv`` script) in the ``subprocess`` runtime. The engine behind the
router is the scripted one of ``tests/agents/conftest.py`` (the random tiny model cannot be made
to call a tool), so the test decides the replies; each episode's reward is recomputed with the
task's own scoring (``Task.score`` on a trace holding the episode's final reply). A failing
episode comes from a taskset written here whose reward raises for a chosen reply. The
end-to-end run on the tiny model is ``tests/e2e/test_verifiers.py``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap

import pytest

from loongsage.config.validate import validate_config
from loongsage.plugin import ConfigError
from loongsage.plugins import get_registries

from tests.environment_sources import built, config, library_reward

ADDER = {"type": "verifiers", "id": "adder-tools", "args": {"num_tasks": 6}, "held_out_size": 2,
         "concurrency": 1}


def run_group(source, prompt, n, engine):
    return asyncio.run(source.agent.run_group(prompt, n, engine, {"max_new_tokens": 64}))


# ---- config errors, before any actor starts --------------------------------------------------

def test_an_unknown_environment_names_the_installed_ones():
    with pytest.raises(ConfigError) as err:
        validate_config(config({"name": "v", "environment": {"type": "verifiers", "id": "adder-tool"}}),
                        get_registries())
    message = str(err.value)
    assert message.startswith("data_sources[0].environment: invalid parameters for environment 'verifiers': "
                              "id: no installed verifiers environment 'adder-tool' (module 'adder_tool'; "
                              "installed: ")
    installed = message.split("installed: ")[1].split(")")[0].split(", ")
    assert "adder_tools" in installed and "textarena" in installed  # ours, and verifiers' own bridges
    assert "loongsage_agents" not in installed  # whose [verifiers] extra adds verifiers


def test_without_the_library_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)  # found by no import from here on
    with pytest.raises(ConfigError) as err:
        validate_config(config({"name": "v", "environment": ADDER}), get_registries())
    message = str(err.value)
    assert message.startswith("data_sources[0].environment.type: environment 'verifiers' needs the "
                              "'verifiers' library, which is not installed; install the extra [verifiers] "
                              "of loongsage-agents: ")
    assert message.endswith("pip install 'verifiers==0.4.0' 'renderers==0.1.12' 'mcp==2.0.0' 'uv==0.13.9' "
                            "'pydantic>=2.12.3'")


@pytest.mark.parametrize("params, key, problem", [
    ({"args": {"num_tasks": "many"}}, "args", r"taskset\.num_tasks\n  Input should be a valid integer"),
    ({"runtime": "nope"}, "runtime", r"agent\.runtime\n  Input tag 'nope' found using 'type' does not match"),
    ({"agent": {"max_turns": "x"}}, "agent", r"agent\.max_turns\n  Input should be a valid integer"),
    ({"harness": "nope"}, "harness", r"harness 'nope' not found \(tried to import 'nope'\)"),
])
def test_a_config_verifiers_refuses_names_the_parameter(tokenizer, params, key, problem):
    with pytest.raises(ConfigError, match=rf"^data_sources\[0\]\.environment\.{key}: verifiers (refused the config of|could "
                                          rf"not load) environment 'adder-tools': (?s:.*){problem}"):
        built(get_registries(), {"name": "v", "environment": {**ADDER, **params}}, tokenizer=tokenizer)


def test_the_splits_are_disjoint_and_seeded(tokenizer):
    source = built(get_registries(), {"name": "v", "environment": ADDER}, tokenizer=tokenizer)[1]["v"]
    env = source.agent.environment
    train, held = env.tasks("train"), env.tasks("held_out")
    keys = lambda tasks: [tasks.get(i).metadata["task_idx"] for i in range(len(tasks))]  # noqa: E731
    assert len(train) == 4 and len(held) == 2 and sorted(keys(train) + keys(held)) == list(range(6))
    prompt = train.get(0)
    data = prompt.metadata["task_data"]
    assert prompt.messages[-1] == {"role": "user", "content": f"What is {data['a']} + {data['b']}?"}
    again = built(get_registries(), {"name": "v", "environment": ADDER}, tokenizer=tokenizer)[1]["v"]
    assert keys(again.agent.environment.tasks("train")) == keys(train)
    other = built(get_registries(), {"name": "v", "environment": {**ADDER, "seed": 1}}, tokenizer=tokenizer)[1]["v"]
    assert keys(other.agent.environment.tasks("train")) != keys(train)


# ---- episodes in verifiers' env server through the router ------------------------------------

def call(name: str, arguments: dict) -> str:
    """A reply that calls a tool (the Hermes format the run's tool parser reads)."""
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def test_a_tool_episode_records_the_call_and_its_result_and_scores_as_the_library(scripted_engine, tokenizer):
    source = built(get_registries(), {"name": "v", "environment": ADDER}, tokenizer=tokenizer)[1]["v"]
    prompt = source.get(1)
    data = prompt.metadata["task_data"]
    total = data["a"] + data["b"]
    replies = [call("add", {"a": data["a"], "b": data["b"]}), f"The sum is {total}."]
    try:
        [sample] = run_group(source, prompt, 1, scripted_engine(replies))
    finally:
        source.agent.close()
        asyncio.run(source.agent.environment.server()).stop()
    info = sample.reward_info
    assert "failed" not in info, info
    assert info["episode_reward"] == library_reward(data, f"The sum is {total}.") == 1.0
    assert info["episode_metrics"] == {"used_tool": 1.0, "reward_correct": 1.0, "turns": 2.0}
    assert sample.text == f"The sum is {total}."
    # one trajectory: the prompt, the tool's schema, the call, its result, the answer
    text = tokenizer.decode(sample.prompt_ids + sample.response_ids)
    for piece in ["Use the add tool", f"What is {data['a']} + {data['b']}?", '"name": "add"',
                  "Return the sum of the integers a and b.", f"<tool_response>\n{total}\n</tool_response>",
                  *replies]:
        assert piece in text, piece
    trained = tokenizer.decode([t for t, m in zip(sample.response_ids, sample.loss_mask) if m])
    assert all(reply in trained for reply in replies)
    assert "<tool_response>" not in trained  # the tool's result is out of the loss mask
    assert source.score(sample.text, None, prompt=prompt, sample=sample) == {"score": 1.0}


FLAKY = '''
import asyncio

import verifiers.v1 as vf
from adder_tools.taskset import AdderConfig, AdderTask, AdderTaskset


class FlakyTask(AdderTask):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        if "boom" in trace.last_reply:
            raise RuntimeError("the scorer crashed")
        if "hang" in trace.last_reply:
            await asyncio.sleep(600)
        return await super().correct(trace)


class FlakyTaskset(vf.Taskset[FlakyTask, AdderConfig]):  # the server builds tasks of this type
    def load(self):
        return [FlakyTask(t.data, self.config.task) for t in AdderTaskset.load(self)]


__all__ = ["FlakyTaskset"]
'''


def test_failing_and_hanging_episodes_are_marked_and_the_others_go_on(scripted_engine, tokenizer, tmp_path,
                                                                       monkeypatch):
    (tmp_path / "flaky_adder.py").write_text(textwrap.dedent(FLAKY))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # for verifiers' env server
    env = {**ADDER, "id": "flaky-adder"}
    source = built(get_registries(), {"name": "f", "environment": env}, tokenizer=tokenizer)[1]["f"]
    # the same verifiers config, so the same env server; its episodes stop after 15 s
    hasty = built(get_registries(), {"name": "h", "environment": {**env, "episode_timeout_s": 15}},
                  tokenizer=tokenizer)[1]["h"]
    prompt = source.get(0)
    total = prompt.metadata["task_data"]["a"] + prompt.metadata["task_data"]["b"]
    server = asyncio.run(source.agent.environment.server())
    try:
        [hung] = run_group(hasty, prompt, 1, scripted_engine(["hang"]))
        samples = run_group(source, prompt, 2, scripted_engine(["boom", f"{total}"]))
    finally:
        source.agent.close()
        hasty.agent.close()
        output = server.output()
        server.stop()
    assert hung.reward_info["failed"] == "the environment's episode failed: timed out after 15 s (episode_timeout_s)"
    assert "cancelled run" in output  # verifiers' server was told to abort it, and served the next ones
    crashed, ok = samples
    assert crashed.reward_info["failed"].startswith("the environment's episode failed: RuntimeError: the "
                                                    "verifiers episode failed: ")
    assert "the scorer crashed" in crashed.reward_info["failed"]
    assert crashed.response_ids and hung.response_ids  # their model calls were made and recorded
    assert ok.reward_info["episode_reward"] == 1.0 and "failed" not in ok.reward_info
    assert [source.score(s.text, None, prompt=prompt, sample=s)["score"] for s in [hung, *samples]] == [0.0, 0.0, 1.0]


# ---- vf-eval against loongsage serve ---------------------------------------------------------

def test_vf_eval_against_loongsage_serve_records_one_trajectory_per_rollout(engine_url, tmp_path):
    """verifiers' own CLI, unmodified, against ``loongsage serve --session-header x-session-id``:
    it sends every rollout with one API key and ``X-Session-ID: <the rollout's trace id>``, so
    each rollout is a trajectory of its own, holding exactly the tokens vf-eval counted."""
    import io
    import os
    import subprocess

    import httpx

    from loongsage.controller.serve import run_serve

    router, _ = run_serve("tiny/grpo", [], engine_urls=[engine_url], block=False, out=io.StringIO(),
                          session_header="x-session-id")
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "VF_KEY": "vf-eval", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    try:
        done = subprocess.run(
            [f"{bin_dir}/vf-eval", "adder-tools", "-m", "tiny", "--client.base-url", f"{router.url}/v1",
             "--client.api-key-var", "VF_KEY", "--env.agent.harness.id", "null",
             "--env.agent.runtime.type", "subprocess", "--env.taskset.num-tasks", "2", "-n", "2", "-r", "1",
             "--sampling.max-tokens", "8", "--no-push", "--no-rich"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        [results] = list((tmp_path / "outputs").glob("*/traces.jsonl"))
        episodes = [json.loads(line) for line in results.read_text().splitlines()]
        traces = [episode["traces"][0] for episode in episodes]
        assert len(traces) == 2 and all(episode["ok"] for episode in episodes)
        listing = httpx.get(f"{router.url}/v1/trajectories").json()["trajectories"]
        assert sorted(t["trajectory_id"] for t in listing) == sorted(f"vf-eval.{t['id']}" for t in traces)
        for trace in traces:  # each rollout's trajectory holds the tokens verifiers counted for it
            [traj] = httpx.get(f"{router.url}/v1/trajectories/vf-eval.{trace['id']}").json()["attempts"]
            assert sum(traj["loss_mask"]) == trace["num_output_tokens"]
            last = trace["calls"][-1]["usage"]
            assert len(traj["tokens"]) == last["prompt_tokens"] + last["completion_tokens"]
    finally:
        router.stop()

"""The ``environment`` plugin kind: config binding and errors, episodes through a real router.

Config validation and source building run for real (registries with loongsage-agents
installed, plugins registered at run time). Episodes run through the real AgentFlow router and
the real openai SDK; the engine behind the router is the scripted one of
``tests/agents/conftest.py`` (the random tiny model cannot be made to write a chosen reply), so
the test decides what the policy replies and checks what became of each episode. The adapter
for reasoning-gym is tested in ``test_reasoning_gym.py``.
"""

from __future__ import annotations

import asyncio

import pytest
from environment_sources import GYM, built, config

from loongsage.config.validate import validate_config
from loongsage.plugin import ConfigError, UnknownPluginError, hookimpl
from loongsage.plugins import get_registries, load_plugins



# ---- config errors, before any actor starts ------------------------------------------------

@pytest.mark.parametrize("other", ["dataset", "agent", "reward"])
def test_a_source_naming_an_environment_and_the_triple_is_refused_naming_both(other):
    node = {"dataset": {"format": "synthetic_math"}, "agent": "chat", "reward": "math"}[other]
    with pytest.raises(ConfigError) as err:
        validate_config(config({"name": "rg", "environment": GYM, other: node}), get_registries())
    message = str(err.value)
    assert message.startswith(f"data_sources[0].{other}: the source names both an environment")
    assert "data_sources[0].environment" in message and f"data_sources[0].{other}" in message


def test_unknown_environment_type_names_the_installed_ones():
    with pytest.raises(UnknownPluginError) as err:
        validate_config(config({"name": "rg", "environment": {"type": "reasoning-gym"}}), get_registries())
    message = str(err.value)
    assert message.startswith("data_sources[0].environment.type: unknown environment 'reasoning-gym'")
    assert "reasoning_gym (loongsage-agents)" in message and "Did you mean 'reasoning_gym'?" in message


@pytest.mark.parametrize("key, value", [("episode_timeout_s", 0), ("concurrency", -1)])
def test_the_generic_keys_of_an_environment_node_are_checked(key, value):
    with pytest.raises(ConfigError, match=r"^data_sources\[0\]\.environment: expected episode_timeout_s > 0 "
                                          r"and concurrency >= 0"):
        validate_config(config({"name": "rg", "environment": {**GYM, key: value}}), get_registries())


def test_a_source_without_environment_still_needs_its_dataset_and_reward():
    with pytest.raises(ConfigError, match=r"^data_sources\[0\]\.dataset: required value missing"):
        validate_config(config({"name": "m", "reward": "math"}), get_registries())


class NeedsALibrary:
    """An environment plugin whose library is not installed."""

    from dataclasses import dataclass

    @dataclass
    class Params:
        requires = ("no_such_environment_library", "my-envs", "fancy")
        size: int = 3

    @staticmethod
    @hookimpl
    def loongsage_register_environments(register):
        register("fancy", "my_envs:Fancy", params=NeedsALibrary.Params)


def test_a_missing_library_names_the_extra_to_install():
    registries = load_plugins(extra=[(NeedsALibrary, "my-envs")])
    with pytest.raises(ConfigError) as err:
        validate_config(config({"name": "f", "environment": {"type": "fancy"}}), registries)
    message = str(err.value)
    assert message.startswith("data_sources[0].environment.type: environment 'fancy' needs the "
                              "'no_such_environment_library' library")
    assert "[fancy] of my-envs" in message


# ---- episodes through the router -----------------------------------------------------------

def run_group(source, prompt, n, engine):
    return asyncio.run(source.agent.run_group(prompt, n, engine, {"max_new_tokens": 16}))


class Scripted:
    """A run-time environment plugin: a reply "raise" fails the episode after its model call,
    "hang" never ends, anything else scores its length / 10."""

    from dataclasses import dataclass

    @dataclass
    class Params:
        size: int = 4

    class Env:
        def __init__(self, params, context):
            self.context = context

        def tasks(self, split):
            from loongsage.plugin import Prompt

            class Tasks:
                def __len__(self):
                    return 4

                def get(self, index):
                    return Prompt("", index, [{"role": "user", "content": f"task {split} {index}"}])

            return Tasks()

        async def run_episode(self, task, endpoint):
            from loongsage.plugin import Episode
            from loongsage_agents.agents.chat import openai_client

            async with openai_client(dict(endpoint.urls), endpoint.api_key) as client:
                reply = await client.chat.completions.create(model=endpoint.model, messages=task.messages,
                                                             **dict(endpoint.sampling))
            text = reply.choices[0].message.content
            if text == "raise":
                raise RuntimeError("the scorer crashed")
            if text == "hang":
                await asyncio.sleep(60)
            return Episode(reward=len(text) / 10, metrics={"length": len(text)}, text=text)

    @staticmethod
    @hookimpl
    def loongsage_register_environments(register):
        register("scripted", Scripted.Env, params=Scripted.Params)


@pytest.mark.calls_hook("loongsage_register_environments")
def test_a_failing_or_hanging_episode_is_marked_failed_and_the_others_scored(scripted_engine, tokenizer):
    from loongsage.controller.batching import episode_metrics

    registries = load_plugins(extra=[(Scripted, "scripted-envs")])
    env = {"type": "scripted", "episode_timeout_s": 8.0, "concurrency": 1}  # roomy on a loaded machine
    _, sources = built(registries, {"name": "s", "environment": env}, tokenizer=tokenizer)
    source = sources["s"]
    prompt = source.get(2)
    assert prompt.messages == [{"role": "user", "content": "task train 2"}] and prompt.source == "s"
    try:
        samples = run_group(source, prompt, 3, scripted_engine(["abcd", "raise", "hang"]))
    finally:
        source.agent.close()
    ok, crashed, hung = samples
    assert ok.reward_info["episode_reward"] == 0.4 and "failed" not in ok.reward_info
    assert crashed.reward_info["failed"] == "the environment's episode failed: RuntimeError: the scorer crashed"
    assert hung.reward_info["failed"] == ("the environment's episode failed: timed out after 8 s "
                                          "(episode_timeout_s)")
    assert all(s.response_ids for s in samples)  # each made its model call, recorded token-exactly
    scores = [source.score(s.text, None, prompt=prompt, sample=s)["score"] for s in samples]
    assert scores == [0.4, 0.0, 0.0]
    assert episode_metrics("s", samples) == {"rollout/length_mean/s": 4.0}
    unscored = type(ok)(prompt_ids=[1], response_ids=[], response_logprobs=[], weight_versions=[], loss_mask=[])
    with pytest.raises(ValueError, match="the episode finished without a reward"):
        source.score("", None, prompt=prompt, sample=unscored)


def test_without_the_episode_agent_the_error_says_where_it_comes_from(monkeypatch):
    monkeypatch.setenv("LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD", "1")  # loongsage-agents not loaded
    registries = load_plugins(extra=[(Scripted, "scripted-envs")])
    with pytest.raises(ConfigError) as err:
        validate_config(config({"name": "s", "environment": {"type": "scripted"}}), registries)
    message = str(err.value)
    assert message.startswith("data_sources[0].environment: environment sources run their episodes with the "
                              "'environment' agent, which no loaded distribution registers: 'environment' "
                              "(agent) comes with loongsage-agents, which is installed but not loaded "
                              "(LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD is set)")


class NoTasks:
    """An environment plugin whose tasks are not a dataset."""

    class Env(Scripted.Env):
        def tasks(self, split):
            return ["a list", "has no get"]

    @staticmethod
    @hookimpl
    def loongsage_register_environments(register):
        register("no_tasks", NoTasks.Env, params=Scripted.Params)


def test_tasks_that_are_not_a_dataset_are_a_config_error_naming_the_environment():
    registries = load_plugins(extra=[(NoTasks, "no-tasks")])
    with pytest.raises(ConfigError, match=r"^data_sources\[0\]\.environment: Env\.tasks\('train'\) returned a "
                                          r"list, not a dataset with get\(index\)"):
        built(registries, {"name": "n", "environment": {"type": "no_tasks"}})

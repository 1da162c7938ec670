"""A config-local plugin module's engine, dataset, agent, reward and tracker drive a real run.

The module is written to a temporary folder and named in the recipe's ``plugins:`` list, so
it loads the way a user's own module does; one GRPO step of the tiny model then runs in this
process (real Ray actors, real rollout engine). The train engine class travels to its Ray
actor by value (``register_pickle_by_value``): the actor's worker process cannot import a
module from this test's temporary folder.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

ray = pytest.importorskip("ray")

PROBE = '''
from dataclasses import dataclass

from loongsage import hookimpl
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.tracking.base import Tracker
from loongsage_agents.agents.single_turn import SingleTurnAgent
from loongsage_agents.datasets.synthetic_math import SyntheticMathDataset, SyntheticMathParams

DRAWN, GROUPS, LOGGED = [], [], []


class ProbeTrainEngine(EmbeddedTrainEngine):
    """The embedded trainer, counting its steps in a metric."""

    steps = 0

    def train_step(self, *args, **kwargs):
        metrics = super().train_step(*args, **kwargs)
        type(self).steps += 1
        return {**metrics, "train/probe_engine_steps": float(self.steps)}


class ProbeDataset(SyntheticMathDataset):
    format = "probe_math"

    def get(self, index):
        DRAWN.append(index)
        return super().get(index)


class ProbeAgent(SingleTurnAgent):
    async def run_group(self, prompt, *args, **kwargs):
        GROUPS.append(prompt.index)
        return await super().run_group(prompt, *args, **kwargs)


@dataclass
class ConstantParams:
    """A constant reward."""

    score: float = 0.25


def constant_reward(sample_text, ground_truth, params, **context):
    return {"score": params.score}


class ListTracker(Tracker):
    def log(self, metrics, step):
        LOGGED.append((step, dict(metrics)))


@hookimpl
def loongsage_register_engines(register):
    register("probe_train", ProbeTrainEngine)


@hookimpl
def loongsage_register_datasets(register):
    register("probe_math", ProbeDataset, params=SyntheticMathParams)


@hookimpl
def loongsage_register_agents(register):
    from loongsage_agents.agents.params import SingleTurnParams

    register("probe_agent", ProbeAgent, params=SingleTurnParams)


@hookimpl
def loongsage_register_rewards(register):
    register("constant", constant_reward, params=ConstantParams)


@hookimpl
def loongsage_register_trackers(register):
    register("list", ListTracker)
'''

RECIPE = """
defaults:
  - /tiny/grpo
  - _self_
plugins: [probe_run_plugins]
train: {backend: probe_train}
rollout: {prompts_per_step: 2, n_samples_per_prompt: 2, max_new_tokens: 4}
trainer: {steps: 1, sft: {steps: 0}}
checkpoint: {interval: 0}
logging: {trackers: [list], progress_bar: false, samples_per_step: 0}
data_sources:
  - name: probe
    dataset: {format: probe_math, max_operand: 5}
    agent: {name: probe_agent}
    reward: {name: constant, score: 0.25}
"""


@pytest.mark.slow
@pytest.mark.calls_hook(
    "loongsage_register_engines",
    "loongsage_register_datasets",
    "loongsage_register_agents",
    "loongsage_register_rewards",
    "loongsage_register_trackers",
)
def test_one_step_runs_on_the_plugin_components(tmp_path, monkeypatch):
    from ray import cloudpickle

    from loongsage.config.compose import load_config
    from loongsage.controller import run_training
    from loongsage.plugins import clear_cache

    (tmp_path / "probe_run_plugins.py").write_text(textwrap.dedent(PROBE))
    (tmp_path / "probe.yaml").write_text(textwrap.dedent(RECIPE))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("probe_run_plugins", None)
    try:
        run = load_config("probe", [f"logging.run_root={tmp_path / 'runs'}"], str(tmp_path))
        registries = run.registries
        probe = sys.modules["probe_run_plugins"]
        cloudpickle.register_pickle_by_value(probe)
        run_training(run)
    finally:
        clear_cache()
    assert registries.engine.entry("probe_train").distribution == "local:probe_run_plugins"
    ((step, metrics),) = probe.LOGGED
    assert step == 0 and metrics["train/probe_engine_steps"] == 1.0  # trained by the probe engine
    assert metrics["rollout/reward_mean"] == pytest.approx(0.25)  # scored by the constant reward
    assert len(probe.GROUPS) == 2 and sorted(probe.GROUPS) == sorted(set(probe.GROUPS))  # its agent
    assert set(probe.GROUPS) <= set(probe.DRAWN)  # on prompts its dataset produced

"""The Python entry point for notebooks: ``loongsage.train(recipe, overrides, reward=fn)``.

Like the CLI it composes the recipe, trains and returns; unlike it, a reward can be a plain
Python callable (TRL's ``reward_funcs`` habit) with the reward contract
``fn(text, ground_truth, params, **context) -> float | dict`` (``params`` is ``None``; context
holds ``prompt``, ``sample`` and ``sandbox``). It is registered for this one run through the
same plugin path as any reward, a run-time plugin handed to ``load_config(extra_plugins=)``,
under its ``__name__``, and every data source of the recipe scores with it (set on the composed
config, ``load_config(adjust=)``: the recipe is composed once). Rewards run in
worker processes, which cannot import a notebook's (or a script's) functions, so the
callable's module is sent by value (``cloudpickle.register_pickle_by_value``): the function's
code travels with each call, and module globals it touches are the worker's copies.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from loongsage.hookspecs import hookimpl

if TYPE_CHECKING:
    from omegaconf import DictConfig


@dataclass
class TrainResult:
    """A finished run: its directory and every row of its ``metrics.jsonl``."""

    run_dir: Path
    metrics: list[dict] = field(default_factory=list)

    def series(self, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` of one metric, in step order (rows without it skipped)."""
        return [(r["step"], r[key]) for r in self.metrics if isinstance(r.get(key), (int, float))]


class CallableRewards:
    """A run-time plugin registering plain callables as ``reward`` plugins of one run."""

    def __init__(self, rewards: dict[str, Callable]) -> None:
        self.rewards = rewards

    @hookimpl
    def loongsage_register_rewards(self, register) -> None:
        for name, fn in self.rewards.items():
            register(name, fn, doc=(fn.__doc__ or f"Python callable {name} (loongsage.train)").strip())


def _send_by_value(fn: Callable) -> None:
    """Pickle ``fn``'s module by value, so reward workers need not import it."""
    import inspect
    import sys

    import cloudpickle

    module = inspect.getmodule(fn)
    if module is not None and module.__name__ not in sys.builtin_module_names:
        cloudpickle.register_pickle_by_value(module)


def _use_reward(name: str, cfg: DictConfig) -> None:
    """Every data source's reward is ``name`` (a bare name: the callable's, with no parameters)."""
    for source in cfg.data_sources:
        source.reward = name


def train(config_name: str, overrides: Sequence[str] = (), *, config_dir: str | None = None,
          reward: Callable | None = None) -> TrainResult:
    """Train the recipe ``config_name`` with Hydra ``overrides``; see the module docstring."""
    from loongsage.config.compose import load_config
    from loongsage.controller import run_training
    from loongsage.logs import ROOT, configure_logging
    from loongsage.tracking.jsonl import read_metrics

    if not logging.getLogger(ROOT).handlers:
        configure_logging(0)
    if reward is None:
        run = load_config(config_name, overrides, config_dir)
    else:
        if not callable(reward):
            raise TypeError(f"reward must be a callable (text, ground_truth, params, **context), got {reward!r}")
        name = getattr(reward, "__name__", "python_reward").replace("<lambda>", "python_reward")
        _send_by_value(reward)
        plugin = (CallableRewards({name: reward}), "loongsage.train")
        run = load_config(config_name, overrides, config_dir, extra_plugins=[plugin], adjust=partial(_use_reward, name))
        # the model card and config.yaml say how the recipe was changed, as for an override
        run = dataclasses.replace(run, overrides=(*run.overrides, *(f"data_sources.{s.index}.reward={name}"
                                                                   for s in run.sources)))
    run_dir = Path(run_training(run))
    return TrainResult(run_dir, read_metrics(run_dir / "metrics.jsonl"))

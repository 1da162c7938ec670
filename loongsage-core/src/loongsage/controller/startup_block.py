"""The first lines a run prints: where it writes, what it trains, on what data.

A new user reads the start of the output to learn where the run directory is and whether the
run is the one they meant (model, recipe, algorithm, steps, data sources); these lines come
before Ray's and the engines' own, the run directory first, each one short. The memory
estimate and the actor layout follow as the run builds them (``memory_budget``, ``placement``).
"""

from __future__ import annotations

from typing import Any, Mapping

from loongsage.config.validate import RunConfig


def run_lines(spec: RunConfig, given_model: str, run_dir: Any) -> list[str]:
    """``run directory: ...`` then ``model: ...``; known before anything starts. ``spec`` holds
    the resolved model folder, ``given_model`` what the config named (``builtin:tiny``)."""
    model = spec.cfg.model.path
    named = f" ({given_model})" if given_model != model else ""
    algorithm = f"{spec.algorithm.advantage.name} advantages, {spec.algorithm.policy_loss.name} loss"
    recipe = f"recipe {spec.recipe}, " if spec.recipe else ""
    steps = spec.cfg.trainer.steps
    return [f"run directory: {run_dir}",
            f"model: {model}{named}; {recipe}{algorithm}, {steps} step{'' if steps == 1 else 's'}"]


def data_line(sources: Mapping[str, Any]) -> str:
    """``data: math (jsonl, 1,200 prompts, weight 0.7), gym (environment reasoning_gym, 1,000
    prompts, weight 0.3)``: every source as built."""
    parts = []
    for source in sources.values():
        size = source.size()
        count = "unbounded" if size is None else f"{size:,} prompts"
        role = ", held out" if source.spec.eval_only else f", weight {source.weight:g}"
        tasks = source.spec.tasks  # its dataset, or the environment that supplies its tasks
        what = tasks.name if tasks.kind == "dataset" else f"{tasks.kind} {tasks.name}"
        parts.append(f"{source.name} ({what}, {count}{role})")
    return "data: " + "; ".join(parts)

"""End-to-end helpers (fixture ``runs``): the real CLI in a subprocess with its own Ray cluster,
and checks of an AgentFlow run's persisted trajectories (``trajectories/<source>/``: tokens, loss
mask, logprobs, versions, segments; rewards in ``rewards.jsonl``) against the trained samples."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

CLI = [sys.executable, "-m", "loongsage.cli"]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("RAY_AUTH_MODE", "disabled")
    return env


def train(run_dir: Path, *overrides: str, timeout: float = 900,
          config: str = "tiny/grpo") -> subprocess.CompletedProcess:
    """Run ``loongsage train`` to completion; fail the test with its output if it fails."""
    args = [*CLI, "train", "--config-name", config, f"trainer.run_dir={run_dir}",
            "logging.progress_bar=false", *overrides]
    result = subprocess.run(args, capture_output=True, text=True, env=cli_env(), timeout=timeout)
    if result.returncode != 0:
        pytest.fail(f"loongsage train failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def start_train(run_dir: Path, *overrides: str) -> subprocess.Popen:
    """Start ``loongsage train`` in its own process group (so a kill takes Ray with it)."""
    args = [*CLI, "train", "--config-name", "tiny/grpo", f"trainer.run_dir={run_dir}",
            "logging.progress_bar=false", *overrides]
    return subprocess.Popen(args, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def kill_group(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def wait_for(predicate, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"training exited early with {proc.returncode}")
        time.sleep(0.5)
    pytest.fail("timed out waiting for the training run")


def kill_after_a_checkpoint(run_dir: Path, steps: int, *overrides: str) -> int:
    """Start ``loongsage train`` (``trainer.steps=steps`` among ``overrides``), SIGKILL its
    process group once a checkpoint of step 1 or later is complete, and return that step; fail
    the test if the run had already reached its last step."""
    proc = start_train(run_dir, *overrides)
    wait_for(lambda: latest_step(run_dir) >= 1, timeout=600, proc=proc)
    kill_group(proc)
    last = latest_step(run_dir)
    assert 1 <= last < steps - 1, "the kill must land before the run finished"
    return last


def metrics(run_dir: Path) -> list[dict]:
    from loongsage.tracking.jsonl import read_metrics

    return read_metrics(run_dir / "metrics.jsonl")


def latest_step(run_dir: Path) -> int:
    """The step of the newest complete checkpoint, -1 before the first."""
    marker = run_dir / "checkpoints" / "latest"
    return int(marker.read_text().split("_")[-1]) if marker.exists() else -1


def trained_prompts(run_dir: Path, step: int) -> list[tuple[str, int]]:
    """(source, prompt index) of every sample saved for ``step``, in order."""
    path = run_dir / "samples" / f"step_{step:06d}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [(r["source"], r["prompt_index"]) for r in rows]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def finished_trajectories(run_dir: Path, source: str, min_version: int = 1,
                          unscored_allowed: bool = False) -> tuple[list[dict], list[dict]]:
    """Every scored trajectory of ``source``, each finished with aligned arrays and its sampled
    tokens from policy version ``min_version`` or later (1: after the run's warm start); and
    their reward rows, in the same order.

    ``unscored_allowed``: an asynchronous run ends with groups still in flight for steps that
    never came; their trajectories are persisted without a reward (never trained, so
    ``check_samples_are_trajectories`` still finds every trained sample scored) and are left
    out. Otherwise every persisted trajectory must have been scored.
    """
    trajectories = read_jsonl(run_dir / "trajectories" / source / "trajectories.jsonl")
    rewards = read_jsonl(run_dir / "trajectories" / source / "rewards.jsonl")
    scored = {r["trajectory_id"] for r in rewards}
    assert scored <= {t["trajectory_id"] for t in trajectories}
    if unscored_allowed:
        trajectories = [t for t in trajectories if t["trajectory_id"] in scored]
    assert sorted(r["trajectory_id"] for r in rewards) == sorted(t["trajectory_id"] for t in trajectories)
    for traj in trajectories:
        assert traj["status"] == "finished", traj["error"]
        n = len(traj["tokens"])
        assert len(traj["loss_mask"]) == len(traj["logprobs"]) == len(traj["versions"]) == n
        sampled = [i for i, m in enumerate(traj["loss_mask"]) if m]
        assert sampled and all(traj["versions"][i] >= min_version for i in sampled)
    return trajectories, rewards


def segment_tokens(traj: dict, segment_id: int) -> tuple[list[int], list[int]]:
    """A trajectory segment's tokens and loss mask, in order."""
    [segment] = [g for g in traj["segments"] if g["segment_id"] == segment_id]
    positions = [i for start, end in segment["spans"] for i in range(start, end)]
    return [traj["tokens"][i] for i in positions], [traj["loss_mask"][i] for i in positions]


def check_samples_are_trajectories(run_dir: Path, step: int, trajectories: list[dict],
                                   rewards: list[dict]) -> list[dict]:
    """The samples saved for ``step`` are the trajectories' segments token for token, their
    loss masks the router's, their rewards the recorded ones; returns the samples."""
    saved = read_jsonl(run_dir / "samples" / f"step_{step:06d}.jsonl")
    by_id = {t["trajectory_id"]: t for t in trajectories}
    reward_of = {r["trajectory_id"]: r["reward"] for r in rewards}
    for sample in saved:
        info = sample["reward_info"]
        tokens, mask = segment_tokens(by_id[info["trajectory_id"]], info["segment_id"])
        assert sample["prompt_ids"] + sample["response_ids"] == tokens
        assert [0] * len(sample["prompt_ids"]) + sample["loss_mask"] == mask
        assert reward_of[info["trajectory_id"]] == sample["reward"]
    return saved


def first_last_means(rows: list[dict], key: str, n: int = 5) -> tuple[float, float]:
    """Mean of ``key`` over the first ``n`` and over the last ``n`` metric rows."""
    values = [r[key] for r in rows]
    first, last = values[:n], values[-n:]
    return sum(first) / len(first), sum(last) / len(last)


class Runs:
    """The helpers above, handed to tests as the ``runs`` fixture."""

    cli = CLI
    env = staticmethod(cli_env)
    train = staticmethod(train)
    start_train = staticmethod(start_train)
    kill_group = staticmethod(kill_group)
    wait_for = staticmethod(wait_for)
    kill_after_a_checkpoint = staticmethod(kill_after_a_checkpoint)
    metrics = staticmethod(metrics)
    trained_prompts = staticmethod(trained_prompts)
    latest_step = staticmethod(latest_step)
    read_jsonl = staticmethod(read_jsonl)
    finished_trajectories = staticmethod(finished_trajectories)
    segment_tokens = staticmethod(segment_tokens)
    check_samples_are_trajectories = staticmethod(check_samples_are_trajectories)
    first_last_means = staticmethod(first_last_means)


@pytest.fixture(scope="session")  # stateless helpers: module fixtures may use them too
def runs() -> type[Runs]:
    return Runs

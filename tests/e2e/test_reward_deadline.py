"""A reward that never returns on some samples cannot hang a training run: ``loongsage train``
with a config-local reward module whose first two calls spin forever (CPU-bound) finishes
both its steps, the two samples marked and counted as timeouts, and the killed worker
processes gone from the process table."""

from __future__ import annotations

import json
import os
import textwrap

import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.serial]

SPIN_PLUGIN = '''
import os
from dataclasses import dataclass
from pathlib import Path

from loongsage import hookimpl


@dataclass
class SpinFirstParams:
    """The first ``spins`` calls of the run loop forever (each writes its pid first)."""

    state_dir: str = ""
    spins: int = 2


def spin_first(sample_text, ground_truth, params, **context):
    for n in range(params.spins):
        try:
            os.close(os.open(Path(params.state_dir, f"spin-{n}"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        Path(params.state_dir, f"pid-{os.getpid()}").touch()
        while True:
            pass
    return 0.5


@hookimpl
def loongsage_register_rewards(register):
    register("spin_first", spin_first, params=SpinFirstParams)
'''


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_spinning_reward_times_out_and_the_run_completes(tmp_path, runs, monkeypatch):
    (tmp_path / "spin_run_plugin.py").write_text(textwrap.dedent(SPIN_PLUGIN))
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    run_dir = tmp_path / "run"
    runs.train(run_dir, "plugins=[spin_run_plugin]", "trainer.steps=2", "trainer.sft.steps=0",
               "rollout.prompts_per_step=2", "rollout.n_samples_per_prompt=2", "rollout.max_new_tokens=4",
               "checkpoint.interval=0", "reward.workers=2",
               f"data_sources=[{{name: spin, dataset: {{format: synthetic_math, max_operand: 9}}, "
               f"reward: {{name: spin_first, state_dir: '{state}', timeout_s: 2}}}}]",
               timeout=600)
    rows = runs.metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1]
    assert sum(r["rollout/reward_timeouts"] for r in rows) == 2.0
    assert sum(r["rollout/reward_errors"] + r["rollout/reward_dropped_groups"] for r in rows) == 0.0
    samples = [json.loads(line) for step in (0, 1)
               for line in (run_dir / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()]
    marked = [s for s in samples if s["reward_info"].get("reward_failure") == "timeout"]
    assert len(marked) == 2 and all(s["reward"] == 0.0 for s in marked)
    assert {s["reward_info"]["reward_error"] for s in marked} == {"timeout after 2 s (worker killed)"}
    assert sorted(s["reward"] for s in samples) == [0.0, 0.0] + [0.5] * 6
    pids = [int(p.name.split("-")[1]) for p in state.glob("pid-*")]
    assert len(pids) == 2 and all(gone(p) for p in pids)

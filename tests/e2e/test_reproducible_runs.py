"""Reproducible runs, step replay and training from a recording, on tiny synchronous CPU runs.

Real processes throughout: ``loongsage.train`` in a subprocess with its own local Ray cluster,
``loongsage replay`` through the CLI. The runs score with a reward that varies with the text
(the tiny untrained model never earns the math reward, and a group of equal rewards has no
gradient), so the weights move and a difference anywhere would show.

* two runs with the same config and seed write the same ``metrics.jsonl`` (timings, memory
  and CPU figures aside), the same saved samples and bitwise the same final weights; a run
  with another seed samples other tokens;
* ``loongsage replay`` of step 3 reproduces the logged loss, gradient norm and
  ``train/is_approx_k3_kl`` exactly, and under ``--override algorithm/policy_loss=gspo`` prints
  another loss;
* a run trained ``rollout.from_recording`` of the first one starts no rollout engine (its
  actor layout has only the train rank) and says so in its metrics.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = '''
import sys
import loongsage


def varied_reward(text, ground_truth, params, **context):
    return float(len(set(text)) % 4) / 3


if __name__ == "__main__":
    loongsage.train("tiny/grpo", sys.argv[1:], reward=varied_reward)
'''
COMMON = (
    "logging.progress_bar=false",
    "trainer.sft.steps=0",
    "rollout.prompts_per_step=2",
    "rollout.n_samples_per_prompt=4",
    "rollout.max_new_tokens=8",
    "logging.samples_per_step=8",
    "rollout.max_running_requests=1",  # every request decoded alone: logprobs bitwise (docs/debugging.md)
)
RECORDED = ("trainer.steps=4", "checkpoint.interval=1", "checkpoint.keep_last=10", "rollout.record=true")
NOT_COMPARED = ("timing/", "perf/")  # and each row's wall-clock "time"


def train_py(tmp: Path, run_dir: Path, *overrides: str, runs) -> None:
    script = tmp / "train_run.py"
    script.write_text(SCRIPT)
    args = [sys.executable, str(script), f"trainer.run_dir={run_dir}", *COMMON, *overrides]
    result = subprocess.run(args, capture_output=True, text=True, env=runs.env(), timeout=900)
    if result.returncode != 0:
        pytest.fail(f"training failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def compared_metrics(run_dir: Path, runs) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "time" and not k.startswith(NOT_COMPARED)}
            for row in runs.metrics(run_dir)]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, runs) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("repro")
    dirs = {name: tmp / name for name in ("first", "second", "other_seed")}
    train_py(tmp, dirs["first"], *RECORDED, runs=runs)
    train_py(tmp, dirs["second"], *RECORDED, runs=runs)
    train_py(tmp, dirs["other_seed"], "trainer.steps=1", "trainer.seed=1", runs=runs)
    return dirs


def test_same_seed_same_metrics_samples_and_weights_other_seed_other_samples(recorded, runs):
    first, second = recorded["first"], recorded["second"]
    rows = compared_metrics(first, runs)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert any(r["train/grad_norm"] > 0 for r in rows)  # the weights moved
    assert rows == compared_metrics(second, runs)
    for step in range(4):
        name = f"samples/step_{step:06d}.jsonl"
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    weights = "final_model/model.safetensors"
    assert digest(first / weights) == digest(second / weights)
    ours = runs.read_jsonl(first / "samples/step_000000.jsonl")
    theirs = runs.read_jsonl(recorded["other_seed"] / "samples/step_000000.jsonl")
    assert [s["response_ids"] for s in ours] != [s["response_ids"] for s in theirs]
    assert all(s["sampling_seed"] is not None for s in ours)


def replay(run_dir: Path, *args: str, runs) -> dict:
    result = subprocess.run([*runs.cli, "replay", str(run_dir), "--step", "3", "--json", *args],
                            capture_output=True, text=True, env=runs.env(), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.splitlines()[0])


def test_replay_reproduces_the_logged_step_and_recomputes_it_under_another_loss(recorded, runs, tmp_path):
    first = recorded["first"]
    dump = tmp_path / "step3.pt"
    rows = {r["metric"]: r for r in replay(first, "--dump", str(dump), runs=runs)["rows"]}
    logged = runs.metrics(first)[3]
    for key in ("train/loss", "train/grad_norm", "train/is_approx_k3_kl", "train/pg_loss"):
        assert rows[key]["logged"] == logged[key]
        assert rows[key]["replayed"] == logged[key], key
        assert rows[key]["difference"] == 0.0
    assert logged["train/grad_norm"] > 0

    import torch

    tensors = torch.load(dump)
    assert tensors["old_logprobs"].shape == tensors["input_ids"].shape
    assert torch.equal(tensors["loss_mask"].bool().sum(), torch.tensor(sum(
        len(s["response_ids"]) for s in runs.read_jsonl(first / "samples/step_000003.jsonl"))))

    gspo = {r["metric"]: r for r in replay(first, "--override", "algorithm/policy_loss=gspo", runs=runs)["rows"]}
    assert gspo["train/loss"]["logged"] == logged["train/loss"]
    assert gspo["train/loss"]["replayed"] != logged["train/loss"]
    assert gspo["train/grad_norm"]["replayed"] != logged["train/grad_norm"]


def test_a_run_from_a_recording_starts_no_engine(recorded, runs, tmp_path):
    run_dir = tmp_path / "from_recording"
    train_py(tmp_path, run_dir, "trainer.steps=2", f"rollout.from_recording={recorded['first']}", runs=runs)
    layout = json.loads((run_dir / "layout.json").read_text())
    assert [a["role"] for a in layout["actors"]] == ["train"]
    rows = runs.metrics(run_dir)
    assert [r["rollout/from_recording"] for r in rows] == [1.0, 1.0]
    recorded_rows = runs.metrics(recorded["first"])
    # the first step starts from the recording's weights: the same step; afterwards they differ
    # only through what each trained on, which is the same batches here
    assert rows[0]["train/loss"] == recorded_rows[0]["train/loss"]
    assert [r["rollout/reward_mean"] for r in rows] == [r["rollout/reward_mean"] for r in recorded_rows[:2]]

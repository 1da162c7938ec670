"""A plain Python script that calls ``loongsage.train(..., reward=fn)`` at module level, with no
``if __name__ == "__main__":`` guard, trains as written: the reward worker processes never
import the script again (before, each worker re-ran it and started a whole second run). Real
processes throughout: the script in a subprocess with its own Ray cluster; the script counts
how often it is imported in a file next to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent('''
    import pathlib

    import loongsage

    with open(pathlib.Path(__file__).with_name("imports.txt"), "a") as marks:
        marks.write(__name__ + "\\n")


    def short_answers(text, ground_truth, params, **context):
        return float(len(context["sample"].response_ids) <= 6)


    result = loongsage.train("tiny/grpo", ["trainer.run_dir=run", "trainer.steps=3", "trainer.sft.steps=0",
                                           "rollout.prompts_per_step=2", "rollout.n_samples_per_prompt=2",
                                           "rollout.max_new_tokens=8", "reward.workers=2",
                                           "logging.progress_bar=false"], reward=short_answers)
    print("steps", [row["step"] for row in result.metrics])
''')


def script_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own Ray cluster
    return {**env, "RAY_AUTH_MODE": "disabled", "OMP_WAIT_POLICY": "PASSIVE"}


def test_a_script_without_the_main_guard_trains_once_with_its_callable_reward(tmp_path):
    (tmp_path / "train_me.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, "train_me.py"], cwd=tmp_path, env=script_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "imports.txt").read_text().splitlines() == ["__main__"], done.stderr[-3000:]
    assert "steps [0, 1, 2]" in done.stdout
    samples = [json.loads(line) for path in sorted((tmp_path / "run" / "samples").glob("step_*.jsonl"))
               for line in path.read_text().splitlines()]
    assert len(samples) == 3 * 2 * 2
    assert all(s["reward"] == float(len(s["response_ids"]) <= 6) for s in samples)

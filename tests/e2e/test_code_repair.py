"""The agentic code-repair recipe (``tiny/code_repair``, shrunk) end to end, synchronous and
asynchronous: GRPO steps whose rollouts are ``tool_loop`` conversations (openai SDK -> the
run's router -> embedded engine) whose tool calls run in the task's bubblewrap sandbox, and
whose answer is ``solution.py`` as the sandbox holds it afterwards, scored by the task's
hidden tests in a fresh sandbox. Both runs start from one warm start on the tasks' bash
demonstrations (``loongsage sft`` on the same recipe with the recipe's own warm start: the slow
part, built once per source tree and cached by tests/warm_starts.py). That warm start decays its learning rate to zero: at a constant
3e-3 the tiny model's tool calling hinged on the noise of its last batches (three 200-step warm
starts that differed only in seed or thread count wrote a well-formed first call greedily on 35,
40 and 6 of 40 tasks, and a CI machine's made no call in 24 trajectories); decayed, 100 steps
gave 40 of 40 in each of two (seeds 0 and 1).

Checks: every trajectory is persisted and the trained samples are its tokens exactly, with
the rollout logprobs the train engine computes for them (synchronous run: same weights);
every tool result the model read is in the trajectory's tokens and out of the loss mask;
each reward is the hidden tests' verdict (``passed/total`` from ``code_exec``: a trajectory
that never ran a command submits the buggy file unchanged, which passes exactly as many
hidden tests as the buggy file does here, and scores 0, while the task's fix scores 1); the
held-out source is evaluated and never trained on. The 3M model does not learn the task:
this is the pipeline's test, not a learning curve.
"""

from __future__ import annotations

import asyncio
import shutil

import pytest
from warm_starts import warm_start

pytestmark = pytest.mark.slow

MODES = {"sync": (), "async": ("async.enable=true", "placement.mode=disaggregated")}
STEPS, PROMPTS, SAMPLES, EVAL_PROMPTS = 2, 2, 2, 2
MAX_NEW_TOKENS = 64  # per model turn, the recipe's rollout.max_new_tokens
SHRUNK = (f"trainer.steps={STEPS}", f"rollout.prompts_per_step={PROMPTS}",
          f"rollout.n_samples_per_prompt={SAMPLES}", f"trainer.eval_interval={STEPS}",
          f"trainer.eval_prompts={EVAL_PROMPTS}", "trainer.sft.steps=0",
          f"rollout.max_new_tokens={MAX_NEW_TOKENS}")


@pytest.fixture(scope="module")
def warm_model(runs):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (the recipe's sandbox)")
    return warm_start("tiny/code_repair", env=runs.env())


def _hidden_test_verdicts(prompts: dict, files: str) -> dict:
    """``code_exec`` in bwrap on each prompt's buggy file and on its fix (the demonstration's)."""
    from loongsage.data.sources import SandboxFactory
    from loongsage.plugins import get_registries

    from loongsage_agents.agents.task_files import submission
    from loongsage_agents.rewards.code_exec import code_exec_reward_async

    registries = get_registries()
    factory = SandboxFactory(registries.resolve("sandbox", {"type": "bwrap", "cpu_time_s": 20}, "sandbox", "type"))

    async def verdict(prompt, code):
        return await code_exec_reward_async(submission(code), prompt.ground_truth, None, sandbox=factory)

    async def all_verdicts():
        keys = list(prompts)
        buggy = await asyncio.gather(*(verdict(prompts[k], prompts[k].metadata["files"][files]) for k in keys))
        fixed = await asyncio.gather(*(verdict(prompts[k], _fix(prompts[k])) for k in keys))
        return {k: (b, f) for k, b, f in zip(keys, buggy, fixed)}

    return asyncio.run(all_verdicts())


def _fix(prompt) -> str:
    import json

    [write] = [json.loads(c["function"]["arguments"])["command"] for m in prompt.metadata["demonstration"]
               if m["role"] == "assistant" for c in m.get("tool_calls", [])
               if "<< 'EOF'" in c["function"]["arguments"]]
    return write.split("<< 'EOF'\n", 1)[1][:-len("EOF")]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_code_repair_trajectories_are_token_exact_and_scored_by_the_sandboxed_hidden_tests(
        mode, warm_model, tmp_path, runs):
    from transformers import AutoTokenizer

    from loongsage_agents.datasets.code_repair import CodeRepairDataset
    from loongsage_agents.datasets.params import CodeRepairParams

    run_dir = tmp_path / mode
    runs.train(run_dir, *SHRUNK, *MODES[mode], f"model.path={warm_model}", "logging.samples_per_step=64",
               config="tiny/code_repair")
    rows = runs.metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 2: the evaluation after the last step
    for row in rows[:STEPS]:
        assert 1.0 <= row["rollout/turns_mean"] <= 4.0
        assert row["rollout/total_mean"] >= 4  # hidden tests per task: at least 2 visible + 2 more
        assert row["rollout/has_code_mean"] == 1.0  # solution.py is always submitted
    if mode == "sync":  # the train engine's logprobs of the stored ids are the engine's
        assert all(row["train/is_approx_k3_kl"] < 1e-6 for row in rows[:STEPS])
    evals = [r for r in rows if "eval/reward_mean" in r]
    assert [r["step"] for r in evals] == [0, STEPS]
    assert all("eval/reward_mean/heldout" in r and "eval/reward_mean/code_repair" not in r for r in evals)

    tokenizer = AutoTokenizer.from_pretrained(run_dir / "final_model")
    data = {split: CodeRepairDataset(CodeRepairParams(split=split, **({"size": 200} if split == "heldout" else {})))
            for split in ("train", "heldout")}
    checked_tools = 0
    for source, split in (("code_repair", "train"), ("heldout", "heldout")):
        trajectories, rewards = runs.finished_trajectories(run_dir, source, min_version=0,
                                                           unscored_allowed=mode == "async")
        if source == "heldout":
            assert len(trajectories) == 2 * EVAL_PROMPTS  # before step 0 and after the last step
        else:
            assert len(trajectories) >= STEPS * PROMPTS * SAMPLES
        prompts = {t["metadata"]["index"]: data[split].get(t["metadata"]["index"]) for t in trajectories}
        verdicts = _hidden_test_verdicts(prompts, "solution.py")
        for t, r in zip(sorted(trajectories, key=lambda t: t["trajectory_id"]),
                        sorted(rewards, key=lambda r: r["trajectory_id"])):
            prompt, info = prompts[t["metadata"]["index"]], r["info"]
            buggy, fixed = verdicts[t["metadata"]["index"]]
            assert fixed["score"] == 1.0 and buggy["score"] == 0.0
            assert info["total"] == len(prompt.ground_truth["tests"]) and info["has_code"]
            assert r["reward"] == float(info["passed"] == info["total"])
            if info["tool_calls"] == 0:  # nothing ran: the buggy file went to the hidden tests
                assert (info["passed"], r["reward"]) == (buggy["passed"], 0.0)
            checked_tools += _check_tool_results_unmasked(t, tokenizer)
    for step in range(STEPS):
        saved = runs.check_samples_are_trajectories(
            run_dir, step, *runs.finished_trajectories(run_dir, "code_repair", 0, unscored_allowed=mode == "async"))
        assert len(saved) == PROMPTS * SAMPLES and {s["source"] for s in saved} == {"code_repair"}
    assert checked_tools >= 1, "no trajectory called a tool: the warm start did not teach the call format"


def _check_tool_results_unmasked(traj: dict, tokenizer) -> int:
    """Each tool result of the trajectory is inside a run of tokens out of the loss mask, and
    each loss-masked run is one model turn: it ends in the end-of-turn token or at the
    per-turn token limit."""
    tokens, mask = traj["tokens"], traj["loss_mask"]
    runs, start = [], 0
    for i in range(1, len(tokens) + 1):
        if i == len(tokens) or mask[i] != mask[start]:
            runs.append((mask[start], i - start, tokenizer.decode(tokens[start:i])))
            start = i
    masked_out = [text for m, _, text in runs if not m]
    for m, length, text in runs:
        if m:
            assert text.endswith("<|im_end|>") or length == MAX_NEW_TOKENS, text
    results = [msg["content"] for segment in traj["segments"] for msg in segment["messages"]
               if msg["role"] == "tool" and msg["content"]]
    for result in results:
        assert any(result in text for text in masked_out), result
    return len(results)

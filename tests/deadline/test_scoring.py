"""RewardScorer on data sources resolved by config validation, with real worker processes:
a reward that never returns, a huge factorial for the math reward and a reward that raises
each get the source's ``reward.on_error``, are named in ``reward_info`` and counted, and the
rest of the group is scored; a killed worker leaves the process table."""

from __future__ import annotations

import asyncio

import pytest
from omegaconf import OmegaConf

from loongsage.config.validate import validate_config
from loongsage.data.scoring import RewardFailed, RewardScorer
from loongsage.data.sources import build_sources
from loongsage.data.types import Prompt, Sample
from loongsage.deadline.pool import DeadlinePool

pytestmark = [pytest.mark.timeout(240), pytest.mark.serial]  # a reward that is not stopped fails the test instead of hanging

NO_FAILURES = {"rollout/reward_timeouts": 0.0, "rollout/reward_errors": 0.0, "rollout/reward_dropped_groups": 0.0}


@pytest.fixture(scope="module")
def pool():
    with DeadlinePool(2, preload=["deadline_probes", "loongsage_agents.rewards.math"]) as workers:
        yield workers


def source(registries, reward, **section):
    cfg = OmegaConf.create({"model": {"path": "unused"}, "reward": section, "data_sources": [
        {"name": "p", "dataset": {"format": "synthetic_math", "size": 8}, "reward": reward}]})
    run = validate_config(cfg, registries)
    return build_sources(run.sources, registries)["p"]


def group(*texts):
    prompt = Prompt("p", 0, [{"role": "user", "content": "1 + 2?"}], ground_truth="3")
    return prompt, [Sample([1], [2], [0.0], [0], [1], text=t, reward_info={"turns": 1}) for t in texts]


def score(scorer, src, prompt, samples):
    return asyncio.run(scorer.score_group(src, prompt, samples))


def test_a_reward_that_never_returns_is_stopped_marked_and_counted(registries, pool, tmp_path, process_table):
    src = source(registries, {"name": "probe", "pid_dir": str(tmp_path), "timeout_s": 1})
    scorer = RewardScorer(pool)
    prompt, samples = group("ok", "SPIN", "fine", "SPIN again")
    assert score(scorer, src, prompt, samples) is True  # on_error defaults to zero: the group trains
    assert [s.reward for s in samples] == [1.0, 0.0, 1.0, 0.0]
    for s in (samples[1], samples[3]):
        assert s.reward_info == {"turns": 1, "reward_failure": "timeout", "reward_error": "timeout after 1 s (worker killed)"}
    assert samples[0].reward_info["turns"] == 1 and "reward_failure" not in samples[0].reward_info
    assert scorer.metrics() == {**NO_FAILURES, "rollout/reward_timeouts": 2.0}
    assert scorer.metrics() == NO_FAILURES  # counted once, per step
    spun = [int(p.name) for p in tmp_path.iterdir()]
    assert len(spun) == 2 and process_table.wait_gone(spun) == []


def test_the_math_reward_on_a_huge_factorial(registries, pool):
    """Guarded, it never reaches sympy; with the guards and math-verify's own limits off, the
    call's deadline kills it."""
    prompt, samples = group("\\boxed{99999999!}", "so \\boxed{3}")
    scorer = RewardScorer(pool)
    assert score(scorer, source(registries, {"name": "math", "timeout_s": 20}), prompt, samples)
    assert samples[0].reward_info["unchecked"] == "the factorial of 99999999 is above max_factorial=10000"
    assert [s.reward for s in samples] == [0.0, 1.0] and scorer.metrics() == NO_FAILURES

    unguarded = {"name": "math", "max_factorial": 0, "timeout_seconds": 0, "timeout_s": 2}
    prompt, samples = group("\\boxed{99999999!}", "so \\boxed{3}")
    assert score(scorer, source(registries, unguarded), prompt, samples)
    assert samples[0].reward_info["reward_error"] == "timeout after 2 s (worker killed)"
    assert samples[1].reward_info == {"turns": 1, "correct": True, "boxed": True} and samples[1].reward == 1.0
    assert scorer.metrics() == {**NO_FAILURES, "rollout/reward_timeouts": 1.0}


def test_on_error_zero_scores_the_failed_sample_zero_and_names_the_exception(registries, pool):
    scorer = RewardScorer(pool)
    prompt, samples = group("fine", "RAISE")
    assert score(scorer, source(registries, {"name": "probe"}, on_error="zero"), prompt, samples) is True
    assert [s.reward for s in samples] == [1.0, 0.0]
    assert samples[1].reward_info["reward_failure"] == "error"
    assert samples[1].reward_info["reward_error"] == "ValueError: probe reward rejects 'RAISE'"
    assert scorer.metrics() == {**NO_FAILURES, "rollout/reward_errors": 1.0}


def test_on_error_drop_group_drops_the_group_and_gives_up_on_a_prompt_after_the_retries(registries, pool):
    scorer = RewardScorer(pool, drop_group_retries=1)
    src = source(registries, {"name": "probe", "on_error": "drop_group"})
    prompt, samples = group("RAISE", "fine")
    assert score(scorer, src, prompt, samples) is False
    assert samples[0].reward_info["reward_error"] == "ValueError: probe reward rejects 'RAISE'"
    assert samples[1].reward == 1.0  # scored all the same: its trajectory is recorded with its reward
    scorer.dropped(src, prompt, 1)
    with pytest.raises(RewardFailed, match=r"prompt p\[0\] 2 times in a row .*drop_group_retries=1"):
        scorer.dropped(src, prompt, 2)
    assert scorer.metrics() == {**NO_FAILURES, "rollout/reward_errors": 1.0, "rollout/reward_dropped_groups": 2.0}


def test_on_error_fail_names_the_source_the_reward_and_the_sample(registries, pool):
    scorer = RewardScorer(pool)
    prompt, samples = group("fine", "RAISE")
    with pytest.raises(RewardFailed) as err:
        score(scorer, source(registries, {"name": "probe", "on_error": "fail"}), prompt, samples)
    message = str(err.value)
    assert message.startswith("data_sources[0].reward (source 'p'): reward 'probe' failed on sample 1 of "
                              "prompt p[0] (response 'RAISE'): ValueError: probe reward rejects 'RAISE' "
                              "(on_error=fail; 1 of 2 samples of the group failed)")
    assert "in probe_reward" in message  # the worker's traceback
    assert scorer.metrics()["rollout/reward_errors"] == 1.0


@pytest.mark.parametrize("on_error", ["zero", "drop_group"])
def test_a_non_finite_score_is_a_reward_error(registries, pool, on_error):
    """NaN or inf would pass into the advantages and end the run at the first optimizer step
    (``NonFiniteLossError``) naming no reward: it is a failed call like an exception."""
    scorer = RewardScorer(pool)
    prompt, samples = group("fine", "NAN", "INF")
    trained = score(scorer, source(registries, {"name": "probe"}, on_error=on_error), prompt, samples)
    assert trained is (on_error == "zero")
    assert [s.reward for s in samples] == [1.0, 0.0, 0.0]
    assert samples[1].reward_info["reward_failure"] == "error"
    assert samples[1].reward_info["reward_error"] == (
        "ValueError: reward of source 'p' returned a non-finite score: nan")
    assert samples[2].reward_info["reward_error"] == (
        "ValueError: reward of source 'p' returned a non-finite score: -inf")
    assert scorer.metrics() == {**NO_FAILURES, "rollout/reward_errors": 2.0}


def test_a_non_finite_score_under_on_error_fail_names_the_reward(registries, pool):
    scorer = RewardScorer(pool)
    prompt, samples = group("NAN")
    with pytest.raises(RewardFailed, match=r"reward 'probe' failed on sample 0 of prompt p\[0\] "
                       r"\(response 'NAN'\): ValueError: reward of source 'p' returned a non-finite score: nan"):
        score(scorer, source(registries, {"name": "probe", "on_error": "fail"}), prompt, samples)

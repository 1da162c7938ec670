"""Dataset readers and data filters run in-process within the ``budgets`` section: a stalled
one stops the step with an error naming the plugin, its config key and the budget's key.
The stalled probes wait on an event the test sets afterwards, so no thread outlives a test."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

import deadline_probes
from loongsage.config.validate import validate_config
from loongsage.controller.build import data_filters
from loongsage.data.sources import build_sources
from loongsage.data.types import Group
from loongsage.deadline.budget import Budget, BudgetExceeded

pytestmark = [pytest.mark.timeout(120), pytest.mark.serial]


@pytest.fixture(autouse=True)
def release():
    deadline_probes.RELEASE.clear()
    yield
    deadline_probes.RELEASE.set()


def run_config(registries, dataset, budgets, filters=()):
    cfg = OmegaConf.create({"model": {"path": "unused"}, "budgets": budgets,
                            "algorithm": {"filters": list(filters)},
                            "data_sources": [{"name": "s", "dataset": dataset, "reward": "math"}]})
    return validate_config(cfg, registries)


def test_a_budget_returns_the_value_or_reraises_and_stops_waiting_past_it():
    budget = Budget(0.5, "budgets.filter_s")
    assert budget.run("sum", sum, [1, 2]) == 3
    with pytest.raises(ZeroDivisionError):
        budget.run("divide", lambda: 1 / 0)
    with pytest.raises(BudgetExceeded) as err:
        budget.run("x: data filter 'wait'", deadline_probes.RELEASE.wait, 60)
    assert str(err.value).startswith("x: data filter 'wait' did not return within its 0.5 s budget "
                                     "(budgets.filter_s)")


def test_a_stalled_dataset_read_names_the_source_the_dataset_and_the_budget(registries):
    run = run_config(registries, {"format": "stall", "stall_index": 3}, {"dataset_get_s": 0.5})
    source = build_sources(run.sources, registries)["s"]
    assert source.get(2).ground_truth == "3"
    with pytest.raises(BudgetExceeded) as err:
        source.get(3)
    assert str(err.value).startswith("data_sources[0].dataset: dataset 'stall' get(3) did not return "
                                     "within its 0.5 s budget (budgets.dataset_get_s)")


def test_reads_on_one_thread_each_keep_their_own_budget_and_name_the_record_that_stalls(registries):
    """``get_each`` (the start-up prompt check's reads): errors come back in their record's place,
    reads slower in total than one budget pass as long as each is within it, and the read that
    stalls is named. Fails if the budget covered the batch rather than each read."""
    run = run_config(registries, {"format": "stall", "stall_index": 3}, {"dataset_get_s": 0.5})
    source = build_sources(run.sources, registries)["s"]
    assert [p.ground_truth for p in source.get_each([0, 1, 2])] == ["1", "2", "3"]
    with pytest.raises(BudgetExceeded) as err:
        source.get_each([0, 1, 2, 3, 4])
    assert str(err.value).startswith("data_sources[0].dataset: dataset 'stall' get(3) did not return "
                                     "within its 0.5 s budget (budgets.dataset_get_s)")
    budget = Budget(0.3, "budgets.dataset_get_s")
    results = budget.run_each(str, lambda x: (deadline_probes.RELEASE.wait(0.2), 1 / x)[1], [1, 0, 4])
    assert results[0] == 1.0 and isinstance(results[1], ZeroDivisionError) and results[2] == 0.25


def test_a_stalled_dataset_build(registries):
    run = run_config(registries, {"format": "stall", "stall_on_load": True}, {"dataset_load_s": 0.5})
    with pytest.raises(BudgetExceeded, match=r"^data_sources\[0\]\.dataset: dataset 'stall' building its "
                                             r"prompts did not return within its 0.5 s budget"):
        build_sources(run.sources, registries)


def test_a_stalled_data_filter_names_the_filter_and_the_budget(registries):
    run = run_config(registries, {"format": "stall"}, {"filter_s": 0.5}, filters=["stall"])
    prompt = build_sources(run.sources, registries)["s"].get(0)
    apply, _ = data_filters(run)
    with pytest.raises(BudgetExceeded) as err:
        apply([Group(0, prompt)])
    assert str(err.value).startswith("algorithm.filters[0]: data filter 'stall' did not return within its "
                                     "0.5 s budget (budgets.filter_s)")


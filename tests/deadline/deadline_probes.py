"""Plugins that misbehave on purpose, for the deadline tests: a reward that spins forever,
raises or kills its process depending on the response text, a reward that fails the first
call of each even prompt, a data filter and a dataset that stall until released."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from loongsage import hookimpl
from loongsage.algorithms.filters import FilterResult
from loongsage.data.types import Prompt

RELEASE = threading.Event()  # set by a test to let stalled filters and datasets return


@dataclass
class ProbeParams:
    """``SPIN`` in the text: loop forever (after writing this pid under ``pid_dir``);
    ``RAISE``: raise; ``EXIT``: end the process; ``NAN``: return NaN; ``INF``: a dict whose
    score is -inf; otherwise score 1 and report the pid."""

    pid_dir: str = ""


def probe_reward(sample_text, ground_truth, params, **context):
    if "SPIN" in sample_text:
        if params.pid_dir:
            Path(params.pid_dir, str(os.getpid())).touch()
        while True:  # CPU-bound: no thread could ever interrupt this
            pass
    if "RAISE" in sample_text:
        raise ValueError(f"probe reward rejects {sample_text!r}")
    if "EXIT" in sample_text:
        os._exit(7)
    if "NAN" in sample_text:
        return float("nan")
    if "INF" in sample_text:
        return {"score": float("-inf"), "pid": os.getpid()}
    return {"score": 1.0, "pid": os.getpid()}


@dataclass
class FlakyParams:
    """Fail the first call for each even prompt index (a marker file under ``state_dir``)."""

    state_dir: str = ""


def flaky_reward(sample_text, ground_truth, params, **context):
    prompt = context["prompt"]
    if prompt.index % 2 == 0:
        try:
            os.close(os.open(Path(params.state_dir, str(prompt.index)), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            raise RuntimeError(f"flaky reward: first call for prompt {prompt.index}")
    return 0.5


@dataclass
class StallFilterParams:
    """A data filter that waits for ``RELEASE`` (at most ``wait_s``) before keeping every group."""

    wait_s: float = 60.0


def stall_filter(groups, params):
    RELEASE.wait(params.wait_s)
    return FilterResult(list(groups))


@dataclass
class StallDatasetParams:
    """Stall (until ``RELEASE``, at most ``wait_s``) building, or reading prompt ``stall_index``."""

    stall_on_load: bool = False
    stall_index: int = -1
    wait_s: float = 60.0


class StallDataset:
    def __init__(self, params, seed):
        self.params = params
        if params.stall_on_load:
            RELEASE.wait(params.wait_s)

    def __len__(self):
        return 10

    def get(self, index):
        if index == self.params.stall_index:
            RELEASE.wait(self.params.wait_s)
        return Prompt(source="", index=index, messages=[{"role": "user", "content": f"{index} + 1 = ?"}],
                      ground_truth=str(index + 1))


@hookimpl
def loongsage_register_rewards(register):
    register("probe", probe_reward, params=ProbeParams)
    register("flaky", flaky_reward, params=FlakyParams)


@hookimpl
def loongsage_register_data_filters(register):
    register("stall", stall_filter, params=StallFilterParams)


@hookimpl
def loongsage_register_datasets(register):
    register("stall", StallDataset, params=StallDatasetParams)

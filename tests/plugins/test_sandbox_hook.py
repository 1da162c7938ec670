"""A sandbox backend from an installed plugin distribution runs the code reward's tests.

The distribution is real as far as discovery goes: a ``*.dist-info`` folder with a
``loongsage`` entry point in a folder on ``sys.path``, found by ``importlib.metadata`` like
any installed package. The backend subclasses the ``process`` sandbox and records what it
runs, so the test can see that the reward's tests ran in it.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

pytest.importorskip("loongsage_sandbox")

PLUGIN = '''
from loongsage import hookimpl
from loongsage_sandbox.params import ProcessParams
from loongsage_sandbox.process import ProcessSandbox

RAN = []


class RecordingSandbox(ProcessSandbox):
    """The process sandbox, recording every command."""

    backend = "recording"

    async def exec(self, command, **kwargs):
        RAN.append(command)
        return await super().exec(command, **kwargs)


@hookimpl
def loongsage_register_sandboxes(register):
    register("recording", RecordingSandbox, params=ProcessParams)
'''


@pytest.mark.calls_hook("loongsage_register_sandboxes")
def test_code_reward_runs_its_tests_in_the_plugin_sandbox(tmp_path, monkeypatch):
    from loongsage.data.sources import SandboxFactory
    from loongsage.plugins import clear_cache, get_registries

    (tmp_path / "recording_sandbox.py").write_text(textwrap.dedent(PLUGIN))
    info = tmp_path / "recording_sandbox-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: recording-sandbox\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[loongsage]\nrecording_sandbox = recording_sandbox\n")
    monkeypatch.delenv("LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("LOONGSAGE_LOAD_PLUGINS", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("recording_sandbox", None)
    try:
        registries = get_registries()
        assert registries.sandbox.entry("recording").distribution == "recording-sandbox"
        code_exec = registries.reward.get("code_exec")
        node = {"type": "recording", "allow_untrusted_code": True}  # the data source's sandbox
        sandbox = SandboxFactory(registries.resolve("sandbox", node, "data_sources[0].sandbox", "type"))

        def reward(text, ground_truth, params):
            return code_exec(text, ground_truth, params, sandbox=sandbox)

        params = {"exec_timeout_s": 10}
        solution = "```python\ndef add(a, b):\n    return a + b\n```"
        wrong = "```python\ndef add(a, b):\n    return a - b\n```"
        tests = {"tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]}
        assert reward(solution, tests, params)["score"] == 1.0
        assert reward(wrong, tests, params)["score"] == 0.0
    finally:
        clear_cache()
    assert (
        sys.modules["recording_sandbox"].RAN == [["python3", "-"]] * 2
    )  # one test harness per reward

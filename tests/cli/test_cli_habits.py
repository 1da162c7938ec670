"""CLI habits: ``--version``, ``train --help`` listing every config group with its options,
help and ``plugins`` without importing torch, ``-v``/``-q`` through logging, and a delegated
subcommand's failure printed as one error line (its traceback only with ``-v``). The real
``loongsage`` entry point runs in a subprocess."""

from __future__ import annotations

import subprocess
import sys

from loongsage import __version__
from loongsage.config.store import PLUGIN_GROUPS
from loongsage.plugins import get_registries

CLI = [sys.executable, "-m", "loongsage.cli"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def test_version_flag():
    result = _run("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"loongsage {__version__}"


def test_train_help_lists_every_config_group_and_its_options():
    result = _run("train", "--help")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    registries = get_registries()
    for group in PLUGIN_GROUPS.values():
        at = next(i for i, line in enumerate(lines) if line.strip().split()[:1] == [group.group])
        options = {name.strip() for name in lines[at + 1].split(",")}
        assert options == {e.name for e in registries[group.kind]}, group.group
    assert "m2po" in result.stdout and "tiny/grpo" in result.stdout


def test_help_and_plugins_import_no_torch():
    """`loongsage --help`, `train --help` and `plugins` list every plugin and config group without
    importing torch or transformers (docs/plugins.md promises it to plugin authors; it used to
    come in through config validation, about 3 s of a 4 s `--help`)."""
    for args in (["--help"], ["train", "--help"], ["plugins"]):
        code = ("import sys\nfrom loongsage.cli import main\n"
                f"sys.argv = ['loongsage', *{args!r}]\n"
                "try:\n    raise SystemExit(main())\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
                "print('heavy:', sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip().splitlines()[-1] == "heavy: []", (args, result.stdout[-200:])


def test_delegated_command_failure_is_one_error_line_and_a_traceback_with_verbose(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    target = str(blocker / "model")  # a folder below a regular file cannot be made
    quiet = _run("models", "tiny", "--out", target)
    assert quiet.returncode == 1
    assert "Traceback" not in quiet.stderr
    assert quiet.stderr.strip().splitlines()[-1].startswith("error: loongsage models: NotADirectoryError")
    verbose = _run("-v", "models", "tiny", "--out", target)
    assert verbose.returncode == 1 and "Traceback (most recent call last)" in verbose.stderr


def test_quiet_hides_progress_and_keeps_errors():
    loud = _run("config", "recipes")
    assert loud.returncode == 0 and "tiny/grpo" in loud.stdout.split()
    wrong = _run("-q", "train", "--config-name", "tiny/grpo", "trainer.stepz=2")
    assert wrong.returncode == 2 and "trainer.stepz" in wrong.stderr and wrong.stdout == ""

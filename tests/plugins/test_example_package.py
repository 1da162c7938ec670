"""A real third-party package, pip-installed with its own entry point, seen end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loongsage.kind_table import KINDS

LOONGSAGE = [sys.executable, "-m", "loongsage.cli"]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "loongsage-example-plugin"


def _run(args: list[str], site: Path | None = None, **extra_env: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD", None)
    env.pop("LOONGSAGE_LOAD_PLUGINS", None)
    env.update(extra_env)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return subprocess.run([*LOONGSAGE, *args], capture_output=True, text=True, env=env, timeout=120)


def test_installed_package_is_listed_under_its_distribution(example_plugin_path):
    result = _run(["plugins", "--json"], example_plugin_path)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    ours = {(r["kind"], r["name"]): r for r in rows if r["distribution"] == "loongsage-example-plugin"}
    assert sorted(kind for kind, _ in ours) == sorted(KINDS), "one example entry of every plugin kind"
    assert {("tracker", "csv"), ("reward", "exact_match"), ("command", "csv-tail"),
            ("step_term", "entropy_bonus")} <= set(ours)
    assert ours[("tracker", "csv")]["params"][0] == {
        "name": "filename", "type": "str", "default": "metrics.csv"
    }
    assert set(rows[0]) == {"kind", "name", "distribution", "doc", "params"}


def test_installed_package_passes_the_contract_checks_of_the_public_api(example_plugin_path):
    """The example's own tests (``loongsage.plugin.testing`` on everything it registers) pass
    against the pip-installed package, as a third-party author would run them."""
    tests = EXAMPLE / "tests"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(example_plugin_path),
                                                                     os.environ.get("PYTHONPATH")])))
    env.pop("LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD", None)
    env.pop("LOONGSAGE_LOAD_PLUGINS", None)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "--rootdir", str(EXAMPLE), "-c", str(EXAMPLE / "pyproject.toml"), str(tests)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "9 passed" in result.stdout


def test_installed_command_runs_as_a_loongsage_subcommand(example_plugin_path, tmp_path):
    """loongsage_register_commands: a third party's command is a `loongsage` subcommand, given
    the registries (it reads the csv tracker's default file name from them)."""
    (tmp_path / "metrics.csv").write_text("step,reward\n" + "".join(f"{i},{i / 10}\n" for i in range(8)))
    result = _run(["csv-tail", str(tmp_path), "-n", "2"], example_plugin_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["step\treward", "6\t0.6", "7\t0.7"]
    assert "csv-tail" in _run(["--help"], example_plugin_path).stdout
    missing = _run(["csv-tail", str(tmp_path)])
    assert missing.returncode == 2 and "invalid choice: 'csv-tail'" in missing.stderr


def test_a_siblings_command_that_is_not_loaded_says_which_distribution_brings_it():
    result = _run(["sandbox", "run", "--", "true"], LOONGSAGE_LOAD_PLUGINS="loongsage_agents")
    assert result.returncode == 2
    assert "'sandbox' (command) comes with loongsage-sandbox, which is installed but not loaded" in result.stderr


def test_without_the_package_its_names_are_unknown(example_plugin_path):
    result = _run(["plugins", "tracker", "--json"])
    names = {r["name"] for r in json.loads(result.stdout)}
    assert "csv" not in names and {"console", "jsonl"} <= names


def test_recipe_override_can_name_the_third_party_plugin(example_plugin_path):
    args = ["config", "show", "--config-name", "tiny/grpo",
            "logging.trackers=[console,{name: csv, filename: m.csv}]"]
    result = _run(args, example_plugin_path)
    assert result.returncode == 0, result.stderr
    assert "name: csv" in result.stdout and "filename: m.csv" in result.stdout
    missing = _run(args)
    assert missing.returncode == 2
    assert "logging.trackers[1].name: unknown tracker 'csv'" in missing.stderr


@pytest.mark.parametrize(
    "override, expected",
    [
        ("algorithm.policy_loss.name=ppo_clipp", "algorithm.policy_loss.name: unknown policy_loss 'ppo_clipp'. Did you mean 'ppo_clip'?"),
        ("algorithm/policy_loss=ppo_clipp", "algorithm.policy_loss: unknown policy_loss 'ppo_clipp'. Did you mean 'ppo_clip'?"),
        ("data_sources.0.reward.name=maht", "data_sources[0].reward.name: unknown reward 'maht'. Did you mean 'math'?"),
    ],
)
def test_misspelled_plugin_fails_before_anything_starts(override, expected):
    result = _run(["config", "show", "--config-name", "tiny/grpo", override])
    assert result.returncode == 2
    assert expected in result.stderr
    assert "(loongsage-core)" in result.stderr or "(loongsage-agents)" in result.stderr


@pytest.mark.calls_hook("loongsage_register_commands")
def test_a_registered_command_is_dispatched_with_the_registries(capsys):
    """The CLI finds a command plugin in the registries it runs with and calls it with the
    rest of argv and those registries; `--help` lists it with its distribution."""
    from loongsage import hookimpl
    from loongsage.cli import main
    from loongsage.plugins import load_plugins

    seen = []

    def probe(argv, registries):
        seen.append((argv, registries))
        return 7

    class Plugin:
        @staticmethod
        @hookimpl
        def loongsage_register_commands(register):
            register("probe", probe, doc="Probe command.")

    registries = load_plugins(extra=[(Plugin, "probe-commands")])
    assert main(["probe", "--flag", "x"], registries) == 7
    assert seen == [(["--flag", "x"], registries)]
    with pytest.raises(SystemExit):
        main(["--help"], registries)
    assert "Probe command. (from probe-commands)" in capsys.readouterr().out

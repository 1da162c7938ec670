"""What a new user's first commands print: a config error from ``train`` comes before Ray or
the controller is imported (as fast as ``config show``, and the same line); a misspelled recipe
name gets the close ones; a list the shell split at its spaces gets the quoted form; under
``-q`` Ray's own INFO line ("Started a local Ray instance") stays out too. Real processes: the
CLI and a real local Ray start in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

CLI = [sys.executable, "-m", "loongsage.cli"]


def test_a_train_config_error_comes_before_the_heavy_imports():
    code = textwrap.dedent("""
        import sys
        from loongsage.cli import main
        code = main(["train", "--config-name", "tiny/grpo", "rollout.n_samples_per_prompt=abc"])
        heavy = ("ray", "torch", "loongsage.controller.run", "loongsage.controller.build")
        print(code, sorted(m for m in heavy if m in sys.modules))
    """)
    train = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    show = subprocess.run([*CLI, "config", "show", "--config-name", "tiny/grpo", "rollout.n_samples_per_prompt=abc"],
                          capture_output=True, text=True, timeout=300)
    assert train.stdout.strip().splitlines()[-1] == "2 []", train.stderr[-2000:]
    assert train.stderr.strip() == show.stderr.strip() == \
        "error: rollout.n_samples_per_prompt: expected an integer, got 'abc'"


def test_a_misspelled_recipe_gets_the_close_names():
    result = subprocess.run([*CLI, "train", "--config-name", "tiny/grop"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: --config-name: no recipe 'tiny/grop' among the bundled recipes; did you mean tiny/grpo")


RAY_START = textwrap.dedent("""
    import sys, types
    import ray
    from loongsage.controller.actors import start_ray
    from loongsage.logs import configure_logging
    configure_logging(int(sys.argv[1]))
    start_ray(types.SimpleNamespace(ray_address=None, num_cpus=1, object_store_memory=1 << 28))
    ray.shutdown()
""")


def test_quiet_keeps_rays_info_line_out_too():
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "disabled"
    output = {}
    for verbosity in (-1, 0):
        done = subprocess.run([sys.executable, "-c", RAY_START, str(verbosity)], capture_output=True, text=True,
                              env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        output[verbosity] = done.stdout + done.stderr
    assert "Started a local Ray instance" in output[0]  # the line is there to hide
    assert "Started a local Ray instance" not in output[-1] and " INFO " not in output[-1]


def test_an_unquoted_list_split_by_the_shell_gets_the_quoted_form():
    result = subprocess.run([*CLI, "config", "show", "--config-name", "tiny/grpo", "logging.trackers=[console,",
                             "jsonl]"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: logging.trackers: its value was split by the shell at its spaces into "
        "['logging.trackers=[console,', 'jsonl]']; quote the whole override: 'logging.trackers=[console, jsonl]'")

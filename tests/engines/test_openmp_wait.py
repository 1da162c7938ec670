"""``openmp_wait_env``: a LoongSage process's OpenMP threads spin briefly before sleeping
unless the environment chose their waiting itself, and that choice reaches every process:
``loongsage``'s own (set before torch loads) and, through the job's runtime env, every actor
(checked on a real actor in ``tests/controller/test_run_processes.py``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from loongsage.controller.actors import actor_runtime_env
from loongsage.engines.openmp_wait import OPENMP_WAIT_VARIABLES, SHORT_SPIN, openmp_wait_env


def test_an_environment_without_a_choice_gets_the_short_spin():
    assert openmp_wait_env({"PATH": "/bin"}) == {"GOMP_SPINCOUNT": SHORT_SPIN}
    assert int(SHORT_SPIN) <= 100_000  # libgomp's default is 300,000: milliseconds of spinning


@pytest.mark.parametrize("chosen", [{"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "0"},
                                    {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "500"}])
def test_a_choice_already_made_is_kept_and_nothing_is_added(chosen):
    # GOMP_SPINCOUNT beside PASSIVE would make libgomp spin anyway: none may be added
    assert openmp_wait_env({"HOME": "/root", **chosen}) == chosen


def test_the_actors_runtime_env_carries_the_choice():
    assert actor_runtime_env({"OMP_WAIT_POLICY": "PASSIVE"}) == {"env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}}
    assert actor_runtime_env({}) == {"env_vars": {"GOMP_SPINCOUNT": SHORT_SPIN}}


@pytest.mark.parametrize("given, expected", [({}, f"None {SHORT_SPIN}"),
                                              ({"OMP_WAIT_POLICY": "PASSIVE"}, "PASSIVE None")])
def test_the_cli_sets_it_before_anything_reads_it(given, expected):
    env = {k: v for k, v in os.environ.items() if k not in OPENMP_WAIT_VARIABLES}
    code = ("import os, sys\nfrom loongsage.cli import main\ntry:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write(f\"{os.environ.get('OMP_WAIT_POLICY')} {os.environ.get('GOMP_SPINCOUNT')}\")")
    done = subprocess.run([sys.executable, "-c", code], env={**env, **given}, capture_output=True, text=True,
                          timeout=120)
    assert done.stderr.strip().splitlines()[-1] == expected, done.stderr

"""Engine fixtures: ``engine``, a started embedded rollout engine on the tiny model (seed 3, one
thread), fresh per test. Test modules that need other limits or a module-wide engine define
their own ``engine``, which takes precedence."""

from __future__ import annotations

import pytest



@pytest.fixture
def engine(running_engine, tiny_model_dir):
    with running_engine(tiny_model_dir, seed=3) as eng:
        yield eng

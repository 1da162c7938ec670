"""Engine fixtures: ``engine``, a started embedded rollout engine on the tiny model (seed 3, one
thread), fresh per test. Test modules that need other limits or a module-wide engine define
their own ``engine``, which takes precedence."""

from __future__ import annotations

import pytest

from loongsage.engines.embedded_rollout import EmbeddedRolloutEngine


@pytest.fixture
def engine(tiny_model_dir):
    eng = EmbeddedRolloutEngine(str(tiny_model_dir), seed=3, num_threads=1)
    eng.start()
    yield eng
    eng.stop()

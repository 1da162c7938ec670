"""How long an idle OpenMP thread spins before it sleeps: set before torch loads its runtime.

torch's CPU kernels run on an OpenMP thread team (GNU libgomp in the PyPI wheels). Between
two kernels the team's workers wait for the next one, spinning for a while and then sleeping
on a futex. Both extremes cost something on the 2-core machines this framework is tested on:

* sleeping at once (``OMP_WAIT_POLICY=PASSIVE``) makes every kernel wake its workers through
  the kernel scheduler: a tiny-model GRPO train phase (64 rows of ~75 tokens, 2 threads)
  took 0.83-0.86 s passive against 0.44-0.47 s with a short spin, slower than one thread
  (0.71-0.74 s); in ``loongsage train`` the tiny step went from 1.85 to 1.47 s and the
  SmolLM2 train phase from 22.8 to 20.5 s;
* libgomp's default spin (300,000 iterations, milliseconds) or ``ACTIVE`` keeps idle
  workers on the cores, where a process sharing them waits: two of those tiny train phases
  run at once on the same 2 cores took 1.3 s each with the default spin, 2.1 s with
  ``GOMP_SPINCOUNT=10000``, 0.8 s passive.

Within a run, cores are not oversubscribed by design (colocated actors take turns,
disaggregated ones are pinned to cores of their own), so the default is a short spin,
``GOMP_SPINCOUNT=10000`` (long enough to cover the gap between one module's kernels, a few
hundred microseconds of spinning at most once a phase ends). A machine shared with other
work (a CI runner, a test suite: ``tests/conftest.py`` does this) is better off passive: an
``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` already in the environment is kept as it is, and
nothing is added beside it (libgomp's ``GOMP_SPINCOUNT`` would override a ``PASSIVE`` policy).
"""

from __future__ import annotations

from typing import Mapping

SHORT_SPIN = "10000"
OPENMP_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def openmp_wait_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The OpenMP waiting variables a LoongSage process should run with, given ``environ``:
    the caller's own when it set either, else the short spin."""
    chosen = {name: environ[name] for name in OPENMP_WAIT_VARIABLES if name in environ}
    return chosen or {"GOMP_SPINCOUNT": SHORT_SPIN}

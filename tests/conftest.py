"""Shared fixtures: the tiny test model, built once and cached by content hash, a local
two-CPU Ray cluster for tests that start train ranks, embedded rollout engines on loopback
(``running_engine``, ``tiny_engine_url``), and the check behind ``@pytest.mark.calls_hook``.

OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``, inherited by Ray
workers and subprocesses started by tests): on a shared 2-core machine a 15-step tiny SFT
run took 49 s with spinning threads, 2.4 s passive (3.9 s single-threaded).
"""

from __future__ import annotations

import os
import socket
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads its OpenMP runtime


@pytest.fixture(scope="session")
def ray_cluster():
    """The one local Ray (2 CPUs) of this test process for every test that hosts actors in it,
    shut down when the session ends (it reuses a cluster an in-process run already started).
    No test stops it: under pytest-xdist a process runs files in any order, and a module that
    shut down the cluster it had started killed the actors another module's fixtures held."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=1 << 30, log_to_driver=False)
    yield ray
    ray.shutdown()


def _random_groups(count: int, seed: int = 0, *, sources: tuple[str, ...] = ("math",),
                   untrained_first: bool = False, shuffle: bool = False) -> list:
    """``count`` groups of 2 samples with random tokens (ids 3..499), lengths and rewards.

    ``sources``: every third group takes the second source when there are two;
    ``untrained_first``: each response's first token is out of the loss mask at random (a tool
    output); ``shuffle``: the groups come out of order, as the asynchronous scheduler delivers them.
    """
    import random

    from loongsage.data.types import Group, Prompt, Sample

    rng = random.Random(seed)
    groups = []
    for gid in range(count):
        samples = []
        for _ in range(2):
            prompt = [rng.randrange(3, 500) for _ in range(rng.randint(3, 6))]
            response = [rng.randrange(3, 500) for _ in range(rng.randint(2, 9))]
            mask = [1] * len(response)
            if untrained_first:
                mask[0] = rng.choice([0, 1])
            samples.append(Sample(prompt, response, [-1.0] * len(response), [0] * len(response),
                                  mask, reward=float(rng.random() < 0.5)))
        source = sources[1 if len(sources) > 1 and gid % 3 == 2 else 0]
        groups.append(Group(gid, Prompt(source, gid, []), samples))
    if shuffle:
        rng.shuffle(groups)
    return groups


@contextmanager
def _running_engine(model_dir, **options):
    from loongsage.engines.embedded_rollout import EmbeddedRolloutEngine

    engine = EmbeddedRolloutEngine(str(model_dir), **{"seed": 0, "num_threads": 1, **options})
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture(scope="session")
def running_engine():
    """``with running_engine(model_dir, seed=..., max_running_requests=...) as engine:`` an
    embedded rollout engine serving on loopback (seed 0, one thread unless given), stopped at
    the block's end; the one way tests start an in-process engine."""
    return _running_engine


@pytest.fixture(scope="module")
def tiny_engine_url(tiny_model_dir):
    """The URL of an embedded engine on the tiny model (seed 0, one thread), one per module."""
    with _running_engine(tiny_model_dir) as engine:
        yield engine.url


@pytest.fixture(scope="session")
def random_groups():
    """``random_groups(count, seed, sources=, untrained_first=, shuffle=)``: train-rank test batches."""
    return _random_groups


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """A tiny Qwen2 HF folder (≈3.3 M params, local BPE tokenizer, ChatML template).

    Built deterministically into ``$LOONGSAGE_CACHE`` (default ``~/.cache/loongsage``) under
    a hash of its recipe, so sessions reuse it; treat it as read-only.
    """
    from loongsage.models.tiny import ensure_tiny_model

    return ensure_tiny_model()


# ---- every hook has a test that really calls it --------------------------------------------
# A test marked ``@pytest.mark.calls_hook("loongsage_register_...", ...)`` must register a
# plugin through each named hook and have *library* code (the shipped distributions' sources)
# resolve the registered entry while the test runs; the check runs at the test's teardown.
# ``tests/plugins/test_hook_docs.py`` requires such a marked test for every hook.

HOOK_MARKER = "calls_hook"
SHIPPED_DISTRIBUTIONS = frozenset(
    {"loongsage-core", "loongsage-algos", "loongsage-agents", "loongsage-distill", "loongsage-sandbox"})
SHIPPED_SOURCES = tuple(str(p) + os.sep for p in Path(__file__).resolve().parents[1].glob("loongsage-*/src"))


class HookUsage:
    """Which plugin kinds library code resolved from entries that tests registered.

    An entry counts when its distribution is not a shipped one (a run-time plugin, a
    config-local module, a package a test installed) and the first frame outside
    ``loongsage/registry.py`` that asked for ``entry.obj`` lies in shipped source code, so
    a test fetching its own plugin from the registry does not count as the library using it.
    """

    def __init__(self) -> None:
        self._active: list[set[str]] = []

    def note(self, entry: object) -> None:
        import sys

        from loongsage import registry

        if not self._active or getattr(entry, "distribution", None) in SHIPPED_DISTRIBUTIONS:
            return
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename == registry.__file__:
            frame = frame.f_back
        if frame is not None and frame.f_code.co_filename.startswith(SHIPPED_SOURCES):
            for kinds in self._active:
                kinds.add(entry.kind)

    @contextmanager
    def recording(self):
        """Yield the set of kinds resolved by library code until the block ends."""
        kinds: set[str] = set()
        self._active.append(kinds)
        try:
            yield kinds
        finally:
            self._active.remove(kinds)


HOOK_USAGE = HookUsage()


def pytest_configure(config) -> None:
    from loongsage.registry import RegistryEntry

    config.addinivalue_line(
        "markers", f"{HOOK_MARKER}(*hooks): registers a plugin through each hook and library code "
        "uses it (checked at teardown)")
    resolve = RegistryEntry.obj.fget

    def obj(entry):
        value = resolve(entry)
        HOOK_USAGE.note(entry)
        return value

    RegistryEntry.obj = property(obj, doc=RegistryEntry.obj.__doc__)


@pytest.fixture
def hook_usage() -> HookUsage:
    return HOOK_USAGE


@pytest.fixture(autouse=True)
def _marked_hooks_are_called(request):
    marker = request.node.get_closest_marker(HOOK_MARKER)
    if marker is None:
        yield
        return
    from loongsage.registry import KINDS

    kind_of = {k.hook: k.name for k in KINDS.values()}
    unknown = [h for h in marker.args if h not in kind_of]
    if unknown or not marker.args:
        pytest.fail(f"{HOOK_MARKER} names no hook or unknown hooks {unknown}; hooks: {sorted(kind_of)}")
    with HOOK_USAGE.recording() as used:
        yield
    missing = [h for h in marker.args if kind_of[h] not in used]
    if missing:
        pytest.fail(f"marked {HOOK_MARKER} but no plugin the test registered through {missing} was "
                    "used by library code")


@pytest.fixture
def hung_url():
    """Accepts connections, reads, never answers: a hung engine as it looks from outside."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for conn in held:
        conn.close()

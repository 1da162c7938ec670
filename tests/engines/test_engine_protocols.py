"""The built-in engines implement core's engine protocols, and each rollout engine class opens
its own weight sync (``engines.protocols``, ``engines.weight_sync``).

The weight-sync choice is checked by replacing the sync classes in the engine's module with a
recorder: opening a real one needs started engines and train ranks, which the end-to-end tests
do (``tests/engines/test_sglang_launcher.py`` runs both SGLang syncs, ``tests/e2e`` the mesh).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from loongsage.engines.embedded_rollout.engine import EmbeddedRolloutEngine
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.engines.megatron.engine import MegatronTrainEngine
from loongsage.engines.mesh_sync import MeshWeightSync
from loongsage.engines.protocols import RolloutEngine, TrainEngine, check_rollout_engine
from loongsage.engines.sglang import engine as sglang_engine
from loongsage.engines.sglang.engine import SGLangServerEngine
from loongsage.engines.sglang.sync_distributed import DistributedWeightSync
from loongsage.engines.sglang.sync_tensor import TensorWeightSync
from loongsage.engines.weight_sync import WeightSync
from loongsage.errors import ConfigError
from loongsage.transfer import TransferConfig


def members(protocol: type) -> set[str]:
    """The names a class must have to implement ``protocol`` (methods, properties, attributes)."""
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {name for name in vars(protocol) if not name.startswith("_")}
    return names


@pytest.mark.parametrize("protocol, classes", [
    (TrainEngine, [EmbeddedTrainEngine, MegatronTrainEngine]),
    (RolloutEngine, [EmbeddedRolloutEngine, SGLangServerEngine]),
    (WeightSync, [MeshWeightSync, DistributedWeightSync, TensorWeightSync]),
])
def test_the_built_in_engines_and_syncs_implement_the_protocols(protocol, classes):
    assert len(members(protocol)) >= 5  # the walk sees the protocol's members
    for cls in classes:
        missing = sorted(name for name in members(protocol) if not hasattr(cls, name))
        assert missing == [], f"{cls.__name__} lacks {missing} of {protocol.__name__}"


class Recorder:
    def __init__(self, trainers, rollout_actors, transfer, **options):
        self.args = (trainers, rollout_actors, transfer)
        self.options = options


@pytest.mark.parametrize("engine, mode, chosen, options", [
    (EmbeddedRolloutEngine, "colocated", "MeshWeightSync", {"bind_views": True}),
    (EmbeddedRolloutEngine, "disaggregated", "MeshWeightSync", {"bind_views": False}),
    (SGLangServerEngine, "colocated", "TensorWeightSync", {}),
    (SGLangServerEngine, "disaggregated", "DistributedWeightSync", {}),
])
def test_the_rollout_engine_class_opens_its_weight_sync(monkeypatch, engine, mode, chosen, options):
    from loongsage.engines import mesh_sync
    from loongsage.engines.sglang import sync_distributed, sync_tensor

    for module, name in ((mesh_sync, "MeshWeightSync"), (sync_tensor, "TensorWeightSync"),
                         (sync_distributed, "DistributedWeightSync")):
        monkeypatch.setattr(module, name, type(name, (Recorder,), {}))
    trainers, actors, transfer = object(), [object()], TransferConfig()
    sync = engine.weight_sync({"placement": {"mode": mode}}, trainers, actors, transfer)
    assert (type(sync).__name__, sync.options) == (chosen, options)
    assert sync.args == (trainers, actors, transfer)


def test_a_rollout_engine_without_a_weight_sync_is_refused_naming_the_backend():
    class NoSync:
        @classmethod
        def from_config(cls, cfg, device=None):
            return cls()

    with pytest.raises(ConfigError, match=r"^rollout.backend: engine 'no_sync' .*NoSync\) has no weight_sync"):
        check_rollout_engine(NoSync, "no_sync")
    for cls in (EmbeddedRolloutEngine, SGLangServerEngine):
        check_rollout_engine(cls, "built-in")


def test_colocated_sglang_engines_need_a_train_rank_each():
    """The tensor sync's own check, reached through the engine class as the controller calls it."""

    class TwoRanks:
        actors, world_size = [object(), object()], 2

    with pytest.raises(ConfigError, match="^rollout.num_engines: 3 colocated SGLang engines"):
        SGLangServerEngine.weight_sync({"placement": {"mode": "colocated"}}, TwoRanks(), [object()] * 3,
                                       TransferConfig())


RAY_FREE_ENGINES = ("loongsage.engines.embedded_rollout.engine", "loongsage.engines.embedded_train",
                    "loongsage.engines.sglang.engine", "loongsage.engines.megatron.engine")


def test_engine_modules_import_without_ray():
    """An engine is hosted by Ray but is not Ray: its module imports none (the GPU check's first
    stage loads the engines on a machine without Ray), and only ``weight_sync``, which runs in the
    controller, reaches for the Ray-side syncs."""
    blocker = ("import sys\n"
               "class NoRay:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name.split('.')[0] == 'ray':\n"
               "            raise ModuleNotFoundError(f'{name} imported')\n"
               "sys.meta_path.insert(0, NoRay())\n"
               f"for module in {RAY_FREE_ENGINES!r}:\n"
               "    __import__(module)\n")
    result = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]

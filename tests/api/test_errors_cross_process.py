"""LoongSage's errors cross process boundaries intact: Ray pickles an error raised in an actor
to hand it to the caller, and an error whose constructor does not take its message alone came
back as Ray's ``UnserializableException`` (a colocated SGLang weight push that hit a dead
server ended the run that way instead of restarting the engine)."""

from __future__ import annotations

import pickle

import pytest

from loongsage.engines.replies import EngineError
from loongsage.errors import ConfigError
from loongsage.transfer import WeightSyncError
from loongsage_sandbox.errors import SandboxCrashedError

ERRORS = [
    WeightSyncError(3, 1, "http://127.0.0.1:1/update_weights_from_tensor: connection refused"),
    ConfigError("rollout.num_engines", "at most train.dp_size"),
    EngineError("/generate", "connection refused"),
    EngineError("/generate", "bad field", status=400, field="sampling_params"),
    SandboxCrashedError("the supervisor died"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_an_error_survives_pickling_with_its_message_and_fields(error):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error) and back.args == error.args
    assert vars(back) == vars(error)


def test_an_error_raised_in_a_ray_actor_reaches_the_caller_as_itself(ray_cluster):
    import ray

    @ray.remote(num_cpus=0)
    class Sender:
        def push(self, version: int) -> None:
            raise WeightSyncError(version, 2, "the server is gone")

    sender = Sender.remote()
    with pytest.raises(WeightSyncError) as caught:
        ray.get(sender.push.remote(7))
    assert (caught.value.version, caught.value.bucket, caught.value.problem) == (7, 2, "the server is gone")
    assert "weight version 7 failed at bucket 2: the server is gone" in str(caught.value)
    ray.kill(sender)

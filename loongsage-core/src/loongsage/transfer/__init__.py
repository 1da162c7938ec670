"""TransferMesh: bucketed, verified weight sync from trainer ranks to rollout engines.

Sender: `TransferMesh(config, sender_rank=...).start()`, then `mesh.sync(named_tensors, version)`.
Receiver: `WeightReceiver([mesh.address, ...], apply=engine.apply_weights).start()`.
The transport per receiver (shared memory, gloo, CUDA IPC, NCCL) follows from where it runs;
see `topology.py`. Same-host receivers may pass `zero_copy=True` to apply from views of the
shared segment (`views.py`; needs `num_slots * bucket_bytes` >= one version).
Transport-generic: nothing here knows an engine. SGLang's wire formats (its distributed and
`/update_weights_from_tensor` updates, both sides) live with the SGLang engine, `engines/sglang/`.
"""

from loongsage.transfer.frames import (
    MeshAddress,
    ReceiverInfo,
    SyncReport,
    TransferConfig,
    WeightSyncError,
)


def __getattr__(name: str):
    """Import the torch-using halves on first use, so the config schema can import frames."""
    if name == "TransferMesh":
        from loongsage.transfer.mesh import TransferMesh

        return TransferMesh
    if name == "WeightReceiver":
        from loongsage.transfer.receiver import WeightReceiver

        return WeightReceiver
    raise AttributeError(f"module 'loongsage.transfer' has no attribute {name!r}")


__all__ = [
    "MeshAddress",
    "ReceiverInfo",
    "SyncReport",
    "TransferConfig",
    "TransferMesh",
    "WeightReceiver",
    "WeightSyncError",
]

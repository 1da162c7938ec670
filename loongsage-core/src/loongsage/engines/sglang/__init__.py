"""``rollout.backend=sglang``: the SGLang server engine, its weight syncs and SGLang's wire formats.

- ``engine.py``: ``SGLangServerEngine``, one SGLang server process per replica;
- ``sync_tensor.py``, ``sync_distributed.py``: the ``WeightSync``s its ``weight_sync`` opens
  (colocated: ``/update_weights_from_tensor`` from the bundle-mate train rank; disaggregated:
  train rank 0 broadcasting over ``/update_weights_from_distributed``);
- ``tensor_sender.py``, ``distributed_sender.py``: the trainer's side of those two updates;
  ``tensor_receiver.py``, ``distributed_receiver.py``: the server's side, for an engine that
  speaks SGLang's API without being SGLang (the embedded rollout engine mounts them).

Nothing here imports ``sglang``: the server is another process.
"""

"""``rollout.backend=sglang``: the SGLang server engine (``engine.py``) and its weight syncs.

``sync_tensor.py`` (colocated: ``/update_weights_from_tensor`` from the bundle-mate train rank)
and ``sync_distributed.py`` (disaggregated: train rank 0 broadcasting over
``/update_weights_from_distributed``) are the ``WeightSync``s ``SGLangServerEngine.weight_sync``
opens. Nothing here imports ``sglang``: the server is another process.
"""

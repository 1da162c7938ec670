"""The embedded rollout engine: a Hugging Face causal LM served over SGLang's HTTP API.

Modules: ``params`` (request validation, torch-free), ``sampler`` (batched sampling and the
reported logprob), ``kv_batch`` (the shared left-padded KV cache), ``scheduler`` (the decode
loop), ``server`` (the FastAPI app), ``weights_codec`` (the inline payload of
``/update_weights_from_tensor``) and ``engine`` (:class:`EmbeddedRolloutEngine`). Importing
the package is cheap; ``EmbeddedRolloutEngine`` is loaded on first access.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EmbeddedRolloutEngine"]


def __getattr__(name: str) -> Any:
    if name == "EmbeddedRolloutEngine":
        from loongsage.engines.embedded_rollout.engine import EmbeddedRolloutEngine

        return EmbeddedRolloutEngine
    raise AttributeError(name)

"""Inline wire encoding of named tensors for ``/update_weights_from_tensor``.

SGLang's own ``serialized_named_tensors`` entries carry handles to the sender's memory (CUDA
IPC, or shared memory on CPU: ``engines.sglang.tensor_sender``), which only a process on the
sender's host can map. ``load_format="loongsage_torch_b64"`` carries the bytes instead: each
entry is ``base64(torch.save(list[(name, tensor)]))``, so any client anywhere can send weights
(``EngineClient.update_weights_from_tensor(named_tensors)``). Several entries are applied
together. Decoding uses ``torch.load(weights_only=True)``, so a payload can carry only tensors.
This path is for tests and small models; runs use TransferMesh or the handle path.
"""

from __future__ import annotations

import base64
import io
from typing import Iterable

import torch

LOAD_FORMAT = "loongsage_torch_b64"


def encode_named_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """One ``serialized_named_tensors`` entry holding ``named_tensors`` (moved to CPU)."""
    items = [(str(name), t.detach().to("cpu").contiguous()) for name, t in named_tensors]
    buf = io.BytesIO()
    torch.save(items, buf)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def decode_named_tensors(entry: str) -> list[tuple[str, torch.Tensor]]:
    """Inverse of :func:`encode_named_tensors`; raises ``ValueError`` on a malformed entry."""
    try:
        raw = base64.b64decode(entry.encode("ascii"), validate=True)
        items = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
    except Exception as exc:
        raise ValueError(f"not a {LOAD_FORMAT} payload: {exc}") from exc
    if not isinstance(items, list) or not all(
        isinstance(it, (tuple, list)) and len(it) == 2 and isinstance(it[0], str)
        and isinstance(it[1], torch.Tensor) for it in items
    ):
        raise ValueError(f"a {LOAD_FORMAT} payload must be a list of (name, tensor) pairs")
    return [(name, tensor) for name, tensor in items]

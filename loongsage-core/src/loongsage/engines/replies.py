"""What a rollout engine answers, read from SGLang's native ``/generate`` replies.

``GenerateOutput`` (one finished generation), ``StreamChunk`` (the tokens a streaming one added)
and ``EngineError`` (an error reply, or no reply), with the functions that read them out of a
reply's JSON. The wire format's variations are the ones ``loongsage.engines.client`` documents:
``output_ids`` at the top level or inside ``meta_info.output_token_logprobs``, a finish reason
given as a string or as ``{"type", "matched"}``, weight versions as decimal strings, and MoE
routes as base64 int32 with their ``[layers, top_k]`` shape (``loongsage.engines.routing``).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from loongsage.errors import LoongSageError


class EngineError(LoongSageError):
    """An engine answered with an error (``status``) or could not be reached (``status`` None)."""

    def __init__(self, endpoint: str, message: str, status: int | None = None,
                 field: str | None = None):
        self.endpoint, self.status, self.field = endpoint, status, field
        where = f"HTTP {status}" if status is not None else "unreachable"
        super().__init__(f"{endpoint} ({where}): {message}")


@dataclass
class GenerateOutput:
    """The result of one ``/generate`` call.

    ``output_logprobs[i]`` is the engine's logprob of ``output_ids[i]`` (``None`` when
    ``return_logprob`` was false). ``finish_reason`` is ``"stop"``, ``"length"`` or
    ``"abort"``; ``matched_stop`` is the stop token/string that ended it, if any.
    ``output_weight_versions`` (embedded engine only; ``None`` from SGLang) gives the weight
    version that sampled each token, for partial rollouts spanning a weight update.
    """

    output_ids: list[int]
    output_logprobs: list[float] | None
    finish_reason: str | None
    weight_version: int | str | None
    prompt_tokens: int
    rid: str
    text: str = ""
    matched_stop: int | str | None = None
    output_weight_versions: list[int] | None = None
    meta_info: dict[str, Any] = field(default_factory=dict, repr=False)
    routed_experts: np.ndarray | None = field(default=None, repr=False)  # [prompt + output, layers, k]

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)


@dataclass
class StreamChunk:
    """New tokens since the previous chunk of a streaming generation."""

    output_ids: list[int]
    output_logprobs: list[float] | None
    text: str  # text added since the previous chunk
    finished: bool
    finish_reason: str | None
    weight_version: int | str | None
    rid: str
    routed_experts: np.ndarray | None = None  # on the final chunk, when asked (GenerateOutput's)
    output_weight_versions: list[int] | None = None  # per new token (embedded engine only)


def weight_version_of(value: Any) -> int | str | None:
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


def finish_of(meta: dict[str, Any]) -> tuple[str | None, int | str | None]:
    reason = meta.get("finish_reason")
    if isinstance(reason, dict):
        return reason.get("type"), reason.get("matched")
    return reason, None


def tokens_of(out: dict[str, Any], endpoint: str) -> tuple[list[int], list[float] | None]:
    meta = out.get("meta_info", {})
    pairs = meta.get("output_token_logprobs")
    ids = out.get("output_ids")
    if ids is None and pairs is None:
        raise EngineError(endpoint, "response has neither output_ids nor "
                          "meta_info.output_token_logprobs; request return_logprob=True")
    if ids is None:
        ids = [int(p[1]) for p in pairs]
    logprobs = [float(p[0]) for p in pairs] if pairs is not None else None
    return list(ids), logprobs


def routes_of(meta: dict[str, Any], tokens: int) -> np.ndarray | None:
    """``meta_info.routed_experts`` as ``[tokens, layers, top_k]`` int16, -1 past the record."""
    raw, shape = meta.get("routed_experts"), meta.get("routed_experts_shape")
    if raw is None:
        return None
    if not shape or len(shape) != 2:
        raise EngineError("/generate", "meta_info.routed_experts came without routed_experts_shape "
                          "[layers, top_k]; the engine's route format is not the embedded one")
    fed = np.frombuffer(base64.b64decode(raw), dtype="<i4").reshape(-1, *shape)
    routes = np.full((tokens, *shape), -1, dtype=np.int16)
    routes[:min(len(fed), tokens)] = fed[:tokens]
    return routes


def generate_output(out: dict[str, Any], rid: str) -> GenerateOutput:
    meta = out.get("meta_info", {})
    ids, logprobs = tokens_of(out, "/generate")
    reason, matched = finish_of(meta)
    routes = routes_of(meta, int(meta.get("prompt_tokens", 0)) + len(ids))
    return GenerateOutput(
        output_ids=ids, output_logprobs=logprobs, finish_reason=reason,
        weight_version=weight_version_of(meta.get("weight_version")),
        prompt_tokens=int(meta.get("prompt_tokens", 0)), rid=str(meta.get("id") or rid),
        text=out.get("text") or "", matched_stop=matched,
        output_weight_versions=meta.get("output_token_weight_versions"), meta_info=meta,
        routed_experts=routes,
    )


def raise_for_error(resp: httpx.Response, endpoint: str) -> None:
    if resp.is_success:
        return
    message, fld = resp.text, None
    try:
        body = resp.json()
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            message, fld = err.get("message", message), err.get("field")
        elif isinstance(body, dict) and "message" in body:
            message = body["message"]
    except ValueError:
        pass
    raise EngineError(endpoint, message, resp.status_code, fld)

"""vLLM's token-in route ``POST /inference/v1/generate``: prime-rl's and verifiers' training client.

That client renders the chat itself and sends the prompt's token ids:
``{"model", "token_ids", "sampling_params": {"stop_token_ids", "logprobs": 1, ...}}``. It reads
``choices[0].token_ids``, one ``{"token": "token_id:N", "logprob": x}`` per sampled token in
``choices[0].logprobs.content`` and ``choices[0].finish_reason`` (the ``renderers`` package's
``renderers.client.generate``, which verifiers' ``--client.type train`` calls). The router records
such a turn like any other: the prompt extends the trajectory's segment whose tokens it starts
with, else a segment forks at the longest token prefix they share (``tito.plan_tokens``); the
sampled tokens are appended with their logprobs and weight versions. Nothing is re-tokenized.

Refused, naming the field: streaming (the client never streams), multimodal inputs
(``features``, ``content_parts``), ``n`` other than 1, ``logprobs`` above 1 (the reply carries
the sampled token's logprob only) and the sampling parameters the router does not pass on to
the engines (penalties, ``min_p``, ``min_tokens``, ``ignore_eos``) unless they hold their
neutral value. ``top_k`` 0 means off, as in vLLM. ``cache_salt`` and ``priority`` are accepted and change nothing:
replies never depend on the prefix cache, and the pool has no priorities. Nor does
``sampling_params.routed_experts_prompt_start`` (a non-negative int), which verifiers'
``TrainClient`` adds on a turn whose prompt it bridged from the previous turn's tokens: it says
where the MoE routing it wants back starts, and the reply carries no routing (the router keeps
it with the trajectory).
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from loongsage.agentflow.errors import RequestError
from loongsage.agentflow.messages import ChatRequest, SamplingOptions
from loongsage.agentflow.protocols.base import (
    StreamEvent, TurnResult, get_field, openai_error, require_object, stop_list,
)

ROUTE = "/inference/v1/generate"
NO_EFFECT = ("cache_salt", "priority")  # accepted top-level keys that change no reply
REQUEST_KEYS = {"model", "token_ids", "sampling_params", "stream", *NO_EFFECT}
# sampling keys accepted only at the value that leaves sampling unchanged
NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
           "min_tokens": 0, "min_p": 0.0, "ignore_eos": False}
ROUTING_START = "routed_experts_prompt_start"  # accepted sampling key that changes no reply
SAMPLING_KEYS = {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
                 "logprobs", "n", "skip_special_tokens", "spaces_between_special_tokens",
                 ROUTING_START, *NEUTRAL}


def _token_ids(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                              and t >= 0 for t in value):
        raise RequestError(f"{name}: expected a list of non-negative token ids", param=name)
    return list(value)


def _sampling(raw: dict[str, Any]) -> SamplingOptions:
    unknown = sorted(set(raw) - SAMPLING_KEYS)
    if unknown:
        raise RequestError(f"sampling_params.{unknown[0]}: not supported; accepted: "
                           f"{sorted(SAMPLING_KEYS)}", param=f"sampling_params.{unknown[0]}")
    for name, neutral in NEUTRAL.items():
        if name in raw and raw[name] is not None and raw[name] != neutral:
            raise RequestError(f"sampling_params.{name}: only {neutral!r} (no effect) is supported, "
                               f"got {raw[name]!r}", param=f"sampling_params.{name}")
    n = get_field(raw, "n", int, 1)
    if n != 1:
        raise RequestError(f"sampling_params.n: only n=1 is supported, got {n}", param="sampling_params.n")
    logprobs = get_field(raw, "logprobs", int, 1)
    if logprobs > 1:
        raise RequestError("sampling_params.logprobs: only the sampled token's logprob (1) is "
                           f"returned, got {logprobs}", param="sampling_params.logprobs")
    stop_ids = raw.get("stop_token_ids")
    try:
        if get_field(raw, ROUTING_START, int, 0) < 0:
            raise RequestError(f"{ROUTING_START}: expected a non-negative int", param=ROUTING_START)
        return SamplingOptions(
            max_tokens=get_field(raw, "max_tokens", int),
            temperature=float(get_field(raw, "temperature", (int, float), 1.0)),
            top_p=float(get_field(raw, "top_p", (int, float), 1.0)),
            top_k=get_field(raw, "top_k", int, -1) or -1,
            stop=stop_list(raw.get("stop"), "stop"),
            stop_token_ids=[] if stop_ids is None else _token_ids(stop_ids, "stop_token_ids"),
            seed=get_field(raw, "seed", int))
    except RequestError as err:  # the body nests these under sampling_params
        raise RequestError(f"sampling_params.{err.message}", param=f"sampling_params.{err.param}") from None


class TokenGenerateAdapter:
    wire = "token_generate"

    def parse_request(self, body: Any) -> ChatRequest:
        body = require_object(body, "inference/v1/generate")
        unknown = sorted(set(body) - REQUEST_KEYS)
        if unknown:
            raise RequestError(f"{unknown[0]}: not supported by {ROUTE} (accepted: "
                               f"{sorted(REQUEST_KEYS)})", param=unknown[0])
        if get_field(body, "stream", bool, False):
            raise RequestError(f"stream: {ROUTE} answers whole replies only", param="stream")
        prompt = _token_ids(get_field(body, "token_ids", list, required=True), "token_ids")
        if not prompt:
            raise RequestError("token_ids: at least one prompt token is required", param="token_ids")
        return ChatRequest(wire=self.wire, model=get_field(body, "model", str, required=True),
                           messages=[], sampling=_sampling(get_field(body, "sampling_params", dict, {})),
                           prompt_ids=prompt, raw=body)

    def render_response(self, request: ChatRequest, result: TurnResult) -> dict[str, Any]:
        content = [{"token": f"token_id:{t}", "logprob": lp}
                   for t, lp in zip(result.output_ids, result.output_logprobs)]
        return {"request_id": result.response_id,
                "choices": [{"index": 0, "token_ids": list(result.output_ids),
                             "logprobs": {"content": content},
                             "finish_reason": result.finish_reason}],
                "usage": {"prompt_tokens": result.prompt_tokens,
                          "completion_tokens": result.completion_tokens,
                          "total_tokens": result.prompt_tokens + result.completion_tokens}}

    def stream_response(self, request: ChatRequest,
                        events: AsyncIterator[StreamEvent]) -> AsyncIterator[str]:
        """Never reached: ``parse_request`` refuses ``stream``."""
        raise RequestError(f"stream: {ROUTE} answers whole replies only", param="stream")

    def render_error(self, error: RequestError) -> dict[str, Any]:
        return openai_error(error)

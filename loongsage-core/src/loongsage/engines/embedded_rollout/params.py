"""Parse and validate SGLang ``/generate`` request bodies (torch-free).

The embedded engine accepts the subset of SGLang's ``GenerateReqInput`` / ``SamplingParams``
that RL needs. A field the engine does not implement is rejected with an error naming it,
rather than silently ignored, so a recipe never believes a setting took effect when it did
not. Purely cosmetic SGLang fields (``skip_special_tokens`` and friends) are accepted.
Every error is a :class:`RequestError` carrying the offending field path; the server
turns it into HTTP 400 with ``{"error": {"message": ..., "field": ...}}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# sampling_params keys that change nothing the embedded engine computes.
_COSMETIC = {"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "n"}
_SUPPORTED = {
    "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids",
    "ignore_eos", "sampling_seed",
}
# top-level /generate keys: accepted and used, accepted and meaningless here, the rest reject.
_REQUEST_KEYS = {"input_ids", "text", "sampling_params", "rid", "return_logprob", "stream",
                 "return_routed_experts"}
_REQUEST_NOOP = {"logprob_start_len", "return_text_in_logprobs", "top_logprobs_num"}


class RequestError(ValueError):
    """A malformed request; ``field`` is the dotted path of the offending value."""

    def __init__(self, field: str, problem: str):
        self.field = field
        super().__init__(f"{field}: {problem}")


@dataclass
class SamplingParams:
    """Per-request sampling settings (SGLang names and defaults; ``max_new_tokens`` 16)."""

    max_new_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    min_p: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    # the request's randomness (SGLang's field); None: derived from the engine's seed and the rid
    sampling_seed: int | None = None


@dataclass
class GenerateRequest:
    """One validated generation request."""

    input_ids: list[int]
    params: SamplingParams
    rid: str | None = None
    return_logprob: bool = False
    stream: bool = False
    return_routed_experts: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _number(value: Any, name: str, *, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(name, f"expected a number, got {value!r}")
    if integer and (isinstance(value, float) and not value.is_integer()):
        raise RequestError(name, f"expected an integer, got {value!r}")
    return int(value) if integer else float(value)


def _token_ids(value: Any, name: str, vocab_size: int, *, allow_empty: bool) -> list[int]:
    if not isinstance(value, list) or (not value and not allow_empty):
        raise RequestError(name, f"expected a non-empty list of token ids, got {value!r:.80}")
    for i, tok in enumerate(value):
        if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < vocab_size:
            raise RequestError(
                f"{name}[{i}]", f"expected a token id in [0, {vocab_size}), got {tok!r}"
            )
    return value


def parse_sampling_params(raw: Any, vocab_size: int) -> SamplingParams:
    """Validate a ``sampling_params`` dict into :class:`SamplingParams`."""
    if raw is None:
        return SamplingParams()
    if not isinstance(raw, dict):
        raise RequestError("sampling_params", f"expected an object, got {raw!r:.80}")
    for key in raw:
        if key not in _SUPPORTED and key not in _COSMETIC:
            raise RequestError(
                f"sampling_params.{key}",
                "not supported by the embedded engine; supported: "
                + ", ".join(sorted(_SUPPORTED | _COSMETIC)),
            )
    p = SamplingParams()
    if "max_new_tokens" in raw:
        p.max_new_tokens = int(_number(raw["max_new_tokens"], "sampling_params.max_new_tokens",
                                       integer=True))
        if p.max_new_tokens < 0:
            raise RequestError("sampling_params.max_new_tokens", "must be >= 0")
    if "temperature" in raw:
        p.temperature = _number(raw["temperature"], "sampling_params.temperature")
        if p.temperature < 0:
            raise RequestError("sampling_params.temperature", f"must be >= 0, got {p.temperature}")
    if "top_p" in raw:
        p.top_p = _number(raw["top_p"], "sampling_params.top_p")
        if not 0 < p.top_p <= 1:
            raise RequestError("sampling_params.top_p", f"must be in (0, 1], got {p.top_p}")
    if "top_k" in raw:
        p.top_k = int(_number(raw["top_k"], "sampling_params.top_k", integer=True))
        if p.top_k != -1 and p.top_k < 1:
            raise RequestError("sampling_params.top_k", f"must be -1 (off) or >= 1, got {p.top_k}")
        if p.top_k >= vocab_size:  # keeps every token, as off does (and 2**63 overflowed the sampler)
            p.top_k = -1
    if "min_p" in raw:
        p.min_p = _number(raw["min_p"], "sampling_params.min_p")
        if not 0 <= p.min_p <= 1:
            raise RequestError("sampling_params.min_p", f"must be in [0, 1], got {p.min_p}")
    if raw.get("stop"):
        raise RequestError(
            "sampling_params.stop",
            "stop strings are not supported by the embedded engine; use stop_token_ids",
        )
    if raw.get("stop_token_ids") is not None:
        ids = _token_ids(raw["stop_token_ids"], "sampling_params.stop_token_ids", vocab_size,
                         allow_empty=True)
        p.stop_token_ids = tuple(ids)
    if "ignore_eos" in raw:
        if not isinstance(raw["ignore_eos"], bool):
            raise RequestError("sampling_params.ignore_eos", "expected true or false")
        p.ignore_eos = raw["ignore_eos"]
    if raw.get("sampling_seed") is not None:
        p.sampling_seed = int(_number(raw["sampling_seed"], "sampling_params.sampling_seed", integer=True))
        if not 0 <= p.sampling_seed < 1 << 64:
            raise RequestError("sampling_params.sampling_seed",
                               f"expected an integer in [0, 2**64), got {p.sampling_seed}")
    if "skip_special_tokens" in raw:
        p.skip_special_tokens = bool(raw["skip_special_tokens"])
    if raw.get("n", 1) != 1:
        raise RequestError("sampling_params.n", "only n=1 is supported; send n requests")
    return p


def parse_generate(body: Any, vocab_size: int,
                   tokenize=None) -> tuple[list[GenerateRequest], bool]:
    """Validate a ``/generate`` body into ``(requests, batched)``.

    A batched body (a list of prompts) gives one request per prompt and ``batched=True``.

    ``tokenize`` (text -> ids) enables the ``text`` field; without it ``text`` is rejected.
    """
    if not isinstance(body, dict):
        raise RequestError("body", "expected a JSON object")
    for key in body:
        if key not in _REQUEST_KEYS and key not in _REQUEST_NOOP:
            raise RequestError(key, "not supported by the embedded engine")
    if body.get("top_logprobs_num"):
        raise RequestError("top_logprobs_num", "top logprobs are not supported")
    if "input_ids" in body and body["input_ids"] is not None:
        raw_ids = body["input_ids"]
        batched = isinstance(raw_ids, list) and bool(raw_ids) and isinstance(raw_ids[0], list)
        prompts = raw_ids if batched else [raw_ids]
        names = [f"input_ids[{i}]" for i in range(len(prompts))] if batched else ["input_ids"]
        prompts = [_token_ids(p, n, vocab_size, allow_empty=False) for p, n in zip(prompts, names)]
    elif body.get("text") is not None:
        if tokenize is None:
            raise RequestError("text", "this engine has no tokenizer; send input_ids")
        texts = body["text"]
        batched = isinstance(texts, list)
        texts = texts if batched else [texts]
        if not texts or not all(isinstance(t, str) and t for t in texts):
            raise RequestError("text", "expected a non-empty string or list of strings")
        prompts = [tokenize(t) for t in texts]
    else:
        raise RequestError("input_ids", "missing: send input_ids (a list of token ids)")

    n = len(prompts)

    def per_item(key: str, default: Any) -> list[Any]:
        value = body.get(key, default)
        if batched and isinstance(value, list):
            if len(value) != n:
                raise RequestError(key, f"expected {n} entries (one per prompt), got {len(value)}")
            return value
        return [value] * n

    sps = per_item("sampling_params", None)
    rids = per_item("rid", None)
    logps = per_item("return_logprob", False)
    if batched and body.get("rid") is not None and not isinstance(body["rid"], list):
        raise RequestError("rid", "a batched request needs a list of rids")
    routes = body.get("return_routed_experts", False)
    if not isinstance(routes, bool):
        raise RequestError("return_routed_experts", "expected true or false")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("stream", "expected true or false")
    if stream and batched:
        raise RequestError("stream", "streaming is supported for single prompts only")
    out = []
    for i in range(n):
        rid = rids[i]
        if rid is not None and not isinstance(rid, str):
            raise RequestError("rid", f"expected a string, got {rid!r}")
        params = parse_sampling_params(sps[i], vocab_size)
        out.append(GenerateRequest(prompts[i], params, rid, bool(logps[i]), stream, routes))
    return out, batched

"""The single-turn agent: the smallest white-box agent loop.

For a prompt group it renders the prompt's chat messages once with the tokenizer's chat
template (``add_generation_prompt=True``), encodes that text without adding special tokens
again (the template already holds them, as in verl and slime), sends the ``n`` copies of
the prompt to the engine as one batched generate request (so the engine admits them together
and prefills the shared prompt once, instead of as many HTTP requests arriving a few at a
time), and returns one ``Sample`` per completion:
every response token was sampled by the model, so the loss mask is all ones, and every
token carries the weight version that sampled it (the engine's per-token versions when it
reports them, as the embedded engine does for partial rollouts, else the response's one
``weight_version``).

The client is anything with ``async agenerate_batch(prompts, sampling_params, rids=None)``
(one output per prompt, in order) and, to continue a sample, ``async agenerate(input_ids,
sampling_params, rid=None)``, each output an object with ``output_ids``, ``output_logprobs``, ``finish_reason``,
``weight_version`` and optionally ``output_weight_versions`` and ``routed_experts``
(``loongsage.engines.client.GenerateOutput``; MoE routes of prompt + output, kept on the sample
for router replay; a continued sample takes the continuation's, which cover all its tokens). Rewards are not computed
here: the controller scores samples with the data source's reward.

``sampling_params["sampling_seed"]``, when the rollout manager sets it, is the group's seed:
sample ``i`` is drawn with ``sample_seed(group seed, i)`` (each prompt of the batched request
carries its own ``sampling_seed``), kept on the sample so a continuation draws on with it.
"""

from __future__ import annotations

import uuid
from typing import Any

from loongsage.plugin import Prompt, SEED_KEY, Sample, sample_seed

from loongsage_agents.agents.params import SingleTurnParams


class SingleTurnAgent:
    """Chat-template the prompt, sample n completions, return them as samples."""

    def __init__(self, params: SingleTurnParams | None, context: Any) -> None:
        self.params = params or SingleTurnParams()
        self.tokenizer = context.tokenizer

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The token ids of the prompt's messages rendered with the chat template."""
        text = self.tokenizer.apply_chat_template(
            prompt.messages,
            add_generation_prompt=True,
            tokenize=False,
            **self.params.chat_template_kwargs,
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _sample(self, prompt_ids: list[int], out: Any, seed: int | None = None) -> Sample:
        ids = [int(t) for t in out.output_ids]
        if out.output_logprobs is None:
            raise ValueError(f"single_turn: request {out.rid} came back without logprobs")
        versions = getattr(out, "output_weight_versions", None)
        if versions is None:
            if not isinstance(out.weight_version, int):
                raise ValueError(
                    f"single_turn: request {out.rid} reported weight_version "
                    f"{out.weight_version!r}; expected an integer policy version"
                )
            versions = [out.weight_version] * len(ids)
        return Sample(
            prompt_ids=prompt_ids,
            response_ids=ids,
            response_logprobs=[float(x) for x in out.output_logprobs],
            weight_versions=[int(v) for v in versions],
            loss_mask=[1] * len(ids),
            finish_reason=out.finish_reason,
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            routed_experts=getattr(out, "routed_experts", None),
            sampling_seed=seed,
        )

    async def run_group(
        self, prompt: Prompt, n: int, client: Any, sampling_params: dict[str, Any]
    ) -> list[Sample]:
        """Generate ``n`` completions of ``prompt`` in one batched request."""
        if n < 1:
            raise ValueError(f"single_turn: n must be >= 1, got {n}")
        prompt_ids = self.prompt_ids(prompt)
        group = uuid.uuid4().hex[:8]
        rids = [f"{prompt.source}-{prompt.index}-{group}-{i}" for i in range(n)]
        base = sampling_params.get(SEED_KEY)
        seeds = [None if base is None else sample_seed(base, i) for i in range(n)]
        per_sample = [_with_seed(sampling_params, seed) for seed in seeds]
        outputs = await client.agenerate_batch([prompt_ids] * n, per_sample, rids=rids)
        return [self._sample(prompt_ids, out, seed) for out, seed in zip(outputs, seeds)]

    async def continue_sample(self, sample: Sample, client: Any, sampling_params: dict[str, Any]) -> Sample:
        """Continue a sample aborted at a weight update from its tokens (partial rollout).

        The new tokens carry the weight version that sampled them, so a continued sample
        mixes versions; the token budget is what ``max_new_tokens`` leaves.
        """
        budget = int(sampling_params.get("max_new_tokens", 0)) - len(sample.response_ids)
        if budget <= 0:
            sample.finish_reason = "length"
            return sample
        params = _with_seed({**sampling_params, "max_new_tokens": budget}, sample.sampling_seed)
        out = await client.agenerate(sample.prompt_ids + sample.response_ids, params)
        more = self._sample(sample.prompt_ids + sample.response_ids, out, sample.sampling_seed)
        ids = sample.response_ids + more.response_ids
        return Sample(
            prompt_ids=sample.prompt_ids,
            response_ids=ids,
            response_logprobs=sample.response_logprobs + more.response_logprobs,
            weight_versions=sample.weight_versions + more.weight_versions,
            loss_mask=sample.loss_mask + more.loss_mask,
            finish_reason=more.finish_reason,
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            routed_experts=more.routed_experts,
            sampling_seed=sample.sampling_seed,
        )


def _with_seed(sampling_params: dict[str, Any], seed: int | None) -> dict[str, Any]:
    """``sampling_params`` with one sample's ``sampling_seed`` (none: the engine picks)."""
    out = {k: v for k, v in sampling_params.items() if k != SEED_KEY}
    if seed is not None:
        out[SEED_KEY] = seed
    return out

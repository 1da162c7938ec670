"""Data filters and DAPO's overlong reward shaping (DAPO, arXiv 2503.14476 §3.2–3.4).

Contract (``loongsage.algorithms.filters``): ``fn(groups: list[Group], params) ->
FilterResult``; inputs are never mutated, modified groups and samples are copies.

    dynamic_sampling         drop groups whose rewards all tie (max − min ≤ tolerance),
                             i.e. all right or all wrong: they give Â = 0 and only dilute the
                             batch. The caller redraws through ``fill_batch`` up to
                             ``max_rounds`` times. Groups of one sample are dropped too.
    overlong                 "overlong filtering": zero the loss mask of truncated samples
                             (finish_reason = length); the group keeps them for its baseline.
    length                   drop samples whose response length is outside
                             [min_tokens, max_tokens]; a group left empty is dropped.
    overlong_reward_shaping  add DAPO's soft overlong punishment to each sample's reward:
                             R_len = 0 if |y| ≤ L_max − L_cache, ((L_max − L_cache) − |y|)/L_cache
                             if |y| ≤ L_max, −1 beyond (times ``penalty``); recorded in
                             ``reward_info["overlong_penalty"]``. It wraps any reward plugin
                             because it runs on scored groups; it is a data filter that drops
                             nothing.

Metrics (summed by the chain): ``rollout/filter_drop`` (groups dropped by
dynamic_sampling or length), ``rollout/overlong_masked`` (samples masked),
``rollout/length_dropped`` (samples dropped), ``rollout/overlong_penalty_sum``.
"""

from __future__ import annotations

import dataclasses

from loongsage.plugin import FilterResult, Group, Sample
from loongsage_algos.params import (
    DynamicSamplingParams,
    LengthParams,
    OverlongParams,
    OverlongShapingParams,
)


def _with_samples(group: Group, samples: list[Sample]) -> Group:
    return dataclasses.replace(group, samples=samples)


def dynamic_sampling(groups: list[Group], params: DynamicSamplingParams) -> FilterResult:
    """Keep only groups whose rewards differ (0 < #correct < G for 0/1 rewards)."""
    kept = [g for g in groups if len(g.samples) > 1 and max(g.rewards) - min(g.rewards) > params.tolerance]
    return FilterResult(kept, {"rollout/filter_drop": float(len(groups) - len(kept))})


def overlong(groups: list[Group], params: OverlongParams) -> FilterResult:
    """Zero the loss mask of truncated samples."""
    out, masked = [], 0
    for group in groups:
        samples = []
        for s in group.samples:
            if s.truncated:
                masked += 1
                s = dataclasses.replace(s, loss_mask=[0] * len(s.loss_mask))
            samples.append(s)
        out.append(_with_samples(group, samples))
    return FilterResult(out, {"rollout/overlong_masked": float(masked)})


def length(groups: list[Group], params: LengthParams) -> FilterResult:
    """Drop samples whose response length lies outside [min_tokens, max_tokens]."""
    hi = params.max_tokens
    out, dropped, dropped_groups = [], 0, 0
    for group in groups:
        samples = [s for s in group.samples
                   if len(s.response_ids) >= params.min_tokens and (hi is None or len(s.response_ids) <= hi)]
        dropped += len(group.samples) - len(samples)
        if samples:
            out.append(_with_samples(group, samples))
        else:
            dropped_groups += 1
    return FilterResult(out, {"rollout/length_dropped": float(dropped), "rollout/filter_drop": float(dropped_groups)})


def overlong_penalty(response_len: int, max_len: int, cache_len: int, penalty: float = 1.0) -> float:
    """DAPO soft overlong punishment R_len for a response of ``response_len`` tokens."""
    soft_start = max_len - cache_len
    if response_len <= soft_start:
        return 0.0
    if response_len <= max_len:
        return penalty * (soft_start - response_len) / cache_len
    return -penalty


def overlong_reward_shaping(groups: list[Group], params: OverlongShapingParams) -> FilterResult:
    """Add the DAPO overlong penalty to every sample's reward."""
    out, total = [], 0.0
    for group in groups:
        samples = []
        for s in group.samples:
            p = overlong_penalty(len(s.response_ids), params.max_len, params.cache_len, params.penalty)
            total += p
            info = {**s.reward_info, "overlong_penalty": p}
            samples.append(dataclasses.replace(s, reward=s.reward + p, reward_info=info))
        out.append(_with_samples(group, samples))
    return FilterResult(out, {"rollout/overlong_penalty_sum": total})

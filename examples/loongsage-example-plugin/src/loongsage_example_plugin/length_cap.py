"""A data filter dropping every prompt group with a response over a token budget."""

from loongsage.plugin import FilterResult


def length_cap(groups, params):
    kept = [g for g in groups if all(len(s.response_ids) <= params.max_response_tokens for s in g.samples)]
    return FilterResult(kept, {"rollout/length_cap_dropped": float(len(groups) - len(kept))})

"""Data filters, DAPO overlong shaping, the filter chain and batch filling with a cap."""

import pytest

from loongsage.algorithms.filters import FilterChain, fill_batch
from loongsage.plugin import Group, Prompt, Sample
from loongsage.plugin.testing import installed_registries
from loongsage_algos.filters import dynamic_sampling, length, overlong, overlong_penalty, overlong_reward_shaping
from loongsage_algos.params import DynamicSamplingParams, LengthParams, OverlongParams, OverlongShapingParams


def _sample(reward, n_tokens=3, finish="stop"):
    return Sample(prompt_ids=[1], response_ids=list(range(n_tokens)), response_logprobs=[-0.1] * n_tokens,
                  weight_versions=[0] * n_tokens, loss_mask=[1] * n_tokens, finish_reason=finish, reward=reward)


def _group(gid, rewards, **kw):
    return Group(gid, Prompt("src", gid, [{"role": "user", "content": "q"}]), [_sample(r, **kw) for r in rewards])


def test_dynamic_sampling_drops_tied_groups():
    groups = [_group(0, [1, 1, 1]), _group(1, [0, 1, 0]), _group(2, [0, 0]), _group(3, [1]), _group(4, [0.5, 0.52])]
    out = dynamic_sampling(groups, DynamicSamplingParams())
    assert [g.group_id for g in out.groups] == [1, 4]
    assert out.metrics["rollout/filter_drop"] == 3
    out = dynamic_sampling(groups, DynamicSamplingParams(tolerance=0.05))
    assert [g.group_id for g in out.groups] == [1]


def test_overlong_masks_truncated_samples_without_mutating_input():
    group = Group(0, Prompt("src", 0, []), [_sample(1.0), _sample(0.0, finish="length")])
    out = overlong([group], OverlongParams())
    assert [s.loss_mask for s in out.groups[0].samples] == [[1, 1, 1], [0, 0, 0]]
    assert group.samples[1].loss_mask == [1, 1, 1]
    assert out.metrics["rollout/overlong_masked"] == 1


def test_length_drops_samples_and_empty_groups():
    groups = [Group(0, Prompt("s", 0, []), [_sample(1, n_tokens=2), _sample(0, n_tokens=5)]),
              Group(1, Prompt("s", 1, []), [_sample(1, n_tokens=9)])]
    out = length(groups, LengthParams(min_tokens=3, max_tokens=8))
    assert [(g.group_id, [len(s.response_ids) for s in g.samples]) for g in out.groups] == [(0, [5])]
    assert out.metrics == {"rollout/length_dropped": 2.0, "rollout/filter_drop": 1.0}


@pytest.mark.parametrize("n,expected", [(10, 0.0), (16, 0.0), (18, -0.5), (20, -1.0), (21, -1.0)])
def test_overlong_penalty_by_hand(n, expected):
    # L_max 20, L_cache 4: zero up to 16, ((20-4) - n)/4 up to 20, -1 beyond
    assert overlong_penalty(n, max_len=20, cache_len=4) == pytest.approx(expected)


def test_overlong_reward_shaping_adds_the_penalty():
    group = _group(0, [1.0, 0.0], n_tokens=18)
    out = overlong_reward_shaping([group], OverlongShapingParams(max_len=20, cache_len=4))
    assert [s.reward for s in out.groups[0].samples] == [0.5, -0.5]
    assert out.groups[0].samples[0].reward_info["overlong_penalty"] == -0.5
    assert group.samples[0].reward == 1.0


def test_chain_from_config_runs_in_order_and_sums_metrics():
    chain = FilterChain(installed_registries().resolve_all("data_filter", [{"name": "overlong_reward_shaping", "max_len": 20, "cache_len": 4},
                                     {"name": "dynamic_sampling", "max_rounds": 3}], "algorithm.filters"))
    assert chain.max_rounds == 3
    # rewards tie before shaping; the length penalty separates them, so the group survives
    groups = [Group(0, Prompt("s", 0, []), [_sample(1.0, n_tokens=10), _sample(1.0, n_tokens=18)]),
              _group(1, [0.0, 0.0])]
    out = chain(groups)
    assert [g.group_id for g in out.groups] == [0]
    assert out.metrics["rollout/filter_drop"] == 1 and out.metrics["rollout/overlong_penalty_sum"] == -0.5


def test_fill_batch_draws_until_full_and_reports_counts():
    stream = iter([[0, 1], [1, 1], [0, 0], [1, 0], [0, 1], [1, 0], [0, 1]])  # rewards of each drawn group
    ids = iter(range(100))

    def draw(n):
        return [_group(next(ids), next(stream)) for _ in range(n)]

    chain = FilterChain(installed_registries().resolve_all("data_filter", ["dynamic_sampling"], "algorithm.filters"))
    result = fill_batch(draw, chain, target=3, max_rounds=5)
    # round 1 draws 3 ([0,1] ok, [1,1], [0,0]) -> 1 kept; round 2 draws 2 -> both kept
    assert [g.group_id for g in result.groups] == [0, 3, 4]
    assert result.metrics["rollout/filter_groups_drawn"] == 5
    assert result.metrics["rollout/filter_rounds"] == 2
    assert result.metrics["rollout/filter_drop"] == 2
    assert result.metrics["rollout/filter_batch_short"] == 0


def test_fill_batch_stops_at_the_cap():
    ids = iter(range(100))
    result = fill_batch(lambda n: [_group(next(ids), [1, 1]) for _ in range(n)],
                        FilterChain(installed_registries().resolve_all("data_filter", ["dynamic_sampling"], "algorithm.filters")), target=2, max_rounds=3)
    assert result.groups == [] and result.metrics["rollout/filter_groups_drawn"] == 6
    assert result.metrics["rollout/filter_batch_short"] == 2


def test_bad_filter_params_name_the_key():
    from loongsage.plugin import ConfigError

    with pytest.raises(ConfigError) as info:
        FilterChain(installed_registries().resolve_all("data_filter", [{"name": "length", "min_tokens": 5, "max_tokens": 2}], key="data_sources[0].filters"))
    assert info.value.key == "data_sources[0].filters[0]"

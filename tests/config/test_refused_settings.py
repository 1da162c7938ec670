"""Settings whose feature is not built yet are refused at load, naming the key, instead of
being accepted and ignored (distillation lands with loongsage-distill's Teacher Manager)."""

from __future__ import annotations

import pytest

from loongsage.config.compose import load_config
from loongsage.errors import ConfigError


@pytest.mark.parametrize("override, key", [
    ("data_sources.0.teacher=math_expert", "data_sources[0].teacher"),
    ("opd.pg_ratio=0.5", "opd.pg_ratio"),
    ("opd.gkd_ratio=1.0", "opd.gkd_ratio"),
    ("opd.gkd_kl_method=k2", "opd.gkd_kl_method"),
])
def test_distillation_settings_are_refused_until_built(override, key):
    with pytest.raises(ConfigError) as info:
        load_config("tiny/grpo", [override])
    assert info.value.key == key and "not built yet" in info.value.problem


def test_defaults_load_and_filters_with_oversampling_are_refused():
    assert load_config("tiny/grpo").cfg.opd.pg_ratio == 0.0
    with pytest.raises(ConfigError, match=r"^algorithm.filters: data filters run in the synchronous"):
        load_config("tiny/grpo", ["rollout.oversample_groups=2", "algorithm.filters=[dynamic_sampling]"])

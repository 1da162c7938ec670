"""Settings that cannot take effect together are refused at load, naming the key, instead of
being accepted and ignored (distillation settings: ``test_opd_config.py``)."""

from __future__ import annotations

import pytest

from loongsage.config.compose import load_config
from loongsage.errors import ConfigError


def test_defaults_load_and_filters_with_oversampling_are_refused():
    assert load_config("tiny/grpo").cfg.opd.pg_ratio == 0.0
    with pytest.raises(ConfigError, match=r"^algorithm.filters: data filters run in the synchronous"):
        load_config("tiny/grpo", ["rollout.oversample_groups=2", "algorithm.filters=[dynamic_sampling]"])

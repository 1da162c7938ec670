"""IS corrections (token/sequence/geometric × clip/mask, IcePop), OPSM, and their validation."""

import math

import pytest
import torch

from loongsage.algorithms.objective import Objective
from loongsage.plugin.testing import loss_context, split_and_sum
from loongsage.plugin import PolicyLossInputs
from loongsage.algorithms.validate import validate_algorithm
from loongsage.plugin import ConfigError
from loongsage.plugin.testing import installed_registries
from loongsage_algos.is_corrections import geometric_is, icepop, sequence_is, token_is
from loongsage_algos.opsm import opsm
from loongsage_algos.params import IcePopParams, ISParams, OPSMParams

D = torch.float64
DELTA = [[0.1, 1.0, -0.5], [0.2, 0.3, 9.0]]  # log π_old − log π_roll; row 1 token 2 is padding
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


def _inputs(delta=DELTA, mask=MASK, logprob_shift=None, adv=None):
    old = torch.full((len(delta), len(delta[0])), -1.0, dtype=D)
    roll = old - torch.tensor(delta, dtype=D)
    lp = old if logprob_shift is None else old + torch.tensor(logprob_shift, dtype=D)
    adv = torch.ones_like(old) if adv is None else torch.tensor(adv, dtype=D)
    return PolicyLossInputs(lp.clone().requires_grad_(), old, roll, adv, torch.tensor(mask, dtype=D))


def test_token_clip_is_one_sided_tis_by_default():
    c = token_is(_inputs(), ISParams(action="clip", upper=2.0))
    assert c.keep is None
    assert c.weight[0].tolist() == pytest.approx([math.exp(0.1), 2.0, math.exp(-0.5)])
    assert c.metrics["train/is_clipfrac"][0].tolist() == [0.0, 1.0, 0.0]


def test_token_mask_drops_out_of_bound_tokens_two_sided():
    c = token_is(_inputs(), ISParams(action="mask", lower=0.7, upper=2.0))
    assert c.keep[0].tolist() == [1.0, 0.0, 0.0]
    assert c.weight[0].tolist() == pytest.approx([math.exp(0.1), 0.0, 0.0])


def test_sequence_and_geometric_levels():
    s = sequence_is(_inputs(), ISParams(action="clip", lower=0.5, upper=10.0))
    assert s.weight[0].tolist() == pytest.approx([math.exp(0.6)] * 3)
    assert s.weight[1].tolist() == pytest.approx([math.exp(0.5)] * 3)  # padding excluded
    g = geometric_is(_inputs(), ISParams(action="mask", lower=0.5, upper=1.2))
    # row 0: exp(0.6/3) = 1.221 > 1.2 -> dropped; row 1: exp(0.25) = 1.284 -> dropped too
    assert g.keep.tolist() == [[0.0] * 3, [0.0] * 3]
    g = geometric_is(_inputs(), ISParams(action="mask", lower=0.5, upper=1.25))
    assert g.keep[0].tolist() == [1.0] * 3 and g.weight[0].tolist() == pytest.approx([math.exp(0.2)] * 3)
    assert g.keep[1].tolist() == [0.0] * 3


def test_icepop_defaults_are_two_sided_half_to_five():
    c = icepop(_inputs(delta=[[math.log(0.4), math.log(0.6), math.log(4.9), math.log(5.1)]], mask=[[1.0] * 4]),
               IcePopParams())
    assert c.keep[0].tolist() == [0.0, 1.0, 1.0, 0.0]
    assert c.weight[0].tolist() == pytest.approx([0.0, 0.6, 4.9, 0.0])


@pytest.mark.parametrize("fn", [token_is, sequence_is, geometric_is, icepop])
@pytest.mark.parametrize("action", ["clip", "mask"])
def test_weights_are_one_when_rollout_and_training_agree(fn, action):
    c = fn(_inputs(delta=[[0.0] * 3] * 2), ISParams(action=action, lower=0.9, upper=1.1))
    assert torch.all(c.weight == 1.0)
    assert c.keep is None or torch.all(c.keep == 1.0)
    assert torch.all(c.metrics["train/is_clipfrac"] == 0.0)


def test_opsm_masks_exactly_the_sequences_the_rule_names():
    # mean log(π_old/π_θ) per row = −mean(logprob_shift) over loss tokens
    shift = [[-0.2, -0.2], [-0.2, -0.2], [-0.05, -0.05], [-0.125, -0.125], [-0.3, 0.1]]
    adv = [[-1.0] * 2, [1.0] * 2, [-1.0] * 2, [-1.0] * 2, [-1.0] * 2]
    mask = [[1.0, 1.0]] * 4 + [[1.0, 0.0]]
    c = opsm(_inputs(delta=[[0.0, 0.0]] * 5, mask=mask, logprob_shift=shift, adv=adv), OPSMParams(delta=0.125))
    # row 0: Â<0, kl 0.2 > δ -> drop; row 1: Â>0 -> keep; row 2: kl 0.05 -> keep;
    # row 3: kl 0.125 (exact in binary) is not > δ -> keep; row 4: only token 0 counts, kl 0.3 -> drop
    assert c.keep[:, 0].tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert c.metrics["train/opsm_drop_frac"].tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]


def _extras(inp):
    return {"old_logprobs": inp.old_logprobs, "rollout_logprobs": inp.rollout_logprobs, "advantages": inp.advantages}


def test_objective_applies_tis_weight_to_the_policy_loss():
    inp = _inputs()
    obj = Objective.from_config({"policy_loss": {"name": "ppo_clip"},
                                 "is_correction": {"name": "token", "action": "clip", "upper": 2.0}},
                                installed_registries())
    loss, metrics = obj(loss_context(inp.logprobs, inp.mask, _extras(inp)))
    w = [math.exp(0.1), 2.0, math.exp(-0.5), math.exp(0.2), math.exp(0.3)]
    assert loss.item() == pytest.approx(-sum(w) / 5)  # on policy: ρ = 1, Â = 1
    assert metrics["train/is_weight_mean"] == pytest.approx(sum(w) / 5)
    k3 = [math.exp(d) - d - 1 for d in (0.1, 1.0, -0.5, 0.2, 0.3)]
    assert metrics["train/is_approx_k3_kl"] == pytest.approx(sum(k3) / 5)
    assert metrics["train/is_logprob_abs_diff"] == pytest.approx(2.1 / 5)


def test_m2po_with_opsm_composes_and_is_split_invariant_after_prepare():
    g = torch.Generator().manual_seed(3)
    n, length = 6, 5
    mask = (torch.rand(n, length, generator=g) > 0.2).double()
    old = -torch.rand(n, length, generator=g, dtype=D)
    extras = {"old_logprobs": old, "rollout_logprobs": old + 0.3 * torch.randn(n, length, generator=g, dtype=D),
              "advantages": torch.randn(n, 1, generator=g, dtype=D).expand(n, length) * mask}
    logprobs = old + 0.3 * torch.randn(n, length, generator=g, dtype=D)
    obj = Objective.from_config({"policy_loss": {"name": "m2po", "threshold": 0.04},
                                 "is_correction": {"name": "opsm", "delta": 0.05}}, installed_registries())
    batch = loss_context(logprobs, mask, extras).batch
    obj.prepare(batch)  # the batch-level M2PO mask, as the trainer does before splitting
    prepared = batch.extras
    full, full_m = obj(loss_context(logprobs, mask, prepared))
    split, split_m = split_and_sum(obj, logprobs, mask, prepared, [0, 2, 3, 6])
    assert 0 < full_m["train/m2po_masked_frac"] < 1 and 0 < full_m["train/opsm_drop_frac"] < 1
    assert split.item() == pytest.approx(full.item(), rel=1e-12)
    for key in ("train/m2po_masked_frac", "train/opsm_drop_frac", "train/keep_frac"):
        assert split_m[key] == pytest.approx(full_m[key]), key
    # the kept tokens' second moment respects the threshold over the whole batch
    sq = (old - extras["rollout_logprobs"]) ** 2
    kept = prepared["m2po_keep"] * mask
    assert (sq * kept).sum() / kept.sum() <= 0.04
    # without prepare each micro-batch would compute its own statistic
    bare, _ = split_and_sum(obj, logprobs, mask, extras, [0, 2, 3, 6])
    assert bare.item() != pytest.approx(full.item(), rel=1e-6)


def _reject(cfg, key, reason):
    with pytest.raises(ConfigError) as info:
        validate_algorithm(cfg, installed_registries())
    assert info.value.key == key and reason in info.value.problem


@pytest.mark.parametrize("corr", ["token", "sequence", "geometric", "icepop"])
def test_m2po_with_an_is_correction_is_rejected_with_the_reason(corr):
    _reject({"policy_loss": {"name": "m2po"}, "is_correction": {"name": corr}}, "algorithm.is_correction",
            "corrected twice")


def test_correction_lists():
    spec = validate_algorithm({"policy_loss": "m2po", "is_correction": [{"name": "opsm"}]}, installed_registries())
    assert [c.name for c in spec.corrections] == ["opsm"]
    spec = validate_algorithm({"is_correction": ["opsm", {"name": "icepop"}]}, installed_registries())
    assert [c.name for c in spec.corrections] == ["opsm", "icepop"]
    _reject({"policy_loss": "m2po", "is_correction": ["opsm", "token"]}, "algorithm.is_correction[1]", "twice")
    _reject({"is_correction": ["token", "sequence"]}, "algorithm.is_correction[1]", "at most one")
    _reject({"is_correction": {"name": "token", "action": "drop"}}, "algorithm.is_correction", "action")

"""OPSM: off-policy sequence masking (DeepSeek-V3.2, arXiv 2512.02556 §3.1).

    M_i = 0  iff  Â_i < 0  and  (1/|o_i|) Σ_t log(π_old(y_t)/π_θ(y_t)) > δ,   else 1

over the row's loss tokens, with π_θ detached (the mask carries no gradient) and Â_i the
mean advantage of the row. The mask multiplies the policy loss after the loss is computed;
the aggregation denominator is unchanged (baidu-baige/LoongSage ``compute_opsm_mask``). π_old is the
trainer's step-start recompute, as in baidu-baige/LoongSage and slime.

δ: baidu-baige/LoongSage defaults to 0.1, slime to 1e-4; we take **0.1**. A mean per-token KL of
1e-4 is within the ordinary train/inference mismatch of a dense model (dense 1e-5 to 1e-3:
zhaochenyang20/Awesome-ML-SYS-Tutorial, `rlhf/mismatch/blog-en.md`), so slime's value would drop
most negative samples as soon as the policy moves at all. Metric ``train/opsm_drop_frac``: fraction
of valid sequences masked.
"""

from __future__ import annotations

import torch

from loongsage.plugin import Correction, PolicyLossInputs
from loongsage_algos.losses.common import seq_mean
from loongsage_algos.params import OPSMParams


def opsm_mask(inputs: PolicyLossInputs, delta: float) -> torch.Tensor:
    """[N] keep mask: 0 for negative-advantage sequences whose mean log(π_old/π_θ) > delta."""
    seq_kl = seq_mean(inputs.old_logprobs - inputs.logprobs.detach(), inputs.mask)
    adv = seq_mean(inputs.advantages, inputs.mask)
    return 1.0 - ((adv < 0) & (seq_kl > delta)).to(inputs.mask.dtype)


def opsm(inputs: PolicyLossInputs, params: OPSMParams) -> Correction:
    """OPSM: drop the policy-gradient term of stale negative sequences."""
    keep_seq = opsm_mask(inputs, params.delta)
    return Correction(
        keep=keep_seq.unsqueeze(-1).expand_as(inputs.mask),
        metrics={"train/opsm_drop_frac": 1.0 - keep_seq},
    )

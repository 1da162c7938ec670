"""An advantage estimator: reward minus the prompt group's median reward, so one outlier in a
group moves its baseline less than a mean would (GRPO's baseline is the mean)."""

import torch

from loongsage.plugin import broadcast


def median_baseline(inputs, params):
    """Â_i = r_i − median of r over i's group, on every loss token of row i."""
    baseline = torch.empty_like(inputs.rewards)
    for group in torch.unique(inputs.group_ids):
        rows = inputs.group_ids == group
        baseline[rows] = inputs.rewards[rows].median()
    return broadcast(inputs.rewards - baseline, inputs.mask).detach()

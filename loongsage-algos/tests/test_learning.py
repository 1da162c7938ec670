"""End-to-end learning on a toy bandit: compute_advantages -> Objective -> Adam raises reward.

The policy is a categorical distribution over 6 tokens; each sample is 3 tokens drawn from
it and its reward is the fraction equal to token 2 (chance 1/6). Rollout logprobs carry a
little noise (a fake inference engine, since no engine runs here) so the mismatch
corrections and M2PO see a real π_old/π_roll gap. Each step trains two mini-batches, so the
second one is off-policy and clipping/masking is exercised.
"""

import pytest
import torch

from loongsage.algorithms.advantages import compute_advantages
from loongsage.algorithms.validate import validate_algorithm
from loongsage.algorithms.objective import Objective
from loongsage.plugin.testing import loss_context
from loongsage.plugin.testing import installed_registries

V, L, GROUPS, G, TARGET = 6, 3, 8, 4, 2


def _train(algorithm: dict, steps: int = 25, seed: int = 0) -> tuple[float, float]:
    torch.manual_seed(seed)
    logits = torch.zeros(V, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.1)
    objective = Objective.from_config(algorithm, installed_registries())
    rewards_seen = []
    n = GROUPS * G
    for _ in range(steps):
        with torch.no_grad():
            logp_all = torch.log_softmax(logits, -1)
            tokens = torch.multinomial(logp_all.exp(), n * L, replacement=True).view(n, L)
            old = logp_all[tokens]
        rewards = (tokens == TARGET).float().mean(-1)
        rewards_seen.append(rewards.mean().item())
        mask = torch.ones(n, L)
        group_ids = torch.arange(GROUPS).repeat_interleave(G)
        adv = compute_advantages(rewards, group_ids, mask, validate_algorithm(algorithm, installed_registries()))
        extras = {"old_logprobs": old, "rollout_logprobs": old + 0.05 * torch.randn(n, L), "advantages": adv}
        batch = loss_context(old, mask, extras).batch
        objective.prepare(batch)
        for rows in torch.tensor_split(torch.randperm(n), 2):
            part = {k: v[rows] for k, v in batch.extras.items()}
            logprobs = torch.log_softmax(logits, -1)[tokens[rows]]
            loss, _ = objective(loss_context(logprobs, mask[rows], part))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return sum(rewards_seen[:3]) / 3, sum(rewards_seen[-3:]) / 3


@pytest.mark.parametrize(
    "algorithm",
    [
        {"policy_loss": "ppo_clip"},
        {"policy_loss": "ppo_clip", "is_correction": {"name": "token", "action": "clip"}},
        {"policy_loss": {"name": "gspo", "eps_low": 0.2, "eps_high": 0.28}, "loss_agg_mode": "seq_mean_token_mean"},
        {"policy_loss": {"name": "gspo_token", "eps_low": 0.2, "eps_high": 0.28},
         "loss_agg_mode": "seq_mean_token_mean"},
        {"policy_loss": "cispo"},
        {"policy_loss": "reinforce", "is_correction": "icepop"},
        {"policy_loss": "m2po", "is_correction": "opsm"},
        {"advantage_estimator": "dr_grpo", "loss_agg_mode": "seq_mean_token_sum_norm"},
        {"advantage_estimator": "rloo"},
        {"advantage_estimator": "reinforce_plus_plus_baseline"},
        {"advantage_estimator": "reinforce_plus_plus"},
    ],
    ids=lambda a: "+".join(str(v if isinstance(v, str) else v["name"]) for v in a.values()
                           if isinstance(v, (str, dict))),
)
def test_reward_rises(algorithm):
    start, end = _train(algorithm)
    assert start < 0.35  # chance is 1/6
    assert end > 0.6, f"reward {start:.2f} -> {end:.2f}"

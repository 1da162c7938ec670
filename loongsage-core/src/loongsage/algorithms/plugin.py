"""Core's built-in algorithms plugins, registered through the same hooks as third-party code.

Only ``grpo``, ``gae``, ``ppo_clip`` and the KL policies live in core (enough for one GRPO or
PPO run); ``loongsage-algos`` registers every other estimator, loss, correction and filter.
Targets are lazy ``"module:attr"`` strings so importing this module never imports torch.
"""

from loongsage.hookspecs import hookimpl
from loongsage.algorithms.params import GAEParams, GRPOParams, KLLossParams, KLPenaltyParams, PPOClipParams

_KL = "loongsage.algorithms.kl"


@hookimpl
def loongsage_register_advantage_estimators(register):
    register("grpo", "loongsage.algorithms.advantages:grpo_advantage", params=GRPOParams)
    register("gae", "loongsage.algorithms.gae:gae_advantage", params=GAEParams)


@hookimpl
def loongsage_register_policy_losses(register):
    register("ppo_clip", "loongsage.algorithms.policy_loss:ppo_clip_loss", params=PPOClipParams)


@hookimpl
def loongsage_register_kl_policies(register):
    penalty, loss = {"params": KLPenaltyParams}, {"params": KLLossParams}
    register("k1", f"{_KL}:k1", doc="k1 = log π_θ − log π_ref: unbiased value; use detached (reward penalty)",
             **penalty)
    register("k2", f"{_KL}:k2", doc="k2 = ½(log π_θ − log π_ref)²: gradient is the exact KL(π_θ‖π_ref) gradient",
             **loss)
    register("k3", f"{_KL}:k3", doc="k3 = r − 1 − log r, r = π_ref/π_θ: unbiased, non-negative value", **loss)
    register("low_var_kl", f"{_KL}:low_var_kl", doc="k3 clamped as verl does (log-ratio ±20, value ±10)", **loss)
    register("k1_st", f"{_KL}:k1_st", doc="straight-through: value of k1, gradient of k2 (verl k1+)", **loss)
    register("k3_st", f"{_KL}:k3_st", doc="straight-through: value of k3, gradient of k2 (verl k3+)", **loss)

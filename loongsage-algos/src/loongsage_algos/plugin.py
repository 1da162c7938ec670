"""Registrations of loongsage-algos: only hook implementations, cheap to import (no torch).

Core registers ``grpo``, ``ppo_clip``, ``gae`` and the KL policies; everything here is
additional and never re-registers a core name. The step term ``critic`` (section
``algorithm.critic``) supplies the per-token values a values-based estimator (``gae``) reads,
from the value model engine ``embedded_critic`` (``critic/``).
"""

from loongsage.plugin import hookimpl
from loongsage_algos import params as p

_PKG = "loongsage_algos"


@hookimpl
def loongsage_register_advantage_estimators(register):
    adv = f"{_PKG}.advantages"
    register("dr_grpo", f"{adv}:dr_grpo_advantage", params=p.DrGRPOParams)
    register("rloo", f"{adv}:rloo_advantage", params=p.RLOOParams)
    register("reinforce_plus_plus", f"{adv}:reinforce_pp_advantage", params=p.ReinforcePPParams)
    register("reinforce_plus_plus_baseline", f"{adv}:reinforce_pp_baseline_advantage",
             params=p.ReinforcePPBaselineParams)


@hookimpl
def loongsage_register_policy_losses(register):
    losses = f"{_PKG}.losses"
    register("gspo", f"{losses}.gspo:gspo_loss", params=p.GSPOParams)
    register("gspo_token", f"{losses}.gspo:gspo_token_loss", params=p.GSPOTokenParams)
    register("cispo", f"{losses}.cispo:cispo_loss", params=p.CISPOParams)
    register("reinforce", f"{losses}.reinforce:reinforce_loss", params=p.ReinforceParams)
    register("m2po", f"{losses}.m2po:m2po_loss", params=p.M2POParams)
    register("sao", f"{losses}.sao:sao_loss", params=p.SAOParams)


@hookimpl
def loongsage_register_is_corrections(register):
    isc = f"{_PKG}.is_corrections"
    register("token", f"{isc}:token_is", params=p.ISParams,
             doc="Token-level IS weight π_old/π_roll, clipped (TIS) or masked (MIS)")
    register("sequence", f"{isc}:sequence_is", params=p.ISParams,
             doc="Sequence-level IS weight exp(Σ log π_old/π_roll), clipped or masked")
    register("geometric", f"{isc}:geometric_is", params=p.ISParams,
             doc="Geometric-mean IS weight exp(mean log π_old/π_roll), clipped or masked")
    register("icepop", f"{isc}:icepop", params=p.IcePopParams)
    register("opsm", f"{_PKG}.opsm:opsm", params=p.OPSMParams)


@hookimpl
def loongsage_register_data_filters(register):
    flt = f"{_PKG}.filters"
    register("dynamic_sampling", f"{flt}:dynamic_sampling", params=p.DynamicSamplingParams)
    register("overlong", f"{flt}:overlong", params=p.OverlongParams)
    register("length", f"{flt}:length", params=p.LengthParams)
    register("overlong_reward_shaping", f"{flt}:overlong_reward_shaping", params=p.OverlongShapingParams)


@hookimpl
def loongsage_register_step_terms(register):
    register("critic", f"{_PKG}.critic.step:STEP_TERM",
             doc="Value model of a values-based estimator (gae): values before the step, trained after it "
                 "(section algorithm.critic)")


@hookimpl
def loongsage_register_engines(register):
    register("embedded_critic", f"{_PKG}.critic.engine:EmbeddedCriticEngine",
             doc="Value model (HF decoder + scalar head) trained on the clipped value loss (algorithm.critic).")

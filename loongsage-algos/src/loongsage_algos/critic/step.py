"""``critic``: the value model of a values-based estimator, as a step term
(``loongsage.plugin.StepTermPlugin``).

The step term owns ``algorithm.critic`` (``config``), is active when the run's advantage
estimator reads per-token values (``needs_values``: ``gae``) and supplies them
(``supplies = ("values",)``), adds no term to the policy's loss (``has_train_term = False``,
so it combines with a step term that does, such as distillation), estimates its actor's
memory, and builds the critic's extension (``extension.Critic``) with its actor beside train
rank 0. Cheap to import (no torch): ``loongsage plugins`` and config loading read it.

Memory: the value model's actor holds a full copy of the model as the trainer does (weights,
gradients and AdamW's two moments: 4 x the weights in ``model.dtype``) plus the per-token
values and returns of a step's batch in fp32, and its process.
"""

from __future__ import annotations

from typing import Any, Sequence

from loongsage_algos.critic.config import CriticConfig, CriticSpec, validate_critic


class ValueModel:
    """The ``critic`` step term (module docstring)."""

    section = "algorithm.critic"
    schema = CriticConfig
    source_schema = None
    has_train_term = False
    supplies = ("values",)

    def validate(self, cfg: Any, registries: Any) -> CriticSpec | None:
        return validate_critic(cfg, registries)

    def memory(self, cfg: Any, settings: CriticSpec, batch_tokens: int) -> Sequence[Any]:
        from loongsage.plugin import (PROCESS_BYTES, ConfigError, MemoryShare, ModelShape, dtype_bytes,
                                      resolve_model_path)

        path = settings.settings.path or cfg.model.path
        try:
            shape = ModelShape.from_folder(str(resolve_model_path(str(path))))
        except (OSError, ValueError) as err:
            raise ConfigError("algorithm.critic.path", f"cannot read the critic's model config at {path}: {err}") from err
        model_state = 4 * shape.parameters * dtype_bytes(cfg.model.dtype)
        per_token = 3 * batch_tokens * 4  # values, old values and returns of the step's batch, fp32
        return (MemoryShare("critic", PROCESS_BYTES + model_state + per_token,
                            detail=f"weights, gradients and AdamW {model_state / 2**30:.1f} GB"),)

    def build(self, context: Any) -> Any:
        from loongsage_algos.critic.extension import Critic

        return Critic(context)


STEP_TERM = ValueModel()

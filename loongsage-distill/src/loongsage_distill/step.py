"""``opd``: on-policy distillation as a step term (``loongsage.plugin.StepTermPlugin``).

The step term owns the ``opd`` section and every data source's ``teacher`` key (``config``),
validates them into a ``DistillSpec``, estimates the teachers' memory (``memory``), and
builds the distiller (``opd.distiller``, ``config.DISTILLERS``) with its teachers beside
train rank 0. Cheap to import (no torch): ``loongsage plugins`` and config loading read it.
"""

from __future__ import annotations

import importlib
from typing import Any, Sequence

from loongsage_distill.config import DISTILLERS, DistillSpec, OPDConfig, TeacherSourceConfig, validate_opd


class OnPolicyDistillation:
    """The ``opd`` step term (module docstring)."""

    section = "opd"
    schema = OPDConfig
    source_schema = TeacherSourceConfig

    def validate(self, cfg: Any, registries: Any) -> DistillSpec | None:
        if cfg.get(self.section) is None:  # a saved config of a run without this distribution
            return None
        return validate_opd(cfg, registries)

    def memory(self, cfg: Any, settings: DistillSpec, batch_tokens: int) -> Sequence[Any]:
        from loongsage_distill.memory import teacher_memory, teacher_shapes

        return (teacher_memory(cfg, settings, teacher_shapes(settings), batch_tokens),)

    def build(self, context: Any) -> Any:
        module, name = DISTILLERS[context.settings.distiller].split(":")
        return getattr(importlib.import_module(module), name)(context)


STEP_TERM = OnPolicyDistillation()

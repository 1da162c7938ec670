"""Parameter types of loongsage-distill's plugins (torch-free, so ``plugin.py`` stays cheap).

The KL policies take no config keys of their own (``opd.topk`` and ``opd.jsd_beta`` are run
settings); their dataclasses carry what each declares about itself for validation
(``loongsage.algorithms.params``): the roles it can play in distillation (``opd_roles``:
``pg`` penalty, ``gkd`` loss) and what it needs of the teacher (``teacher_targets``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass
class TopKKLParams:
    """Reverse KL on the teacher's top-k tokens, student and teacher renormalised over them."""

    opd_roles: ClassVar[tuple[str, ...]] = ("pg", "gkd")
    teacher_targets: ClassVar[str] = "topk"


@dataclass
class TopKJSDParams:
    """JSD_β with the teacher's top-k probabilities (0 elsewhere) and the tail term."""

    opd_roles: ClassVar[tuple[str, ...]] = ("gkd",)
    teacher_targets: ClassVar[str] = "topk"


@dataclass
class FullKLParams:
    """Reverse KL over the full vocabulary, teacher logits rebuilt from its hidden states."""

    opd_roles: ClassVar[tuple[str, ...]] = ("pg", "gkd")
    teacher_targets: ClassVar[str] = "full"


@dataclass
class FullJSDParams:
    """JSD_β over the full vocabulary, teacher logits rebuilt from its hidden states."""

    opd_roles: ClassVar[tuple[str, ...]] = ("gkd",)
    teacher_targets: ClassVar[str] = "full"

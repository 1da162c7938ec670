"""Parameter types of loongsage-distill's plugins (torch-free, so ``plugin.py`` stays cheap).

The KL policies take no config keys of their own (``opd.topk`` and ``opd.jsd_beta`` are run
settings); their dataclasses carry what each declares about itself for validation
(docs/plugins.md, kl_policy): what it may be used as (``kl_roles``: a detached ``penalty``,
opd's PG role, and/or a differentiable ``loss``, its GKD role) and what it needs of the
teacher (``kl_targets``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass
class TopKKLParams:
    """Reverse KL on the teacher's top-k tokens, student and teacher renormalised over them."""

    kl_roles: ClassVar[tuple[str, ...]] = ("penalty", "loss")
    kl_targets: ClassVar[str] = "topk"


@dataclass
class TopKJSDParams:
    """JSD_β with the teacher's top-k probabilities (0 elsewhere) and the tail term."""

    kl_roles: ClassVar[tuple[str, ...]] = ("loss",)
    kl_targets: ClassVar[str] = "topk"


@dataclass
class FullKLParams:
    """Reverse KL over the full vocabulary, teacher logits rebuilt from its hidden states."""

    kl_roles: ClassVar[tuple[str, ...]] = ("penalty", "loss")
    kl_targets: ClassVar[str] = "full"


@dataclass
class FullJSDParams:
    """JSD_β over the full vocabulary, teacher logits rebuilt from its hidden states."""

    kl_roles: ClassVar[tuple[str, ...]] = ("loss",)
    kl_targets: ClassVar[str] = "full"

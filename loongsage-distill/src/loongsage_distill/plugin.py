"""Registrations of loongsage-distill: only hook implementations, cheap to import (no torch).

- step term ``opd``: the ``opd`` section and ``data_sources[*].teacher``; its distiller
  ``multi_teacher`` runs the Teacher Manager and the on-policy distillation objectives
  (PG-style advantage penalty, GKD-style loss, their mix), one teacher per data source;
- engine ``embedded_teacher``: a forward-only HF causal LM slot holding one or more teachers
  of one architecture, swapped in from host memory;
- kl_policy ``topk_kl``, ``topk_jsd``, ``full_kl``, ``full_jsd``: logit-level divergences
  (core registers the token-level ``k1``, ``k2``, ``k3``).
"""

from loongsage.plugin import hookimpl
from loongsage_distill import params as p

_PKG = "loongsage_distill"


@hookimpl
def loongsage_register_step_terms(register):
    register("opd", f"{_PKG}.step:STEP_TERM",
             doc="On-policy distillation: teachers per data source, PG penalty, GKD loss (section opd)")


@hookimpl
def loongsage_register_engines(register):
    register("embedded_teacher", f"{_PKG}.teacher_engine:EmbeddedTeacherEngine",
             doc="Forward-only HF causal LM teachers sharing one memory slot (host copies, prefetch)")


@hookimpl
def loongsage_register_kl_policies(register):
    kl = f"{_PKG}.kl_methods"
    register("topk_kl", f"{kl}:topk_kl", params=p.TopKKLParams)
    register("topk_jsd", f"{kl}:topk_jsd", params=p.TopKJSDParams)
    register("full_kl", f"{kl}:full_kl", params=p.FullKLParams)
    register("full_jsd", f"{kl}:full_jsd", params=p.FullJSDParams)

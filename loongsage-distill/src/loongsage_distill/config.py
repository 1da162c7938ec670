"""The ``opd`` section and ``data_sources[*].teacher``: their schema, validated into a ``DistillSpec``.

On-policy distillation (GKD, arXiv 2306.13649; Thinking Machines' on-policy distillation blog, 2025)
has each data source name its teacher among
``opd.teachers``; the distiller (``opd.distiller``: ``multi_teacher``) hosts the teachers,
computes their outputs for every training batch, and adds its terms to the objective. The
section and the data sources' ``teacher`` key are this distribution's: the step term ``opd``
(``step``) adds them to the run's config (``loongsage.plugin.StepTermPlugin``). Config rules,
each refused with the key:

- without ``opd.teachers`` no source names a teacher and every other ``opd`` key keeps its
  default (a setting that would do nothing is an error, not silently ignored);
- teacher names are unique; every ``data_sources[i].teacher`` is one of them and every
  teacher is some source's (a teacher nobody uses would only hold memory);
- ``λ_pg = opd.pg_ratio ≥ 0`` and ``λ_gkd = opd.gkd_ratio ∈ [0, 1]``, not both 0;
  ``λ_pg > 0`` with ``λ_gkd = 1`` is refused (the RL loss that would carry the penalised
  advantage is switched off), as is ``λ_gkd = 1`` with a source that names no teacher (its
  samples would train on nothing);
- ``opd.pg_kl_method`` must be a KL policy usable as a detached penalty and
  ``opd.gkd_kl_method`` one usable as a loss (each declares its ``kl_roles``);
- ``opd.distiller`` is one of ``DISTILLERS``;
- ``opd.topk ≥ 1``, ``opd.jsd_beta ∈ (0, 1)``, ``0 ≤ opd.teacher_slots ≤`` the number of
  teachers (0: one slot per teacher). Teachers sharing a slot must share an architecture;
  that needs their model folders and is checked when the run is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from loongsage.plugin import ConfigError, PluginRef, Registries, closest

ROLE_KEYS = {"pg": "opd.pg_kl_method", "gkd": "opd.gkd_kl_method"}
KL_ROLE = {"pg": "penalty", "gkd": "loss"}  # the kl_roles a KL policy declares for each opd role
ROLE_USES = {"pg": "a detached per-token penalty on the advantage (opd.pg_ratio)",
             "gkd": "a differentiable loss (opd.gkd_ratio)"}


# opd.distiller -> the class it builds (``cls(context)``, ``loongsage.plugin.StepContext``)
DISTILLERS = {"multi_teacher": "loongsage_distill.distiller:MultiTeacherDistiller"}


@dataclass
class TeacherConfig:
    """One distillation teacher: the name data sources give in ``teacher``, and its model."""

    name: str = MISSING  # what data_sources[*].teacher gives to pick this teacher
    path: str = MISSING  # any Hugging Face folder, builtin:*, or a run's exported model
    backend: str = "embedded_teacher"  # engine plugin hosting it, forward only


@dataclass
class OPDConfig:
    """On-policy distillation: each data source's teacher, the objectives, the teachers' memory."""

    teachers: List[TeacherConfig] = field(default_factory=list)  # none = no distillation
    distiller: str = "multi_teacher"  # the distiller hosting the teachers (loongsage-distill: multi_teacher)
    pg_ratio: float = 0.0  # λ_pg: advantage A_t − λ_pg·sg(KL_t)
    gkd_ratio: float = 0.0  # λ_gkd: loss (1 − λ_gkd)·L_RL + λ_gkd·L_GKD; 1 skips the RL loss
    pg_kl_method: str = "k1"  # kl_policy of the PG penalty: k1 | topk_kl | full_kl
    gkd_kl_method: str = "topk_kl"  # kl_policy of the GKD loss: k2 | k3 | topk_kl | topk_jsd | full_kl | full_jsd
    topk: int = 256  # teacher top-k entries per token (topk_* methods; capped at the vocabulary)
    jsd_beta: float = 0.5  # β of JSD_β (the *_jsd methods)
    teacher_slots: int = 0  # memory slots the teachers share; 0 = one slot per teacher (all resident)
    prefetch: bool = True  # copy the next teacher of a shared slot in while the current one computes


@dataclass
class TeacherSourceConfig:
    """What distillation adds to every data source."""

    teacher: Optional[str] = None  # the opd.teachers name distilling into this source; null = none


@dataclass(frozen=True)
class TeacherSpec:
    """One ``opd.teachers[i]`` entry, its engine plugin resolved."""

    index: int
    name: str
    path: str
    engine: PluginRef

    @property
    def key(self) -> str:
        return f"opd.teachers[{self.index}]"


@dataclass(frozen=True)
class DistillSpec:
    """The validated ``opd`` section: teachers, each source's teacher, objectives, memory.

    ``source_teachers[i]`` is the index in ``teachers`` of data source ``i``'s teacher, or -1.
    ``pg_method`` / ``gkd_method`` are None when their ratio is 0. ``slots`` is resolved
    (``opd.teacher_slots: 0`` becomes one per teacher).
    """

    distiller: str
    teachers: tuple[TeacherSpec, ...]
    source_names: tuple[str, ...]
    source_teachers: tuple[int, ...]
    pg_ratio: float
    gkd_ratio: float
    pg_method: PluginRef | None
    gkd_method: PluginRef | None
    topk: int
    jsd_beta: float
    slots: int
    prefetch: bool

    @property
    def resident(self) -> bool:
        """Every teacher has a slot of its own: no swaps."""
        return self.slots >= len(self.teachers)

    def methods(self) -> tuple[PluginRef, ...]:
        return tuple(m for m in (self.pg_method, self.gkd_method) if m is not None)


def _check_without_teachers(cfg: DictConfig) -> None:
    for i, source in enumerate(cfg.data_sources):
        if source.get("teacher") is not None:
            raise ConfigError(f"data_sources[{i}].teacher", f"names teacher {source.teacher!r} but opd.teachers "
                              "is empty; add the teacher to opd.teachers ({name, path}) or remove it")
    defaults = OmegaConf.structured(OPDConfig)
    for name in defaults:
        if name != "teachers" and cfg.opd[name] != defaults[name]:
            raise ConfigError(f"opd.{name}", f"has no effect without opd.teachers; add teachers or leave it at "
                              f"its default ({defaults[name]!r})")


def _teachers(cfg: DictConfig, registries: Registries) -> tuple[TeacherSpec, ...]:
    seen: set[str] = set()
    teachers = []
    for i, node in enumerate(cfg.opd.teachers):
        key = f"opd.teachers[{i}]"
        if not node.name:
            raise ConfigError(f"{key}.name", "expected a non-empty teacher name")
        if node.name in seen:
            raise ConfigError(f"{key}.name", f"duplicate teacher name {node.name!r}")
        if not node.path:
            raise ConfigError(f"{key}.path", "expected a model folder, builtin:* name or exported run model")
        seen.add(node.name)
        engine = registries.resolve("engine", node.backend, f"{key}.backend")
        teachers.append(TeacherSpec(i, str(node.name), str(node.path), engine))
    return tuple(teachers)


def _source_teachers(cfg: DictConfig, teachers: tuple[TeacherSpec, ...], gkd_ratio: float) -> tuple[int, ...]:
    index = {t.name: t.index for t in teachers}
    chosen = []
    for i, source in enumerate(cfg.data_sources):
        key = f"data_sources[{i}].teacher"
        if source.teacher is None:
            if gkd_ratio == 1:
                raise ConfigError(key, f"data source {source.name!r} names no teacher, and opd.gkd_ratio=1 trains "
                                  "on the distillation loss alone, so its samples would train on nothing; name a "
                                  "teacher or lower opd.gkd_ratio")
            chosen.append(-1)
            continue
        if source.teacher not in index:
            match = closest(str(source.teacher), list(index))
            hint = f"; did you mean {match!r}?" if match else ""
            raise ConfigError(key, f"unknown teacher {source.teacher!r}; opd.teachers has {sorted(index)}{hint}")
        chosen.append(index[source.teacher])
    for teacher in teachers:
        if teacher.index not in chosen:
            raise ConfigError(f"{teacher.key}.name", f"teacher {teacher.name!r} is named by no data source "
                              "(data_sources[*].teacher); remove it or name it from a source")
    return tuple(chosen)


def _ratios(opd: DictConfig) -> tuple[float, float]:
    pg, gkd = float(opd.pg_ratio), float(opd.gkd_ratio)
    if pg < 0:
        raise ConfigError("opd.pg_ratio", f"expected λ_pg >= 0, got {pg}")
    if not 0 <= gkd <= 1:
        raise ConfigError("opd.gkd_ratio", f"expected λ_gkd in [0, 1], got {gkd}")
    if pg == 0 and gkd == 0:
        raise ConfigError("opd.gkd_ratio", "opd.teachers are set but both opd.pg_ratio and opd.gkd_ratio are 0, "
                          "so no teacher would be used; set λ_pg > 0 (advantage penalty) or λ_gkd > 0 (loss)")
    if pg > 0 and gkd == 1:
        raise ConfigError("opd.pg_ratio", "opd.gkd_ratio=1 switches the RL loss off, so the advantage penalty "
                          "λ_pg would reach nothing; set opd.pg_ratio=0 or opd.gkd_ratio below 1")
    return pg, gkd


def _method(opd: DictConfig, role: str, registries: Registries) -> PluginRef:
    key = ROLE_KEYS[role]
    ref = registries.resolve("kl_policy", OmegaConf.select(opd, key.split(".", 1)[1]), key)
    roles = [r for r in ROLE_KEYS if KL_ROLE[r] in ref.trait("kl_roles", ())]
    if role not in roles:
        usable = " or ".join(ROLE_USES[r].split(" (")[0] for r in roles) or "nothing in distillation"
        raise ConfigError(key, f"kl_policy '{ref.name}' cannot be used as {ROLE_USES[role]}: it declares itself "
                          f"usable as {usable}")
    return ref


def _check_ranges(opd: DictConfig, teachers: int) -> int:
    if opd.topk < 1:
        raise ConfigError("opd.topk", f"expected >= 1 teacher entries per token, got {opd.topk}")
    if not 0 < opd.jsd_beta < 1:
        raise ConfigError("opd.jsd_beta", f"expected β in (0, 1), got {opd.jsd_beta}")
    if not 0 <= opd.teacher_slots <= teachers:
        raise ConfigError("opd.teacher_slots", f"expected 0 (one per teacher) up to the {teachers} teacher(s); "
                          f"got {opd.teacher_slots}")
    return int(opd.teacher_slots) or teachers


def _distiller(opd: DictConfig) -> str:
    if opd.distiller not in DISTILLERS:
        match = closest(str(opd.distiller), list(DISTILLERS))
        hint = f"; did you mean {match!r}?" if match else ""
        raise ConfigError("opd.distiller", f"unknown distiller {opd.distiller!r}; expected one of "
                          f"{sorted(DISTILLERS)}{hint}")
    return str(opd.distiller)


def validate_opd(cfg: DictConfig, registries: Registries) -> DistillSpec | None:
    """The ``DistillSpec`` of ``cfg``, None without teachers, or ``ConfigError`` (module docstring)."""
    opd = cfg.opd
    if not opd.teachers:
        _check_without_teachers(cfg)
        return None
    distiller = _distiller(opd)
    teachers = _teachers(cfg, registries)
    pg, gkd = _ratios(opd)
    slots = _check_ranges(opd, len(teachers))
    return DistillSpec(
        distiller=distiller,
        teachers=teachers,
        source_names=tuple(str(s.name) for s in cfg.data_sources),
        source_teachers=_source_teachers(cfg, teachers, gkd),
        pg_ratio=pg,
        gkd_ratio=gkd,
        pg_method=_method(opd, "pg", registries) if pg > 0 else None,
        gkd_method=_method(opd, "gkd", registries) if gkd > 0 else None,
        topk=int(opd.topk),
        jsd_beta=float(opd.jsd_beta),
        slots=slots,
        prefetch=bool(opd.prefetch),
    )

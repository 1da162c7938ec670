"""The ``opd`` section and ``data_sources[*].teacher``, validated into a ``DistillSpec``.

On-policy distillation (GKD, arXiv 2306.13649; Thinking Machines' on-policy distillation blog, 2025)
has each data source name its teacher among
``opd.teachers``; the distiller plugin (``opd.distiller``, built in loongsage-distill) hosts
the teachers, computes their outputs for every training batch, and adds its terms to the
objective. Config rules, each refused with the key:

- without ``opd.teachers`` no source names a teacher and every other ``opd`` key keeps its
  default (a setting that would do nothing is an error, not silently ignored);
- teacher names are unique; every ``data_sources[i].teacher`` is one of them and every
  teacher is some source's (a teacher nobody uses would only hold memory);
- ``λ_pg = opd.pg_ratio ≥ 0`` and ``λ_gkd = opd.gkd_ratio ∈ [0, 1]``, not both 0;
  ``λ_pg > 0`` with ``λ_gkd = 1`` is refused (the RL loss that would carry the penalised
  advantage is switched off), as is ``λ_gkd = 1`` with a source that names no teacher (its
  samples would train on nothing);
- ``opd.pg_kl_method`` must be a KL policy usable as a detached penalty and
  ``opd.gkd_kl_method`` one usable as a loss (each declares its ``opd_roles``);
- ``opd.topk ≥ 1``, ``opd.jsd_beta ∈ (0, 1)``, ``0 ≤ opd.teacher_slots ≤`` the number of
  teachers (0: one slot per teacher). Teachers sharing a slot must share an architecture;
  that needs their model folders and is checked when the run is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from loongsage.errors import ConfigError
from loongsage.hints import closest
from loongsage.registry import PluginRef, Registries
from loongsage.schema import OPDConfig

ROLE_KEYS = {"pg": "opd.pg_kl_method", "gkd": "opd.gkd_kl_method"}
ROLE_USES = {"pg": "a detached per-token penalty on the advantage (opd.pg_ratio)",
             "gkd": "a differentiable loss (opd.gkd_ratio)"}


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

    distiller: PluginRef
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
        if source.teacher is not None:
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
    roles = tuple(ref.trait("opd_roles", ()))
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


def validate_opd(cfg: DictConfig, registries: Registries) -> DistillSpec | None:
    """The ``DistillSpec`` of ``cfg``, None without teachers, or ``ConfigError`` (module docstring)."""
    opd = cfg.opd
    if not opd.teachers:
        _check_without_teachers(cfg)
        return None
    distiller = registries.resolve("distiller", opd.distiller, "opd.distiller")
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

"""What distillation adds to the run's start-up memory estimate (``StepTermPlugin.memory``).

* **teacher slots** (``opd.teachers``, split into ``opd.teacher_slots`` contiguous groups as
  the Teacher Manager splits them, ``manager.place``): each holds its largest teacher's
  weights, and when shared a host copy of every teacher in it plus, with ``opd.prefetch``, a
  spare buffer; one chunk of fp32 logits and the batch's outputs (hidden states, the widest
  output), and the process;
* **each train actor** also keeps the teachers' output layers in fp32 (to rebuild their
  logits, ``teacher_heads``) and the batch's hidden states.
"""

from __future__ import annotations

from typing import Any

from loongsage.plugin import PROCESS_BYTES, ConfigError, MemoryShare, ModelShape, dtype_bytes, resolve_model_path

from loongsage_distill.config import DistillSpec


def teacher_shapes(spec: DistillSpec) -> list[ModelShape]:
    """The shape of every teacher's model, in ``opd.teachers`` order."""
    shapes = []
    for teacher in spec.teachers:
        try:
            shapes.append(ModelShape.from_folder(str(resolve_model_path(teacher.path))))
        except (OSError, ValueError) as err:
            raise ConfigError(f"{teacher.key}.path", f"cannot read teacher {teacher.name!r}'s model "
                                                     f"config: {err}") from err
    return shapes


def teacher_memory(cfg: Any, spec: DistillSpec, teachers: list[ModelShape], batch_tokens: int) -> MemoryShare:
    """The teacher slots' bytes and the train actor's share (module docstring)."""
    from loongsage_distill.manager import place

    b = dtype_bytes(cfg.model.dtype)
    chunk = cfg.train.logprob_chunk_tokens
    slots = place(len(teachers), spec.slots)
    total = 0
    for slot in slots:
        group = [teachers[i] for i in slot]
        weights = max(t.parameters for t in group) * b
        copies = (len(group) + spec.prefetch) * weights if len(group) > 1 else 0
        outputs = batch_tokens * max(t.hidden for t in group) * 4
        total += PROCESS_BYTES + weights + copies + 3 * chunk * max(t.vocab for t in group) * 4 + outputs
    heads = sum(t.vocab * t.hidden * 4 for t in teachers)
    return MemoryShare("teacher slots", total, heads + batch_tokens * max(t.hidden for t in teachers) * 4,
                       f"{len(teachers)} teacher(s) in {len(slots)} slot(s)")

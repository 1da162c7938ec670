"""``multi_teacher``: the distiller of multi-teacher on-policy distillation (MOPD).

Built by the ``opd`` step term (``step``) as ``MultiTeacherDistiller(context)`` from the
validated ``opd`` section (``context.settings``, a ``DistillSpec``;
``loongsage.plugin.StepContext``). It starts the Teacher Manager's slots (``manager``),
checks that every teacher speaks the student's vocabulary, and for each training batch
asks the teachers for exactly what the configured KL methods need (sampled-token log-probs
and entropy always; top-k log-probs and ids for ``topk`` methods, ``opd.topk`` capped at the
vocabulary; hidden states for ``full`` ones), writing them with each row's teacher and
source into the batch (``train_term``'s keys). Rows whose source names no teacher get
teacher -1 and zeros. Under any scheduler (synchronous, asynchronous with any window policy,
partial rollout) this runs for every training batch the loop hands over, so tokens
generated across weight updates are distilled like any other.

``before_train`` is the step extension's hook (``loongsage.plugin.StepExtension``): it adds the
teachers' outputs to the batch and reports the seconds it waited for them as ``timing/teacher``.
``train_term`` is the ``OPDTerm`` the objective carries into the train actor.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import ray
import torch

from loongsage.plugin import ConfigError, TrainBatch, resolve_model_path

from loongsage_distill.manager import TeacherManager
from loongsage_distill.teacher_engine import Wants
from loongsage_distill.train_term import (ENTROPY, HIDDEN, LOGPROBS, SOURCE, TEACHER, TOPK_IDS, TOPK_LOGPROBS,
                                          OPDTerm)

OUTPUTS = {"logprobs": LOGPROBS, "entropy": ENTROPY, "topk_logprobs": TOPK_LOGPROBS, "topk_ids": TOPK_IDS,
           "hidden": HIDDEN}


def _student_vocab(model_path: str) -> int:
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(model_path).vocab_size)


class MultiTeacherDistiller:
    """Teacher outputs for every training batch, and the train-side term (module docstring)."""

    def __init__(self, context: Any) -> None:
        spec, config = context.settings, context.config
        self.spec = spec
        targets = {m.trait("kl_targets") for m in spec.methods()}
        self.wants = Wants(entropy=True, topk=spec.topk if "topk" in targets else 0, hidden="full" in targets)
        self.manager = TeacherManager(spec.teachers, spec.slots, spec.prefetch, config, context.spawn)
        self.actors = self.manager.actors
        self._check_vocab(_student_vocab(config["model"]["path"]))
        algorithm = config["algorithm"]
        self.train_term = OPDTerm(
            pg_ratio=spec.pg_ratio, gkd_ratio=spec.gkd_ratio, pg_method=spec.pg_method, gkd_method=spec.gkd_method,
            beta=spec.jsd_beta, topk=spec.topk,
            head_paths=tuple(str(resolve_model_path(t.path)) for t in spec.teachers),
            fp32=bool(config["model"].get("fp32_lm_head", True)), source_names=spec.source_names,
            loss_agg_mode=algorithm["loss_agg_mode"], loss_agg_norm_len=algorithm.get("loss_agg_norm_len"),
        )

    def _check_vocab(self, vocab: int) -> None:
        for group, described in zip(self.manager.groups, self.manager.described):
            if described["vocab"] != vocab:
                teacher = self.spec.teachers[group[0]]
                raise ConfigError(f"{teacher.key}.path", f"teacher {teacher.name!r} has a {described['vocab']}-token "
                                  f"vocabulary, the student {vocab}; distillation compares distributions over one "
                                  "vocabulary, so the teacher must use the student's tokenizer")

    def before_train(self, batch: TrainBatch, row_sources: Sequence[str]) -> dict[str, float]:
        """The teachers' outputs for ``batch`` (``row_sources[i]``: row i's data source)."""
        start = time.perf_counter()
        metrics = self.teacher_outputs(batch, row_sources)
        return {**metrics, "timing/teacher": time.perf_counter() - start}

    def teacher_outputs(self, batch: TrainBatch, row_sources: Sequence[str]) -> dict[str, float]:
        index = {name: i for i, name in enumerate(self.spec.source_names)}
        source = torch.tensor([index[name] for name in row_sources], dtype=torch.long)
        teacher = torch.tensor(self.spec.source_teachers, dtype=torch.long)[source]
        outputs, metrics = self.manager.compute(batch.input_ids, batch.attention_mask, teacher, self.wants)
        for key, shape in self._shapes(*batch.input_ids.shape).items():  # a batch no teacher's source drew
            outputs.setdefault(key, torch.zeros(shape, dtype=torch.long if key == "topk_ids" else torch.float32))
        batch.extras.update({OUTPUTS[key]: value for key, value in outputs.items()})
        batch.extras[TEACHER], batch.extras[SOURCE] = teacher, source
        return metrics

    def _shapes(self, rows: int, length: int) -> dict[str, tuple[int, ...]]:
        """The shape of every output the teachers return for a batch of ``rows`` x ``length``."""
        described = self.manager.described[0]
        shapes = {"logprobs": (rows, length), "entropy": (rows, length)}
        if self.wants.topk:
            k = min(self.wants.topk, described["vocab"])
            shapes.update(topk_logprobs=(rows, length, k), topk_ids=(rows, length, k))
        if self.wants.hidden:
            shapes["hidden"] = (rows, length, max(d["hidden"] for d in self.manager.described))
        return shapes

    def close(self) -> None:
        for actor in self.actors.values():
            ray.kill(actor)

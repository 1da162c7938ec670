"""The embedded teacher engine: forward-only HF causal LMs sharing one memory slot.

One engine is one slot (``weight_slot``): it builds the first teacher's model, keeps a host
copy of every teacher it holds, and answers ``forward(jobs, wants)`` for a batch bucketed by
teacher, running the jobs in the order given (the Teacher Manager puts the resident teacher
first) and prefetching the next job's teacher while the current one computes. Teachers that
share a slot must share an architecture: the same model config (bar names and metadata) and
parameter shapes, or the engine refuses with the teacher's config key.

What a forward returns, per job, aligned with ``input_ids`` like the train engine's
log-probs (``loongsage.engines.batch``; position 0 and padding are 0), only as ``wants``
asks: ``logprobs`` [n, L] of the sampled tokens, ``entropy`` [n, L], the top-k log-probs
and token ids [n, L, k] (``topk`` > 0), and the final hidden states [n, L, H] (``hidden``)
from which the train actor rebuilds full-vocabulary logits. The LM head runs in chunks of
``train.logprob_chunk_tokens`` positions, in fp32 with ``model.fp32_lm_head``, through the
train engine's own chunked head, so teacher and student log-probs are the same function.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from loongsage.plugin import (
    ConfigError, LogitTerm, final_hidden, head_scores, load_causal_lm, resolve_model_path, scatter_positions,
)

from loongsage_distill.weight_slot import WeightSlot

IGNORED_CONFIG_KEYS = {"_name_or_path", "name_or_path", "transformers_version", "torch_dtype", "dtype",
                       "architectures", "_commit_hash", "use_cache", "return_dict", "output_attentions",
                       "output_hidden_states"}  # names, metadata and runtime flags, not the architecture
MAX_EXACT_ID = 1 << 24  # token ids travel through fp32 in the chunked head: exact below 2^24


@dataclass(frozen=True)
class Wants:
    """What a forward must return besides the sampled tokens' log-probs."""

    entropy: bool = True
    topk: int = 0
    hidden: bool = False


@dataclass(frozen=True)
class Job:
    """The rows of one teacher: its index in the slot and the rows' token ids."""

    teacher: int
    input_ids: torch.Tensor
    attention_mask: torch.Tensor


@dataclass(frozen=True)
class _TopK:
    """A ``LogitTerm`` function: the top-k log-probs and (as floats) their token ids."""

    k: int

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        top = logits.topk(self.k, dim=-1)
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        return torch.cat([top.values - lse, top.indices.to(logits.dtype)], dim=-1)


def _config_differences(a: Any, b: Any) -> list[str]:
    left, right = a.to_dict(), b.to_dict()
    keys = (set(left) | set(right)) - IGNORED_CONFIG_KEYS
    return sorted(k for k in keys if left.get(k) != right.get(k))


class EmbeddedTeacherEngine:
    """Forward-only teachers in one slot (module docstring)."""

    def __init__(self, teachers: list[Mapping[str, str]], dtype: str = "float32", fp32_lm_head: bool = True,
                 chunk_tokens: int = 512, prefetch: bool = True, trust_remote_code: bool = False,
                 device: str | None = None) -> None:
        if not teachers:
            raise ConfigError("opd.teachers", "a teacher slot needs at least one teacher")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.names = [t["name"] for t in teachers]
        self.fp32_lm_head, self.chunk_tokens = fp32_lm_head, chunk_tokens
        first = self._load(teachers[0], dtype, trust_remote_code)
        self.model = first.to(self.device)
        self.slot = WeightSlot(self.model, len(teachers), prefetch)
        self.vocab = int(self.model.get_output_embeddings().weight.shape[0])
        if len(teachers) > 1:
            self.slot.store_resident(0)
        for index, teacher in enumerate(teachers[1:], start=1):
            other = self._load(teacher, dtype, trust_remote_code)
            self._check_same_architecture(teachers[0], teacher, other)
            self.slot.store(index, dict(other.named_parameters()))
            del other

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], device: str | None = None) -> "EmbeddedTeacherEngine":
        """Build from ``{"model": ..., "train": ..., "teacher_slot": {"teachers", "prefetch"}}``
        on ``device`` (the host's: ``cuda:0`` when Ray gave it a GPU; None: CUDA if present)."""
        model, train, slot = cfg["model"], cfg.get("train") or {}, cfg["teacher_slot"]
        return cls([dict(t) for t in slot["teachers"]], dtype=model.get("dtype", "float32"),
                   fp32_lm_head=bool(model.get("fp32_lm_head", True)),
                   chunk_tokens=int(train.get("logprob_chunk_tokens", 512)), prefetch=bool(slot["prefetch"]),
                   trust_remote_code=bool(model.get("trust_remote_code", False)), device=device)

    @staticmethod
    def _load(teacher: Mapping[str, str], dtype: str, trust_remote_code: bool) -> torch.nn.Module:
        try:
            path = resolve_model_path(str(teacher["path"]))
            model = load_causal_lm(path, dtype, trust_remote_code)
        except (OSError, ValueError) as err:
            raise ConfigError(f"{teacher['key']}.path", f"cannot load teacher {teacher['name']!r}: {err}") from err
        return model.requires_grad_(False).eval()

    def _check_same_architecture(self, first: Mapping[str, str], teacher: Mapping[str, str], other: Any) -> None:
        differ = _config_differences(self.model.config, other.config)
        mine = {n: p.shape for n, p in self.model.named_parameters()}
        theirs = {n: p.shape for n, p in other.named_parameters()}
        if differ or mine != theirs:
            what = f"config keys {differ}" if differ else "parameter shapes"
            raise ConfigError(f"{teacher['key']}.path", f"teacher {teacher['name']!r} shares a memory slot with "
                              f"{first['name']!r} but their architectures differ ({what}); teachers of one slot "
                              "must share one, so give it a slot of its own (raise opd.teacher_slots)")

    def describe(self) -> dict[str, Any]:
        """The slot's teachers and shapes, for the distiller's checks and the metrics."""
        head = self.model.get_output_embeddings()
        return {"teachers": list(self.names), "vocab": self.vocab,
                "hidden": int(head.weight.shape[1]), "slot_bytes": self.slot.nbytes, "resident": self.slot.resident}

    @torch.no_grad()
    def _forward(self, job: Job, wants: Wants) -> dict[str, torch.Tensor]:
        ids, mask = job.input_ids.to(self.device), job.attention_mask.to(self.device)
        hidden, real = final_hidden(self.model, ids, mask)
        k = min(wants.topk, self.vocab)
        if k and self.vocab > MAX_EXACT_ID:
            raise ConfigError("opd.topk", f"top-k ids above {MAX_EXACT_ID} cannot travel exactly; the vocabulary "
                              "is too large for the embedded teacher")
        scores = head_scores(self.model, hidden, ids[:, 1:].reshape(-1).index_select(0, real),
                             fp32_lm_head=self.fp32_lm_head, with_entropy=wants.entropy,
                             chunk_tokens=self.chunk_tokens, term=LogitTerm(_TopK(k), width=2 * k) if k else None)
        full = scatter_positions(scores, real, ids.shape).cpu()
        out = {"logprobs": full[..., 0]}
        if wants.entropy:
            out["entropy"] = full[..., 1]
        if k:
            top = full[..., 1 + wants.entropy:]
            out["topk_logprobs"], out["topk_ids"] = top[..., :k].contiguous(), top[..., k:].long()
        if wants.hidden:
            out["hidden"] = scatter_positions(hidden, real, ids.shape).cpu()
        return out

    def forward(self, jobs: list[Job], wants: Wants) -> tuple[list[dict[str, torch.Tensor]], dict[str, float]]:
        """Each job's outputs, in order, and what the call cost (swaps, swap, compute, overlap seconds)."""
        outputs, computing = [], []
        for i, job in enumerate(jobs):
            self.slot.switch(job.teacher)
            if i + 1 < len(jobs):
                self.slot.prefetch(jobs[i + 1].teacher)
            start = time.perf_counter()
            outputs.append(self._forward(job, wants))
            computing.append((start, time.perf_counter()))
        stats = self.slot.take_stats()  # every prefetch has been joined by the switch after it
        overlap = sum(max(0.0, min(e, ce) - max(s, cs)) for s, e in stats.copies for cs, ce in computing)
        return outputs, {"swaps": float(stats.swaps), "swap_s": stats.swap_s,
                         "compute_s": sum(e - s for s, e in computing), "overlap_s": overlap,
                         "copy_s": sum(e - s for s, e in stats.copies), "resident": float(self.slot.resident)}

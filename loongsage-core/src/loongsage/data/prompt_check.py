"""Every prompt checked before the run spends anything on it: read, rendered, measured.

A record can be well-formed JSON and still break a run hours in: a message whose content is
not text fails the chat template (``TypeError: can only concatenate str (not "dict") to
str``) at the step that draws it, and a prompt longer than ``rollout.max_prompt_tokens`` or
the model's context fails at the engine (``/generate (HTTP 400)``) naming no record.

``PromptChecker.scan`` runs once before any actor starts. It reads every record of every
data source with a known size (``DataSource.get``), renders it through the chat template
with the source's tools and counts its tokens, within ``budgets.prompt_check_s`` for all
sources together (the records read streamed, one at a time, nothing kept but the indexes of
dropped ones). A record that cannot be read or rendered fails the run there, naming the
source, the record and, when its dataset can say (``locate(index)``), the file and line. A
prompt above the limit (``rollout.max_prompt_tokens``, or the model's context when shorter)
is handled by ``rollout.long_prompts``: ``refuse`` fails naming it, ``drop`` leaves it out
of training and counts it.

Records the budget left unchecked are checked as the mixer draws them (``CheckedSource``,
what the mixer reads): one found bad then is skipped, named in a warning and counted
(``data/skipped_records``, per step), and the mixer draws the next one of that source: never a
crash mid-run. Dropped records are skipped the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from loongsage.data.mixer import SkippedRecord
from loongsage.data.sources import DataSource
from loongsage.data.types import Prompt
from loongsage.errors import LoongSageError

log = logging.getLogger(__name__)

LONG_PROMPTS = ("refuse", "drop")
SHOWN = 5  # records named in one error
BATCH = 256  # records rendered, then tokenized together (one call into the tokenizer per batch)


class DataCheckFailed(LoongSageError):
    """Records that cannot be trained on, found before the run started; each one named."""


def record_name(source: DataSource, index: int) -> str:
    """``data_sources[0] (source 'math') record 39 (math.jsonl line 40)``."""
    locate = getattr(source.dataset, "locate", None)
    where = f" ({locate(index)})" if locate is not None else ""
    return f"{source.spec.key} (source {source.name!r}) record {index}{where}"


@dataclass
class PromptChecker:
    """Reads, renders and measures prompts (module docstring); one per run."""

    tokenizer: Any
    max_tokens: int  # the smaller of rollout.max_prompt_tokens and the model's context less one
    limit_key: str  # what sets max_tokens, for messages
    long_prompts: str = "refuse"
    budget_s: float | None = None
    _checked: dict[str, int] = field(default_factory=dict)  # source -> records [0, n) checked at start-up
    _dropped: dict[str, set[int]] = field(default_factory=dict)
    _skipped: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def problem(self, source: DataSource, index: int) -> tuple[str, bool] | None:
        """``(what is wrong, whether it is only its length)`` for record ``index``, or ``None``."""
        try:
            prompt = source.get(index)
        except Exception as err:  # a dataset's error: whatever it is, named
            prompt = err
        rendered = self._rendered(source, prompt)
        if not isinstance(rendered, str):
            return rendered
        return self._length_problem(len(self._token_ids([rendered])[0]))

    def _rendered(self, source: DataSource, prompt: Prompt | Exception) -> str | tuple[str, bool]:
        """The record rendered through the chat template with the source's tools, or ``(what is
        wrong, False)`` when it could not be read or cannot be rendered."""
        if isinstance(prompt, Exception):
            return f"{type(prompt).__name__}: {prompt}", False
        try:
            messages = prompt.messages
            if not all(isinstance(m.get("content"), str) for m in messages):
                kinds = sorted({type(m.get("content")).__name__ for m in messages})
                raise TypeError(f"message content must be text, got {', '.join(kinds)}")
            return self.tokenizer.apply_chat_template(messages, tools=source.tool_schemas() or None, tokenize=False,
                                                      add_generation_prompt=True)
        except Exception as err:  # a dataset's or a chat template's error: whatever it is, named
            return f"{type(err).__name__}: {err}", False

    def _token_ids(self, rendered: list[str]) -> list[list[int]]:
        """The rendered prompts' token ids as ``apply_chat_template(tokenize=True)`` gives them
        (the template writes the special tokens itself), encoded in one batch."""
        return self.tokenizer(rendered, add_special_tokens=False)["input_ids"]

    def _length_problem(self, n_tokens: int) -> tuple[str, bool] | None:
        if n_tokens > self.max_tokens:
            return f"its prompt has {n_tokens} tokens, above the limit of {self.max_tokens} ({self.limit_key})", True
        return None

    def scan(self, sources: Mapping[str, DataSource]) -> None:
        """Check every record of every sized source within the budget (module docstring)."""
        start = time.monotonic()
        broken: list[str] = []
        long: list[str] = []
        for source in sources.values():
            size = source.size()
            if size is None:
                continue
            dropped = self._dropped.setdefault(source.name, set())
            index = 0
            while index < size and (self.budget_s is None or time.monotonic() - start < self.budget_s):
                batch = range(index, min(index + BATCH, size))
                rendered = {i: self._rendered(source, p) for i, p in zip(batch, source.get_each(batch))}
                texts = {i: r for i, r in rendered.items() if isinstance(r, str)}
                lengths = dict(zip(texts, map(len, self._token_ids(list(texts.values()))))) if texts else {}
                for i in batch:
                    found = self._length_problem(lengths[i]) if i in lengths else rendered[i]
                    if found is not None:
                        what, too_long = found
                        (long if too_long else broken).append(f"{record_name(source, i)}: {what}")
                        if too_long:
                            dropped.add(i)
                index = batch.stop
            self._checked[source.name] = index
            if index < size:
                log.warning(f"{source.spec.key} (source {source.name!r}): budgets.prompt_check_s="
                            f"{self.budget_s:g} s ran out after {index} of {size} records; the rest are "
                            "checked as they are drawn (a bad one skipped and counted)")
        if broken:
            raise DataCheckFailed(_listing(f"{len(broken)} record(s) cannot be used", broken))
        if long and self.long_prompts == "refuse":
            raise DataCheckFailed(_listing(
                f"{len(long)} prompt(s) too long", long,
                "shorten them, raise rollout.max_prompt_tokens (within the model's context), or leave them "
                "out of training with rollout.long_prompts=drop"))
        if long:
            log.warning(_listing(f"rollout.long_prompts=drop: {len(long)} prompt(s) left out of training", long))
        log.info(f"prompt check: {sum(self._checked.values())} records read, rendered and measured in "
                 f"{time.monotonic() - start:.1f} s, {len(long)} too long")

    def get(self, source: DataSource, index: int) -> Prompt:
        """Record ``index`` for training, checked unless the scan did; ``SkippedRecord`` if bad."""
        dropped = self._dropped.setdefault(source.name, set())
        if index in dropped:
            raise self._skip()
        if index >= self._checked.get(source.name, 0):
            found = self.problem(source, index)
            if found is not None:
                dropped.add(index)  # named once; skipped in every later epoch too
                log.warning(f"skipped {record_name(source, index)}: {found[0]}")
                raise self._skip()
        return source.get(index)

    def _skip(self) -> SkippedRecord:
        with self._lock:
            self._skipped += 1
        return SkippedRecord("record skipped")

    def metrics(self) -> dict[str, float]:
        """Records skipped since the last call (and reset)."""
        with self._lock:
            skipped, self._skipped = self._skipped, 0
        return {"data/skipped_records": float(skipped)}


def prompt_checker(cfg: Any, tokenizer: Any) -> PromptChecker:
    """The run's checker: its limit is ``rollout.max_prompt_tokens``, or the model's context
    less one token when that is smaller (an engine refuses a prompt that fills its context)."""
    from transformers import AutoConfig

    context = getattr(AutoConfig.from_pretrained(cfg.model.path), "max_position_embeddings", None)
    limit, key = int(cfg.rollout.max_prompt_tokens), "rollout.max_prompt_tokens"
    if context is not None and context - 1 < limit:
        limit, key = int(context) - 1, f"the model's context: max_position_embeddings={context}"
    return PromptChecker(tokenizer, limit, key, cfg.rollout.long_prompts, cfg.budgets.prompt_check_s)


@dataclass
class CheckedSource:
    """A data source as the mixer reads it: its records through the run's ``PromptChecker``."""

    source: DataSource
    checker: PromptChecker

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def weight(self) -> float:
        return self.source.weight

    def size(self) -> int | None:
        return self.source.size()

    def get(self, index: int) -> Prompt:
        return self.checker.get(self.source, index)


def _listing(head: str, items: list[str], advice: str = "") -> str:
    more = f"\n  ... and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    tail = f"\n{advice}" if advice else ""
    return f"{head}:\n  " + "\n  ".join(items[:SHOWN]) + more + tail

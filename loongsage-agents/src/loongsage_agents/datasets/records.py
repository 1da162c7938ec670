"""Turning one raw record (a JSON object or a Parquet row) into a ``Prompt``.

Shared by the JSONL and Parquet formats so both accept the same layouts: the prompt is a
plain string (one user turn) or a list of ``{"role", "content"}`` messages (the verl /
DAPO-Math-17k layout), and fields are addressed by dotted paths such as
``reward_model.ground_truth``. Every error names the file, the record and the field.
"""

from __future__ import annotations

from typing import Any, Mapping

from loongsage.plugin import Prompt

from loongsage_agents.datasets.params import FileDatasetParams

_MISSING = object()


class DatasetRecordError(ValueError):
    """A record lacks a field or holds a value of the wrong shape."""


def lookup(record: Any, path: str) -> Any:
    """Follow a dotted ``path`` through nested mappings; ``_MISSING`` when absent."""
    node = record
    for part in path.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def to_messages(value: Any, where: str) -> list[dict[str, Any]]:
    """A prompt value as chat messages: a string becomes one user message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, (list, tuple)) and value:
        messages = []
        for i, message in enumerate(value):
            if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
                raise DatasetRecordError(
                    f"{where}[{i}]: expected a message {{'role': ..., 'content': ...}}, got {message!r:.120}"
                )
            messages.append({"role": str(message["role"]), "content": message["content"]})
        return messages
    raise DatasetRecordError(
        f"{where}: expected a string or a non-empty list of chat messages, got {value!r:.120}"
    )


def add_instruction(messages: list[dict[str, Any]], instruction: str | None) -> list[dict[str, Any]]:
    """Append ``instruction`` to the last user message (a new list; inputs are not changed)."""
    if not instruction:
        return messages
    out = [dict(m) for m in messages]
    for message in reversed(out):
        if message["role"] == "user":
            message["content"] = f"{message['content']}\n{instruction}"
            return out
    out.append({"role": "user", "content": instruction})
    return out


def record_to_prompt(
    record: Any, params: FileDatasetParams, index: int, where: str, source: str
) -> Prompt:
    """Build the ``Prompt`` of one record; ``where`` says "file line N" / "file row N"."""
    if not isinstance(record, Mapping):
        raise DatasetRecordError(f"{where}: expected a JSON object, got {type(record).__name__}")
    fields = {"prompt_field": params.prompt_field, "ground_truth_field": params.ground_truth_field}
    values = {}
    for param, path in fields.items():
        value = lookup(record, path)
        if value is _MISSING or value is None:
            keys = ", ".join(sorted(map(str, record))) or "none"
            state = "is null" if value is None else "is missing"
            raise DatasetRecordError(
                f"{where}: field '{path}' (dataset.{param}) {state}; top-level keys: {keys}"
            )
        values[param] = value
    metadata = {}
    for path in params.metadata_fields:
        value = lookup(record, path)
        if value is _MISSING:
            raise DatasetRecordError(f"{where}: metadata field '{path}' is missing")
        metadata[path] = value
    messages = to_messages(values["prompt_field"], f"{where}: field '{params.prompt_field}'")
    return Prompt(
        source=source,
        index=index,
        messages=add_instruction(messages, params.instruction),
        ground_truth=values["ground_truth_field"],
        metadata=metadata,
    )

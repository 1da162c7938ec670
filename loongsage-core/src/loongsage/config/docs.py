"""``loongsage config show --doc``: the resolved config, one key a line with its description.

A key's description is the comment after its field in the schema's dataclasses
(``loongsage.schema``: ``lr: float = 1e-5  # AdamW learning rate``), read from their source, so
the schema stays the one place that says what a key means. Keys of plugin-parameter nodes (a
dataset's, a loss's) and keys whose field has no comment print without one.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import io
import tokenize
from functools import lru_cache
from typing import Any, Iterator

from omegaconf import DictConfig, ListConfig, OmegaConf


@lru_cache(maxsize=None)
def field_comments(cls: type) -> dict[str, str]:
    """``{field: comment}`` of a dataclass, from the comment ending its field's line."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    names = {f.name for f in dataclasses.fields(cls)}
    comments, line_field = {}, {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME and token.start[1] == 4 and token.string in names:
            line_field.setdefault(token.start[0], token.string)  # a field at the class body's indent
        elif token.type == tokenize.COMMENT and token.start[0] in line_field:
            comments[line_field[token.start[0]]] = token.string.lstrip("#").strip()
    return comments


def documented_lines(node: Any, prefix: str = "", doc: str = "") -> Iterator[str]:
    """``key: value  # description`` for every leaf under ``node`` (lists of nodes by index)."""
    if isinstance(node, DictConfig) and len(node) > 0:
        cls = OmegaConf.get_type(node)
        comments = field_comments(cls) if dataclasses.is_dataclass(cls) else {}
        for key in node:
            yield from documented_lines(node._get_node(key), f"{prefix}{key}.", comments.get(str(key), ""))
        return
    if isinstance(node, ListConfig) and any(isinstance(item, DictConfig) for item in node):
        for index in range(len(node)):
            yield from documented_lines(node._get_node(index), f"{prefix}{index}.", "")
        return
    value = OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node._value()
    text = value if isinstance(value, str) else json.dumps(value)  # lists and mappings in flow style
    yield f"{prefix.rstrip('.')}: {text}" + (f"  # {doc}" if doc else "")

"""``loongsage config show --doc``: the resolved config, one key a line with its description.

A key's description is the comment of its field in the dataclass typing its node, read from
the class's source: ``lr: float = 1e-5  # AdamW learning rate``, or a comment block on the
lines just above the field (the trailing comment wins when both exist), else a ``name: text``
entry of the class docstring. So the dataclasses stay the one place that says what a key means.

The dataclass typing a node is the schema's section (``loongsage.schema``) for core keys; for
a plugin's node (a dataset's, a loss's) it is the plugin's parameter dataclass plus the core's
generic keys of its kind (a reward's deadline), found through the run's resolved ``PluginRef``s,
and the node's name key carries the plugin's own one-line doc. A mapping that no dataclass
types (``sampling``, ``chat_template_kwargs``) is one line, like a list.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import re
import tokenize
from functools import lru_cache
from typing import Any, Iterable, Iterator, Mapping

from omegaconf import DictConfig, ListConfig, OmegaConf

from loongsage.registry import PluginRef
from loongsage.schema import ROOT_KEYS


def _own_comments(cls: type) -> dict[str, str]:
    """``{field: comment}`` of the fields ``cls`` itself declares, from its source."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    names = set(inspect.get_annotations(cls)) & {f.name for f in dataclasses.fields(cls)}
    alone, trailing, field_line = {}, {}, {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME and token.start[1] == 4 and token.string in names:
            field_line.setdefault(token.string, token.start[0])  # a field at the class body's indent
        elif token.type == tokenize.COMMENT:
            text = token.string.lstrip("#").strip()
            (alone if token.line.lstrip().startswith("#") else trailing)[token.start[0]] = text
    comments = _docstring_entries(cls, names)
    for name, line in field_line.items():
        above = line - 1
        while above in alone:  # the comment block ending on the line above the field
            above -= 1
        block = " ".join(alone[n] for n in range(above + 1, line))
        if trailing.get(line) or block:
            comments[name] = trailing.get(line) or block
    return comments


def _docstring_entries(cls: type, names: set[str]) -> dict[str, str]:
    """``name: text`` paragraphs of the class docstring that describe its fields (continuation
    lines indented deeper), for classes documented that way (``transfer.frames.TransferConfig``)."""
    entries: dict[str, str] = {}
    current = None
    for line in inspect.cleandoc(cls.__dict__.get("__doc__") or "").splitlines():
        name, colon, text = line.partition(": ")
        if colon and name in names:
            current, entries[name] = name, text.strip()
        elif current is not None and line.startswith(" ") and line.strip():
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


@lru_cache(maxsize=None)
def field_comments(cls: type) -> dict[str, str]:
    """``{field: comment}`` of a dataclass, its inherited fields included."""
    comments: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            comments.update(_own_comments(base))
    return comments


def plugin_refs(run: Any) -> Iterator[PluginRef]:
    """Every ``PluginRef`` a resolved run holds (``RunConfig`` and the specs in it)."""
    if isinstance(run, PluginRef):
        yield run
    elif isinstance(run, (tuple, list)):
        for item in run:
            yield from plugin_refs(item)
    elif dataclasses.is_dataclass(run) and not isinstance(run, type):
        for f in dataclasses.fields(run):
            yield from plugin_refs(getattr(run, f.name))


def _plugin_key_docs(ref: PluginRef, node: DictConfig) -> dict[str, str]:
    """A plugin node's key descriptions: its generic keys', its parameters', its name key's."""
    fields: set[str] = set()
    docs: dict[str, str] = {}
    for cls in (type(ref.options), ref.entry.params):
        if dataclasses.is_dataclass(cls):
            fields |= {f.name for f in dataclasses.fields(cls)}
            docs.update(field_comments(cls))
    about = f"{ref.kind} plugin" + (f": {ref.entry.doc}" if ref.entry.doc else "")
    # the node holds its name key (name, format or type), the generic keys and the parameters
    return {key: docs.get(key, "") if key in fields else about for key in map(str, node)}


def documented_lines(cfg: DictConfig, plugins: Iterable[PluginRef] = ()) -> Iterator[str]:
    """``key: value  # description`` for every leaf of ``cfg`` (lists of nodes by index);
    ``plugins`` are the run's resolved references, which type their nodes' keys."""
    by_key = {re.sub(r"\[(\d+)\]", r".\1", ref.key): ref for ref in plugins}
    return _lines(cfg, "", "", by_key)


def _key_docs(node: DictConfig, key: str, plugins: Mapping[str, PluginRef]) -> dict[str, str] | None:
    """The descriptions of ``node``'s keys, or None when nothing types it (a free mapping)."""
    if not key:
        return ROOT_KEYS
    if key in plugins:
        return _plugin_key_docs(plugins[key], node)
    cls = OmegaConf.get_type(node)
    return field_comments(cls) if dataclasses.is_dataclass(cls) else None


def _lines(node: Any, prefix: str, doc: str, plugins: Mapping[str, PluginRef]) -> Iterator[str]:
    if isinstance(node, DictConfig) and len(node) > 0:
        docs = _key_docs(node, prefix.rstrip("."), plugins)
        if docs is not None:
            for key in node:
                yield from _lines(node._get_node(key), f"{prefix}{key}.", docs.get(str(key), ""), plugins)
            return
    if isinstance(node, ListConfig) and any(isinstance(item, DictConfig) for item in node):
        for index in range(len(node)):
            yield from _lines(node._get_node(index), f"{prefix}{index}.", doc, plugins)
        return
    value = OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node._value()
    # one line a key: lists and mappings in flow style, a string of several lines quoted
    text = value if isinstance(value, str) and "\n" not in value else json.dumps(value)
    yield f"{prefix.rstrip('.')}: {text}" + (f"  # {doc}" if doc else "")

"""What a configuration error suggests: the closest existing key and the type a value needed.

OmegaConf's own messages name the key but not the fix ("Key 'stepz' not in
'TrainerConfig'", "Value 'abc' of type 'str' could not be converted to Integer"), and
Hydra's hint for an unknown key is to add it with ``+``, which a typed section refuses. These
helpers turn an OmegaConf failure into a ``ConfigError`` that names the key, says what was
expected and, for an unknown key, offers the closest key that exists. Keys are matched one
path segment at a time: compared as whole dotted strings, a long shared prefix would make an
unrelated key look close (``algorithm.policy_loss.foo`` is "close" to every loss parameter).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from typing import Any, Iterable, Mapping, Sequence

from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    OmegaConfBaseException,
    ValidationError,
)

from loongsage.errors import ConfigError

CUTOFF = 0.6  # difflib ratio below which nothing is suggested

_SINGULAR = {
    int: "an integer",
    float: "a number",
    bool: "a boolean (true or false)",
    str: "a string",
}
_PLURAL = {int: "integers", float: "numbers", bool: "booleans", str: "strings"}


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate most like ``name``, or None when none is close enough to suggest."""
    match = difflib.get_close_matches(str(name), [str(c) for c in candidates], n=1, cutoff=CUTOFF)
    return match[0] if match else None


def split_key(key: str) -> list[str]:
    """``data_sources[0].reward.nme`` (or ``data_sources.0.reward.nme``) as path segments."""
    return [part for part in re.split(r"[.\[\]]+", str(key)) if part]


def join_key(parts: Sequence[str]) -> str:
    """Path segments as a config key, list indices in brackets: ``data_sources[0].reward``."""
    key = ""
    for part in parts:
        key += f"[{part}]" if part.isdigit() else (f".{part}" if key else part)
    return key


def _children(node: Any) -> dict[str, Any]:
    if isinstance(node, Mapping):
        return {str(k): v for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return {str(i): v for i, v in enumerate(node)}
    return {}


def closest_key(tree: Any, parts: Sequence[str]) -> list[str] | None:
    """The existing path of plain containers ``tree`` closest to ``parts``, segment by segment."""
    if not parts:
        return []
    children = _children(tree)
    head, rest = parts[0], parts[1:]
    if head in children:
        tail = closest_key(children[head], rest)
        return None if tail is None else [head, *tail]
    for candidate in difflib.get_close_matches(head, list(children), n=3, cutoff=CUTOFF):
        tail = closest_key(children[candidate], rest)
        if tail is not None:
            return [candidate, *tail]
    return None


def describe_type(tp: Any) -> str | None:
    """``int`` -> "an integer", ``Optional[float]`` -> "a number or null"; None for Any."""
    if tp in _SINGULAR:
        return _SINGULAR[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        named = [describe_type(a) for a in args if a is not type(None)]
        if None in named:
            return None
        return " or ".join(named) + (" or null" if type(None) in args else "")
    if origin in (list, tuple) or tp in (list, tuple):
        item = args[0] if args else Any
        return f"a list of {_PLURAL.get(item) or describe_type(item) or 'values'}"
    if origin is dict or tp is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return f"a mapping of {tp.__name__} fields"
    return None


def _field_type(err: OmegaConfBaseException) -> Any:
    owner, key, ref = (
        getattr(err, "object_type", None),
        getattr(err, "key", None),
        getattr(err, "ref_type", None),
    )
    if isinstance(key, int) and typing.get_origin(ref) in (list, tuple):
        return typing.get_args(ref)[0] if typing.get_args(ref) else None
    if owner is not None and dataclasses.is_dataclass(owner) and isinstance(key, str):
        return typing.get_type_hints(owner).get(key)
    return None


def first_line(err: OmegaConfBaseException) -> str:
    """OmegaConf's message without the ``full_key:`` / ``object_type=`` lines it appends."""
    return str(getattr(err, "msg", None) or err).strip().splitlines()[0]


def first_leaf_key(key: str, value: Any) -> str:
    """``key`` extended down a lone chain of mappings: ``trainr`` holding {steps: 3} -> ``trainr.steps``."""
    while isinstance(value, Mapping) and len(value) == 1:
        ((child, value),) = value.items()
        key = f"{key}.{child}"
    return key


def _nest(prefix: str, tree: Any) -> Any:
    for part in reversed(split_key(prefix)):
        tree = {part: tree}
    return tree


def unknown_key_error(
    key: str, tree: Any, *, typed: bool, add_with: str | None = None
) -> ConfigError:
    """``key`` is not in ``tree`` (plain containers): suggest the closest key that is.

    ``typed`` says the parent is a schema dataclass (no key can be added there, nor at the
    root); for an open mapping, ``add_with`` is the ``+key=value`` override that adds it. The
    suggestion is spelt as ``key`` is (``data_sources.0.x`` on the command line,
    ``data_sources[0].x`` in validation messages).
    """
    parts = split_key(key)
    spell = join_key if "[" in key else ".".join
    match = closest_key(tree, parts)
    if match is not None:
        return ConfigError(key, f"unknown key; did you mean {spell(match)}?")
    node, depth = tree, 0  # the deepest part of the key that exists
    while depth < len(parts) and parts[depth] in _children(node):
        node, depth = _children(node)[parts[depth]], depth + 1
    where = spell(parts[:depth]) or "the config root"
    keys = ", ".join(sorted(_children(node))) or "none"
    if typed or depth == 0 or add_with is None:  # the root takes no new keys either
        return ConfigError(key, f"unknown key; {where} has these keys: {keys}")
    return ConfigError(
        key,
        f"unknown key ({where} has {keys}); to add a new key to this open mapping use {add_with}",
    )


def omegaconf_error(
    err: OmegaConfBaseException,
    tree: Any,
    *,
    prefix: str = "",
    key: str | None = None,
    add_with: str | None = None,
) -> ConfigError:
    """A ``ConfigError`` for an OmegaConf failure: unknown key, wrong type, or its own reason.

    ``tree`` (plain containers) holds the keys that exist, for suggestions; ``prefix`` is
    prepended to OmegaConf's key (the config path of the node that was merged); ``key``
    replaces it (the key as the user wrote it, when OmegaConf names only its first part).
    """
    full = (
        key
        or join_key([*split_key(prefix), *split_key(getattr(err, "full_key", "") or "")])
        or "config"
    )
    tree = _nest(prefix, tree)
    if isinstance(err, (ConfigKeyError, ConfigAttributeError)):
        owner = getattr(err, "object_type", None)
        typed = owner is not None and dataclasses.is_dataclass(owner)
        return unknown_key_error(full, tree, typed=typed, add_with=add_with)
    if isinstance(err, ValidationError):
        expected = describe_type(_field_type(err))
        if expected is not None:
            return ConfigError(full, f"expected {expected}, got {getattr(err, 'value', None)!r}")
    return ConfigError(full, first_line(err))

"""Typed parameters of the agents in this package (torch-free, imported by ``plugin.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict


@dataclass
class SingleTurnParams:
    """One chat-templated prompt, one sampled completion per sample; no tools."""

    chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)  # e.g. {enable_thinking: false}

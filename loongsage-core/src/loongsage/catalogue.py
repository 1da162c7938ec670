"""Which sibling distribution provides which plugin names, for the hint of an unknown name.

Core never imports its siblings, so when a config names a plugin that no loaded
distribution registered (``m2po`` without loongsage-algos), this table is the only way the
error can say which ``pip install`` brings it. ``tests/plugins/test_catalogue.py`` compares it
with what the installed siblings really register, so it cannot drift from them.
"""

from __future__ import annotations

import os
from importlib import metadata

from loongsage.install_hints import distribution_command

# distribution -> kind -> names it registers
SIBLING_PLUGINS: dict[str, dict[str, tuple[str, ...]]] = {
    "loongsage-agents": {
        "agent": (
            "chat",
            "claude_code",
            "codex",
            "command",
            "environment",
            "mini_swe_agent",
            "opencode",
            "single_turn",
            "tool_loop",
        ),
        "dataset": ("code_repair", "huggingface", "jsonl", "parquet", "synthetic_math"),
        "environment": ("openenv", "reasoning_gym", "verifiers"),
        "reward": ("code_exec", "math"),
        "tool_parser": ("hermes", "qwen3_xml"),
    },
    "loongsage-algos": {
        "advantage": ("dr_grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo"),
        "data_filter": ("dynamic_sampling", "length", "overlong", "overlong_reward_shaping"),
        "is_correction": ("geometric", "icepop", "opsm", "sequence", "token"),
        "policy_loss": ("cispo", "gspo", "gspo_token", "m2po", "reinforce", "sao"),
    },
    "loongsage-distill": {
        "step_term": ("opd",),
        "engine": ("embedded_teacher",),
        "kl_policy": ("full_jsd", "full_kl", "topk_jsd", "topk_kl"),
    },
    "loongsage-sandbox": {
        "command": ("sandbox",),
        "sandbox": ("bwrap", "docker", "process", "remote"),
    },
}


def provider(kind: str, name: str) -> str | None:
    """The sibling distribution that registers ``name`` as a ``kind``, if any."""
    for distribution, kinds in SIBLING_PLUGINS.items():
        if name in kinds.get(kind, ()):
            return distribution
    return None


def is_installed(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def _why_not_loaded() -> str:
    if os.environ.get("LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD"):
        return "LOONGSAGE_DISABLE_PLUGIN_AUTOLOAD is set"
    if os.environ.get("LOONGSAGE_LOAD_PLUGINS") is not None:
        return "LOONGSAGE_LOAD_PLUGINS does not name it"
    return "its entry point was not loaded"


def install_hint(kind: str, name: str) -> str:
    """Where ``name`` comes from and how to get it, or "" when no sibling provides it.

    For example ``'m2po' (policy_loss) comes with loongsage-algos, which is not installed; in a
    clone of LoongSage: make wheels && pip install dist/loongsage_algos-*.whl`` (the command last,
    so it can be copied as it stands).
    """
    distribution = provider(kind, name)
    if distribution is None:
        return ""
    what = f"'{name}' ({kind}) comes with {distribution}, which"
    if is_installed(distribution):
        return f" {what} is installed but not loaded ({_why_not_loaded()})."
    return f" {what} is not installed; {distribution_command(distribution)}"

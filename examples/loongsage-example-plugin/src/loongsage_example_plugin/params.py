"""Typed parameters of the example plugins (plain dataclasses; Hydra validates overrides).

Torch-free and import-light: ``plugin.py`` imports this module when ``loongsage plugins``
lists the kinds, so the listing never loads an entry's own module.
"""

from dataclasses import dataclass
from typing import ClassVar


@dataclass
class CsvParams:
    """Write the chosen metrics to a CSV file in the run directory."""

    filename: str = "metrics.csv"
    columns: tuple = ("rollout/reward_mean", "train/loss", "timing/step")


@dataclass
class ExactMatchParams:
    """1.0 when the last whitespace-separated token equals the ground truth, else 0.0."""

    strip_chars: str = ".,;:!?$ "


@dataclass
class PlainPromptParams:
    """One turn, no chat template: the last user message, between a prefix and a suffix, is the prompt."""

    prefix: str = "Question: "  # completion-style prompting, for base models without a chat template
    suffix: str = "\nAnswer:"


@dataclass
class TempdirParams:
    """Commands run as subprocesses in a fresh temporary folder; NOT a security boundary."""

    allow_untrusted_code: bool = False  # it isolates nothing: refuse untrusted code unless set
    timeout_s: float = 30.0  # a command's wall-clock limit when exec passes none


@dataclass
class FixedListParams:
    """A fixed list of questions and answers, reshuffled every epoch by the run's seed."""

    questions: tuple = ("What is 2 + 3?", "What is 7 - 4?", "What is 6 * 7?")
    answers: tuple = ("5", "3", "42")


@dataclass
class StaticTasksParams:
    """Tasks from a fixed list; one chat call per episode through the router, scored by exact match."""

    questions: tuple = ("What is 2 + 3?", "What is 7 - 4?", "What is 6 * 7?")
    answers: tuple = ("5", "3", "42")
    strip_chars: str = ".,;:!?$ "


@dataclass
class HeaderTagParams:
    """Copy one request header into the trajectory's metadata (e.g. a client's task tag)."""

    header: str = "x-task-tag"  # matched lower-cased
    key: str = "task_tag"  # the trajectory metadata key


@dataclass
class MedianBaselineParams:
    """Advantage = reward minus its prompt group's median reward (robust to one outlier)."""


@dataclass
class ClippedReinforceParams:
    """REINFORCE on π_θ with the importance ratio π_θ/π_old detached and capped from above."""

    ratio_cap: float = 2.0  # the detached ratio's upper bound


@dataclass
class AbsLogRatioParams:
    """|log π_θ − log π_ref| per token: zero on identical policies, usable as a penalty or a loss."""

    kl_roles: ClassVar[tuple[str, ...]] = ("penalty", "loss")


@dataclass
class TokenCapParams:
    """Per-token importance weight π_old/π_roll, detached and capped (truncated IS)."""

    uses_rollout_ratio: ClassVar[bool] = True  # it corrects log(π_old/π_roll)
    cap: float = 2.0  # the weight's upper bound


@dataclass
class LengthCapParams:
    """Drop prompt groups in which any response is longer than a token budget."""

    max_response_tokens: int = 1024


@dataclass
class MaxInFlightParams:
    """Dispatch only while fewer than `limit` groups are generating."""

    limit: int = 8


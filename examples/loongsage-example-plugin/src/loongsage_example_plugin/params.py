"""Typed parameters of the example plugins (plain dataclasses; Hydra validates overrides)."""

from dataclasses import dataclass


@dataclass
class CsvParams:
    """Write the chosen metrics to a CSV file in the run directory."""

    filename: str = "metrics.csv"
    columns: tuple = ("rollout/reward_mean", "train/loss", "timing/step")


@dataclass
class ExactMatchParams:
    """1.0 when the last whitespace-separated token equals the ground truth, else 0.0."""

    strip_chars: str = ".,;:!?$ "

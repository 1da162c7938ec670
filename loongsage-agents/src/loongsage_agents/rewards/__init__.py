"""Rewards: functions ``reward(sample_text, ground_truth, params, **context) -> float | dict``."""

"""The single controller: builds every component from the config and runs the loop."""

from loongsage.controller.run import run_sft_only, run_training

__all__ = ["run_training", "run_sft_only"]

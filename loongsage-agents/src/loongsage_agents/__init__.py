"""LoongSage agents: agent loops, black-box agent launchers, rewards, tool parsers, datasets."""

__version__ = "0.1.0"

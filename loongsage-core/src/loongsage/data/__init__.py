"""Data: sample/group types, prompt sources, multi-source mixing."""

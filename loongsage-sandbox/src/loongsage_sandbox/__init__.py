"""LoongSage sandboxes: bubblewrap, process, docker and remote backends with pooling."""

__version__ = "0.1.0"

"""LoongSage algorithms: advantage estimators, policy losses, KL policies, IS corrections, data filters."""

__version__ = "0.1.0"

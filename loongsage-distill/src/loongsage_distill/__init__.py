"""LoongSage distillation: Teacher Manager, on-policy distillation losses."""

__version__ = "0.1.0"

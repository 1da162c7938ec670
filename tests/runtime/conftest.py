"""Make the simulated rollout helpers (``runtime_sim.py``) importable (pytest uses importlib mode)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

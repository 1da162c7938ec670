"""Core's built-in trackers, registered through the same hook as third-party trackers.

``tensorboard``, ``wandb`` and ``mlflow`` need their package (extras of loongsage-core);
their modules import it only when a run builds the tracker.
"""

from loongsage.hookspecs import hookimpl
from loongsage.tracking.console import ConsoleParams
from loongsage.tracking.jsonl import JsonlParams
from loongsage.tracking.mlflow_tracker import MlflowParams
from loongsage.tracking.tensorboard_tracker import TensorBoardParams
from loongsage.tracking.wandb_tracker import WandbParams


@hookimpl
def loongsage_register_trackers(register):
    register("console", "loongsage.tracking.console:ConsoleTracker", params=ConsoleParams)
    register("jsonl", "loongsage.tracking.jsonl:JsonlTracker", params=JsonlParams)
    register("tensorboard", "loongsage.tracking.tensorboard_tracker:TensorBoardTracker",
             params=TensorBoardParams)
    register("wandb", "loongsage.tracking.wandb_tracker:WandbTracker", params=WandbParams)
    register("mlflow", "loongsage.tracking.mlflow_tracker:MlflowTracker", params=MlflowParams)

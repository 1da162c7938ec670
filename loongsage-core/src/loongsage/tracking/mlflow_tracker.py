"""MLflow tracker: a local file store under ``<run_dir>/mlruns`` unless a tracking URI is given.

``tracking_uri`` (or ``MLFLOW_TRACKING_URI``) points at any MLflow server or store; without
one, metrics land in ``file:<run_dir>/mlruns`` (``mlflow ui --backend-store-uri`` shows them).
MLflow 3 keeps its file store in maintenance mode behind ``MLFLOW_ALLOW_FILE_STORE``, which
this tracker sets for that default store only. The flattened resolved config is logged as
params (``train.lr``); the MLflow run id is kept in ``<run_dir>/mlflow_run_id``, so a resumed
run logs into the same MLflow run (the resumed steps overwrite nothing: MLflow keeps every
value, so a step logged twice shows both). Needs ``mlflow-skinny`` (extra
``loongsage-core[mlflow]``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Mapping, Optional

from loongsage.tracking.base import SAMPLE_COLUMNS, Tracker
from loongsage.tracking.optional import finite, flatten, require

PARAMS_PER_CALL = 100  # MLflow's log_batch limit
PARAM_VALUE_LIMIT = 6000


@dataclass
class MlflowParams:
    """Log to MLflow (a file store in the run directory by default)."""

    tracking_uri: Optional[str] = None  # default: $MLFLOW_TRACKING_URI, else file:<run_dir>/mlruns
    experiment: str = "loongsage"  # experiment name; created when missing
    run_name: Optional[str] = None  # default: the run directory's name

    def __post_init__(self) -> None:
        require("mlflow", "mlflow")


class MlflowTracker(Tracker):
    """One batch of metrics per step in one MLflow run."""

    def __init__(self, params, run_dir, config) -> None:
        super().__init__(params, run_dir, config)
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = params.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None:
            uri = (self.run_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.tracking_uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        id_file = self.run_dir / "mlflow_run_id"
        if id_file.is_file():
            self.run_id = id_file.read_text(encoding="utf-8").strip()
            return
        experiment = self.client.get_experiment_by_name(params.experiment)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(params.experiment))
        run = self.client.create_run(experiment_id, run_name=params.run_name or self.run_dir.name)
        self.run_id = run.info.run_id
        id_file.write_text(self.run_id, encoding="utf-8")
        values = [Param(k, str(v)[:PARAM_VALUE_LIMIT]) for k, v in flatten(config).items()]
        for start in range(0, len(values), PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=values[start:start + PARAMS_PER_CALL])

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, value, now, step) for key, value in finite(metrics)]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_samples(self, rows: list[list], step: int) -> None:
        """The samples as the artifact ``samples/step_NNNNNN.json`` (MLflow's table format:
        ``columns`` and ``data``)."""
        import json

        table = {"columns": list(SAMPLE_COLUMNS), "data": rows}
        self.client.log_text(self.run_id, json.dumps(table), f"samples/step_{step:06d}.json")

    def close(self) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id)
            self.run_id = None

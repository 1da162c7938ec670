"""Sample completions with their rewards reach the trackers (TRL's habit): a TensorBoard text
table, an MLflow artifact in MLflow's table format and a W&B table, each read back with the
library's own reader (TensorBoard's ``EventAccumulator``, ``MlflowClient``, the offline run's
``.wandb`` records and the table file they point at). The rows are what ``samples/step_*.jsonl``
holds, ground truth included; a tracker built through the registry as a run builds it."""

from __future__ import annotations

import json

from loongsage.plugins import get_registries
from loongsage.tracking.base import SAMPLE_COLUMNS, sample_rows

SAVED = [{"step": 4, "source": "arithmetic", "group_id": 7, "prompt": "What is 2 + 3?", "response": "\\boxed{5}",
          "ground_truth": "5", "reward": 1.0, "advantages": [0.5, 0.5, 0.5]},
         {"step": 4, "source": "arithmetic", "group_id": 7, "prompt": "What is 2 + 3?", "response": "6 | 7",
          "ground_truth": "5", "reward": 0.0, "advantages": [-0.5, -0.5]}]
ROWS = sample_rows(SAVED)
CONFIG = {"train": {"lr": 0.001}}


def build(name, run_dir, **params):
    entry = get_registries().tracker.entry(name)
    return entry.obj(entry.build_params(params, f"logging.trackers[{name}]"), run_dir, CONFIG)


def test_sample_rows_carry_text_ground_truth_reward_and_mean_advantage():
    assert ROWS == [[4, "arithmetic", 7, "What is 2 + 3?", "\\boxed{5}", "5", 1.0, 0.5],
                    [4, "arithmetic", 7, "What is 2 + 3?", "6 | 7", "5", 0.0, -0.5]]


def test_tensorboard_text_table(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = build("tensorboard", tmp_path)
    tracker.log({"rollout/reward_mean": 0.5}, 4)
    tracker.log_samples(ROWS, 4)
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    [event] = events.Tensors("samples/text_summary")
    text = event.tensor_proto.string_val[0].decode()
    assert event.step == 4
    assert text.splitlines() == ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + "---|" * 8,
                                 "| 4 | arithmetic | 7 | What is 2 + 3? | \\boxed{5} | 5 | 1.0 | 0.5 |",
                                 "| 4 | arithmetic | 7 | What is 2 + 3? | 6 \\| 7 | 5 | 0.0 | -0.5 |"]


def test_mlflow_artifact_table(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = build("mlflow", tmp_path)
    tracker.log_samples(ROWS, 4)
    run_id, uri = tracker.run_id, tracker.tracking_uri
    tracker.close()
    client = MlflowClient(tracking_uri=uri)
    [artifact] = client.list_artifacts(run_id, "samples")
    assert artifact.path == "samples/step_000004.json"
    local = client.download_artifacts(run_id, artifact.path, str(tmp_path / "down"))
    table = json.loads(open(local).read())
    assert table == {"columns": list(SAMPLE_COLUMNS), "data": ROWS}


def test_wandb_table(tmp_path, monkeypatch, wandb_log):
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    tracker = build("wandb", tmp_path, project="samples")
    tracker.log({"rollout/reward_mean": 0.5}, 4)
    tracker.log_samples(ROWS, 4)
    tracker.close()
    [log] = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    [row] = [r for r in wandb_log.history(log) if "samples/path" in r]  # nested keys come flattened
    assert row["_step"] == 4 and row["samples/_type"] == "table-file" and row["samples/nrows"] == 2
    assert row["rollout/reward_mean"] == 0.5  # the step's metrics and its table share one row
    table = json.loads((log.parent / "files" / row["samples/path"]).read_text())
    assert table["columns"] == list(SAMPLE_COLUMNS) and table["data"] == ROWS

"""The tensorboard, wandb and mlflow trackers, built through the tracker registry as a run
builds them, read back with each library's own reader: TensorBoard's ``EventAccumulator``,
W&B's protobuf records of the offline run's ``.wandb`` log, and ``MlflowClient``. Metric names
stay ``section/name``; non-finite values are left out; a resume drops or reuses what it must."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from loongsage.errors import ConfigError
from loongsage.plugins import get_registries

STEPS = [
    {"rollout/reward_mean": 0.25, "train/loss": 1.5, "train/is_approx_k3_kl": float("nan")},
    {"rollout/reward_mean": 0.5, "train/loss": 1.25, "train/is_approx_k3_kl": 0.01},
    {"rollout/reward_mean": 0.75, "train/loss": 1.0, "train/is_approx_k3_kl": 0.02},
]
CONFIG = {"train": {"lr": 0.001, "betas": [0.9, 0.999]}, "trainer": {"steps": 3}}


def build(name: str, run_dir: Path, **params):
    entry = get_registries().tracker.entry(name)
    return entry.obj(entry.build_params(params, f"logging.trackers[{name}]"), run_dir, CONFIG)


def log_steps(tracker, rows=STEPS, first=0):
    for step, row in enumerate(rows, start=first):
        tracker.log(row, step)
    tracker.close()


def expected(key: str, rows=STEPS, first=0) -> list[tuple[int, float]]:
    return [(step, row[key]) for step, row in enumerate(rows, start=first) if math.isfinite(row[key])]


def same_series(got, want) -> bool:
    """Equal steps and values equal to float32 precision (TensorBoard stores float32)."""
    return [s for s, _ in got] == [s for s, _ in want] and \
        [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)


def test_tensorboard_events_read_back_by_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_steps(build("tensorboard", tmp_path))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(STEPS[0])
    for key in STEPS[0]:
        got = [(e.step, e.value) for e in events.Scalars(key)]
        assert same_series(got, expected(key)), key


def test_tensorboard_has_the_config_as_hyperparameters(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    log_steps(build("tensorboard", tmp_path))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    contents = events.PluginTagToContent("hparams").values()
    starts = [data.session_start_info for data in map(plugin_data_pb2.HParamsPluginData.FromString, contents)
              if data.HasField("session_start_info")]
    assert len(starts) == 1
    hparams = {key: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
               for key, value in starts[0].hparams.items()}
    assert hparams == {"train.lr": 0.001, "train.betas": "[0.9, 0.999]", "trainer.steps": 3.0}


def test_tensorboard_resume_purges_the_resumed_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_steps(build("tensorboard", tmp_path))
    resumed = build("tensorboard", tmp_path)
    resumed.truncate_before(2)  # what resume_or_warm_start does when continuing at step 2
    log_steps(resumed, [{"rollout/reward_mean": 0.9}, {"rollout/reward_mean": 1.0}], first=2)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    got = [(e.step, e.value) for e in events.Scalars("rollout/reward_mean")]
    assert same_series(got, [(0, 0.25), (1, 0.5), (2, 0.9), (3, 1.0)])


def test_wandb_is_offline_without_a_login_and_its_log_reads_back(tmp_path, monkeypatch, wandb_log):
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    tracker = build("wandb", tmp_path, project="readback")
    assert tracker.mode == "offline"
    log_steps(tracker)
    [log] = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    rows = wandb_log.history(log)
    for key in STEPS[0]:
        assert same_series([(r["_step"], r[key]) for r in rows if key in r], expected(key)), key
    assert wandb_log.config(log)["train"] == CONFIG["train"]


def test_wandb_goes_online_once_logged_in(tmp_path, monkeypatch):
    from loongsage.tracking.wandb_tracker import resolve_mode

    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password abc123\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert resolve_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")  # the environment wins
    assert resolve_mode("auto") == "offline"
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    assert resolve_mode("auto") == "offline" and resolve_mode("disabled") == "disabled"


def test_mlflow_file_store_reads_back_and_a_resume_reuses_the_run(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first = build("mlflow", tmp_path)
    run_id, uri = first.run_id, first.tracking_uri
    log_steps(first, STEPS[:2])
    assert uri == (tmp_path / "mlruns").resolve().as_uri()
    log_steps(build("mlflow", tmp_path), STEPS[2:], first=2)  # resumed: same MLflow run
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.data.params["train.lr"] == "0.001" and run.data.params["trainer.steps"] == "3"
    assert set(run.data.metrics) == set(STEPS[0])
    for key in STEPS[0]:
        got = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        assert same_series(got, expected(key)), key
    assert run.info.status == "FINISHED"


def test_a_bad_mode_is_a_config_error_naming_the_tracker(tmp_path):
    entry = get_registries().tracker.entry("wandb")
    with pytest.raises(ConfigError, match=r"logging.trackers\[wandb\].*mode must be one of auto"):
        entry.build_params({"mode": "sometimes"}, "logging.trackers[wandb]")

"""Checkpoints that verify themselves (``RunDirectory`` and ``checkpoint_manifest``).

Real checkpoints: the embedded train engine on the tiny model, in this process, after one
optimizer step, writes each one through ``RunDirectory.write_checkpoint`` (the writer the
run's ``save_checkpoint`` hands the train actors). Then a file is damaged as a user or a full
disk would: deleted, truncated, overwritten with the same size, or ``latest`` left naming a
folder that is gone. A resume names the damaged file, falls back to the newest intact
checkpoint (which loads into the engine) and moves the damaged one aside; with none intact it
fails naming each. Before, a missing ``train_state.pt`` resumed "successfully" with a fresh
optimizer and RNG, and the other cases ended in raw tracebacks naming neither file nor step.

A full disk is injected (``OSError(ENOSPC)`` from the writer after it wrote part of its file):
filling a real disk is not something a test may do on a shared machine.
"""

from __future__ import annotations

import errno
import json
import logging
import shutil

import pytest
import torch

from loongsage.controller.checkpoint_manifest import MANIFEST
from loongsage.controller.run_dir import CheckpointDamaged, CheckpointWriteFailed, RunDirectory
from loongsage.engines import train_state
from loongsage.engines.embedded_train import EmbeddedTrainEngine


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    engine = EmbeddedTrainEngine.from_config({"model": {"path": str(tiny_model_dir)}})
    loss = sum(p.float().pow(2).sum() for p in engine.model.parameters()) * 1e-6
    loss.backward()
    engine.optimizer.step()  # a non-empty optimizer state: what a lost train_state.pt loses
    engine.optimizer.zero_grad()
    return engine


def save(run_dir: RunDirectory, engine, step: int, keep_last: int = 3):
    return run_dir.write_checkpoint(step, lambda folder: engine.save(folder / "trainer"),
                                    {"step": step, "version": step + 1, "scheduler": None}, keep_last)


@pytest.fixture
def two_checkpoints(tmp_path, engine):
    run_dir = RunDirectory(tmp_path / "run")
    run_dir.checkpoints.mkdir(parents=True)
    save(run_dir, engine, 2)
    save(run_dir, engine, 3)
    return run_dir


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGES = {
    "train_state deleted": (lambda c: (c / "trainer" / "train_state.pt").unlink(),
                            "trainer/train_state.pt is missing"),
    "weights truncated": (lambda c: truncate(c / "trainer" / "model.safetensors"),
                          "trainer/model.safetensors has "),
    "train_state truncated": (lambda c: truncate(c / "trainer" / "train_state.pt"), "trainer/train_state.pt has "),
    "state.json truncated": (lambda c: truncate(c / "state.json"), "state.json has "),
    "weights changed, same size": (lambda c: flip_a_byte(c / "trainer" / "model.safetensors"),
                                   "trainer/model.safetensors does not match its SHA-256 in the manifest"),
    "manifest deleted": (lambda c: (c / MANIFEST).unlink(), "manifest.json is missing"),
    "folder deleted, latest dangling": (lambda c: shutil.rmtree(c),
                                        "checkpoints/latest names it but the folder is gone"),
}


def test_a_checkpoint_carries_a_manifest_of_every_file(two_checkpoints):
    folder = two_checkpoints.checkpoint_dir(3)
    files = json.loads((folder / MANIFEST).read_text())["files"]
    on_disk = {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*")
               if p.is_file() and p.name != MANIFEST}
    assert {name: entry["size"] for name, entry in files.items()} == on_disk
    assert {"state.json", "trainer/model.safetensors", "trainer/train_state.pt"} <= set(files)
    assert not list(two_checkpoints.checkpoints.glob(".tmp_*"))
    assert two_checkpoints.resume_checkpoint()[1]["step"] == 3


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_resume_names_the_damage_and_falls_back_to_the_newest_intact_checkpoint(
        two_checkpoints, engine, damage, caplog):
    apply, named = DAMAGES[damage]
    newest = two_checkpoints.checkpoint_dir(3)
    apply(newest)
    with caplog.at_level(logging.WARNING, logger="loongsage.controller.run_dir"):
        folder, state = two_checkpoints.resume_checkpoint()
    assert (folder.name, state["step"]) == ("step_000002", 2)
    assert f"checkpoint step_000003 is damaged: {named}" in caplog.text
    assert "falling back to step_000002, the newest intact checkpoint" in caplog.text
    assert (two_checkpoints.checkpoints / "latest").read_text() == "step_000002"
    assert not newest.exists()
    if damage != "folder deleted, latest dangling":  # kept for inspection, out of keep_last's way
        assert (two_checkpoints.checkpoints / "damaged_step_000003").is_dir()
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    engine.load(folder / "trainer")  # the fallback is a checkpoint the engine really restores
    assert all(torch.equal(before[k], v) for k, v in engine.model.state_dict().items())
    assert engine.optimizer.state  # with its optimizer state, not a fresh one


def test_a_resume_with_every_checkpoint_damaged_fails_naming_each(two_checkpoints):
    (two_checkpoints.checkpoint_dir(3) / "trainer" / "train_state.pt").unlink()
    truncate(two_checkpoints.checkpoint_dir(2) / "trainer" / "model.safetensors")
    with pytest.raises(CheckpointDamaged) as err:
        two_checkpoints.resume_checkpoint()
    message = str(err.value)
    assert message.startswith(f"no intact checkpoint to resume from in {two_checkpoints.checkpoints}: ")
    assert "step_000003: trainer/train_state.pt is missing" in message
    assert "step_000002: trainer/model.safetensors has " in message
    assert message.endswith("Restore one of them, or start a new run in a new trainer.run_dir")


def test_the_run_s_own_question_is_answered_from_sizes_alone(two_checkpoints):
    flip_a_byte(two_checkpoints.checkpoint_dir(3) / "trainer" / "model.safetensors")
    assert two_checkpoints.latest_checkpoint()[0].name == "step_000003"  # no byte read
    (two_checkpoints.checkpoint_dir(3) / "trainer" / "train_state.pt").unlink()
    assert two_checkpoints.latest_checkpoint()[0].name == "step_000002"


def test_a_full_disk_names_the_file_removes_the_partial_files_and_keeps_the_previous_checkpoint(
        two_checkpoints, engine, monkeypatch):
    def full_disk(state, path):
        with open(path, "wb") as handle:
            handle.write(b"\0" * 4096)  # part of the file made it before the disk filled
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(train_state.torch, "save", full_disk)
    previous = sum(p.stat().st_size for p in two_checkpoints.checkpoint_dir(3).rglob("*") if p.is_file())
    with pytest.raises(CheckpointWriteFailed) as err:
        save(two_checkpoints, engine, 4)
    free = shutil.disk_usage(two_checkpoints.checkpoints).free
    message = str(err.value)
    expected_start = (f"checkpoint step_000004 failed writing trainer/train_state.pt: no space left on device: "
                      f"{previous / (1 << 20):.0f} MB needed (the size of step_000003), ")
    assert message.startswith(expected_start), message
    free_mb = int(message.split("needed (the size of step_000003), ")[1].split(" MB free")[0])
    assert abs(free_mb - free / (1 << 20)) < 64  # the disk's free space now, give or take other writers
    assert message.endswith(f"its partial files were removed; the previous checkpoint step_000003 is intact: "
                            f"resume with trainer.resume=true trainer.run_dir={two_checkpoints.path}")
    assert sorted(p.name for p in two_checkpoints.checkpoints.iterdir()) == ["latest", "step_000002", "step_000003"]
    assert (two_checkpoints.checkpoints / "latest").read_text() == "step_000003"
    assert two_checkpoints.resume_checkpoint()[1]["step"] == 3


def test_another_write_failure_is_named_with_its_own_reason(tmp_path, engine):
    run_dir = RunDirectory(tmp_path / "run")
    run_dir.checkpoints.mkdir(parents=True)

    def refuses(folder):
        engine.save(folder / "trainer")
        raise PermissionError(errno.EACCES, "Permission denied", str(folder / "critic" / "model.safetensors"))

    with pytest.raises(CheckpointWriteFailed) as err:
        run_dir.write_checkpoint(0, refuses, {"step": 0}, 2)
    partial = run_dir.checkpoints / ".tmp_step_000000" / "critic" / "model.safetensors"
    assert str(err.value) == ("checkpoint step_000000 failed writing critic/model.safetensors: PermissionError: "
                              f"[Errno 13] Permission denied: '{partial}'; "
                              "its partial files were removed; no earlier checkpoint exists")
    assert list(run_dir.checkpoints.iterdir()) == []


def test_the_cli_refuses_a_resume_with_no_intact_checkpoint_before_ray_starts(two_checkpoints):
    """The real ``loongsage train``: the checkpoints are verified before anything starts."""
    import os
    import subprocess
    import sys

    (two_checkpoints.checkpoint_dir(3) / "trainer" / "train_state.pt").unlink()
    (two_checkpoints.checkpoint_dir(2) / MANIFEST).unlink()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    result = subprocess.run([sys.executable, "-m", "loongsage.cli", "train", "--config-name", "tiny/grpo",
                             f"trainer.run_dir={two_checkpoints.path}", "trainer.resume=true"],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert (f"error: no intact checkpoint to resume from in {two_checkpoints.checkpoints}: step_000003: "
            "trainer/train_state.pt is missing; step_000002: manifest.json is missing (the checkpoint was never "
            "completed)") in result.stderr
    assert "Started a local Ray instance" not in result.stderr + result.stdout

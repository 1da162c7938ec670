"""The step terms of a run, addressed as one (``controller.step_extension.StepExtensions``).

Two extensions stand for a run's step terms: one with every optional hook of the seam (as a
value model has: inputs before the step, a warm-up, training after it, checkpoint state, the
warm start, the colocated phases) and one with only the required ones (as distillation has).
Each hook reaches exactly the extensions that define it, in order; the warm-started policy is
saved once, and only when a hook asks for it; the colocated phases move the extensions with
the train ranks. The value model's step term adds its actor's memory to the start-up estimate.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from loongsage.config.compose import load_config
from loongsage.controller import lifecycle
from loongsage.controller.memory_budget import PROCESS_BYTES, ModelShape, dtype_bytes, estimate_run
from loongsage.controller.phases import ColocatedPhases
from loongsage.controller.step_extension import StepExtensions
from loongsage.engines.batch import TrainBatch


class Full:
    """Every optional hook, recording its calls."""

    sample_fields = ("values",)
    train_term = None

    def __init__(self, warmup: int) -> None:
        self.warmup, self.calls, self.actors = warmup, [], {"critic": "actor-c"}

    def before_train(self, batch, row_sources):
        batch.extras["values"] = torch.ones_like(batch.loss_mask)
        self.calls.append("before_train")
        return {"timing/values": 1.0}

    def policy_trains(self, step):
        return step >= self.warmup

    def after_train(self, batch, rewards, group_index):
        self.calls.append(("after_train", float(batch.extras["values"].sum()), float(rewards.sum())))
        return {"critic/value_loss": 0.5}

    def save_state(self, folder):
        self.calls.append(("save_state", folder))

    def load_state(self, folder):
        self.calls.append(("load_state", folder))

    def warm_started(self, policy):
        self.calls.append(("warm_started", policy(), policy()))

    def onload(self):
        self.calls.append("onload")

    def offload(self):
        self.calls.append("offload")

    def close(self):
        self.calls.append("close")


class Minimal:
    """The required hooks only, with a train-side term."""

    def __init__(self) -> None:
        self.train_term, self.actors, self.closed = "the loss term", {"teacher_slot_0": "actor-t"}, False

    def before_train(self, batch, row_sources):
        batch.extras["teacher"] = torch.zeros(len(batch), dtype=torch.long)
        return {"timing/teacher": 2.0}

    def close(self):
        self.closed = True


def _batch() -> TrainBatch:
    return TrainBatch(torch.ones(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), torch.ones(2, 4))


def test_each_hook_reaches_the_extensions_that_define_it():
    full, minimal = Full(warmup=2), Minimal()
    extensions = StepExtensions([full, minimal])
    assert extensions.train_term == "the loss term" and extensions.sample_fields == ("values",)
    assert extensions.actors == {"critic": "actor-c", "teacher_slot_0": "actor-t"}
    batch = _batch()
    assert extensions.before_train(batch, ["a", "b"]) == {"timing/values": 1.0, "timing/teacher": 2.0}
    assert {"values", "teacher"} <= set(batch.extras)
    assert [extensions.policy_trains(step) for step in range(4)] == [False, False, True, True]
    assert extensions.after_train(batch, torch.tensor([1.0, 0.5]), torch.arange(2)) == {"critic/value_loss": 0.5}
    extensions.save_state(Path("ckpt"))
    extensions.load_state(Path("ckpt"))
    saved = []
    extensions.warm_started(lambda: saved.append("saved") or Path("warm_start_model"))
    assert saved == ["saved"]  # asked twice by the hook, saved once
    extensions.close()
    assert full.calls == ["before_train", ("after_train", 8.0, 1.5), ("save_state", Path("ckpt")),
                          ("load_state", Path("ckpt")),
                          ("warm_started", Path("warm_start_model"), Path("warm_start_model")), "close"]
    assert minimal.closed


def test_without_the_optional_hooks_every_step_trains_and_no_policy_copy_is_saved():
    extensions = StepExtensions([Minimal()])
    saved = []
    extensions.warm_started(lambda: saved.append("saved") or Path("unused"))
    assert saved == [] and extensions.policy_trains(0) and extensions.after_train(_batch(), None, None) == {}
    assert StepExtensions().train_term is None and StepExtensions().sample_fields == ()


def test_colocated_phases_move_the_extensions_with_the_train_ranks():
    full = Full(warmup=0)
    trainer_calls = []
    phases = ColocatedPhases(SimpleNamespace(pause=lambda: None), SimpleNamespace(call=trainer_calls.append), [],
                             StepExtensions([full, Minimal()]))
    phases.to_train()
    phases.to_rollout()
    assert trainer_calls == ["onload", "offload"] and full.calls == ["onload", "offload"]


def test_the_critic_adds_its_actor_to_the_memory_estimate(tiny_model_dir):
    """Weights, gradients and AdamW (4 x the weights), the batch's values, old values and
    returns in fp32, and its process."""
    run = load_config("tiny/ppo", [f"model.path={tiny_model_dir}"])
    shape = ModelShape.from_folder(str(tiny_model_dir))
    without, with_critic = estimate_run(run.cfg, shape, 100), estimate_run(run.cfg, shape, 100,
                                                                           step_terms=run.step_terms)
    r = run.cfg.rollout
    batch_tokens = (r.prompts_per_step + r.oversample_groups) * r.n_samples_per_prompt * 100
    expected = PROCESS_BYTES + 4 * shape.parameters * dtype_bytes(run.cfg.model.dtype) + 3 * batch_tokens * 4
    assert "critic" not in without.parts and with_critic.parts["critic"] == expected
    assert with_critic.parts["train actor"] == without.parts["train actor"]


def test_checkpoints_save_and_resume_restores_the_step_terms_state(tmp_path):
    """``save_actor_state`` (checkpoints and step snapshots) and ``resume_or_warm_start`` hand the
    checkpoint folder to the trainer and to every step term keeping a state, in that order."""
    full = Full(warmup=0)
    calls = []
    run = SimpleNamespace(trainers=SimpleNamespace(call=lambda method, path: calls.append((method, path))),
                          extensions=StepExtensions([full, Minimal()]), scheduler=None, trackers=[],
                          rollout_actors=[], resume_from=(tmp_path / "step_000003", {"step": 3, "version": 4,
                                                                                     "scheduler": None}),
                          version=0)
    lifecycle.save_actor_state(run, tmp_path / "step_000003")
    assert lifecycle.resume_or_warm_start(run) == 4 and run.version == 4
    assert calls == [("save", str(tmp_path / "step_000003" / "trainer")),
                     ("load", str(tmp_path / "step_000003" / "trainer"))]
    assert full.calls == [("save_state", tmp_path / "step_000003"), ("load_state", tmp_path / "step_000003")]

"""When a training step fails: say which actor died and why, and keep the trainer's state.

A rollout engine that Ray's memory monitor killed shows up in the driver as an HTTP error
from its client (``/generate (unreachable)``), far from the cause. ``dead_actors`` asks
every actor of the run whether it is alive: Ray answers a call to an actor its memory
monitor killed with ``OutOfMemoryError`` ("... killed due to the node running low on
memory ..."), and a call to an actor that died otherwise with ``RayActorError``.

``FailureGuard`` wraps the training loop. On an exception it saves the trainer's state as a
checkpoint of the last step the trainer finished (when the train actor is alive and that
step is not checkpointed yet), then raises ``RunFailed`` naming the dead actors and the
memory figures of the last step when an actor died, or re-raises the original error with a
note saying where the state went; either way the message ends with the resume command when a
checkpoint exists. A dead train actor's state is gone with it: the guard then promotes the
step snapshot (``step_snapshot``: the state after the last finished step, kept on disk) to
that step's checkpoint when it is newer than the latest one, so the run loses at most the step
in flight; without a snapshot the last checkpoint stays intact. Whether the failed step was
trained is read from the engine's ``weight_version`` (its optimizer-step count) against its
value when the step began.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loongsage.controller.lifecycle import save_checkpoint
from loongsage.controller.memory import is_train_role
from loongsage.controller.run_dir import CheckpointWriteFailed
from loongsage.controller.step_snapshot import StepSnapshot
from loongsage.errors import LoongSageError

PING_TIMEOUT_S = 30.0


class RunFailed(LoongSageError):
    """A training step failed because an actor of the run died; ``resume_dir`` is the run
    directory when it holds a checkpoint to resume from (what ``trainer.auto_resume`` does)."""

    def __init__(self, message: str, resume_dir: Path | None = None) -> None:
        super().__init__(message)
        self.resume_dir = resume_dir


class RunStopped(LoongSageError):
    """The run stopped on SIGTERM or SIGINT (``stop_request``) after checkpointing its last finished
    step; not a failure, so ``FailureGuard`` lets it through untouched."""


def resume_command(run_dir: Any) -> str:
    return f"resume with trainer.resume=true trainer.run_dir={run_dir.path}"


@dataclass
class ActorDeath:
    role: str  # train, rollout0, ...
    out_of_memory: bool  # killed by Ray's memory monitor
    reason: str  # Ray's own first line


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _death_reason(err: BaseException) -> str:
    """Ray's explanation: the line saying why the actor is dead, without its list of guesses."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    line = next((line for line in lines if "because" in line), _first_line(err))
    return line.split(" Some common causes")[0]


def dead_actors(actors: dict[str, Any], timeout_s: float = PING_TIMEOUT_S) -> list[ActorDeath]:
    """The actors of ``actors`` (role -> ``EngineHost`` handle) that no longer answer."""
    import ray

    refs = {role: actor.memory.remote() for role, actor in actors.items()}
    deaths = []
    for role, ref in refs.items():
        try:
            ray.get(ref, timeout=timeout_s)
        except ray.exceptions.OutOfMemoryError as err:
            deaths.append(ActorDeath(role, True, _first_line(err)))
        except ray.exceptions.RayActorError as err:
            deaths.append(ActorDeath(role, False, _death_reason(err)))
        except ray.exceptions.GetTimeoutError:
            deaths.append(ActorDeath(role, False, f"did not answer within {timeout_s:.0f} s"))
    return deaths


ROLE_KINDS = {"train": "train actor", "rollout": "rollout engine"}  # other roles: "<role> actor"


def describe(death: ActorDeath) -> str:
    kind = "train" if is_train_role(death.role) else death.role.rstrip("0123456789")
    what = f"{ROLE_KINDS.get(kind, f'{kind} actor')} {death.role!r}"
    if death.out_of_memory:
        return f"Ray's memory monitor killed {what} ({death.reason})"
    return f"{what} died ({death.reason})"


def _trainer_version(engine: Any) -> int:
    return int(engine.weight_version)


class FailureGuard:
    """Context manager around the step loop of a ``Run`` (see the module docstring)."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.step: int | None = None
        self._version_at_start: int | None = None
        self.snapshot = StepSnapshot(run) if run.cfg.checkpoint.snapshot else None

    def begin(self, step: int) -> None:
        """Call at the start of every step."""
        import ray

        self.step = step
        self._version_at_start = ray.get(self.run.trainers.actors[0].run.remote(_trainer_version))

    def keep(self, step: int) -> None:
        """Call after a step that was not checkpointed: its state becomes the step snapshot."""
        if self.snapshot is not None:
            self.snapshot.take(step)

    def __enter__(self) -> "FailureGuard":
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        try:
            return self._handle(exc)
        finally:
            if self.snapshot is not None:
                self.snapshot.close()

    def _handle(self, exc: BaseException | None) -> bool:
        if not isinstance(exc, Exception) or isinstance(exc, RunStopped) or self.step is None:
            return False
        deaths = dead_actors(self.run.memory.actors)
        if isinstance(exc, CheckpointWriteFailed) and not deaths:
            return False  # it says what it kept: do not save again; an actor death while saving is a death
        saved = self._save_trainer(alive=not any(is_train_role(d.role) for d in deaths))
        if not deaths:
            exc.add_note(saved)
            return False
        lines = [f"step {self.step} failed: " + "; ".join(describe(d) for d in deaths) + ".",
                 self._memory_line(any(d.out_of_memory for d in deaths)), saved,
                 f"the step itself failed with {type(exc).__name__}: {_first_line(exc)}"]
        resumable = self.run.run_dir.latest_checkpoint() is not None
        raise RunFailed("\n".join(lines), self.run.run_dir.path if resumable else None) from exc

    def _memory_line(self, out_of_memory: bool) -> str:
        last = self.run.memory.last
        figures = ", ".join(f"{role} {report.rss / 1e9:.1f} GB" for role, report in sorted(last.items()))
        line = f"RSS after the last completed step: {figures or 'not measured'}; {self.run.memory.summary_line()}"
        if out_of_memory:
            line += ("; lower train.micro_batch_size, rollout.max_running_requests or rollout.max_new_tokens "
                     "(the start-up estimate prints what each needs)")
        return line

    def _save_trainer(self, alive: bool) -> str:
        import ray

        run_dir = self.run.run_dir
        latest = run_dir.latest_checkpoint()
        kept = f"the latest checkpoint is {latest[0].name}" if latest else "no checkpoint exists"
        if not alive:
            promoted = self.snapshot.promote() if self.snapshot is not None else None
            if promoted is not None:
                return (f"the train actor is gone; its state after step {promoted} (the step snapshot) saved as "
                        f"checkpoint {run_dir.checkpoint_dir(promoted).name}: {resume_command(run_dir)}")
            resume = f": {resume_command(run_dir)}" if latest else ""
            return f"the train actor is gone with its state since the latest checkpoint; {kept}{resume}"
        try:
            trained = ray.get(self.run.trainers.actors[0].run.remote(_trainer_version)) != self._version_at_start
            done = self.step if trained else self.step - 1
            if done < 0:
                return f"no RL step finished, nothing to checkpoint; {kept}"
            if latest is not None and latest[1]["step"] == done:
                return f"trainer state through step {done} is in checkpoint {latest[0].name}"
            save_checkpoint(self.run, done)
        except Exception as err:  # the run is failing already: report, do not mask the first error
            return f"saving the trainer's state failed ({type(err).__name__}: {_first_line(err)}); {kept}"
        return (f"trainer state through step {done} saved as checkpoint {run_dir.checkpoint_dir(done).name}: "
                f"{resume_command(run_dir)}")

"""number_guess's episode logic: a secret in [LOW, HIGH] drawn from the reset seed, MAX_GUESSES
guesses, each answered with a hint.

Rewards (one per step): ``CORRECT`` for the right guess (the episode ends), ``WRONG`` for any
other, so an episode's return says how fast the secret was found. ``secret_of(seed)`` and
``step_reward`` are plain functions so a test can recompute an episode from its guesses.
"""

from __future__ import annotations

import random
from typing import Any, Optional
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

from number_guess.models import HIGH, LOW, GuessAction, GuessObservation

MAX_GUESSES = 4
CORRECT, WRONG = 1.0, -0.1


def secret_of(seed: Optional[int]) -> int:
    """The secret of the episode reset with ``seed`` (deterministic)."""
    return random.Random(seed).randint(LOW, HIGH)


def step_reward(secret: int, guess: int) -> float:
    return CORRECT if guess == secret else WRONG


def hint(secret: int, guess: int) -> str:
    if guess == secret:
        return f"{guess} is correct."
    return f"The secret number is {'higher' if secret > guess else 'lower'} than {guess}."


class NumberGuessEnvironment(Environment):
    """Guess the secret number; each episode (WebSocket session) has its own instance."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._secret = secret_of(None)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None,
              **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self._secret = secret_of(seed)
        return GuessObservation(message=f"Guess the secret whole number from {LOW} to {HIGH}.",
                                guesses_left=MAX_GUESSES, done=False, reward=0.0)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None,  # type: ignore[override]
             **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        left = MAX_GUESSES - self._state.step_count
        correct = action.guess == self._secret
        return GuessObservation(message=hint(self._secret, action.guess), guesses_left=left,
                                done=correct or left <= 0, reward=step_reward(self._secret, action.guess))

    @property
    def state(self) -> State:
        return self._state

"""The typed action and observation of number_guess (pydantic, OpenEnv's base types)."""

from openenv.core.env_server.types import Action, Observation
from pydantic import Field

LOW, HIGH = 1, 16  # the secret is drawn from [LOW, HIGH]


class GuessAction(Action):
    """One guess of the secret number."""

    guess: int = Field(..., ge=LOW, le=HIGH, description=f"a whole number from {LOW} to {HIGH}")


class GuessObservation(Observation):
    """The hint after a guess (or the task at reset) and how many guesses are left."""

    message: str = Field(default="", description="the task, or whether the secret is higher or lower")
    guesses_left: int = Field(default=0, description="guesses left before the episode ends")

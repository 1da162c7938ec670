"""number_guess: an OpenEnv environment where the agent guesses a secret number from hints."""

from number_guess.models import GuessAction, GuessObservation

__all__ = ["GuessAction", "GuessObservation"]

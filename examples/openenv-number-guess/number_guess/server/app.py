"""The FastAPI app of number_guess: ``uvicorn number_guess.server.app:app``."""

from openenv.core.env_server.http_server import create_app

from number_guess.models import GuessAction, GuessObservation
from number_guess.server.environment import NumberGuessEnvironment

app = create_app(NumberGuessEnvironment, GuessAction, GuessObservation, env_name="number_guess",
                 max_concurrent_envs=64)

"""The number_guess server: its Environment and the FastAPI app OpenEnv serves it with."""

"""The ``openenv`` environment: action parsing, config errors, and episodes on a real OpenEnv
server (openenv-core 0.3.0) through a real router.

The servers are real: the example environment ``examples/openenv-number-guess`` (installed by
requirements-dev.txt) started by the adapter as a uvicorn process on loopback, and, for the
failure cases, an openenv-core app over a subclass of it written here whose step hangs or
raises for chosen guesses. The engine behind the router is the scripted one of
``tests/agents/conftest.py`` (the random tiny model cannot be made to write a chosen action),
so the test decides the replies and recomputes each episode's return from the environment's
own logic. The end-to-end run on the tiny model is ``tests/e2e/test_openenv.py``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time

import pytest
from omegaconf import OmegaConf

from loongsage.config.validate import validate_config
from loongsage.data.sources import build_sources
from loongsage.plugin import ConfigError
from loongsage.plugins import get_registries

from loongsage_agents.environments.openenv_env import parse_action
from loongsage_agents.environments.openenv_server import InvalidAction

GUESS = {"type": "openenv", "env": "number_guess", "max_turns": 4, "size": 6, "held_out_size": 3,
         "concurrency": 1}


def config(*sources):
    return OmegaConf.create({"model": {"path": "unused"}, "data_sources": list(sources)})


def built(*sources, tokenizer=None):
    registries = get_registries()
    run = validate_config(config(*sources), registries)
    return build_sources(run.sources, registries, 0, tokenizer)


def run_group(source, prompt, n, engine):
    return asyncio.run(source.agent.run_group(prompt, n, engine, {"max_new_tokens": 16}))


# ---- action parsing -------------------------------------------------------------------------

@pytest.mark.parametrize("reply, action", [
    ('{"guess": 7}', {"guess": 7}),
    ('I will try 7.\n```json\n{"guess": 7}\n```', {"guess": 7}),
    ('{not json} then {"guess": 3} and {"guess": 4}', {"guess": 3}),  # the first JSON object
    ('{"a": {"b": [1, 2]}}', {"a": {"b": [1, 2]}}),
])
def test_an_action_is_the_first_json_object_of_the_reply(reply, action):
    assert parse_action(reply) == action


@pytest.mark.parametrize("reply", ["", "seven", "[7]", '"guess": 7', "{guess: 7}"])
def test_a_reply_without_a_json_object_is_an_invalid_action(reply):
    with pytest.raises(InvalidAction, match="^the reply holds no JSON object$"):
        parse_action(reply)


def test_an_observation_is_its_json_or_the_text_of_one_field():
    from loongsage_agents.environments.openenv_env import OpenEnvEnvironment
    from loongsage_agents.environments.openenv_params import OpenEnvParams

    observation = {"message": "Higher than 4.", "guesses_left": 2}
    as_json = OpenEnvEnvironment(OpenEnvParams(url="http://127.0.0.1:1"), None)
    assert json.loads(as_json.render(observation)) == observation
    one_field = OpenEnvEnvironment(OpenEnvParams(url="http://127.0.0.1:1", observation_field="message"), None)
    assert one_field.render(observation) == "Higher than 4."
    with pytest.raises(RuntimeError, match="observation_field 'message' is not a field of the observation "
                                           r"\(fields: guesses_left\)"):
        one_field.render({"guesses_left": 2})


# ---- config errors, before any actor starts --------------------------------------------------

def test_an_unknown_environment_names_the_installed_ones():
    with pytest.raises(ConfigError) as err:
        validate_config(config({"name": "o", "environment": {"type": "openenv", "env": "number_gues"}}),
                        get_registries())
    message = str(err.value)
    assert message.startswith("data_sources[0].environment: invalid parameters for environment 'openenv': "
                              "env: no installed OpenEnv environment 'number_gues' (installed: ")
    assert "number_guess" in message.split("(installed: ")[1].split(")")[0]


def test_without_the_library_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "openenv", None)  # found by no import from here on
    with pytest.raises(ConfigError) as err:
        validate_config(config({"name": "o", "environment": GUESS}), get_registries())
    message = str(err.value)
    assert message.startswith("data_sources[0].environment.type: environment 'openenv' needs the 'openenv' "
                              "library, which is not installed; install the extra [openenv] of "
                              "loongsage-agents: ")
    assert message.endswith("pip install 'openenv-core==0.3.0' 'websockets>=13' 'httpx>=0.27'")  # the extra's


@pytest.mark.parametrize("params, problem", [
    ({}, "name exactly one of env"),
    ({"env": "number_guess", "action_format": "xml"}, "action_format: expected one of json, tool_call, got 'xml'"),
    ({"env": "number_guess", "url": "http://127.0.0.1:1"}, "name exactly one of env"),
    ({"url": "127.0.0.1:8000"}, "url: expected an http(s):// base URL"),
    ({"env": "number_guess", "max_turns": 0}, "expected max_turns >= 1"),
])
def test_parameter_errors_name_the_key(params, problem):
    with pytest.raises(ConfigError, match=r"^data_sources\[0\]\.environment: invalid parameters for "
                                          r"environment 'openenv': " + problem.replace("(", r"\(").replace(")", r"\)")):
        validate_config(config({"name": "o", "environment": {"type": "openenv", **params}}), get_registries())


# ---- episodes on a real server through the router --------------------------------------------

@pytest.fixture(scope="module")
def guess_source(tokenizer):
    """A number_guess source; its environment starts the server once for the module's tests."""
    source = built({"name": "g", "environment": GUESS}, tokenizer=tokenizer)["g"]
    yield source
    source.agent.environment._server.stop()


def test_an_episode_plays_until_done_answering_invalid_actions_with_their_error(scripted_engine, tokenizer,
                                                                              guess_source):
    from number_guess.server.environment import CORRECT, WRONG, secret_of, step_reward

    source = guess_source
    prompt = source.get(2)
    seed = prompt.metadata["reset_seed"]
    assert seed == 2 and source.agent.environment.tasks("held_out").get(0).metadata["reset_seed"] == 6
    secret = secret_of(seed)
    wrong = 1 if secret != 1 else 2
    replies = ["I guess seven", '{"guess": 99}', f'Try: {{"guess": {wrong}}}', f'{{"guess": {secret}}}']
    try:
        [sample] = run_group(source, prompt, 1, scripted_engine(replies))
    finally:
        source.agent.close()
    info = sample.reward_info
    assert "failed" not in info
    expected = step_reward(secret, wrong) + step_reward(secret, secret)  # the environment's own logic
    assert info["episode_reward"] == pytest.approx(expected) == pytest.approx(WRONG + CORRECT)
    assert info["step_rewards"] == [WRONG, CORRECT]
    assert info["episode_metrics"] == {"invalid_actions": 2.0, "turns": 4.0, "steps": 2.0, "done": 1.0}
    # one trajectory, every turn in it: the errors and hints are user turns, the replies trained
    text = tokenizer.decode(sample.prompt_ids + sample.response_ids)
    for piece in ['"guess": {"description"', "Guess the secret whole number from 1 to 16.",
                  "Invalid action (the reply holds no JSON object)",
                  "Invalid action (guess: Input should be less than or equal to 16)",
                  f"The secret number is {'higher' if secret > wrong else 'lower'} than {wrong}.",
                  *replies]:
        assert piece in text, piece
    trained = tokenizer.decode([t for t, m in zip(sample.response_ids, sample.loss_mask) if m])
    assert all(reply in trained for reply in replies)
    assert "Invalid action" not in trained and "secret number is" not in trained  # out of the loss mask
    assert source.score(sample.text, None, prompt=prompt, sample=sample) == {"score": pytest.approx(expected)}


def test_max_turns_ends_an_episode_that_never_acts_validly(scripted_engine, guess_source):
    try:  # GUESS: max_turns 4
        [sample] = run_group(guess_source, guess_source.get(0), 1, scripted_engine(["no", "[1]", "{}", "x"]))
    finally:
        guess_source.agent.close()
    assert sample.reward_info["episode_reward"] == 0.0
    assert sample.reward_info["episode_metrics"] == {"invalid_actions": 4.0, "turns": 4.0, "steps": 0.0,
                                                     "done": 0.0}


def call(arguments: dict) -> str:
    """A reply that calls the tool act (the Hermes format the run's tool parser reads)."""
    return f'<tool_call>\n{json.dumps({"name": "act", "arguments": arguments})}\n</tool_call>'


def test_tool_call_actions_take_the_calls_arguments_and_answer_with_tool_results(scripted_engine, tokenizer,
                                                                               guess_source):
    from number_guess.server.environment import CORRECT, WRONG, secret_of

    url = asyncio.run(guess_source.agent.environment.ready())[0]  # the module's server
    env = {"type": "openenv", "url": url, "max_turns": 4, "action_format": "tool_call", "concurrency": 1}
    source = built({"name": "t", "environment": env}, tokenizer=tokenizer)["t"]
    prompt = source.get(3)
    secret = secret_of(3)
    wrong = 1 if secret != 1 else 2
    replies = ["Let me think.", call({"guess": 0}), call({"guess": wrong}), call({"guess": secret})]
    try:
        [sample] = run_group(source, prompt, 1, scripted_engine(replies))
    finally:
        source.agent.close()
    info = sample.reward_info
    assert info["step_rewards"] == [WRONG, CORRECT] and info["episode_reward"] == pytest.approx(WRONG + CORRECT)
    assert info["episode_metrics"] == {"invalid_actions": 2.0, "turns": 4.0, "steps": 2.0, "done": 1.0}
    text = tokenizer.decode(sample.prompt_ids + sample.response_ids)
    assert '"name": "act"' in text and '"guess"' in text  # the tool's schema is the action's
    no_call = text.index("Invalid action (the reply calls no tool; expected one call of act)")
    refused = text.index("Invalid action (guess: Input should be greater than or equal to 1)")
    hint = text.index(f"The secret number is {'higher' if secret > wrong else 'lower'} than {wrong}.")
    assert no_call < refused < hint
    assert text.count("<tool_response>") == 2  # the calls before the last, answered by tool results
    trained = tokenizer.decode([t for t, m in zip(sample.response_ids, sample.loss_mask) if m])
    assert "Invalid action" not in trained and "secret number is" not in trained
    assert trained.count("<tool_call>") == 3


def test_a_server_that_exits_at_start_is_an_error_with_its_output():
    from pathlib import Path

    from loongsage_agents.environments.openenv_server import LocalServer

    server = LocalServer("no_such_openenv_module")
    log = Path(server.log.name)
    with pytest.raises(RuntimeError, match=r"^the OpenEnv server of 'no_such_openenv_module' exited with 1: "
                                           r"(?s:.*)no_such_openenv_module"):
        server.wait_healthy(60)
    server.stop()
    assert not log.exists()  # its log goes with it


FLAKY_SERVER = '''
import time

from openenv.core.env_server.http_server import create_app

from number_guess.models import GuessAction, GuessObservation
from number_guess.server.environment import NumberGuessEnvironment


class FlakyGuess(NumberGuessEnvironment):
    """number_guess whose step hangs for guess 13 and raises for guess 14."""

    def step(self, action, timeout_s=None, **kwargs):
        if action.guess == 13:
            time.sleep(20)
        if action.guess == 14:
            raise RuntimeError("the environment crashed")
        return super().step(action, timeout_s, **kwargs)


app = create_app(FlakyGuess, GuessAction, GuessObservation, max_concurrent_envs=8)
'''


@pytest.fixture
def flaky_server(tmp_path):
    """A real openenv-core server of a number_guess subclass that hangs or raises on command."""
    import httpx

    (tmp_path / "flaky_guess.py").write_text(textwrap.dedent(FLAKY_SERVER))
    from loongsage_agents.environments.server_process import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "flaky_guess:app", "--port", str(port),
                             "--log-level", "warning"], cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None, "the test server did not start"
                time.sleep(0.2)
        yield url
    finally:
        proc.kill()
        proc.wait()


def test_a_hanging_or_failing_step_fails_its_episode_and_the_others_go_on(scripted_engine, tokenizer,
                                                                        flaky_server):
    from number_guess.server.environment import secret_of, step_reward

    env = {"type": "openenv", "url": flaky_server, "max_turns": 1, "step_timeout_s": 1.0, "concurrency": 1}
    source = built({"name": "f", "environment": env}, tokenizer=tokenizer)["f"]
    prompt = source.get(5)
    guess = 1
    try:
        samples = run_group(source, prompt, 3, scripted_engine(['{"guess": 13}', '{"guess": 14}',
                                                                f'{{"guess": {guess}}}']))
    finally:
        source.agent.close()
    hung, crashed, ok = samples
    assert hung.reward_info["failed"] == ("the environment's episode failed: RuntimeError: the OpenEnv server "
                                          "did not answer step within 1 s (step_timeout_s)")
    assert crashed.reward_info["failed"] == ("the environment's episode failed: RuntimeError: the OpenEnv "
                                             "server refused step: the environment crashed (EXECUTION_ERROR)")
    assert ok.reward_info["episode_reward"] == step_reward(secret_of(5), guess)
    assert all(s.response_ids for s in samples)  # each made its model call, recorded token-exactly
    assert [source.score(s.text, None, prompt=prompt, sample=s)["score"] for s in samples] == \
        [0.0, 0.0, step_reward(secret_of(5), guess)]

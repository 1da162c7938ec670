"""Fixtures for the agent tests: the tiny model (and a long-context view of it), a real
embedded engine, a scripted engine replica, and trajectory checks shared by every agent test.

``long_tiny_model_dir`` is the same tiny model (weights symlinked) with
``max_position_embeddings`` raised to 32768: real agent CLIs send prompts of 4–8 K tokens
(system prompt and tool schemas) and the tiny model's nominal 2048 would refuse them. Qwen2's
rotary embedding is computed for any position, so the weights are unchanged and the engine
and the train engine see the same model.

``ScriptedEngine`` stands in for the engine only where the random tiny model cannot do what
a test needs (emit a tool call): it answers with the real tokenizer's ids of a scripted reply
plus the end-of-turn token and fixed logprobs. Router, SDK, agent and sandbox are real.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from loongsage.engines.replies import GenerateOutput, StreamChunk

LONG_CONTEXT = 32768


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def agent_context(tokenizer):
    """``agent_context(sandbox=None)``: the ``SourceContext`` a data source lends its agent,
    with this session's registries; ``sandbox`` is a ``data_sources[*].sandbox`` node."""
    from loongsage.data.sources import SandboxFactory, SourceContext
    from loongsage.plugins import get_registries

    def make(sandbox: Any = None, tokenizer: Any = tokenizer) -> SourceContext:
        registries = get_registries()
        factory = None if sandbox is None else SandboxFactory(
            registries.resolve("sandbox", sandbox, "data_sources[0].sandbox", "type"))
        return SourceContext("test", "data_sources[0]", tokenizer, registries, factory)

    return make


@pytest.fixture(scope="session")
def long_tiny_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny-long")
    for f in Path(tiny_model_dir).iterdir():
        if f.name == "config.json":
            config = json.loads(f.read_text())
            config["max_position_embeddings"] = LONG_CONTEXT
            (out / f.name).write_text(json.dumps(config))
        else:
            os.symlink(f, out / f.name)
    return out


@pytest.fixture(scope="session")
def engine_url(running_engine, long_tiny_model_dir):
    with running_engine(long_tiny_model_dir) as engine:
        yield engine.url


@pytest.fixture(scope="session")
def trainer(long_tiny_model_dir):
    from loongsage.schema import ModelConfig, TrainConfig
    from loongsage.engines.embedded_train import EmbeddedTrainEngine

    return EmbeddedTrainEngine(ModelConfig(path=str(long_tiny_model_dir)), TrainConfig(),
                               device="cpu")


@pytest.fixture(scope="session")
def long_context() -> int:
    return LONG_CONTEXT


@pytest.fixture(scope="session")
def check_logprobs(trainer):
    """``check_logprobs(samples)``: every sampled token's stored rollout logprob equals the
    train engine's (fp32, within 1e-5)."""
    return lambda samples: assert_logprobs_match_trainer(trainer, samples)


def assert_logprobs_match_trainer(trainer: Any, samples: list) -> None:
    from loongsage.engines.batch import TrainBatch

    for s in samples:  # one row each: sequences differ a lot in length
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        mask = torch.zeros(ids.shape, dtype=torch.float32)
        mask[0, len(s.prompt_ids):] = torch.tensor(s.loss_mask, dtype=torch.float32)
        rollout = torch.zeros(ids.shape)
        rollout[0, len(s.prompt_ids):] = torch.tensor(s.response_logprobs)
        got = trainer.compute_logprobs(TrainBatch(ids, torch.ones_like(ids), mask))["logprobs"]
        sel = mask > 0
        assert sel.sum() == sum(s.loss_mask) > 0
        torch.testing.assert_close(got[sel], rollout[sel], atol=1e-5, rtol=0)


class ScriptedEngine:
    """Stands in for ``EngineClient`` where the random tiny model cannot (see module docstring)."""

    LOGPROB, VERSION = -0.5, 2

    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.sampling_seen: list[dict[str, Any]] = []  # the sampling of every request, in order

    def _ids(self, sampling_params: dict[str, Any] | None) -> list[int]:
        self.sampling_seen.append(dict(sampling_params or {}))
        return self.tokenizer.encode(self.replies.pop(0), add_special_tokens=False) + [self.eos]

    async def agenerate(self, input_ids, sampling_params=None, *, return_logprob=True, rid=None):
        ids = self._ids(sampling_params)
        return GenerateOutput(ids, [self.LOGPROB] * len(ids), "stop", self.VERSION,
                              len(input_ids), rid or "")

    async def astream_generate(self, input_ids, sampling_params=None, *, return_logprob=True,
                               rid=None):
        ids = self._ids(sampling_params)
        for i, tok in enumerate(ids):
            last = i == len(ids) - 1
            yield StreamChunk([tok], [self.LOGPROB], "", last, "stop" if last else None,
                              self.VERSION, rid or "")

    async def aabort(self, rid=None, *, abort_all=False):
        return None


@pytest.fixture
def scripted_engine(tokenizer):
    return lambda replies: ScriptedEngine(tokenizer, replies)


class Recorder:
    """A router middleware (registered at run time) that keeps each answered turn's normalised
    request: messages, tools, whether it is trained, and its prompt/completion token counts."""

    def __init__(self) -> None:
        self.turns: list[dict[str, Any]] = []

    def factory(self, settings: Any, params: Any) -> Any:
        from loongsage.agentflow.middleware import RouterMiddleware

        turns = self.turns

        class Recording(RouterMiddleware):
            def on_result(self, ctx, result) -> None:
                turns.append({"trajectory_id": ctx.trajectory.trajectory_id,
                              "trainable": ctx.trainable, "messages": ctx.request.messages,
                              "tools": ctx.request.tools, "prompt_tokens": result.prompt_tokens,
                              "completion_tokens": result.completion_tokens})

        return Recording()


@pytest.fixture
def recording_router(request, tokenizer):
    """``recording_router(agent, engine=None, run_dir=None) -> Recorder``: start a router with
    the agent's own settings plus the recorder, over ``engine`` (default: the real embedded
    engine, started on first use), persisting to ``run_dir`` when given, and hand it to the
    agent (``use_router``, the controller's path)."""
    from loongsage import hookimpl
    from loongsage.agentflow.server import Router
    from loongsage.config.router_plugins import resolve_router_plugins
    from loongsage.engines.client import EngineClient
    from loongsage.plugins import load_plugins

    started = []

    def make(agent: Any, engine: Any = None, run_dir: Any = None) -> Recorder:
        recorder = Recorder()

        class Plugin:
            @hookimpl
            def loongsage_register_router_middlewares(self, register):
                register("test_recorder", recorder.factory, doc="Test: record turns.")

        registries = load_plugins(extra=[(Plugin(), "agents-test-recorder")])
        recording = resolve_router_plugins(registries, None, ["test_recorder"])
        settings = agent.router_settings().with_plugins(recording)
        settings.run_dir = str(run_dir) if run_dir is not None else None
        if engine is None:
            engine = EngineClient(request.getfixturevalue("engine_url"))
        router = Router([engine], tokenizer, settings)
        router.start()
        started.append(router)
        agent.use_router(router)
        return recorder

    yield make
    for router in started:
        router.stop()


@pytest.fixture(scope="session")
def check_trajectories(tokenizer, trainer):
    """``check_trajectories(samples, recorder)``: for every trajectory the stored tokens decode
    to the conversation the agent sent (its last request before each sample's last sampled run,
    rendered from scratch with the model's template), the loss mask covers exactly the tokens
    the engine generated for trained turns, and rollout logprobs equal the train engine's."""
    from loongsage.agentflow.messages import template_messages

    def check(samples: list, recorder: Recorder) -> None:
        tids = {s.reward_info["trajectory_id"] for s in samples}
        trained = [t for t in recorder.turns if t["trainable"] and t["trajectory_id"] in tids]
        assert trained, "no trained turn was recorded"
        assert sum(sum(s.loss_mask) for s in samples) == sum(t["completion_tokens"] for t in trained)
        for s in samples:
            ids = s.prompt_ids + s.response_ids
            mask = [0] * len(s.prompt_ids) + list(s.loss_mask)
            start = max(i for i, m in enumerate(mask) if m)
            while mask[start - 1]:
                start -= 1
            turn = next(t for t in trained if t["trajectory_id"] == s.reward_info["trajectory_id"]
                        and t["prompt_tokens"] == start)
            expected = tokenizer.apply_chat_template(
                template_messages(turn["messages"]), tools=turn["tools"] or None, tokenize=False,
                add_generation_prompt=True)
            assert tokenizer.decode(ids[:start]) == expected
        assert_logprobs_match_trainer(trainer, samples)

    return check

"""Router replay (R3, R2) on ``builtin:tiny_moe`` with the real engines: the embedded rollout
engine over HTTP records routes, the TITO store keeps them aligned through a multi-turn
trajectory whose first turn is a partial rollout continued after a weight update, and the
embedded train engine replays them."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from loongsage.agentflow.messages import ChatRequest
from loongsage.agentflow.store import Trajectory
from loongsage.agentflow.tito import ChatRenderer, plan_turn, record_generation
from loongsage.controller.batching import groups_to_batch
from loongsage.data.types import Group, Prompt
from loongsage.engines.batch import TrainBatch
from loongsage.engines.client import EngineClient
from loongsage.engines.replies import EngineError
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.engines.routing import MoeRouters
from loongsage.errors import ConfigError
from loongsage.schema import ModelConfig, TrainConfig

PROMPTS = [[5, 17, 42, 99, 7, 64, 3], [300, 12], [8, 9, 10, 11, 12, 13, 14, 15, 200, 201, 33, 90]]
GREEDY = {"max_new_tokens": 12, "temperature": 1.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def moe_dir():
    from loongsage.models.resolve import resolve_model_path

    return resolve_model_path("builtin:tiny_moe")


@pytest.fixture(scope="module")
def engine(running_engine, moe_dir):
    with running_engine(moe_dir, max_running_requests=8, seed=3) as eng:
        yield eng


@pytest.fixture(scope="module")
def base_routers(moe_dir):
    state = AutoModelForCausalLM.from_pretrained(moe_dir).state_dict()
    return {n: t.clone() for n, t in state.items() if n.endswith("mlp.gate.weight")}


@pytest.fixture(scope="module")
def client(engine):
    with EngineClient(engine.url, timeout=120, return_routed_experts=True) as c:
        yield c


def trainer(path, replay="off", **train) -> EmbeddedTrainEngine:
    return EmbeddedTrainEngine(ModelConfig(path=str(path)), TrainConfig(**{"lr": 1e-3, **train}),
                               device="cpu", router_replay=replay)


def own_routes(model, ids: list[int]) -> np.ndarray:
    """A plain HF forward's routes of ``ids`` (one unpadded row)."""
    routers = MoeRouters(model)
    with torch.no_grad(), routers.routing(capture=True) as routed:
        model(torch.tensor([ids]))
    return routed.routes().numpy()


def perturb_routers(named: dict, scale: float = 0.1, seed: int = 0) -> dict:
    """New router weights (``*.mlp.gate.weight``), far enough to re-route about 40 % of the tokens in some layer."""
    g = torch.Generator().manual_seed(seed)
    return {n: t + scale * torch.randn(t.shape, generator=g) for n, t in named.items() if n.endswith("mlp.gate.weight")}


def test_tiny_moe_is_a_deterministic_top2_qwen3_moe(tmp_path, moe_dir):
    from loongsage.models.tiny_moe import build_tiny_moe_model

    config = AutoModelForCausalLM.from_pretrained(moe_dir).config
    assert (config.model_type, config.num_experts, config.num_experts_per_tok) == ("qwen3_moe", 4, 2)
    again = build_tiny_moe_model(tmp_path / "again")
    assert (again / "model.safetensors").read_bytes() == (moe_dir / "model.safetensors").read_bytes()


def test_engine_routes_equal_an_unbatched_hf_forward(client, moe_dir):
    """Continuous batching (left-padded prefill of 3 prompts of different lengths, then decode)
    records, for every token the model consumed, the experts a plain forward routes it to."""
    hf = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()

    async def all_prompts():
        return await asyncio.gather(*(client.agenerate(p, GREEDY) for p in PROMPTS))

    for prompt, out in zip(PROMPTS, asyncio.run(all_prompts())):
        tokens = prompt + out.output_ids
        assert out.routed_experts.shape == (len(tokens), 4, 2)
        assert (out.routed_experts[-1] == -1).all()  # the last token was never fed
        expected = own_routes(hf, tokens)[:-1]
        assert np.array_equal(np.sort(out.routed_experts[:-1], -1), np.sort(expected, -1))


def test_dense_models_refuse_router_replay(tiny_model_dir, running_engine):
    with pytest.raises(ConfigError, match="trainer.router_replay.*dense model"):
        trainer(tiny_model_dir, replay="rollout")
    with pytest.raises(ConfigError, match="trainer.router_replay.*expected one of"):
        trainer(tiny_model_dir, replay="always")
    with running_engine(tiny_model_dir) as dense, \
            EngineClient(dense.url, timeout=60, return_routed_experts=True) as c, \
            pytest.raises(EngineError, match="return_routed_experts.*dense model"):
        c.generate([5, 6, 7], GREEDY)


def multi_turn_sample(engine, client, tokenizer, base_routers):
    """A two-turn trajectory: turn 1 is cut after 5 tokens, the engine's routers change (a
    weight update), and turn 1 continues from its tokens (partial rollout); a tool result
    follows and turn 2 is generated. Returns the trainable sample and the weights it ended on."""
    engine.apply_weights(base_routers)
    renderer = ChatRenderer(tokenizer)
    traj = Trajectory("r3", "0")
    msgs = [{"role": "user", "content": "list the files"}]
    plan = plan_turn(traj, ChatRequest("openai_chat", "m", msgs), renderer)
    head = client.generate(plan.prompt_ids, {**GREEDY, "max_new_tokens": 5})
    new = perturb_routers(base_routers)
    engine.apply_weights(new)
    rest = client.generate(plan.prompt_ids + head.output_ids, {**GREEDY, "max_new_tokens": 6})
    ids = head.output_ids + rest.output_ids
    record_generation(traj, plan.segment, ids, head.output_logprobs + rest.output_logprobs,
                      [0] * 5 + [1] * 6, "length", {"role": "assistant", "content": tokenizer.decode(ids)},
                      "", rest.routed_experts)
    msgs = msgs + [traj.segments[0].messages[-1], {"role": "user", "content": "a.txt b.txt"}]
    plan2 = plan_turn(traj, ChatRequest("openai_chat", "m", msgs), renderer)
    assert plan2.segment is plan.segment  # the same conversation, extended
    out = client.generate(plan2.prompt_ids, GREEDY)
    record_generation(traj, plan2.segment, out.output_ids, out.output_logprobs, [1] * len(out.output_ids),
                      "length", {"role": "assistant", "content": "done"}, "", out.routed_experts)
    [sample] = traj.to_samples(reward=1.0)
    return sample, new, out


def test_replayed_routes_equal_recorded_after_multi_turn_partial_rollout(engine, client, moe_dir, base_routers):
    tokenizer = AutoTokenizer.from_pretrained(moe_dir)
    sample, new_routers, last = multi_turn_sample(engine, client, tokenizer, base_routers)
    tokens = sample.prompt_ids + sample.response_ids
    routes = sample.routed_experts
    assert routes.shape == (len(tokens), 4, 2)
    # the last request covered the whole conversation: every token but the final one is recorded
    recorded = (routes >= 0).all(axis=(1, 2))
    assert recorded[:-1].all() and not recorded[-1]
    assert np.array_equal(routes, last.routed_experts)

    batch, _, _ = groups_to_batch([Group(0, Prompt("s", 0, []), [sample])], pad_id=0)
    fresh = trainer(moe_dir, replay="rollout")  # the pre-update routers: its own routes differ
    out = fresh.compute_logprobs(batch, with_routes=True)
    used = out["routed_experts"][0, : len(tokens)].numpy()
    assert np.array_equal(used[:-1], routes[:-1])  # token for token, every layer, in order

    updated = trainer(moe_dir, replay="rollout")
    updated.model.load_state_dict(new_routers, strict=False)  # the weights the rollout ended on
    scored = updated.compute_logprobs(batch)["logprobs"][0]
    p = len(sample.prompt_ids)
    turn2 = slice(len(tokens) - len(last.output_ids), len(tokens))
    torch.testing.assert_close(scored[turn2], torch.tensor(last.output_logprobs), atol=1e-4, rtol=0)
    assert p < turn2.start


def test_mismatch_is_zero_with_replay_and_reported_without(engine, client, moe_dir, base_routers):
    tokenizer = AutoTokenizer.from_pretrained(moe_dir)
    sample, _, _ = multi_turn_sample(engine, client, tokenizer, base_routers)
    batch, _, _ = groups_to_batch([Group(0, Prompt("s", 0, []), [sample])], pad_id=0)

    def loss(ctx):
        return -(ctx.logprobs * ctx.batch.loss_mask).sum() / ctx.global_num_tokens

    off = trainer(moe_dir, replay="off").train_step(batch, loss)
    assert off["train/routing_mismatch"] == off["train/routing_mismatch_own"] > 0.05
    r3_engine = trainer(moe_dir, replay="rollout")
    gate = r3_engine.model.model.layers[0].mlp.gate.weight
    before = gate.detach().clone()
    r3 = r3_engine.train_step(batch, loss)
    assert r3["train/routing_mismatch"] == 0.0
    assert r3["train/routing_mismatch_own"] > 0  # own choices given the replayed upstream layers
    assert not torch.equal(gate.detach(), before)  # the router still learns under replay


def test_replaying_own_routes_changes_nothing_and_r2_replays_pi_old(moe_dir):
    """Gate weights recomputed from the training logits equal the model's own when the replayed
    selection is its own; R2 records pi_old's routes and needs them for the train step."""
    ids = torch.tensor([PROMPTS[0] + [1, 2, 3, 4, 5]])
    batch = TrainBatch(ids, torch.ones_like(ids), torch.ones(ids.shape), {"rollout_logprobs": torch.zeros(ids.shape)})
    r2 = trainer(moe_dir, replay="old_policy")
    old = r2.compute_logprobs(batch)
    assert old["routed_experts"].shape == (*ids.shape, 4, 2)
    batch.extras["routed_experts"] = old["routed_experts"]
    r3 = trainer(moe_dir, replay="rollout")
    torch.testing.assert_close(r3.compute_logprobs(batch)["logprobs"], old["logprobs"], atol=1e-6, rtol=0)
    with pytest.raises(ConfigError, match="old_routed_experts"):
        r2.train_step(batch, lambda ctx: ctx.logprobs.sum())
    batch.extras["old_routed_experts"] = old["routed_experts"]
    assert r2.train_step(batch, lambda ctx: -ctx.logprobs.mean())["train/routing_mismatch"] == 0.0

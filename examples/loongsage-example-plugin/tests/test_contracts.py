"""Every plugin this package registers passes LoongSage's contract checks, as the built-ins do,
and does what its docstring says. The package has one entry of every plugin kind: a kind
added to LoongSage without an entry here fails the first test."""

import asyncio
from types import SimpleNamespace

import pytest
import torch

from loongsage.plugin import (
    KIND_CONTRACTS, AdvantageInputs, ConfigError, Group, LossContext, PolicyLossInputs, Prompt, Sample,
    TrainBatch, TurnContext, WindowView,
)
from loongsage.plugin.testing import (
    check_entry, check_reward_contract, entries_of, installed_registries, tiny_model,
)
from loongsage_example_plugin import params as p
from loongsage_example_plugin.abs_log_ratio import abs_log_ratio
from loongsage_example_plugin.bracket_parser import BracketParser
from loongsage_example_plugin.clipped_reinforce import clipped_reinforce
from loongsage_example_plugin.entropy_bonus import ENTROPY_BONUS, EntropyTerm
from loongsage_example_plugin.exact_match import exact_match
from loongsage_example_plugin.fixed_list import FixedList
from loongsage_example_plugin.frozen_scorer import FrozenScorer
from loongsage_example_plugin.header_tag import HeaderTag
from loongsage_example_plugin.length_cap import length_cap
from loongsage_example_plugin.max_in_flight import MaxInFlight
from loongsage_example_plugin.median_baseline import median_baseline
from loongsage_example_plugin.static_tasks import StaticTasks
from loongsage_example_plugin.tempdir_sandbox import TempdirSandbox
from loongsage_example_plugin.token_cap import token_cap

EXPECTED = {
    "agent": "plain_prompt", "reward": "exact_match", "sandbox": "tempdir", "dataset": "fixed_list",
    "environment": "static_tasks", "tool_parser": "bracket", "router_middleware": "header_tag",
    "advantage": "median_baseline", "policy_loss": "clipped_reinforce", "kl_policy": "abs_log_ratio",
    "is_correction": "token_cap", "data_filter": "length_cap", "window_policy": "max_in_flight",
    "engine": "frozen_scorer", "tracker": "csv", "step_term": "entropy_bonus", "command": "csv-tail",
}


def test_one_entry_of_every_kind_each_honouring_its_kinds_contract():
    assert set(EXPECTED) == set(KIND_CONTRACTS), "every plugin kind needs one example entry"
    entries = list(entries_of(installed_registries(), "loongsage-example-plugin"))
    assert sorted((e.kind, e.name) for e in entries) == sorted(EXPECTED.items())
    for entry in entries:
        check_entry(entry)


def test_the_reward_scores_the_final_answer():
    check_reward_contract(exact_match, p.ExactMatchParams())
    assert exact_match("so the answer is 42.", 42, p.ExactMatchParams())["score"] == 1.0
    assert exact_match("42 is not the answer: 41", 42, p.ExactMatchParams())["score"] == 0.0


def test_the_dataset_and_the_environments_tasks_are_seeded_shuffles_of_the_list():
    first_epoch = [FixedList(p.FixedListParams(), seed=3).get(i).ground_truth for i in range(3)]
    assert sorted(first_epoch) == ["3", "42", "5"]
    tasks = StaticTasks(p.StaticTasksParams(), None).tasks("train")
    assert len(tasks) == 3 and isinstance(tasks.get(4), Prompt) and tasks.get(4).index == 4


def test_the_sandbox_runs_commands_in_its_folder_and_refuses_untrusted_code():
    async def run():
        async with TempdirSandbox(p.TempdirParams(), files={"in.txt": "hi"}, untrusted=False) as box:
            result = await box.exec("cat in.txt > out.txt && echo done")
            return result.stdout, await box.read_file("out.txt"), await box.list_files()

    assert asyncio.run(run()) == (b"done\n", b"hi", ["in.txt", "out.txt"])
    with pytest.raises(ConfigError, match="refuses untrusted code"):
        TempdirSandbox(p.TempdirParams())


def test_the_tool_parser_and_the_middleware():
    parsed = BracketParser().parse('Adding. [[call calculator {"expression": "2 + 3"}]]')
    assert (parsed.content, parsed.tool_calls[0].name, parsed.tool_calls[0].args_object()) == \
        ("Adding.", "calculator", {"expression": "2 + 3"})
    ctx = TurnContext(request=None, headers={"x-task-tag": "arm-b"}, trajectory=SimpleNamespace(metadata={}))
    asyncio.run(HeaderTag(None, p.HeaderTagParams()).on_request(ctx))
    assert ctx.trajectory.metadata == {"task_tag": "arm-b"}


def test_the_algorithms_compute_what_they_say():
    mask = torch.ones(3, 1)
    rewards = AdvantageInputs(torch.tensor([1.0, 2.0, 9.0]), torch.zeros(3, 1), torch.tensor([0, 0, 0]), mask)
    assert median_baseline(rewards, p.MedianBaselineParams()).flatten().tolist() == [-1.0, 0.0, 7.0]
    logprobs = torch.tensor([[-0.5]], requires_grad=True)  # ratio e > cap 2: the weight is 2
    old, one = torch.tensor([[-1.5]]), torch.ones(1, 1)
    loss = clipped_reinforce(PolicyLossInputs(logprobs, old, old, one, one), p.ClippedReinforceParams()).loss
    loss.sum().backward()
    assert logprobs.grad.item() == pytest.approx(-2.0)
    assert abs_log_ratio(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-2.0, -1.0]])).tolist() == [[1.0, 1.0]]
    old = torch.log(torch.tensor([[3.0, 0.5]]))
    weight = token_cap(PolicyLossInputs(old, old, torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2)),
                       p.TokenCapParams()).weight
    assert weight[0].tolist() == pytest.approx([2.0, 0.5])


def test_the_filter_and_the_window_policy():
    def group(length):
        return Group(0, Prompt("s", 0, [{"role": "user", "content": "q"}]),
                     [Sample([1], [2] * length, [0.0] * length, [0] * length, [1] * length)])

    short, long = group(2), group(3)
    result = length_cap([short, long], p.LengthCapParams(max_response_tokens=2))
    assert result.groups == [short] and result.metrics == {"rollout/length_cap_dropped": 1.0}
    view = WindowView(batch_size=4, stale_steps=1, capacity=16, in_flight=6, buffered=0, training=0,
                      next_seq=6, oldest_uncollected_seq=0, version=0)
    assert MaxInFlight(p.MaxInFlightParams(limit=8)).dispatch_count(view) == 2


def test_the_step_term_is_off_by_default_and_adds_an_entropy_bonus():
    assert ENTROPY_BONUS.validate({}, None) is None
    assert ENTROPY_BONUS.validate({"entropy_bonus": {"coef": 0.1}}, None) == 0.1
    with pytest.raises(ConfigError, match="entropy_bonus.coef"):
        ENTROPY_BONUS.validate({"entropy_bonus": {"coef": -1.0}}, None)
    mask = torch.tensor([[0.0, 1, 1], [0, 1, 0]])
    batch = TrainBatch(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3), mask)
    entropy = torch.tensor([[9.0, 1.0, 2.0], [9.0, 3.0, 9.0]])  # only loss tokens count: mean 2
    loss, metrics = EntropyTerm(0.1).loss(LossContext(batch, torch.zeros(2, 3), entropy, 3.0, 2.0))
    assert loss.item() == pytest.approx(-0.2) and metrics == {"train/entropy_bonus": pytest.approx(0.2)}


def test_the_engine_scores_token_logprobs_with_a_frozen_model():
    scorer = FrozenScorer.from_config({"model": {"path": str(tiny_model())}}, device="cpu")
    scores = scorer.score(torch.tensor([[1, 5, 7, 9]]), torch.ones(1, 4, dtype=torch.long))
    assert scores.shape == (1, 4) and scores[0, 0] == 0 and bool((scores[0, 1:] < 0).all())

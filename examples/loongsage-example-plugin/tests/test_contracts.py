"""Every plugin this package registers passes LoongSage's contract checks, as the built-ins do."""

from loongsage.plugin.testing import check_entry, check_reward_contract, entries_of, installed_registries
from loongsage_example_plugin.exact_match import exact_match
from loongsage_example_plugin.params import ExactMatchParams


def test_every_registered_plugin_honours_its_kinds_contract():
    entries = list(entries_of(installed_registries(), "loongsage-example-plugin"))
    assert sorted((e.kind, e.name) for e in entries) == [
        ("command", "csv-tail"), ("reward", "exact_match"), ("tracker", "csv")]
    for entry in entries:
        check_entry(entry)


def test_the_reward_scores_the_final_answer():
    check_reward_contract(exact_match, ExactMatchParams())
    assert exact_match("so the answer is 42.", 42, ExactMatchParams())["score"] == 1.0
    assert exact_match("42 is not the answer: 41", 42, ExactMatchParams())["score"] == 0.0

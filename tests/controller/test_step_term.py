"""A step term from a config-local plugin module drives the train step through core's seam.

The module is written to a temporary folder and named in the recipe's ``plugins:`` list; its
step term is found through ``loongsage_register_step_terms``, owns a config section of its
own (``probe``) and a key of every data source (``probe_target``), validates them, adds its
share to the memory estimate, is built by the controller (``start_step_extension``), writes
its input into the batch, and its term trains the tiny model in this process through the
``TrainStep`` and the ``Objective``: a cross-entropy towards per-token target tokens computed
inside the engine's chunked LM head (a ``LogitTerm``). With ``rl_weight`` 0 no π_old forward
or advantage runs; with 0.5 the term shapes the advantages and the RL loss is scaled.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from loongsage.algorithms.objective import Objective
from loongsage.config.compose import load_config
from loongsage.config.validate import as_container
from loongsage.controller.memory_budget import ModelShape, estimate_run
from loongsage.controller.placement import Seat
from loongsage.controller.step_extension import start_step_extension
from loongsage.controller.train_step import TrainStep
from loongsage.errors import ConfigError
from loongsage.engines.batch import TrainBatch
from loongsage.engines.distributed import RankShards
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.plugins import clear_cache
from loongsage.schema import ModelConfig, TrainConfig

PROBE = '''
from dataclasses import dataclass
from typing import Optional

import torch
from loongsage.plugin import ConfigError, LogitTerm, MemoryShare, hookimpl

BUILT, SHAPED = [], []


def cross_entropy(logits, target):
    return (torch.logsumexp(logits, -1) - logits.gather(-1, target.long()[:, None])[:, 0])[:, None]


class ProbeTerm:
    needs_entropy = False
    old_logit_term = None
    logit_term = LogitTerm(cross_entropy, ("probe_target",), width=1)

    def __init__(self, rl_weight):
        self.rl_weight = rl_weight

    def shape_advantages(self, batch, advantages, old):
        SHAPED.append(float(old["logprobs"].abs().sum()))
        return advantages + 1.0, {"probe/shaped": 1.0}

    def loss(self, ctx):
        mask = ctx.batch.loss_mask
        ce = (ctx.logit_values[..., 0] * mask).sum() / ctx.global_num_tokens
        return (1.0 - self.rl_weight) * ce, {"probe/ce": float(ce.detach())}

    def finish_metrics(self, metrics):
        return {**metrics, "probe/finished": 1.0}


class ProbeExtension:
    def __init__(self, context):
        BUILT.append(context)
        self.actors = {}
        self.train_term = ProbeTerm(1.0 - context.settings["weight"])
        self.targets = context.settings["targets"]

    def before_train(self, batch, row_sources):
        target = torch.tensor([self.targets[source] for source in row_sources])
        batch.extras["probe_target"] = target[:, None].expand_as(batch.input_ids).clone()
        return {"probe/rows": float(len(row_sources))}

    def close(self):
        pass


@dataclass
class ProbeConfig:
    weight: float = 0.0  # the probe loss's weight; 0 = off


@dataclass
class ProbeSourceConfig:
    probe_target: Optional[int] = None  # the token this source's rows are pulled towards


class Probe:
    section = "probe"
    schema = ProbeConfig
    source_schema = ProbeSourceConfig

    def validate(self, cfg, registries):
        if cfg.probe.weight == 0:
            return None
        if not 0 < cfg.probe.weight <= 1:
            raise ConfigError("probe.weight", f"expected a weight in (0, 1], got {cfg.probe.weight}")
        return {"weight": float(cfg.probe.weight),
                "targets": {s.name: s.probe_target or 0 for s in cfg.data_sources}}

    def memory(self, cfg, settings, batch_tokens):
        return (MemoryShare("probe targets", 1000, 8 * batch_tokens, "one token id a position"),)

    def build(self, context):
        return ProbeExtension(context)


@hookimpl
def loongsage_register_step_terms(register):
    register("probe", Probe())
'''


def batch(n=4, length=16) -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (n, length), generator=g)
    mask = torch.zeros(n, length)
    mask[:, length // 2:] = 1.0
    return TrainBatch(ids, torch.ones(n, length, dtype=torch.long), mask,
                      {"rollout_logprobs": torch.zeros(n, length)})


def cross_entropy(engine, b, term) -> float:
    """The term's own per-token value, evaluated by the engine without grad (its mean over loss tokens)."""
    values = engine.compute_logprobs(b, logit_term=term.logit_term)["logit_values"][..., 0]
    return float((values * b.loss_mask).sum() / b.loss_mask.sum())


def one_rank(rows: int) -> RankShards:
    """Every row on the one rank, one mini-batch."""
    return RankShards([torch.arange(rows)], [torch.zeros(rows, dtype=torch.bool)], 1)


def load_probe(tmp_path, monkeypatch, *overrides):
    (tmp_path / "probe_step_plugin.py").write_text(textwrap.dedent(PROBE))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("probe_step_plugin", None)
    return load_config("tiny/grpo", ["plugins=[probe_step_plugin]", *overrides])


@pytest.mark.calls_hook("loongsage_register_step_terms")
def test_a_step_term_owns_its_section_and_is_off_at_its_defaults(tmp_path, monkeypatch, tiny_model_dir):
    try:
        off = load_probe(tmp_path, monkeypatch)
        with pytest.raises(ConfigError, match=r"^probe.weight: expected a weight in \(0, 1\], got 2.0"):
            load_probe(tmp_path, monkeypatch, "probe.weight=2")
        with pytest.raises(ConfigError, match=r"^probe.wieght: unknown key; did you mean probe.weight\?"):
            load_probe(tmp_path, monkeypatch, "probe.wieght=0.5")
        on = load_probe(tmp_path, monkeypatch, "probe.weight=0.5", "data_sources.0.probe_target=9")
    finally:
        clear_cache()
    assert off.step_terms == () and off.cfg.probe.weight == 0 and off.cfg.data_sources[0].probe_target is None
    (term,) = on.step_terms
    assert term.plugin.name == "probe"
    assert term.settings == {"weight": 0.5, "targets": {"arithmetic": 9}}
    shape = ModelShape.from_folder(str(tiny_model_dir))
    without, with_probe = estimate_run(on.cfg, shape, 100), estimate_run(on.cfg, shape, 100, step_terms=on.step_terms)
    rows = on.cfg.rollout.prompts_per_step * on.cfg.rollout.n_samples_per_prompt
    assert "probe targets" not in without.parts and with_probe.parts["probe targets"] == 1000
    assert with_probe.parts["train actor"] - without.parts["train actor"] == 8 * rows * 100


@pytest.mark.calls_hook("loongsage_register_step_terms")
@pytest.mark.parametrize("weight", [1.0, 0.5])
def test_a_plugin_step_term_trains_through_the_objective(tmp_path, monkeypatch, tiny_model_dir, weight):
    try:
        spec = load_probe(tmp_path, monkeypatch, f"probe.weight={weight}", "data_sources.0.probe_target=7")
        probe = sys.modules["probe_step_plugin"]
        extension = start_step_extension(spec.step_terms[0], as_container(spec.cfg),
                                         Seat("train", 0, "", 0, 0, 0, threads=1))
    finally:
        clear_cache()
    (context,) = probe.BUILT
    assert context.settings is spec.step_terms[0].settings and context.config["probe"]["weight"] == weight
    assert callable(context.spawn)

    b = batch()
    metrics = extension.before_train(b, ["arithmetic"] * len(b))
    assert metrics == {"probe/rows": 4.0} and (b.extras["probe_target"] == 7).all()
    engine = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(lr=1e-2, micro_batch_size=3),
                                 device="cpu")
    before = cross_entropy(engine, b, extension.train_term)
    objective = Objective(spec.algorithm, extension.train_term)
    rewards, groups = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1])
    step = TrainStep(objective)
    for _ in range(3):
        out, kept = step(engine, (b, rewards, groups), one_rank(len(b)), keep_rows=[0])
    assert out["probe/ce"] > 0 and "probe/finished" not in out  # finish_metrics runs after adding ranks
    assert step.finish_metrics(out)["probe/finished"] == 1.0
    assert cross_entropy(engine, b, extension.train_term) < before - 1.0  # the term's loss was optimised
    if weight == 1.0:  # no RL at all: no π_old forward, no advantages, no RL loss
        assert "old_logprobs" not in b.extras and "advantages" not in b.extras and not probe.SHAPED
        assert kept is None  # no pi_old forward: no logprobs for the saved samples
        assert out["train/loss"] == pytest.approx(out["probe/ce"], rel=1e-6) and "train/pg_loss" not in out
    else:
        assert len(probe.SHAPED) == 3 and out["probe/shaped"] == 1.0 and "train/pg_loss" in out
        assert kept["train_logprobs"].shape == kept["advantages"].shape == (1, b.input_ids.shape[1])
        assert (b.extras["advantages"][b.loss_mask > 0] >= 0).all()  # shaped: grpo's ±A plus 1

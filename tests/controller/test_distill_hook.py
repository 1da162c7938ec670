"""A distiller from a config-local plugin module drives the train step through core's contract.

The module is written to a temporary folder and named in the recipe's ``plugins:`` list; its
distiller is found through ``loongsage_register_distillers``, built by the controller
(``build_distiller``), writes its "teacher outputs" into the batch, and its term trains the
tiny model in this process through ``train_on_rollout`` and the ``Objective``: a
cross-entropy towards per-token target tokens computed inside the engine's chunked LM head
(a ``LogitTerm``). With ``rl_weight`` 0 no π_old forward or advantage runs; with 0.5 the
term shapes the advantages and the RL loss is scaled.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from loongsage.algorithms.objective import Objective
from loongsage.config.compose import load_config
from loongsage.config.validate import as_container
from loongsage.controller.distill import build_distiller
from loongsage.controller.placement import Seat
from loongsage.controller.trainer_ops import train_on_rollout
from loongsage.engines.batch import TrainBatch
from loongsage.engines.distributed import RankShards
from loongsage.engines.embedded_train import EmbeddedTrainEngine
from loongsage.plugins import clear_cache
from loongsage.schema import ModelConfig, TrainConfig

PROBE = '''
import torch
from loongsage import hookimpl
from loongsage.engines.batch import LogitTerm

BUILT, SHAPED = [], []


def cross_entropy(logits, target):
    return (torch.logsumexp(logits, -1) - logits.gather(-1, target.long()[:, None])[:, 0])[:, None]


class ProbeTerm:
    needs_entropy = False
    pg_logit_term = None
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


class ProbeDistiller:
    def __init__(self, context):
        BUILT.append(context)
        self.actors = {}
        self.train_term = ProbeTerm(1.0 - context.spec.gkd_ratio)

    def teacher_outputs(self, batch, row_sources):
        batch.extras["probe_target"] = torch.full_like(batch.input_ids, 7)
        return {"probe/rows": float(len(row_sources))}

    def close(self):
        pass


@hookimpl
def loongsage_register_distillers(register):
    register("probe_distiller", ProbeDistiller)
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


@pytest.mark.calls_hook("loongsage_register_distillers")
@pytest.mark.parametrize("gkd_ratio", [1.0, 0.5])
def test_a_plugin_distiller_trains_through_the_objective(tmp_path, monkeypatch, tiny_model_dir, gkd_ratio):
    (tmp_path / "probe_distill_plugin.py").write_text(textwrap.dedent(PROBE))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("probe_distill_plugin", None)
    try:
        spec = load_config("tiny/grpo", [
            "plugins=[probe_distill_plugin]", "opd.distiller=probe_distiller",
            "opd.teachers=[{name: probe_teacher, path: builtin:tiny}]", "data_sources.0.teacher=probe_teacher",
            f"opd.gkd_ratio={gkd_ratio}"])
        probe = sys.modules["probe_distill_plugin"]
        distiller = build_distiller(spec.distill, as_container(spec.cfg), Seat("train", 0, "", 0, 0, 0, threads=1))
    finally:
        clear_cache()
    (context,) = probe.BUILT
    assert context.spec is spec.distill and context.config["opd"]["gkd_ratio"] == gkd_ratio
    assert callable(context.spawn)

    b = batch()
    metrics = distiller.teacher_outputs(b, ["arithmetic"] * len(b))
    assert metrics == {"probe/rows": 4.0} and "probe_target" in b.extras
    engine = EmbeddedTrainEngine(ModelConfig(path=str(tiny_model_dir)), TrainConfig(lr=1e-2, micro_batch_size=3),
                                 device="cpu")
    before = cross_entropy(engine, b, distiller.train_term)
    objective = Objective(spec.algorithm, distiller.train_term)
    rewards, groups = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1])
    for _ in range(3):
        out, kept = train_on_rollout(engine, (b, rewards, groups), one_rank(len(b)), objective, keep_rows=[0])
    assert out["probe/ce"] > 0 and "probe/finished" not in out  # TrainGroup finishes after adding ranks
    assert cross_entropy(engine, b, distiller.train_term) < before - 1.0  # the term's loss was optimised
    if gkd_ratio == 1.0:  # no RL at all: no π_old forward, no advantages, no RL loss
        assert "old_logprobs" not in b.extras and "advantages" not in b.extras and not probe.SHAPED
        assert kept is None  # no pi_old forward: no logprobs for the saved samples
        assert out["train/loss"] == pytest.approx(out["probe/ce"], rel=1e-6) and "train/pg_loss" not in out
    else:
        assert len(probe.SHAPED) == 3 and out["probe/shaped"] == 1.0 and "train/pg_loss" in out
        assert kept["train_logprobs"].shape == kept["advantages"].shape == (1, b.input_ids.shape[1])
        assert (b.extras["advantages"][b.loss_mask > 0] >= 0).all()  # shaped: grpo's ±A plus 1

"""A step term adding an entropy bonus to the training loss, to show the step_term contract.

It owns the root config section ``entropy_bonus`` (``entropy_bonus.coef=0.01`` turns it on):
the train actor then computes the policy's entropy in the loss forward (``needs_entropy``) and
adds ``−coef · mean entropy over the loss tokens`` to the loss, which keeps the policy from
collapsing early (the entropy regulariser of A3C, arXiv:1602.01783). It adds no batch inputs,
shapes no advantages and starts no actors. Torch-free: config loading imports this module.
"""

from dataclasses import dataclass

from loongsage.plugin import ConfigError


@dataclass
class EntropyBonusConfig:
    """The ``entropy_bonus`` section."""

    coef: float = 0.0  # weight of the entropy bonus; 0 leaves the training step as it is


class EntropyTerm:
    """The train-side half (``StepTerm``): one extra loss share per micro-batch."""

    rl_weight = 1.0
    needs_entropy = True
    old_logit_term = None
    logit_term = None

    def __init__(self, coef):
        self.coef = coef

    def shape_advantages(self, batch, advantages, old):
        return advantages, {}

    def loss(self, ctx):
        """−coef · Σ entropy over the micro-batch's loss tokens / the mini-batch's loss tokens:
        additive over micro-batches and ranks, as the objective's own shares are."""
        mean_entropy = (ctx.entropy * ctx.batch.loss_mask).sum() / max(ctx.global_num_tokens, 1.0)
        return -self.coef * mean_entropy, {"train/entropy_bonus": float(self.coef * mean_entropy.detach())}

    def finish_metrics(self, metrics):
        return metrics  # each share is already divided by the global token count


class EntropyBonusExtension:
    """The started step term (``StepExtension``): nothing to add before training, no actors."""

    actors: dict = {}

    def __init__(self, coef):
        self.train_term = EntropyTerm(coef)

    def before_train(self, batch, row_sources):
        return {}

    def close(self):
        pass


class EntropyBonus:
    """The registered object (``StepTermPlugin``)."""

    section = "entropy_bonus"
    schema = EntropyBonusConfig
    source_schema = None

    def validate(self, cfg, registries):
        """The coefficient, or None when the section is absent or at its default (off)."""
        section = cfg.get(self.section)
        coef = 0.0 if section is None else float(section.get("coef", 0.0))
        if coef < 0:
            raise ConfigError(f"{self.section}.coef", f"must be >= 0 (a bonus on entropy), got {coef}")
        return coef or None

    def memory(self, cfg, settings, batch_tokens):
        return ()  # the entropy is one [N, L] tensor the train forward computes anyway for its metrics

    def build(self, context):
        return EntropyBonusExtension(context.settings)


ENTROPY_BONUS = EntropyBonus()

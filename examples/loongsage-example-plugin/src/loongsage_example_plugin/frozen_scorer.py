"""An engine hosting a frozen causal LM that scores token log-probs: the kind of engine a step
term starts in an actor of its own (``StepContext.spawn``), e.g. a reference or a judge model.

It implements the ``Engine`` contract (``from_config(cfg, device=...)``) and nothing of the
train or rollout roles; it is built from ``loongsage.plugin``'s engine helpers only.
"""

import torch

from loongsage.plugin import load_causal_lm, resolve_model_path, token_scores


class FrozenScorer:
    """``score(input_ids, attention_mask) -> log-probs [N, L]`` under a frozen model."""

    def __init__(self, model, device):
        self.model, self.device = model, device

    @classmethod
    def from_config(cls, cfg, device=None):
        """Build from ``{"model": {"path": ..., "dtype": ...}}`` on ``device`` (``cpu`` when None)."""
        device = device or "cpu"
        model_cfg = cfg["model"]
        model = load_causal_lm(resolve_model_path(str(model_cfg["path"])), model_cfg.get("dtype", "float32"))
        return cls(model.requires_grad_(False).eval().to(device), device)

    @torch.no_grad()
    def score(self, input_ids, attention_mask):
        """log p(input_ids[t] | input_ids[:t]) at every t > 0; 0 at position 0 and at padding."""
        scores = token_scores(self.model, input_ids.to(self.device), attention_mask.to(self.device))
        return scores.logprobs.cpu()

    def offload(self):
        return False

    def onload(self):
        return False

"""The model card of an exported model: which recipe trained it and what it reached.

Written with ``huggingface_hub``'s ``ModelCard`` / ``ModelCardData`` (the Hub's own card
format: YAML metadata, then Markdown), so the folder can be pushed to a hub as it is. The
card names the recipe and its overrides, the algorithm, the steps, and the metrics: the
last training step's, the reward over the first and last few steps, and the last evaluation.
"""

from __future__ import annotations

from typing import Any, Sequence

SHOWN = ("rollout/reward_mean", "rollout/correct_mean", "rollout/response_length_mean",
         "train/is_approx_k3_kl", "train/loss")
WINDOW = 5  # steps averaged for "first" and "last"


def _mean(rows: Sequence[dict], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else None


def metrics_table(rows: Sequence[dict]) -> list[str]:
    """Markdown rows: each shown metric over the first and last steps, and the last evaluation.
    A run shorter than two windows averages half its steps each, so the two never overlap."""
    trained = [r for r in rows if "rollout/reward_mean" in r]
    n = max(1, min(WINDOW, len(trained) // 2))
    steps = f"{n} steps" if n > 1 else "step"
    lines = [f"| metric | first {steps} | last {steps} |", "|---|---|---|"]
    first, last = trained[:n], trained[-n:]
    for key in SHOWN:
        a, b = _mean(first, key), _mean(last, key)
        if a is not None and b is not None:
            lines.append(f"| `{key}` | {a:.4g} | {b:.4g} |")
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    for key in sorted(k for k in (evals[-1] if evals else {}) if k.startswith("eval/")):
        a, b = _mean(evals[:1], key), _mean(evals[-1:], key)
        if a is not None and b is not None:
            lines.append(f"| `{key}` (first / last evaluation) | {a:.4g} | {b:.4g} |")
    return lines


def source_line(node: Any) -> str:
    """What a data source trains on: its dataset and reward, or its environment."""
    if node.get("environment") is not None:
        return f"environment `{node.environment.type}`"
    return f"{node.dataset.format}, reward `{node.reward.name}`"


def model_card(cfg: Any, recipe: str, overrides: Sequence[str], rows: Sequence[dict]) -> Any:
    """A ``huggingface_hub.ModelCard`` for the model ``cfg`` trained (``rows``: metrics.jsonl)."""
    from huggingface_hub import ModelCard, ModelCardData

    algorithm = cfg.algorithm
    loss, advantage = algorithm.policy_loss.name, algorithm.advantage_estimator.name
    data = ModelCardData(library_name="transformers", pipeline_tag="text-generation", license=None,
                         tags=["loongsage", "reinforcement-learning", loss, advantage])
    steps = [r["step"] for r in rows if "rollout/reward_mean" in r]
    command = " ".join(["loongsage train --config-name", recipe or "?", *overrides])
    sources = ", ".join(f"`{s.name}` ({source_line(s)})" for s in cfg.data_sources)
    body = [
        f"# {cfg.logging.run_name or 'LoongSage run'}: RL post-training with LoongSage", "",
        f"Trained by the LoongSage recipe `{recipe or 'unknown'}`"
        + (f" with overrides `{' '.join(overrides)}`" if overrides else "") + ":", "",
        f"```bash\n{command}\n```", "",
        f"- base model: `{cfg.model.path}`",
        f"- algorithm: advantage `{advantage}`, policy loss `{loss}`, KL coef {algorithm.kl.coef}",
        f"- {len(steps)} training steps of {cfg.rollout.prompts_per_step} prompts x "
        f"{cfg.rollout.n_samples_per_prompt} samples; data sources: {sources}", "",
        "## Metrics", "", *metrics_table(rows), "",
        "The run directory holds every step's metrics (`metrics.jsonl`), the saved trajectories and "
        "the resolved config (`config.yaml`).",
    ]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body) + "\n")

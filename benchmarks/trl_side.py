"""TRL's side of ``benchmarks/vs_trl.py``: one ``GRPOTrainer`` run, run in TRL's own venv.

Reads a JSON job (model folder, prompts in order, GRPO settings, the reward server's URL),
trains with TRL's ``GRPOTrainer`` on CPU and appends one JSON line per optimizer step to the
job's ``out`` file: wall seconds of the step, the mean reward of its completions, and the mean
completion length. The reward is ours: each batch of completions is posted to the reward
server the benchmark runs beside it, which scores them with the data source's own reward.
Imports only TRL, transformers, datasets and the standard library (nothing of LoongSage).

    <trl venv>/bin/python benchmarks/trl_side.py JOB.json
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request


def score(url: str, completions: list, ground_truth: list, **_: object) -> list[float]:
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    body = json.dumps({"texts": texts, "ground_truths": ground_truth}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())["rewards"]


def main(job_path: str) -> None:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    job = json.loads(open(job_path, encoding="utf-8").read())
    torch.set_num_threads(job["threads"])
    torch.manual_seed(job["seed"])
    rows = [{"prompt": p["messages"], "ground_truth": p["ground_truth"]} for p in job["prompts"]]
    # one optimizer step per prompts x samples completions, in micro-batches of one group each
    # (TRL generates the whole batch at once: generation batch = micro-batch x accumulation)
    config = GRPOConfig(
        output_dir=job["workdir"], use_cpu=True, bf16=False, fp16=False, seed=job["seed"],
        learning_rate=job["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=job["grad_clip"],
        per_device_train_batch_size=job["samples"], gradient_accumulation_steps=job["prompts_per_step"],
        num_generations=job["samples"],
        max_completion_length=job["max_tokens"], temperature=job["temperature"], top_p=1.0,
        beta=0.0, epsilon=job["eps_low"], epsilon_high=job["eps_high"], num_iterations=1,
        loss_type="dapo", scale_rewards="group", shuffle_dataset=False, max_steps=job["steps"],
        logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True,
        # as a user tuning for speed would: no activation checkpointing (ours runs none), KV cache on
        gradient_checkpointing=False, use_cache=True,
        model_init_kwargs={"dtype": torch.float32},
    )

    def reward(completions, ground_truth, **kwargs):
        return score(job["reward_url"], completions, ground_truth)

    reward.__name__ = "math_reward"

    class StepLog(TrainerCallback):
        def __init__(self) -> None:
            self.started = time.perf_counter()

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                line = {"step": state.global_step, "seconds": time.perf_counter() - self.started,
                        "reward_mean": logs["reward"],
                        "response_length_mean": logs.get("completions/mean_length")}
                with open(job["out"], "a", encoding="utf-8") as out:
                    out.write(json.dumps(line) + "\n")

    trainer = GRPOTrainer(model=job["model"], reward_funcs=reward, args=config,
                          train_dataset=Dataset.from_list(rows), callbacks=[StepLog()])
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1])

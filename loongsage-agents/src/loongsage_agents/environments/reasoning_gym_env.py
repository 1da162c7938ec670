"""The ``reasoning_gym`` environment: reasoning-gym's procedural tasks, one chat turn each.

Tasks come from ``reasoning_gym.create_dataset(name, seed=, size=, **config)`` (the library's
own generators, deterministic in seed and index; github.com/open-thought/reasoning-gym). The
``tasks`` parameter mixes several: ``size`` entries split over them by weight (largest
remainder), interleaved in a seeded order. Held-out tasks come from ``held_out_seed`` (default
``seed + HELD_OUT_OFFSET``: reasoning-gym draws entry i of seed s with ``Random(s + i)``, so the
entries of nearby seeds are the same ones shifted) with every question that also appears in the
training tasks dropped, so the two splits are disjoint; an ``eval_only`` source reads them.

An episode sends the task's question (after the ``system_prompt``) to the policy through its
trajectory's router URL with the openai SDK and scores the reply with the task's own
``score_answer(answer, entry)``. That scorer expects the bare answer (a raw completion gets
partial credit), so the answer is extracted first: the text inside ``<answer></answer>``
(``reasoning_gym.utils.extract_answer``), else the reply's last non-empty line. A prompt's
``metadata["solution"]`` is the ``<answer>`` line of the true answer, what an SFT warm start
trains on.
"""

from __future__ import annotations

import difflib
import random
from typing import Any

from loongsage.plugin import ConfigError, Endpoint, EnvironmentContext, Episode, Prompt

from loongsage_agents.agents.chat import openai_client
from loongsage_agents.environments.params import HELD_OUT_OFFSET, ReasoningGymParams, task_entries


def apportion(size: int, weights: list[float]) -> list[int]:
    """``size`` split in proportion to ``weights`` (largest remainder; ties to the first)."""
    total = sum(weights)
    exact = [size * w / total for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: size - sum(counts)]:
        counts[i] += 1
    return counts


def extract_final_answer(text: str) -> str | None:
    """The answer a reply gives: inside ``<answer></answer>``, else its last non-empty line."""
    from reasoning_gym.utils import extract_answer

    tagged = extract_answer(text)
    if tagged is not None:
        return tagged
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


class TaskList:
    """One split's tasks as a dataset: ``get(index) -> Prompt`` and ``len``."""

    def __init__(self, split: str, order: list[tuple[int, int]], env: "ReasoningGymEnvironment") -> None:
        self.split = split
        self.order = order  # (task number, index in that task's reasoning-gym dataset)
        self.env = env

    def __len__(self) -> int:
        return len(self.order)

    def get(self, index: int) -> Prompt:
        task, j = self.order[index]
        entry = self.env.entry(self.split, task, j)
        messages = [{"role": "user", "content": entry["question"]}]
        if self.env.params.system_prompt:
            messages.insert(0, {"role": "system", "content": self.env.params.system_prompt})
        name = self.env.tasks_config[task]["name"]
        return Prompt(source="", index=index, messages=messages, ground_truth=str(entry["answer"]),
                      metadata={"task": name, "task_number": task, "split": self.split, "task_index": j,
                                "solution": f"<answer>{entry['answer']}</answer>"})


class ReasoningGymEnvironment:
    """reasoning-gym tasks (a weighted mix), single-turn episodes scored by each task's ``score_answer``."""

    def __init__(self, params: ReasoningGymParams, context: EnvironmentContext) -> None:
        import reasoning_gym

        self.params = params
        self.context = context
        self.tasks_config = task_entries(list(params.tasks))
        known = sorted(reasoning_gym.factory.DATASETS)
        counts = apportion(params.size, [t["weight"] for t in self.tasks_config])
        held_seed = params.seed + HELD_OUT_OFFSET if params.held_out_seed is None else params.held_out_seed
        held_counts = apportion(params.held_out_size, [t["weight"] for t in self.tasks_config])
        self.datasets: dict[str, list[Any]] = {"train": [], "held_out": []}
        for i, task in enumerate(self.tasks_config):
            if task["name"] not in known:
                match = difflib.get_close_matches(task["name"], known, n=1)
                hint = f"; did you mean {match[0]!r}?" if match else ""
                raise ConfigError(f"tasks[{i}].name", f"reasoning-gym has no task {task['name']!r}{hint} "
                                  f"({len(known)} tasks: {', '.join(known)})")
            make = reasoning_gym.create_dataset
            try:
                train = make(task["name"], seed=params.seed, size=max(counts[i], 1), **task["config"])
                # generous: held-out questions that repeat a training one are dropped
                held = make(task["name"], seed=held_seed, size=max(4 * held_counts[i] + 16, 1), **task["config"])
            except (TypeError, ValueError, AssertionError) as err:
                raise ConfigError(f"tasks[{i}].config", f"reasoning-gym task {task['name']!r} refused its "
                                  f"config {task['config']}: {err}") from None
            self.datasets["train"].append(train)
            self.datasets["held_out"].append(held)
        rng = random.Random(f"reasoning_gym:{params.seed}")
        train_order = [(i, j) for i, n in enumerate(counts) for j in range(n)]
        rng.shuffle(train_order)
        seen = {self.datasets["train"][i][j]["question"] for i, j in train_order}
        self.orders = {"train": train_order, "held_out": self._held_out_order(held_counts, seen, rng)}

    def _held_out_order(self, counts: list[int], seen: set[str], rng: random.Random) -> list[tuple[int, int]]:
        order = []
        for i, want in enumerate(counts):
            held = self.datasets["held_out"][i]
            picked = [j for j in range(len(held)) if held[j]["question"] not in seen][:want]
            if len(picked) < want:
                raise ConfigError(f"tasks[{i}]", f"only {len(picked)} of {want} held-out "
                                  f"{self.tasks_config[i]['name']!r} tasks differ from the training ones; "
                                  "lower held_out_size or widen the task's config")
            order += [(i, j) for j in picked]
        rng.shuffle(order)
        return order

    def entry(self, split: str, task: int, index: int) -> dict[str, Any]:
        """reasoning-gym's own entry (question, answer, metadata) of one task."""
        return self.datasets[split][task][index]

    def tasks(self, split: str) -> TaskList:
        return TaskList(split, self.orders[split], self)

    def score(self, prompt: Prompt, text: str) -> tuple[float, str | None]:
        """The task's own score of a reply (its extracted answer), and that answer."""
        meta = prompt.metadata  # task_number: a task named twice (two configs) is two tasks
        task = meta["task_number"]
        entry = self.entry(meta["split"], task, meta["task_index"])
        answer = extract_final_answer(text)
        return float(self.datasets[meta["split"]][task].score_answer(answer, entry)), answer

    async def run_episode(self, task: Prompt, endpoint: Endpoint) -> Episode:
        async with openai_client(dict(endpoint.urls), endpoint.api_key) as client:
            reply = await client.chat.completions.create(model=endpoint.model, messages=task.messages,
                                                         **dict(endpoint.sampling))
        text = reply.choices[0].message.content or ""
        reward, answer = self.score(task, text)
        name = task.metadata["task"]
        return Episode(reward=reward, text=text, metrics={"correct": float(reward == 1.0),
                                                          f"correct_{name}": float(reward == 1.0)},
                       info={"task": name, "extracted_answer": answer})

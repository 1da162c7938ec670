"""A dataset of a few questions given in the config, to show the dataset contract."""

import random

from loongsage.plugin import Prompt


class FixedList:
    """Question i of epoch e is a seeded shuffle of the list: a pure function of seed and index."""

    def __init__(self, params, seed, source="fixed_list"):
        if len(params.questions) != len(params.answers) or not params.questions:
            raise ValueError(f"fixed_list: {len(params.questions)} questions but "
                             f"{len(params.answers)} answers; give one answer per question")
        self.params, self.seed, self.source = params, seed, source

    def __len__(self):
        return len(self.params.questions)

    def get(self, index):
        epoch, offset = divmod(index, len(self))
        order = list(range(len(self)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        i = order[offset]
        return Prompt(self.source, index, [{"role": "user", "content": self.params.questions[i]}],
                      ground_truth=self.params.answers[i])

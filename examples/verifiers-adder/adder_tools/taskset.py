"""The tasks of adder-tools: "What is a + b?" for seeded pairs, scored on the final reply.

Task i of seed s adds two integers drawn with ``random.Random(f"{s}:{i}")`` from
``[0, max_operand]``. The reward ``correct`` (weight 1) is 1.0 when the last integer of the
agent's final reply is the sum; the metric ``used_tool`` says whether the agent called ``add``.
The ``add`` tool holds no per-task state, so it is taskset-scoped (``Taskset.toolsets``): one
MCP server for the whole run instead of one started per rollout.
"""

import random
import re

import verifiers.v1 as vf

from adder_tools.toolset import AdderToolset

SYSTEM_PROMPT = "Use the add tool to add the numbers, then reply with the sum alone."


def last_integer(text: str) -> int | None:
    """The last integer written in ``text``, or None."""
    found = re.findall(r"-?\d+", text)
    return int(found[-1]) if found else None


def operands(seed: int, index: int, max_operand: int) -> tuple[int, int]:
    rng = random.Random(f"{seed}:{index}")
    return rng.randint(0, max_operand), rng.randint(0, max_operand)


class AdderData(vf.TaskData):
    a: int
    b: int


class AdderTask(vf.Task[AdderData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(last_integer(trace.last_reply) == self.data.a + self.data.b)

    @vf.metric
    async def used_tool(self, trace: vf.Trace) -> float:
        return float(any(call.name == "add" for message in trace.assistant_messages
                         for call in message.tool_calls or []))


class AdderConfig(vf.TasksetConfig):
    num_tasks: int = 100
    seed: int = 0
    max_operand: int = 99
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class AdderTaskset(vf.Taskset[AdderTask, AdderConfig]):
    @classmethod
    def toolsets(cls, config: AdderConfig) -> list[vf.Toolset]:
        return [AdderToolset(config.tools)]

    def load(self) -> list[AdderTask]:
        tasks = []
        for i in range(self.config.num_tasks):
            a, b = operands(self.config.seed, i, self.config.max_operand)
            data = AdderData(prompt=f"What is {a} + {b}?", system_prompt=SYSTEM_PROMPT, a=a, b=b)
            tasks.append(AdderTask(data, self.config.task))
        return tasks

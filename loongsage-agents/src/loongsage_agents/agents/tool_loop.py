"""White-box ``tool_loop`` agent: multi-turn function calling through the AgentFlow router.

Each trajectory opens one sandbox of its data source (``data_sources[i].sandbox``, any
``sandbox`` plugin) and loops: send the conversation with the tools' schemas (openai SDK, Chat
Completions), run every tool call the model makes inside the sandbox, append the results as
``tool`` messages, and stop when the model answers without a tool call or after
``max_turns`` model turns. A tool's output loses its trailing newlines (the template frames
it). The router records the tokens (TITO): the model's turns are in
the loss mask, tool results and template text are not. The answer is the last reply's text.

A tool call the sandbox cannot run (its supervisor died mid-exec, or it is already closed after
that: any ``LoongSageError`` but a ``ConfigError`` from ``exec``, which is what sandbox backends
raise) does not end the trajectory: its tool message is the error, so the model sees it on its
next turn, and the trajectory is marked (``sandbox_failed``, ``sandbox_error`` in its info; a step reports
``rollout/sandbox_failed_mean``), which makes it a failed trajectory for
``rollout.failed_trajectory`` (``router_base.trajectory_failure``): a broken environment is
not the model's answer. Later calls get the same kind of error; the sandbox is not replaced,
since a new one would have lost the files the trajectory wrote.

A coding task's repository (its prompt's ``metadata["files"]``, ``agents.task_files``) is
written into the sandbox's work dir before the first turn. With ``submit_file`` set, the
answer is that file as the sandbox holds it after the loop, fenced by
``task_files.submission``, so a ``code_exec`` reward runs its hidden tests on the edited file
in a fresh sandbox; a file the model deleted (or made unreadable) gives an empty answer and
``reward_info["submit_error"]`` says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from loongsage.plugin import ConfigError, LoongSageError, Prompt

from loongsage_agents.agents.chat import chat_sampling, openai_client
from loongsage_agents.agents.router_base import Outcome, RouterAgentBase
from loongsage_agents.agents.router_params import ToolLoopParams
from loongsage_agents.agents.task_files import submission, task_files
from loongsage_agents.agents.tools import Tool, ToolArgumentError, get_tools


@dataclass
class ToolMessage:
    """What one tool call returns to the model, and why its sandbox could not run it (None
    when it ran, or when the call itself was wrong)."""

    text: str
    sandbox_error: str | None = None


async def run_tool(sandbox: Any, tool: Tool, arguments_json: str, timeout: float,
                   max_chars: int) -> ToolMessage:
    """The tool message for one call: its output, what was wrong with the call, or why the
    sandbox could not run it."""
    try:
        arguments = json.loads(arguments_json or "{}")
        if not isinstance(arguments, dict):
            raise ToolArgumentError(f"arguments must be a JSON object, got {arguments_json!r}")
        argv = tool.argv(arguments)
    except (json.JSONDecodeError, ToolArgumentError) as err:
        return ToolMessage(f"error: bad arguments for {tool.name}: {err}")
    try:
        result = await sandbox.exec(argv, timeout=timeout)
    except ConfigError:
        raise  # the run is configured wrong (e.g. tool_timeout_s): stop, naming the key
    except LoongSageError as err:
        return ToolMessage(f"error: {tool.name} did not run: {err}"[:max_chars], sandbox_error=str(err))
    out = (result.stdout + result.stderr).decode("utf-8", "replace").rstrip("\n")
    if result.timed_out:
        out += f"\n[timed out after {timeout:g} s]"
    return ToolMessage(out[:max_chars])


class ToolLoopAgent(RouterAgentBase):
    """Chat with tools until the model stops calling them."""

    params_type = ToolLoopParams

    def __init__(self, params: ToolLoopParams | None, context: Any) -> None:
        super().__init__(params, context)
        self.sandbox = context.require_sandbox("agent 'tool_loop'")
        self.tools = {t.name: t for t in get_tools(list(self.params.tools), key="agent.params.tools")}
        if self.params.max_turns < 1:
            raise ValueError(f"agent.params.max_turns must be >= 1, got {self.params.max_turns}")

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The Chat Completions ``tools`` this agent offers (SFT renders demonstrations with
        them, so warm-start prompts show the same tools as rollouts)."""
        return [t.schema() for t in self.tools.values()]

    async def run_trajectory(self, prompt: Prompt, urls: dict[str, str], key: str,
                             sampling_params: dict[str, Any]) -> Outcome:
        p = self.params
        messages = [dict(m) for m in prompt.messages]
        schemas = self.tool_schemas()
        calls = turns = 0
        finish = sandbox_error = None
        files = task_files(prompt) if "files" in prompt.metadata else None
        async with openai_client(urls, key) as client, \
                self.sandbox(files=files) as sandbox:
            while turns < p.max_turns:
                reply = await client.chat.completions.create(
                    model=p.served_model_names[0], messages=messages, tools=schemas,
                    **chat_sampling(sampling_params))
                turns += 1
                choice = reply.choices[0]
                finish = choice.finish_reason
                message = choice.message
                tool_calls = list(message.tool_calls or [])
                assistant: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
                if tool_calls:
                    assistant["tool_calls"] = [
                        {"id": c.id, "type": "function",
                         "function": {"name": c.function.name, "arguments": c.function.arguments}}
                        for c in tool_calls]
                messages.append(assistant)
                if not tool_calls:
                    break
                for call in tool_calls:
                    calls += 1
                    tool = self.tools.get(call.function.name)
                    output = ToolMessage(f"error: unknown tool '{call.function.name}'; available: "
                                         f"{sorted(self.tools)}") if tool is None else await run_tool(
                        sandbox, tool, call.function.arguments, p.tool_timeout_s,
                        p.max_tool_output_chars)
                    sandbox_error = sandbox_error or output.sandbox_error
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": output.text})
            info: dict[str, Any] = {"turns": turns, "tool_calls": calls, "finish_reason": finish,
                                    "messages": messages, "sandbox_failed": sandbox_error is not None}
            if sandbox_error is not None:
                info["sandbox_error"] = sandbox_error
            if p.submit_file is not None:
                return await self._submit(sandbox, p.submit_file, info)
        answer = next(m for m in reversed(messages) if m["role"] == "assistant")
        return Outcome(text=answer.get("content") or "", info=info)

    @staticmethod
    async def _submit(sandbox: Any, path: str, info: dict[str, Any]) -> Outcome:
        """The answer is ``path`` as the sandbox holds it now, fenced for the reward."""
        try:
            content = (await sandbox.read_file(path)).decode("utf-8", "replace")
        except Exception as err:  # the model removed or broke the file: no code, reward says so
            info["submit_error"] = f"submit_file {path!r} could not be read: {err}"
            return Outcome(text="", info=info)
        return Outcome(text=submission(content), info=info)

"""Typed parameters of the router-based agents (torch-free, imported by ``plugin.py``).

Every router-based agent shares ``RouterAgentParams``: how the agent's private router is
set up when the controller does not hand it one (see ``loongsage_agents.agents.router_base``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class RouterAgentParams:
    """Router settings for agents that run through AgentFlow."""

    # model names the router serves the policy under; the agent asks for the first
    served_model_names: List[str] = field(default_factory=lambda: ["policy"])
    accept_any_model: bool = True  # CLIs insist on their own model names
    untrained_models: List[str] = field(default_factory=list)  # served too, their turns never trained (titles)
    middlewares: List[Any] = field(default_factory=lambda: ["agent_sessions"])  # after agentflow.middlewares
    max_context: Optional[int] = None  # tokens; None = the tokenizer's model_max_length
    default_max_tokens: int = 1024  # max_tokens of a request that sets none
    concurrency: int = 0  # trajectories of a group run at once; 0 = all n
    # the router replaces the agent's temperature/top_p/top_k with the rollout's and caps its
    # max_tokens at rollout.max_new_tokens on trained turns
    enforce_sampling: bool = True


@dataclass
class ChatParams(RouterAgentParams):
    """One chat turn through the router with the openai SDK (white-box, single turn)."""


@dataclass
class EnvironmentAgentParams(RouterAgentParams):
    """An environment's episodes, one per trajectory, each against its own router URL."""

    episode_timeout_s: float = 300.0  # an episode still running then is cancelled and marked failed


@dataclass
class ToolLoopParams(RouterAgentParams):
    """Multi-turn function calling through the router; tools run in the data source's sandbox."""

    tools: List[str] = field(default_factory=lambda: ["calculator"])  # offered to the model: calculator | bash
    max_turns: int = 4  # model turns per trajectory; the loop ends earlier on a reply without a tool call
    tool_timeout_s: float = 10.0  # wall time of one tool call in the sandbox; past it its output says timed out
    max_tool_output_chars: int = 2000  # a tool message is cut to this many characters
    # a file of the sandbox read back after the loop as the answer (agents.task_files.submission),
    # e.g. "solution.py" for a code_exec reward; None = the last reply's text
    submit_file: Optional[str] = None


@dataclass
class CommandParams(RouterAgentParams):
    """Any program, given router base URLs and a per-trajectory key, in its own work dir."""

    argv: List[str] = field(default_factory=list)  # "{task}", "{workdir}" are filled in
    env: Dict[str, str] = field(default_factory=dict)  # extra environment of the program
    files: Dict[str, str] = field(default_factory=dict)  # written into each work dir
    timeout_s: float = 600.0  # wall time of one run; then its process group is stopped (kill_grace_s)
    workdir_root: Optional[str] = None  # None = a temporary directory per trajectory
    keep_workdir: bool = False  # keep each work dir (its path in reward_info) instead of deleting it
    kill_grace_s: float = 2.0  # SIGTERM → SIGKILL of the process group
    max_output_chars: int = 20000  # of stdout/stderr kept in reward_info
    # a work-dir file whose content after the program exits is the answer (as the fenced block
    # ``task_files.submission`` makes, for the code_exec reward); None = the program's own answer
    submit_file: Optional[str] = None


@dataclass
class CliAgentParams(CommandParams):
    """A real agent CLI run offline and non-interactively against the router."""

    bin_dir: Optional[str] = None  # None = the CLI's LoongSage cache (launchers.cli), then PATH
    model: str = "policy"  # the model name the CLI asks the router for
    max_output_tokens: int = 512  # what the CLI is told the model may write per turn
    context_window: int = 32768  # what the CLI is told the context is
    extra_args: List[str] = field(default_factory=list)  # appended to the CLI's command line


@dataclass
class CodexParams(CliAgentParams):
    """Codex CLI (`codex exec --json`), Responses API; `instructions` replaces its prompt."""

    instructions: Optional[str] = None  # replaces Codex's own system prompt; None = keep it


@dataclass
class ClaudeCodeParams(CliAgentParams):
    """Claude Code (`claude -p --output-format json`), Anthropic Messages."""

    tools: List[str] = field(default_factory=lambda: ["Bash"])  # the only tools Claude Code may use
    system_prompt: Optional[str] = None  # replaces Claude Code's own prompt; None = keep it


@dataclass
class OpenCodeParams(CliAgentParams):
    """OpenCode (`opencode run --format json`), Chat Completions via @ai-sdk/openai-compatible."""

    prompt: Optional[str] = None  # replaces the build agent's system prompt
    tools: Dict[str, bool] = field(default_factory=dict)  # e.g. {"*": false, "bash": true}


@dataclass
class MiniSweAgentParams(CliAgentParams):
    """mini-swe-agent (`mini -y`), non-streaming Chat Completions via litellm, one bash tool."""

    step_limit: int = 10  # model calls; then mini stops with LimitsExceeded
    max_consecutive_format_errors: int = 3  # replies without a tool call in a row; 0 = no limit
    command_timeout_s: int = 30  # per bash command mini runs
    model_retries: int = 1  # attempts per model call (mini's default 10 backs off up to 60 s)
    system_template: Optional[str] = None  # None = mini's own (jinja, like mini's config)
    instance_template: Optional[str] = None  # None = mini's own; must use {{task}}
    base_config: str = "mini.yaml"  # mini's config that LoongSage's settings are merged onto

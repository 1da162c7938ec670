"""Registrations of loongsage-agents: only hook implementations, cheap to import (no torch)."""

from loongsage.plugin import hookimpl
from loongsage_agents.agents.params import SingleTurnParams
from loongsage_agents.agents.router_params import (ChatParams, ClaudeCodeParams, CodexParams,
                                                   CommandParams, EnvironmentAgentParams,
                                                   MiniSweAgentParams, OpenCodeParams,
                                                   ToolLoopParams)
from loongsage_agents.datasets.params import (CodeRepairParams, FileDatasetParams,
                                              HuggingFaceDatasetParams, SyntheticMathParams)
from loongsage_agents.environments.openenv_params import OpenEnvParams
from loongsage_agents.environments.params import ReasoningGymParams
from loongsage_agents.environments.verifiers_params import VerifiersParams
from loongsage_agents.rewards.params import MathRewardParams
from loongsage_agents.rewards.code_exec import CodeExecParams


@hookimpl
def loongsage_register_datasets(register):
    register("synthetic_math", "loongsage_agents.datasets.synthetic_math:SyntheticMathDataset",
             params=SyntheticMathParams)
    register("code_repair", "loongsage_agents.datasets.code_repair:CodeRepairDataset",
             params=CodeRepairParams)
    register("jsonl", "loongsage_agents.datasets.jsonl:JsonlDataset", params=FileDatasetParams,
             doc="Prompts and ground truths read from a JSONL file (dotted field paths).")
    register("parquet", "loongsage_agents.datasets.parquet:ParquetDataset", params=FileDatasetParams,
             doc="Prompts and ground truths read from a Parquet file (dotted field paths).")
    register("huggingface", "loongsage_agents.datasets.huggingface:HuggingFaceDataset",
             params=HuggingFaceDatasetParams)


@hookimpl
def loongsage_register_environments(register):
    register("reasoning_gym", "loongsage_agents.environments.reasoning_gym_env:ReasoningGymEnvironment",
             params=ReasoningGymParams)
    register("openenv", "loongsage_agents.environments.openenv_env:OpenEnvEnvironment",
             params=OpenEnvParams)
    register("verifiers", "loongsage_agents.environments.verifiers_env:VerifiersEnvironment",
             params=VerifiersParams)


@hookimpl
def loongsage_register_rewards(register):
    register("math", "loongsage_agents.rewards.math:math_reward", params=MathRewardParams)
    register("code_exec", "loongsage_agents.rewards.code_exec:code_exec_reward", params=CodeExecParams)


@hookimpl
def loongsage_register_agents(register):
    register("single_turn", "loongsage_agents.agents.single_turn:SingleTurnAgent",
             params=SingleTurnParams)
    register("chat", "loongsage_agents.agents.chat:ChatAgent", params=ChatParams)
    register("environment", "loongsage_agents.agents.environment:EnvironmentAgent",
             params=EnvironmentAgentParams)
    register("tool_loop", "loongsage_agents.agents.tool_loop:ToolLoopAgent", params=ToolLoopParams)
    register("command", "loongsage_agents.launchers.command:CommandAgent", params=CommandParams)
    register("codex", "loongsage_agents.launchers.codex:CodexAgent", params=CodexParams)
    register("claude_code", "loongsage_agents.launchers.claude_code:ClaudeCodeAgent",
             params=ClaudeCodeParams)
    register("opencode", "loongsage_agents.launchers.opencode:OpenCodeAgent", params=OpenCodeParams)
    register("mini_swe_agent", "loongsage_agents.launchers.mini_swe_agent:MiniSweAgent",
             params=MiniSweAgentParams)


@hookimpl
def loongsage_register_tool_parsers(register):
    register("hermes", "loongsage_agents.tool_parsers.hermes:HermesToolParser",
             doc="Hermes/Qwen2.5 <tool_call>{json}</tool_call> tool calls.")
    register("qwen3_xml", "loongsage_agents.tool_parsers.xml:XMLToolParser",
             doc="Qwen3-Coder <tool_call><function=name><parameter=k>v</parameter></function> tool calls.")

"""Tools of the ``tool_loop`` agent: an OpenAI function schema plus the command that runs it.

A tool never runs in the trainer's process: ``argv(arguments)`` is executed inside the
trajectory's sandbox (any ``sandbox`` plugin), and its output is the tool message. Bad
arguments are the model's mistake, not a crash: ``ToolArgumentError`` becomes the tool
message so the model sees what it got wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# Evaluates one arithmetic expression (numbers, + - * / // % **, unary -, parentheses) with
# ast, never eval(): it runs inside the sandbox, but a calculator should not be a shell.
CALCULATOR_SOURCE = r"""
import ast, operator, sys
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
       ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
       ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}
def ev(node):
    if isinstance(node, ast.Expression):
        return ev(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        if isinstance(node.op, ast.Pow) and abs(ev(node.right)) > 64:
            raise ValueError("exponent too large")
        return OPS[type(node.op)](ev(node.left), ev(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
        return OPS[type(node.op)](ev(node.operand))
    raise ValueError("unsupported expression element: " + type(node).__name__)
try:
    value = ev(ast.parse(sys.argv[1], mode="eval"))
except Exception as err:
    print("error: " + str(err))
    sys.exit(1)
print(int(value) if isinstance(value, float) and value.is_integer() else value)
"""


class ToolArgumentError(ValueError):
    """The model called a tool with arguments it does not take."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    argv: Callable[[dict[str, Any]], list[str]]

    def schema(self) -> dict[str, Any]:
        """The Chat Completions ``tools`` entry."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def _string_arg(arguments: dict[str, Any], name: str) -> str:
    value = arguments.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ToolArgumentError(f"argument '{name}' must be a non-empty string, got {value!r}")
    return value


def _calculator(arguments: dict[str, Any]) -> list[str]:
    return ["python3", "-c", CALCULATOR_SOURCE, _string_arg(arguments, "expression")]


def _bash(arguments: dict[str, Any]) -> list[str]:
    return ["/bin/sh", "-c", _string_arg(arguments, "command")]


TOOLS: dict[str, Tool] = {
    "calculator": Tool(
        "calculator", "Evaluate an arithmetic expression, e.g. '(3 + 4) * 12'.",
        {"type": "object", "properties": {"expression": {"type": "string"}},
         "required": ["expression"]}, _calculator),
    "bash": Tool(
        "bash", "Run a shell command in the working directory; returns its output.",
        {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        _bash),
}


def get_tools(names: list[str], key: str = "tools") -> list[Tool]:
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        raise ValueError(f"{key}: unknown tool(s) {unknown}; available: {sorted(TOOLS)}")
    return [TOOLS[n] for n in names]

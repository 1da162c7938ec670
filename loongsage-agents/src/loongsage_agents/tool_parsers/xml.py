"""Qwen3-Coder style XML tool calls.

```
<tool_call>
<function=NAME>
<parameter=KEY>
VALUE
</parameter>
</function>
</tool_call>
```

A parameter value is JSON-decoded when it parses (numbers, booleans, objects), else kept as
the string with the one leading and trailing newline the format adds removed. Content rules
match the Hermes parser: text before the first block verbatim, blank text between blocks
dropped, an unparseable block left in the content.
"""

from __future__ import annotations

import json
import re

from loongsage.plugin import ParsedOutput, ToolCall
from loongsage_agents.tool_parsers.blocks import START, split_blocks

FUNCTION = re.compile(r"^\s*<function=([^>\s]+)>(.*?)</function>\s*$", re.DOTALL)
PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.DOTALL)


def _value(raw: str):
    text = raw[1:] if raw.startswith("\n") else raw
    text = text[:-1] if text.endswith("\n") else text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _call(body: str) -> ToolCall | None:
    match = FUNCTION.match(body)
    if match is None:
        return None
    args = {name: _value(raw) for name, raw in PARAMETER.findall(match.group(2))}
    return ToolCall.from_args(match.group(1), args)


class XMLToolParser:
    """Qwen3-Coder ``<function=name><parameter=key>value</parameter></function>`` tool calls."""

    start_marker = START

    def parse(self, text: str) -> ParsedOutput:
        return split_blocks(text, _call)

    def render(self, calls: list[ToolCall]) -> str:
        """Qwen3-Coder's layout; string values verbatim, others as JSON."""
        blocks = []
        for call in calls:
            args = call.args_object()
            params = "".join(
                f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n</parameter>\n"
                for k, v in (args.items() if isinstance(args, dict) else []))
            blocks.append(f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>")
        return "\n".join(blocks)

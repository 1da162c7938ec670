"""Shared splitting of ``<tool_call>...</tool_call>`` blocks out of generated text.

The content is the text before the first block verbatim (no stripping, so a streamed reply
and a non-streamed one agree) plus non-blank text between and after blocks. A block whose
body the format's parser rejects stays in the content as text; an unterminated final block
is parsed too (generation may stop before the closing tag).
"""

from __future__ import annotations

import re
from typing import Callable

from loongsage.plugin import ParsedOutput, ToolCall

START, END = "<tool_call>", "</tool_call>"
BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def split_blocks(text: str, parse_body: Callable[[str], ToolCall | None]) -> ParsedOutput:
    calls: list[ToolCall] = []
    content: list[str] = []
    pos = 0
    for match in BLOCK.finditer(text):
        between = text[pos:match.start()]
        content.append(between.strip() if calls else between)
        call = parse_body(match.group(1))
        if call is None:
            content.append(match.group(0))
        else:
            calls.append(call)
        pos = match.end()
    tail = text[pos:]
    content.append(tail.strip() if calls else tail)
    return ParsedOutput(content="".join(content), tool_calls=calls)

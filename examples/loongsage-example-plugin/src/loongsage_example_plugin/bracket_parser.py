"""A tool-call syntax of one line per call, ``[[call NAME {json arguments}]]``, to show the
tool_parser contract: ``parse`` and its inverse ``render``."""

import json
import re

from loongsage.plugin import ParsedOutput, ToolCall

_CALL = re.compile(r"\[\[call (\S+) (\{.*?\})\]\]")


class BracketParser:
    """Text outside the brackets is the content; each bracket is one call."""

    start_marker = "[[call "

    def parse(self, text):
        calls = [ToolCall(name, arguments) for name, arguments in _CALL.findall(text)]
        if not calls:
            return ParsedOutput(text)
        return ParsedOutput(_CALL.sub("", text).strip(), calls)

    def render(self, calls):
        return "\n".join(f"[[call {c.name} {json.dumps(c.args_object())}]]" for c in calls)

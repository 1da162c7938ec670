"""Tool-call parsers (plugin kind ``tool_parser``): generated text -> content + tool calls."""

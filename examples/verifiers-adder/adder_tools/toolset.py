"""The MCP tool server of adder-tools: one tool, ``add``, started by verifiers per rollout."""

import verifiers.v1 as vf


class AdderToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None  # the tool is called plainly `add`

    @vf.tool
    def add(self, a: int, b: int) -> str:
        """Return the sum of the integers a and b."""
        return str(a + b)


if __name__ == "__main__":
    AdderToolset.run()

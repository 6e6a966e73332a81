"""One memory-tool command per stdin line (the tool input as JSON), run through the stock
Python BetaLocalFilesystemMemoryTool of `anthropic` as the SDK's tool runner runs it (the
result through `tool_result_content`, an exception through `tool_error_content`); one JSON
line {is_error, content} on stdout per command, at once. An agent that keeps its tool open
while another host changes the memory under it.

usage: python memory_repl.py BASE_DIR
"""

import json
import sys

from anthropic.tools import BetaLocalFilesystemMemoryTool
from anthropic.lib.tools._tool_dispatch import tool_error_content, tool_result_content


def main():
    if len(sys.argv) != 2:
        print("usage: python memory_repl.py BASE_DIR", file=sys.stderr)
        sys.exit(2)
    tool = BetaLocalFilesystemMemoryTool(base_path=sys.argv[1])
    for line in sys.stdin:
        if not line.strip():
            continue
        tool_input = json.loads(line)
        try:
            content, is_error = tool_result_content(tool.call(tool_input)), False
        except Exception as exc:  # the runner catches ToolError and any other Exception alike
            content, is_error = tool_error_content(exc), True
        sys.stdout.write(json.dumps({"is_error": is_error, "content": content}, ensure_ascii=False) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Runs a scripted memory-tool session (session.json) through the stock Python
BetaLocalFilesystemMemoryTool of `anthropic` (or, with --async, BetaAsyncLocalFilesystemMemoryTool,
which an AsyncAnthropic tool runner uses), the way the SDK's tool runner calls it:
`tool.call(tool_use.input)`, with the result passed through `tool_result_content` and any
exception through `tool_error_content` (exactly what `_run_tool` does in both runners).
Prints one JSON line per command: {i, note, command, is_error, content}, with the absolute
base path masked as <ROOT> so runs in different directories compare byte for byte.

usage: python run_session.py [--async] BASE_DIR SESSION_JSON
"""

import json
import os
import sys
import asyncio

from anthropic.tools import BetaLocalFilesystemMemoryTool, BetaAsyncLocalFilesystemMemoryTool
from anthropic.lib.tools._tool_dispatch import tool_error_content, tool_result_content


def expand(value):
    """`{"$repeat": UNIT, "count": N, "before": A, "after": B}` -> A + UNIT*N + B."""
    if isinstance(value, dict) and "$repeat" in value:
        return value.get("before", "") + value["$repeat"] * value["count"] + value.get("after", "")
    return value


def make_mask(roots):
    unique = sorted({r for r in roots if r}, key=len, reverse=True)

    def mask_text(text):
        for root in unique:
            text = text.replace(root, "<ROOT>")
        return text

    def mask(content):
        if isinstance(content, str):
            return mask_text(content)
        if isinstance(content, list):
            return [
                {**b, "text": mask_text(b["text"])} if isinstance(b, dict) and isinstance(b.get("text"), str) else b
                for b in content
            ]
        return content

    return mask


def main():
    args = sys.argv[1:]
    use_async = args[:1] == ["--async"]
    if use_async:
        args = args[1:]
    if len(args) != 2:
        print("usage: python run_session.py [--async] BASE_DIR SESSION_JSON", file=sys.stderr)
        sys.exit(2)
    base_dir, session_file = args
    with open(session_file, encoding="utf-8") as f:
        session = json.load(f)
    mask = make_mask([base_dir, os.path.abspath(base_dir), os.path.realpath(base_dir)])

    def emit(i, step, tool_input, content, is_error):
        line = {"i": i, "note": step["note"], "command": tool_input["command"], "is_error": is_error, "content": mask(content)}
        sys.stdout.write(json.dumps(line, ensure_ascii=False) + "\n")

    if use_async:

        async def run_async():
            # The async tool creates `<base>/memories` on its first command, not in its constructor.
            tool = BetaAsyncLocalFilesystemMemoryTool(base_path=base_dir)
            for i, step in enumerate(session):
                tool_input = {k: expand(v) for k, v in step["input"].items()}
                try:
                    content, is_error = tool_result_content(await tool.call(tool_input)), False
                except Exception as exc:  # the runner catches ToolError and any other Exception alike
                    content, is_error = tool_error_content(exc), True
                emit(i, step, tool_input, content, is_error)

        asyncio.run(run_async())
    else:
        # The Python SDK has no `init`: the constructor creates `<base>/memories` itself.
        tool = BetaLocalFilesystemMemoryTool(base_path=base_dir)
        for i, step in enumerate(session):
            tool_input = {k: expand(v) for k, v in step["input"].items()}
            try:
                content, is_error = tool_result_content(tool.call(tool_input)), False
            except Exception as exc:  # the runner catches ToolError and any other Exception alike
                content, is_error = tool_error_content(exc), True
            emit(i, step, tool_input, content, is_error)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Several agents editing one memory at once through the stock Python
BetaLocalFilesystemMemoryTool of `anthropic` (with --async, BetaAsyncLocalFilesystemMemoryTool
and that many asyncio agents in one process), each command passed through the runner's
`tool_result_content` / `tool_error_content`. Each agent makes EDITS edits: even ones insert
`<agent>-insert-<i>` after line 1, odd ones str_replace `slot-<agent>-<i>: empty` with
`slot-<agent>-<i>: done`. A refusal for a lost update (EAGAIN, "Resource temporarily
unavailable") is retried as a model would: the same command again, which re-reads the file.
Prints one JSON line: {ok, refusals, vanished, errors}.

usage: python agents_edit.py [--async] BASE_DIR MEMORY_PATH EDITS AGENT [AGENT...]
"""

import asyncio
import json
import sys

from anthropic.tools import BetaLocalFilesystemMemoryTool, BetaAsyncLocalFilesystemMemoryTool
from anthropic.lib.tools._tool_dispatch import tool_error_content, tool_result_content


def command_for(path, agent, i):
    if i % 2 == 0:
        return {"command": "insert", "path": path, "insert_line": 1, "insert_text": f"{agent}-insert-{i}"}
    return {"command": "str_replace", "path": path, "old_str": f"slot-{agent}-{i}: empty", "new_str": f"slot-{agent}-{i}: done"}


def main():
    args = sys.argv[1:]
    use_async = args[:1] == ["--async"]
    if use_async:
        args = args[1:]
    if len(args) < 4:
        print("usage: python agents_edit.py [--async] BASE_DIR MEMORY_PATH EDITS AGENT [AGENT...]", file=sys.stderr)
        sys.exit(2)
    base_dir, path, edits, agents = args[0], args[1], int(args[2]), args[3:]
    tally = {"ok": 0, "refusals": 0, "vanished": 0, "errors": []}

    def judge(result):
        """True when the command is done (success or a final error), False to retry."""
        text, is_error = result
        if not is_error:
            tally["ok"] += 1
            return True
        text = json.dumps(text) if not isinstance(text, str) else text
        if "no longer exists" in text:
            tally["vanished"] += 1
        if "Resource temporarily unavailable" in text:
            tally["refusals"] += 1
            return False
        tally["errors"].append(text)
        return True

    if use_async:
        tool = BetaAsyncLocalFilesystemMemoryTool(base_path=base_dir)

        async def run(cmd):
            try:
                return tool_result_content(await tool.call(cmd)), False
            except Exception as exc:
                return tool_error_content(exc), True

        async def agent(name):
            for i in range(edits):
                for _ in range(200):
                    if judge(await run(command_for(path, name, i))):
                        break

        async def all_agents():
            await asyncio.gather(*(agent(a) for a in agents))

        asyncio.run(all_agents())
    else:
        tool = BetaLocalFilesystemMemoryTool(base_path=base_dir)

        def run(cmd):
            try:
                return tool_result_content(tool.call(cmd)), False
            except Exception as exc:
                return tool_error_content(exc), True

        # Several agents in one synchronous process take turns.
        for i in range(edits):
            for name in agents:
                for _ in range(200):
                    if judge(run(command_for(path, name, i))):
                        break
    sys.stdout.write(json.dumps(tally) + "\n")


if __name__ == "__main__":
    main()

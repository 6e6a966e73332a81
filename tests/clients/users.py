"""Many users on one mount, each with its own stock Python BetaAsyncLocalFilesystemMemoryTool of
`anthropic` (base path USERS_DIR/<user>), all as asyncio agents in this one process, each
command passed through the runner's `tool_result_content` / `tool_error_content`. Each user
creates FILES memories of about BYTES bytes, then makes one str_replace and one view. The HOG
user has a small quota: the others write their second half only once the hog has been refused,
so they keep writing while it is over its quota. Prints one JSON line: user -> {ok, errors}.

usage: python users.py USERS_DIR FILES BYTES HOG USER...
"""

import asyncio
import json
import sys

from anthropic.tools import BetaAsyncLocalFilesystemMemoryTool
from anthropic.lib.tools._tool_dispatch import tool_error_content, tool_result_content


async def main():
    args = sys.argv[1:]
    if len(args) < 5:
        print("usage: python users.py USERS_DIR FILES BYTES HOG USER...", file=sys.stderr)
        sys.exit(2)
    users_dir, files, size, hog, users = args[0], int(args[1]), int(args[2]), args[3], args[4:]
    hog_refused = asyncio.Event()
    report = {}

    async def user(name):
        tool = BetaAsyncLocalFilesystemMemoryTool(base_path=f"{users_dir}/{name}")
        r = {"ok": 0, "errors": []}
        report[name] = r

        async def run(cmd):
            try:
                tool_result_content(await tool.call(cmd))
                r["ok"] += 1
            except Exception as exc:
                text = tool_error_content(exc)
                r["errors"].append(text if isinstance(text, str) else json.dumps(text))
                if name == hog:
                    hog_refused.set()

        for i in range(files):
            if name != hog and i == files // 2:
                await hog_refused.wait()
            body = f"{name} note {i}\n" + "x" * size + "\n"
            await run({"command": "create", "path": f"/memories/note-{i}.md", "file_text": body})
        await run({"command": "str_replace", "path": "/memories/note-0.md",
                   "old_str": f"{name} note 0", "new_str": f"{name} note zero"})
        await run({"command": "view", "path": "/memories"})
        # Never leave the others waiting, whatever happened to the hog.
        if name == hog:
            hog_refused.set()

    await asyncio.gather(*(user(u) for u in users))
    sys.stdout.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    asyncio.run(main())

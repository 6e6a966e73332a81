#!/usr/bin/env python3
"""What history keeps per edit of one memory: store bytes per edit, by size of the memory.

For each size and each way of rewriting, a fresh store is mounted (history on, the default
30 days), one memory is created, then rewritten N times with 8 bytes changed each (in place:
open O_TRUNC, write, fsync, close; or as the SDK's memory tool does: a temporary file written
and fsynced, then renamed over the memory), unmounted and compacted (`redbfs compact`).
Bytes per edit = (store size after 1,000 edits - store size after 10) / 990: sizes only,
so any build (debug or release) and any load give the same figures.

    bench/edit_history.py --redbfs target/debug/redbfs [--sizes 100,1500,20000]
        [--edits 1000] [--ways inplace,rename] [--json]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile


def content(size, v):
    line = b"- the user prefers short answers with code, and tests first\n"
    out = bytearray((line * (size // len(line) + 1))[:size])
    at = max(0, size // 2 - 4)
    out[at:at + 8] = b"%08d" % v
    return bytes(out[:size])


def run(redbfs, *args):
    subprocess.run([redbfs, *args], check=True, stdout=subprocess.DEVNULL)


def store_bytes(redbfs, size, edits, way):
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        mnt, store = os.path.join(d, "m"), os.path.join(d, "m.redb")
        run(redbfs, "mount", mnt)
        try:
            target = os.path.join(mnt, "mem.md")
            for v in range(edits + 1):
                data = content(size, v)
                path = target if way == "inplace" or v == 0 else os.path.join(mnt, f".tmp-{v}")
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, data)
                os.fsync(fd)
                os.close(fd)
                if path != target:
                    os.rename(path, target)
            with open(target, "rb") as f:
                assert f.read() == content(size, edits)
        finally:
            run(redbfs, "unmount", mnt)
        run(redbfs, "compact", store)
        return os.path.getsize(store)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--redbfs", default="target/release/redbfs")
    p.add_argument("--sizes", default="100,1500,20000")
    p.add_argument("--edits", type=int, default=1000)
    p.add_argument("--ways", default="inplace,rename")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    rows = []
    for way in a.ways.split(","):
        for size in (int(s) for s in a.sizes.split(",")):
            few = store_bytes(a.redbfs, size, 10, way)
            many = store_bytes(a.redbfs, size, a.edits, way)
            per = (many - few) / (a.edits - 10)
            rows.append({"way": way, "size": size, "bytes_10": few,
                         f"bytes_{a.edits}": many, "bytes_per_edit": round(per)})
            if not a.json:
                print(f"{way:8} {size:6} bytes: {few} after 10 edits, {many} after "
                      f"{a.edits}: {per:,.0f} bytes per edit", flush=True)
    if a.json:
        json.dump(rows, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()

"""One process of the concurrent differential test (tests/concurrency.rs): THREADS threads,
each running OPS seeded random operations on a small shared namespace in DIR, which other
processes work on at the same time.

Names: `r0`..`r3` exist from the start and are only ever replaced, by a rename of a
complete temporary file over them (what the SDK memory tools do); `c0`..`c3` are created and
unlinked. Every error is checked against what the same race can produce on ext4: on an `r`
name, nothing (never ENOENT: a replace is atomic for everyone); on a `c` name, ENOENT only.
Every read of an `r` name must be one complete version that some thread wrote.

Prints one JSON line: {"failures": [...], "ops": N}.

usage: python3 worker.py DIR SEED PROC THREADS OPS
"""

import errno
import json
import os
import random
import sys
import threading

REPLACED = [f"r{i}" for i in range(4)]
CHURNED = [f"c{i}" for i in range(4)]


def version(name, tag, rng):
    body = "x" * rng.randrange(0, 3000)
    head = f"V|{name}|{tag}|{len(body)}|"
    return (head + body + "|END\n").encode()


def complete(name, data):
    """None when `data` is one whole version of `name`, else what is wrong with it."""
    text = data.decode(errors="replace")
    parts = text.split("|")
    if len(parts) != 6 or parts[0] != "V" or parts[1] != name or parts[5] != "END\n":
        return f"not a complete version: {text[:60]!r}... ({len(data)} bytes)"
    if len(parts[4]) != int(parts[3]):
        return f"torn body: {len(parts[4])} of {parts[3]} bytes"
    return None


def main():
    d, seed, proc, threads, ops = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    failures = []
    lock = threading.Lock()
    done = [0]

    def fail(op, name, what):
        with lock:
            failures.append({"proc": proc, "op": op, "name": name, "error": what})

    def thread(t):
        rng = random.Random(seed * 1_000_003 + proc * 101 + t)
        for i in range(ops):
            op = rng.choice(["replace", "replace", "read", "read", "read", "stat", "chmod", "list", "unlink", "create"])
            r = rng.choice(REPLACED)
            c = rng.choice(CHURNED)
            tag = f"{proc}-{t}-{i}"
            try:
                if op == "replace":
                    tmp = os.path.join(d, f".tmp-{tag}")
                    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
                    try:
                        os.write(fd, version(r, tag, rng))
                        if rng.random() < 0.3:
                            os.fsync(fd)
                    finally:
                        os.close(fd)
                    os.rename(tmp, os.path.join(d, r))
                elif op == "read":
                    name = r if rng.random() < 0.7 else c
                    data = None
                    try:
                        with open(os.path.join(d, name), "rb") as f:
                            data = f.read()
                    except OSError as e:
                        if not (name in CHURNED and e.errno == errno.ENOENT):
                            raise
                    if name in REPLACED:
                        wrong = complete(name, data)
                        if wrong:
                            fail(op, name, wrong)
                elif op == "stat":
                    name = r if rng.random() < 0.7 else c
                    try:
                        os.stat(os.path.join(d, name))
                    except OSError as e:
                        if not (name in CHURNED and e.errno == errno.ENOENT):
                            raise
                elif op == "chmod":
                    os.chmod(os.path.join(d, r), rng.choice([0o600, 0o640]))
                elif op == "list":
                    names = set(os.listdir(d))
                    missing = [n for n in REPLACED if n not in names]
                    if missing:
                        fail(op, ",".join(missing), "a replaced name was missing from the listing")
                elif op == "unlink":
                    try:
                        os.unlink(os.path.join(d, c))
                    except FileNotFoundError:
                        pass
                elif op == "create":
                    with open(os.path.join(d, c), "wb") as f:
                        f.write(version(c, tag, rng))
            except OSError as e:
                fail(op, r if op in ("replace", "chmod") else c, f"{errno.errorcode.get(e.errno, e.errno)}: {e}")
            with lock:
                done[0] += 1

    ts = [threading.Thread(target=thread, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(json.dumps({"failures": failures, "ops": done[0]}))


if __name__ == "__main__":
    main()

"""One benchmark phase, run by scripts/bench in its own process (stdlib only).

    python3 bench/worker.py PHASE ROOT [options]

Everything the phase needs (names, contents) is prepared before the clock starts; the clock
(time.perf_counter) covers only the phase's system calls. The result is one JSON line on
stdout: {"seconds": ..., ...}. Any wrong result (a short read, wrong bytes, a file left
behind) raises, so the process exits non-zero and the benchmark fails instead of timing a
broken filesystem.

With --sync the worker prints "ready" once prepared and starts when a line arrives on stdin,
so several workers can run one phase at once; it then also reports "start" and "end"
(time.monotonic, comparable across processes).

Layout of the small-files workload (b): ROOT/g<G>/d<D>/f<N>.txt, 5 groups of dirs/5
directories each, files spread evenly; so with 5,000 files in 50 directories each group
directory holds 1,000 files, and `rename_dir` renames g0 (holding files/5 files) to g0r.
"""

import argparse
import json
import os
import random
import stat
import subprocess
import sys
import time

GROUPS = 5


def die(msg):
    raise SystemExit(f"worker: {msg}")


# --- contents ---------------------------------------------------------------------------


def small_content(i, seed):
    """200 to 2,000 bytes, distinct per file, deterministic."""
    rng = random.Random(seed * 1_000_003 + i)
    size = rng.randint(200, 2000)
    line = f"file {i:07d} seed {seed} " + "abcdefghijklmnopqrstuvwxyz0123456789" * 2 + "\n"
    return (line * (size // len(line) + 1)).encode()[:size]


def memory_content(name, i, seed):
    """A memory file as the SDK session uses it: lines '- [<name>:<L>] ...', 3 or more lines,
    each token unique in the file, so str_replace of '[<name>:2]' always matches once."""
    rng = random.Random(seed * 7_000_003 + i)
    words = ["user", "prefers", "tabs", "deploy", "friday", "never", "the", "api", "key",
             "rotates", "monthly", "project", "uses", "redb", "and", "fuse", "tests", "pass"]
    lines = []
    target = rng.randint(200, 2000)
    size = 0
    L = 1
    while L <= 3 or size < target:
        text = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))
        line = f"- [{name}:{L}] {text}"
        lines.append(line)
        size += len(line) + 1
        L += 1
    return ("\n".join(lines) + "\n").encode()


# --- the small-files workload (b) -------------------------------------------------------


def b_layout(root, files, dirs, renamed=False):
    """[(dir, [(path, index)])] for the b workload; dirs must be a multiple of GROUPS."""
    if dirs % GROUPS or files % dirs:
        die(f"--files {files} must divide into --dirs {dirs}, a multiple of {GROUPS}")
    per_dir = files // dirs
    out = []
    i = 0
    for d in range(dirs):
        g = d % GROUPS
        gname = f"g{g}r" if (renamed and g == 0) else f"g{g}"
        dpath = os.path.join(root, gname, f"d{d:03d}")
        entries = []
        for _ in range(per_dir):
            entries.append((os.path.join(dpath, f"f{i:06d}.txt"), i))
            i += 1
        out.append((dpath, entries))
    return out


def run_timed(fn, sync):
    if sync:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        if not sys.stdin.readline():
            die("no go signal")
    start = time.monotonic()
    t0 = time.perf_counter()
    extra = fn() or {}
    t1 = time.perf_counter()
    end = time.monotonic()
    res = {"seconds": t1 - t0, "start": start, "end": end}
    res.update(extra)
    return res


def phase_b(a):
    root = a.root
    renamed = a.phase == "delete"
    layout = b_layout(root, a.files, a.dirs, renamed=renamed)
    allfiles = [(p, i) for _, ents in layout for p, i in ents]
    flags_create = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_TRUNC
    fsync = a.fsync

    if a.phase == "create":
        contents = [small_content(i, a.seed) for _, i in allfiles]
        groups = sorted({os.path.dirname(d) for d, _ in layout})
        plan = [(d, [(p, contents[k]) for k, (p, _) in enumerate(allfiles) if os.path.dirname(p) == d])
                for d, _ in layout]

        def go():
            os.makedirs(root, exist_ok=True)
            for g in groups:
                os.mkdir(g, 0o700)
            for d, ents in plan:
                os.mkdir(d, 0o700)
                for p, data in ents:
                    fd = os.open(p, flags_create, 0o600)
                    n = os.write(fd, data)
                    if n != len(data):
                        die(f"short write {p}")
                    if fsync:
                        os.fsync(fd)
                    os.close(fd)
        return run_timed(go, a.sync)

    if a.phase == "stat":
        paths = [p for p, _ in allfiles]
        dirpaths = [d for d, _ in layout]
        sizes = {p: len(small_content(i, a.seed)) for p, i in allfiles}
        got = {}

        def go():
            for d in dirpaths:
                if not stat.S_ISDIR(os.lstat(d).st_mode):
                    die(f"{d} is not a directory")
            for p in paths:
                got[p] = os.lstat(p).st_size
        r = run_timed(go, a.sync)
        bad = [p for p in paths if got[p] != sizes[p]]
        if bad:
            die(f"{len(bad)} wrong st_size, e.g. {bad[0]}: {got[bad[0]]} != {sizes[bad[0]]}")
        return r

    if a.phase in ("ls_lR", "du"):
        cmd = ["ls", "-lR", root] if a.phase == "ls_lR" else ["du", "-s", root]
        out = {}

        def go():
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out["p"] = p
        r = run_timed(go, a.sync)
        p = out["p"]
        if p.returncode != 0:
            die(f"{' '.join(cmd)} failed: {p.stderr.decode(errors='replace')[:500]}")
        if a.phase == "ls_lR":
            n = sum(1 for line in p.stdout.decode(errors="replace").splitlines() if line.startswith("-"))
            if n != a.files:
                die(f"ls -lR listed {n} files, want {a.files}")
        return r

    if a.phase == "read":
        paths = [p for p, _ in allfiles]
        want = [small_content(i, a.seed) for _, i in allfiles]
        got = [None] * len(paths)

        def go():
            for k, p in enumerate(paths):
                fd = os.open(p, os.O_RDONLY)
                chunks = []
                while True:
                    b = os.read(fd, 65536)
                    if not b:
                        break
                    chunks.append(b)
                os.close(fd)
                got[k] = b"".join(chunks)
        r = run_timed(go, a.sync)
        for k, p in enumerate(paths):
            if got[k] != want[k]:
                die(f"read {p}: {len(got[k])} bytes, want {len(want[k])} (content differs)")
        return r

    if a.phase == "append":
        targets = [(p, f"append {i:07d} ".encode().ljust(99, b".") + b"\n") for p, i in allfiles if i % 5 == 0]

        def go():
            for p, data in targets:
                fd = os.open(p, os.O_WRONLY | os.O_APPEND)
                if os.write(fd, data) != len(data):
                    die(f"short append {p}")
                if fsync:
                    os.fsync(fd)
                os.close(fd)
        r = run_timed(go, a.sync)
        r["files"] = len(targets)
        return r

    if a.phase == "rename_dir":
        src, dst = os.path.join(root, "g0"), os.path.join(root, "g0r")

        def go():
            os.rename(src, dst)
        r = run_timed(go, a.sync)
        inside = sum(len(os.listdir(os.path.join(dst, d))) for d in os.listdir(dst))
        if inside != a.files // GROUPS:
            die(f"{dst} holds {inside} files after the rename, want {a.files // GROUPS}")
        return r

    if a.phase == "delete":
        paths = [p for p, _ in allfiles]
        dirpaths = [d for d, _ in layout]
        groups = sorted({os.path.dirname(d) for d in dirpaths})

        def go():
            for p in paths:
                os.unlink(p)
            for d in dirpaths:
                os.rmdir(d)
            for g in groups:
                os.rmdir(g)
        r = run_timed(go, a.sync)
        left = os.listdir(root)
        if left:
            die(f"{root} not empty after delete: {left[:5]}")
        return r

    die(f"unknown b phase {a.phase}")


# --- fillers (untimed set-up, but reported) ---------------------------------------------


def fill_memories(a):
    """BASE/memories/topicNNN/m<id>.md for ids [start, start+count), topic = id % topics.
    Plain writes, no fsync: the fast writer used to pre-fill stores."""
    mem = os.path.join(a.root, "memories")
    os.makedirs(mem, mode=0o700, exist_ok=True)
    t0 = time.perf_counter()
    made = set()
    for i in range(a.start, a.start + a.count):
        topic = os.path.join(mem, f"topic{i % a.topics:03d}")
        if topic not in made:
            os.makedirs(topic, mode=0o700, exist_ok=True)
            made.add(topic)
        name = f"m{i:06d}"
        fd = os.open(os.path.join(topic, name + ".md"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, memory_content(name, i, a.seed))
        os.close(fd)
    return {"seconds": time.perf_counter() - t0}


def fill_empty(a):
    """ROOT/<name>/e<N> for N in [0, count): empty files (open O_CREAT, close)."""
    d = os.path.join(a.root, a.name)
    os.makedirs(d, mode=0o700, exist_ok=True)
    t0 = time.perf_counter()
    for i in range(a.count):
        os.close(os.open(os.path.join(d, f"e{i:06d}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return {"seconds": time.perf_counter() - t0}


# --- rename scaling (c) -----------------------------------------------------------------


def rename_repeat(a):
    """Renames ROOT/<name> back and forth --repeat times; reports the median single rename."""
    src = os.path.join(a.root, a.name)
    dst = src + ".renamed"
    times = []
    for k in range(a.repeat):
        s, d = (src, dst) if k % 2 == 0 else (dst, src)
        t0 = time.perf_counter()
        os.rename(s, d)
        times.append(time.perf_counter() - t0)
    final = dst if a.repeat % 2 else src
    n = len(os.listdir(final))
    if n != a.count:
        die(f"{final} holds {n} entries after renames, want {a.count}")
    times.sort()
    return {"seconds": times[len(times) // 2], "all": times}


# --- large file (e) ---------------------------------------------------------------------

CHUNK = 1 << 20


def big_chunk(k):
    rnd = random.Random(k).getrandbits(8 * 4096).to_bytes(4096, "little")
    return (k.to_bytes(8, "little") + rnd * (CHUNK // 4096))[:CHUNK]


def big_write(a):
    chunks = [big_chunk(k) for k in range(a.mib)]

    def go():
        fd = os.open(a.root, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for c in chunks:
            if os.write(fd, c) != len(c):
                die("short write")
        os.fsync(fd)
        os.close(fd)
    return run_timed(go, a.sync)


def big_read(a):
    want = [big_chunk(k) for k in range(a.mib)]
    got = []

    def go():
        fd = os.open(a.root, os.O_RDONLY)
        while True:
            b = os.read(fd, CHUNK)
            if not b:
                break
            got.append(b)
        os.close(fd)
    r = run_timed(go, a.sync)
    data = b"".join(got)
    if data != b"".join(want):
        die(f"read back {len(data)} bytes of {a.root}, want {a.mib} MiB with the written content")
    return r


# --- scans (g) --------------------------------------------------------------------------


def stat_tree(a):
    """lstat every entry below ROOT via scandir: the 'scan a store' of g."""
    count = {"n": 0}

    def go():
        stack = [a.root]
        n = 0
        while stack:
            d = stack.pop()
            with os.scandir(d) as it:
                for e in it:
                    st = os.lstat(e.path)
                    n += 1
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(e.path)
        count["n"] = n
    r = run_timed(go, a.sync)
    if a.expect and count["n"] != a.expect:
        die(f"scanned {count['n']} entries below {a.root}, want {a.expect}")
    r["entries"] = count["n"]
    return r


# --- scale (h) --------------------------------------------------------------------------


def scale_content(i):
    """About 100 bytes, distinct per file."""
    return (f"memory {i:07d}: the user prefers short answers; project notes follow.\n" * 2).encode()[:100]


def scale_tree(a):
    """ROOT/d<D>/f<N>.md for N in [0, count), in --dirs directories: the tree h imports."""
    dirs = [os.path.join(a.root, f"d{d:04d}") for d in range(a.dirs)]
    for d in dirs:
        os.makedirs(d, mode=0o755, exist_ok=True)
    t0 = time.perf_counter()
    for i in range(a.count):
        fd = os.open(os.path.join(dirs[i % a.dirs], f"f{i:07d}.md"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, scale_content(i))
        os.close(fd)
    return {"seconds": time.perf_counter() - t0, "bytes": 100 * a.count}


def scale_ops(a):
    """Per-operation costs in a store of any size, on a fresh directory ROOT of --count files:
    create (O_EXCL, write 100 bytes, fsync, close), stat, rename, view (list the directory
    and stat each entry, --repeat times) and durable unlink (unlink, then fsync of the
    directory, which ext4 needs and redbfs gives at unlink). Microseconds per operation."""
    os.makedirs(a.root, mode=0o755, exist_ok=False)
    names = [os.path.join(a.root, f"p{i:05d}.md") for i in range(a.count)]
    moved = [n + ".moved" for n in names]
    data = [scale_content(i) for i in range(a.count)]
    out = {}

    def per_op(key, fn, n):
        t0 = time.perf_counter()
        fn()
        out[key] = (time.perf_counter() - t0) * 1e6 / n

    def create():
        for n, d in zip(names, data):
            fd = os.open(n, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, d)
            os.fsync(fd)
            os.close(fd)

    def stat_all():
        for n in names:
            os.lstat(n)

    def rename_all():
        for n, m in zip(names, moved):
            os.rename(n, m)

    def view():
        for _ in range(a.repeat):
            with os.scandir(a.root) as it:
                k = sum(1 for e in it if e.stat(follow_symlinks=False))
            if k != a.count:
                die(f"view of {a.root} found {k} entries, want {a.count}")

    def unlink_all():
        dfd = os.open(a.root, os.O_RDONLY | os.O_DIRECTORY)
        for m in moved:
            os.unlink(m)
            os.fsync(dfd)
        os.close(dfd)

    per_op("create_fsync_us", create, a.count)
    per_op("stat_us", stat_all, a.count)
    per_op("rename_us", rename_all, a.count)
    per_op("view_us", view, a.repeat)
    per_op("unlink_durable_us", unlink_all, a.count)
    if os.listdir(a.root):
        die(f"{a.root} not empty after the unlinks")
    os.rmdir(a.root)
    return out


def edit(a):
    """--count rewrites (open O_TRUNC, write, fsync, close) of --files memories under ROOT,
    round robin: the history of many small edits."""
    os.makedirs(a.root, mode=0o755, exist_ok=True)
    paths = [os.path.join(a.root, f"e{k:04d}.md") for k in range(a.files)]
    t0 = time.perf_counter()
    for i in range(a.count):
        fd = os.open(paths[i % a.files], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, f"edit {i} of {paths[i % a.files]}\n".encode())
        os.fsync(fd)
        os.close(fd)
    return {"seconds": time.perf_counter() - t0}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("phase")
    p.add_argument("root")
    p.add_argument("--files", type=int, default=5000)
    p.add_argument("--dirs", type=int, default=50)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fsync", action="store_true")
    p.add_argument("--sync", action="store_true")
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--topics", type=int, default=10)
    p.add_argument("--name", default="c")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--expect", type=int, default=0)
    a = p.parse_args()
    b_phases = {"create", "stat", "ls_lR", "du", "read", "append", "rename_dir", "delete"}
    if a.phase in b_phases:
        res = phase_b(a)
    else:
        fn = {
            "fill-memories": fill_memories,
            "fill-empty": fill_empty,
            "rename": rename_repeat,
            "big-write": big_write,
            "big-read": big_read,
            "stat-tree": stat_tree,
            "scale-tree": scale_tree,
            "scale-ops": scale_ops,
            "edit": edit,
        }.get(a.phase)
        if fn is None:
            die(f"unknown phase {a.phase}")
        res = fn(a)
    sys.stdout.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()

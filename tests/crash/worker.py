#!/usr/bin/env python3
"""Workload processes for tests/crash.rs and tests/durability.rs (stdlib only).

usage: worker.py '<json>'   with keys
  mode     create | replace | rev | dirrename | rmtree | large | soak-writer | soak-renamer |
           soak-reader
  mount    the mountpoint (absolute)
  root     this worker's own directory, relative to the mount ("memories/w0"); no other
           worker changes anything below it
  journal  a file on the local disk (never on the mount)
  seed     integer seed of this worker's choices
  tag      a string unique to this run of the worker (names never repeat across kills)
  secs     (soak modes) how long to run
  extra    mode-specific settings

The journal is one JSON object a line, written with write(2) and fsync(2):
  {"ready": true, "pid": N}                      after start-up, before the first operation
  {"b": SEQ, "op": ..., ...}                      an operation begins (intent)
  {"a": SEQ, "len": L}                            an fsync of a write returned with L bytes in
  {"a": SEQ}                                      the operation returned (acknowledged)
  {"f": SEQ, "errno": "ENOTCONN", "dead": bool}   the operation failed; dead says whether the
                                                  mount was gone (daemon killed) at that point
  {"slow": WHAT, "ms": MS}                        a single system call took longer than 30 s (a hang)
  {"done": true, "ops": N, "max_ms": MS}          the worker finished on its own (soak modes)

An acknowledgement is journaled only AFTER the call returned, so everything journaled as
acknowledged was acknowledged by the filesystem before the daemon was killed.

Operations (paths relative to the mount):
  mkdir path | unlink path | rmdir path | rename from to | rmtree path
  write path cid size rev points excl   create (excl, O_CREAT|O_EXCL) or overwrite (O_TRUNC)
                                        with content(cid, size, rev); an fsync after each of
                                        `points` bytes, then close
File contents come from `content()`, the same generator as in tests/crash/model.rs and
tests/crash/sdk_worker.mjs: self-describing text, so any prefix can be checked on its own.
"""

import errno
import json
import os
import random
import stat
import sys
import time

FILL = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ+/"
SLOW_S = 30.0  # a hang detector, not a speed bound: a loaded CI machine stalls for seconds
_cache = {}


def content(cid, size, rev=0):
    key = (cid, size, rev)
    if key in _cache:
        return _cache[key]
    parts = ["#%s %d rev=%04d\n" % (cid, size, rev)]
    total = len(parts[0])
    i = 0
    while total < size:
        p = "%s:%d|" % (cid, i)
        line = p + FILL[: max(0, 63 - len(p))] + "\n"
        parts.append(line)
        total += len(line)
        i += 1
    data = "".join(parts)[:size].encode()
    if size > 1 << 20:
        _cache.clear()
    _cache[key] = data
    return data


def check_prefix(data):
    """None if `data` is a prefix of some content(cid, size, rev); else what is wrong."""
    if not data:
        return None
    nl = data.find(b"\n")
    head = data[: nl if nl >= 0 else len(data)].decode("ascii", "replace")
    try:
        cid, size, rev = head[1:].split(" ")
        size = int(size)
        rev = int(rev[4:])
    except ValueError:
        if nl < 0:
            return None  # a prefix shorter than its header line
        return "no content header: %r" % head[:80]
    want = content(cid, size, rev)
    if len(data) > size:
        return "%d bytes, but the header says %d" % (len(data), size)
    if want[: len(data)] != data:
        at = next(i for i in range(len(data)) if want[i] != data[i])
        return "differs from content(%s) at byte %d" % (cid, at)
    return None


class Stop(Exception):
    pass


class Worker:
    def __init__(self, cfg):
        self.cfg = cfg
        self.mount = cfg["mount"]
        self.root = cfg["root"]
        self.tag = cfg.get("tag", "t")
        self.rng = random.Random(int(cfg["seed"]))
        self.fd = os.open(cfg["journal"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.seq = 0
        self.ops = 0
        self.max_ms = 0.0
        self.soak = cfg["mode"].startswith("soak")
        self.deadline = time.monotonic() + float(cfg.get("secs", 0))

    # ---- journal ----

    def rec(self, obj):
        os.write(self.fd, (json.dumps(obj, separators=(",", ":")) + "\n").encode())
        os.fsync(self.fd)

    def abs(self, rel):
        return os.path.join(self.mount, rel)

    def dead(self, err=None):
        """Whether the mount is gone (the daemon was killed): the error says so, or a readdir
        of the mount root (a stat may be answered from the kernel's attribute cache) fails so."""
        gone = (errno.ENOTCONN, errno.ECONNABORTED)
        if err is not None and err.errno in gone:
            return True
        try:
            os.listdir(self.mount)
            return False
        except OSError as e:
            return e.errno in gone

    def sys(self, what, fn, *args):
        """One system call, timed: the liveness bound applies to each request."""
        t0 = time.monotonic()
        try:
            return fn(*args)
        finally:
            ms = (time.monotonic() - t0) * 1000.0
            self.max_ms = max(self.max_ms, ms)
            if ms > SLOW_S * 1000:
                self.rec({"slow": what, "ms": round(ms, 1)})

    def op(self, desc, body):
        self.seq += 1
        seq = self.seq
        self.rec(dict({"b": seq}, **desc))
        try:
            body(seq)
        except OSError as e:
            dead = self.dead(e)
            self.rec({"f": seq, "errno": errno.errorcode.get(e.errno, str(e.errno)),
                      "msg": str(e), "dead": dead})
            raise Stop()
        self.rec({"a": seq})
        self.ops += 1

    # ---- operations, each journaled ----

    def mkdir(self, rel):
        self.op({"op": "mkdir", "path": rel},
                lambda s: self.sys("mkdir", os.mkdir, self.abs(rel), 0o700))

    def unlink(self, rel):
        self.op({"op": "unlink", "path": rel},
                lambda s: self.sys("unlink", os.unlink, self.abs(rel)))

    def rmdir(self, rel):
        self.op({"op": "rmdir", "path": rel},
                lambda s: self.sys("rmdir", os.rmdir, self.abs(rel)))

    def rename(self, a, b):
        self.op({"op": "rename", "from": a, "to": b},
                lambda s: self.sys("rename", os.rename, self.abs(a), self.abs(b)))

    def write(self, rel, cid, size, rev=0, points=None, excl=True, chunk=1 << 20):
        """The SDK's create: open(O_WRONLY|O_CREAT|O_EXCL|O_TRUNC, 0600), write, fsync, close;
        or with excl=False an overwrite through O_TRUNC. An fsync after each point."""
        points = sorted(set(points or [size]))
        assert points[-1] == size
        data = content(cid, size, rev)

        def body(seq):
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_EXCL if excl else 0)
            fd = self.sys("open", os.open, self.abs(rel), flags, 0o600)
            try:
                pos = 0
                for p in points:
                    while pos < p:
                        n = self.sys("write", os.write, fd, data[pos: min(p, pos + chunk)])
                        pos += n
                    self.sys("fsync", os.fsync, fd)
                    self.rec({"a": seq, "len": p})
            except OSError:
                try:
                    os.close(fd)
                except OSError:
                    pass
                raise
            self.sys("close", os.close, fd)

        self.op({"op": "write", "path": rel, "cid": cid, "size": size, "rev": rev,
                 "points": points, "excl": excl}, body)

    # ---- helpers ----

    def size(self):
        r = self.rng.random()
        if r < 0.80:
            return self.rng.randint(64, 4000)
        if r < 0.97:
            return self.rng.randint(4000, 150_000)
        return self.rng.randint(520_000, 700_000)

    def cid(self, n):
        return "%s.%s.%d" % (self.root.replace("/", "_"), self.tag, n)

    def listdir(self, rel):
        try:
            return sorted(self.sys("listdir", os.listdir, self.abs(rel)))
        except FileNotFoundError:
            return []

    def keep_going(self):
        return time.monotonic() < self.deadline if self.soak else True

    # ---- modes ----

    def m_create(self):
        """Many small memories created the SDK's way."""
        n = 0
        while True:
            n += 1
            self.write("%s/%s-%d.md" % (self.root, self.tag, n), self.cid(n), self.size())

    def m_replace(self):
        """str_replace loops: a temp file written, fsynced and closed, renamed over a target."""
        targets = ["%s/t%d.md" % (self.root, i) for i in range(3)]
        pid = os.getpid()
        n = 0
        while True:
            n += 1
            t = self.rng.choice(targets)
            tmp = "%s/.tmp-%d-%d" % (self.root, pid, n)
            # Mostly small; a fifth span several 64 KiB chunks, where a mix would show.
            if self.rng.random() < 0.8:
                size = self.rng.randint(64, 8_000)
            else:
                size = self.rng.randint(65_000, 200_000)
            self.write(tmp, self.cid(n), size)
            self.rename(tmp, t)

    def m_rev(self):
        """Fallback for sdk_worker.mjs's rev mode: the SDK's str_replace syscalls (read, temp
        file written, fsynced and closed, replacing rename) as one journaled operation."""
        files = ["%s/%s" % (self.root, f) for f in self.cfg["extra"]["files"]]
        pid = os.getpid()
        n = 0
        while True:
            n += 1
            rel = self.rng.choice(files)

            def body(seq, rel=rel, n=n):
                old = self.sys("read", self._read, rel)
                i = old.index(b" rev=") + 5
                frm = int(old[i:i + 4])
                new = old[:i] + b"%04d" % ((frm + 1) % 10000) + old[i + 4:]
                tmp = self.abs("%s/.tmp-%d-%d" % (os.path.dirname(rel), pid, n))
                fd = self.sys("open", os.open, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                self.sys("write", os.write, fd, new)
                self.sys("fsync", os.fsync, fd)
                self.sys("close", os.close, fd)
                self.sys("rename", os.rename, tmp, self.abs(rel))

            with open(self.abs(rel), "rb") as f:
                head = f.read(200)
            i = head.index(b" rev=") + 5
            frm = int(head[i:i + 4])
            self.op({"op": "rev", "path": rel, "from": frm, "to": (frm + 1) % 10000}, body)

    def _read(self, rel):
        with open(self.abs(rel), "rb") as f:
            return f.read()

    def m_dirrename(self):
        """A directory holding 10,000 files renamed back and forth, within and across parents."""
        places = self.cfg["extra"]["places"]
        cur = []
        for p in places:
            # Not os.path.isdir: it reads every error as "not there", so a kill landing before
            # this first look (ENOTCONN) passed for a lost directory. Only ENOENT means absent;
            # any other error goes to run(), which records whether the mount was gone.
            try:
                if stat.S_ISDIR(os.stat(self.abs(p)).st_mode):
                    cur.append(p)
            except FileNotFoundError:
                pass
        if len(cur) != 1:
            raise SystemExit("dirrename: the directory is at %r, want exactly one of %r" % (cur, places))
        i = places.index(cur[0])
        while True:
            j = (i + self.rng.randint(1, len(places) - 1)) % len(places)
            self.rename(places[i], places[j])
            i = j

    def tree_delete(self, rel):
        """rm -r, one journaled unlink or rmdir at a time, children first."""
        for name in self.listdir(rel):
            p = rel + "/" + name
            if os.path.isdir(self.abs(p)):
                self.tree_delete(p)
            else:
                self.unlink(p)
        self.rmdir(rel)

    def m_rmtree(self):
        """Trees built (mkdir, files fsynced) and deleted recursively."""
        for name in self.listdir(self.root):
            self.tree_delete(self.root + "/" + name)
        n = 0
        while True:
            n += 1
            top = "%s/%s-%d" % (self.root, self.tag, n)
            self.mkdir(top)
            for d in range(self.rng.randint(1, 3)):
                sub = "%s/s%d" % (top, d)
                self.mkdir(sub)
                for f in range(self.rng.randint(1, 4)):
                    n += 1
                    self.write("%s/f%d.md" % (sub, f), self.cid(n), self.rng.randint(64, 3000))
            for f in range(self.rng.randint(0, 3)):
                n += 1
                self.write("%s/g%d.md" % (top, f), self.cid(n), self.rng.randint(64, 3000))
            self.tree_delete(top)

    def m_large(self):
        """Large files written in 1 MiB writes with an fsync every few MiB; overwrites through
        O_TRUNC; old files deleted so the store stays bounded."""
        mib = 1 << 20
        n = 0
        while True:
            n += 1
            files = [f for f in self.listdir(self.root) if not f.startswith(".")]
            size = self.rng.randint(1 * mib, 12 * mib) + self.rng.randint(0, 70_000)
            step = self.rng.choice([2, 3, 4]) * mib
            points = list(range(step, size, step)) + [size]
            r = self.rng.random()
            if len(files) >= 3 or (files and r < 0.2):
                self.unlink("%s/%s" % (self.root, self.rng.choice(files)))
            elif files and r < 0.6:
                self.write("%s/%s" % (self.root, self.rng.choice(files)), self.cid(n), size,
                           points=points, excl=False)
            else:
                self.write("%s/%s-%d.bin" % (self.root, self.tag, n), self.cid(n), size,
                           points=points)

    # ---- soak ----

    def m_soak_writer(self):
        """A writer doing what the Python SDK tool does, in its own directory."""
        files = {}  # rel -> rev of files this worker made
        subdirs = []
        pid = os.getpid()
        n = 0
        self.mkdir(self.root)
        while self.keep_going():
            n += 1
            r = self.rng.random()
            if r < 0.35 or len(files) < 3:
                d = self.rng.choice([self.root] + subdirs)
                rel = "%s/m%d.md" % (d, n)
                self.write(rel, self.cid(n), self.size())
                files[rel] = 0
            elif r < 0.60:
                # str_replace: read, temp file, fsync, close, replacing rename.
                t = self.rng.choice(sorted(files))
                self.read_check(t)
                tmp = "%s/.tmp-%d-%d" % (os.path.dirname(t), pid, n)
                self.write(tmp, self.cid(n), self.size())
                self.rename(tmp, t)
            elif r < 0.72:
                t = self.rng.choice(sorted(files))
                self.unlink(t)
                del files[t]
            elif r < 0.82:
                t = self.rng.choice(sorted(files))
                d = self.rng.choice([self.root] + subdirs)
                new = "%s/r%d.md" % (d, n)
                self.rename(t, new)
                files[new] = files.pop(t)
            elif r < 0.88 and len(subdirs) < 4:
                d = "%s/d%d" % (self.root, n)
                self.mkdir(d)
                subdirs.append(d)
            elif r < 0.92 and subdirs:
                d = self.rng.choice(subdirs)
                for f in [f for f in files if f.startswith(d + "/")]:
                    self.unlink(f)
                    del files[f]
                self.rmdir(d)
                subdirs.remove(d)
            else:
                self.read_check(self.rng.choice(sorted(files)))

    def read_check(self, rel):
        """Reads a file the way the SDK's view does (fstat, read st_size bytes) and checks it."""
        fd = self.sys("open", os.open, self.abs(rel), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        try:
            st = self.sys("fstat", os.fstat, fd)
            data = b""
            while len(data) < st.st_size:
                chunk = self.sys("read", os.read, fd, min(512 * 1024, st.st_size - len(data)))
                if not chunk:
                    break
                data += chunk
        finally:
            self.sys("close", os.close, fd)
        if len(data) != st.st_size:
            self.rec({"bad": rel, "why": "read %d bytes of st_size %d" % (len(data), st.st_size)})
        why = check_prefix(data)
        if why:
            self.rec({"bad": rel, "why": why})
        return data

    def m_soak_renamer(self):
        """Directories with files renamed back and forth under its own root."""
        places = ["%s/p%d/D" % (self.root, i) for i in range(3)]
        self.mkdir(self.root)
        for i in range(3):
            self.mkdir("%s/p%d" % (self.root, i))
        self.mkdir(places[0])
        for f in range(int(self.cfg.get("extra", {}).get("files", 100))):
            self.write("%s/f%03d.md" % (places[0], f), self.cid(f), self.rng.randint(64, 2000))
        i = 0
        while self.keep_going():
            j = (i + self.rng.randint(1, 2)) % 3
            self.rename(places[i], places[j])
            i = j
            time.sleep(self.rng.random() * 0.01)

    def m_soak_reader(self):
        """Walks the whole tree like the SDK's view (readdir, stat per entry) and reads files.
        Entries vanishing under it (renames, deletes) are normal; anything else is not."""
        benign = (errno.ENOENT,)
        while self.keep_going():
            stack = ["memories"]
            while stack and self.keep_going():
                d = stack.pop()
                try:
                    names = sorted(self.sys("listdir", os.listdir, self.abs(d)))
                except OSError as e:
                    if e.errno in benign:
                        continue
                    raise
                for name in names:
                    rel = d + "/" + name
                    try:
                        st = self.sys("stat", os.stat, self.abs(rel))
                        if stat.S_ISDIR(st.st_mode):
                            stack.append(rel)
                        elif self.rng.random() < 0.3 and not name.startswith(".tmp-"):
                            self.read_check(rel)
                    except OSError as e:
                        if e.errno in benign:
                            continue
                        raise
                    self.ops += 1

    def run(self):
        self.rec({"ready": True, "pid": os.getpid()})
        mode = self.cfg["mode"].replace("-", "_")
        try:
            getattr(self, "m_" + mode)()
        except Stop:
            return 0 if not self.soak else 1
        except OSError as e:
            dead = self.dead(e)
            self.rec({"f": 0, "errno": errno.errorcode.get(e.errno, str(e.errno)),
                      "msg": str(e), "dead": dead})
            return 0 if dead else 1
        self.rec({"done": True, "ops": self.ops, "max_ms": round(self.max_ms, 1)})
        return 0


if __name__ == "__main__":
    sys.exit(Worker(json.loads(sys.argv[1])).run())

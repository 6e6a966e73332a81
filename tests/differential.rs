//! Differential test through the kernel: seeded random sequences of real syscalls run against a
//! redbfs mount and against a plain directory on the local disk (ext4 here), every return value
//! or errno compared op by op, and at the end of each sequence the two trees compared (names,
//! kinds, sizes, contents, permission bits, link counts).
//!
//! Targets are chosen by index modulo the live set of names of the reference tree, so every
//! sequence stays meaningful: most operations hit something that exists, some hit a fresh name,
//! the other kind of entry, or a path through a file. Several descriptors stay open at once
//! (slots `#0`..`#5`), sometimes two on the same file, and files are unlinked or replaced while
//! open. After every operation that changes content, `fstat` of every open descriptor is
//! compared, so `st_size` must be exact while another handle writes.
//!
//! All sequences share one mount, each in a fresh subdirectory (and a fresh subdirectory of the
//! reference), inside a directory with a quota (`redbfs quota`, generous enough never to
//! refuse: ext4 has none), so every operation keeps the per-directory aggregates. At the end
//! `redbfs check` must find nothing (the aggregates equal what lies below each directory, and
//! bound its paths) and the quota root's usage must equal what a walk of the mount counts. Every 25th sequence keeps its trees; at the end the store is unmounted, mounted
//! again, and those trees are compared once more. Failing seeds found so far are kept below as
//! small named regression tests with the operations spelled out.
//!
//! Knobs (environment):
//! - `REDBFS_DIFF_SEQS=N`     sequences per run (default 500)
//! - `REDBFS_DIFF_OPS=N`      operations per sequence (default 200)
//! - `REDBFS_SEED=S`          replay exactly one sequence, as printed on failure (decimal or 0x..)
//! - `REDBFS_DIFF_BASE=S`     derive the run's seeds from another base, to explore new sequences
//! - `REDBFS_DIFF_VERBOSE=1`  print every operation and both outcomes
//! - `REDBFS_DIFF_AGAINST=DIR` compare against a plain directory instead of a mount (checks the
//!   harness itself: two ext4 directories must never diverge)
//!
//! Known, deliberate divergences from ext4 (not compared, or compared differently):
//! - Directory `st_size` is 4096 on both: ext4 uses one block for a small directory and the
//!   daemon reports 4096 on purpose (the SDK prints it as `4K`), so it IS compared exactly. The
//!   name pool is small, so no ext4 directory here ever grows past one block.
//! - `st_atime` is never compared (ext4 is mounted relatime; the daemon need not track reads).
//! - `st_mtime` is compared only right after `utimensat`/`futimens`: exactly for explicit times,
//!   "unchanged" for `UTIME_OMIT`, "recent" for `UTIME_NOW`. `st_ctime` is never compared.
//! - `st_blocks` is not compared with ext4 (ext4 keeps holes sparse); on the mount it must follow
//!   `st_size` for regular files as SEMANTICS.md promises: `ceil(size / 512)`.
//! - `st_ino`, `st_dev` and `st_blksize` are not compared.
//! - The daemon refuses `symlink`, `link` and `mknod` of FIFOs with EPERM on purpose (only
//!   regular files and directories exist); they are not part of the random operations.
//! - `renameat2(RENAME_EXCHANGE)` may be refused by the daemon with EINVAL. Then the operation is
//!   not compared and not applied to the reference; if the daemon performs it, it is compared.
//! - `lseek` on directory descriptors is not generated: ext4 directory offsets are hash cookies.
//! - The `st_size` of a removed directory still open through a descriptor is not compared (ext4
//!   reports 0 after `rmdir`; the daemon's directories are always 4096); everything else is.
//! - Names are drawn from a pool of NFC names the daemon's normaliser accepts unchanged; its
//!   refusals and NFC folding are deliberate and tested elsewhere.

mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Names every directory draws from: a small pool so that names collide and replace each other.
/// All are NFC, printable and short, so the daemon's normaliser accepts them unchanged.
const NAMES: &[&str] = &["a", "b", "c", "sub", "é", "日本語", "x y", ".tmp-1"];
/// New entries are only created in directories shallower than this.
const MAX_DEPTH: usize = 4;
/// Descriptor slots per world.
const SLOTS: usize = 6;
/// Offsets and sizes stay below about this much, so a run stays fast.
const MAX_FILE: u64 = 1 << 20;

// ---------------------------------------------------------------------------------------------
// Seeded PRNG: the shared splitmix64 of tests/common, with the helpers the generator uses.

struct Rng(common::Rng);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(common::Rng(seed))
    }
    fn next_u64(&mut self) -> u64 {
        self.0.next()
    }
    /// Uniform in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.0.below(n) }
    }
    /// Uniform in `lo..hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }
}

fn mix(x: u64) -> u64 {
    Rng::new(x).next_u64()
}

/// Deterministic content for a write: `len` bytes derived from `seed`.
fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(len);
    out
}

// ---------------------------------------------------------------------------------------------
// Operations

#[derive(Clone, Copy, Debug, PartialEq)]
enum Time {
    Now,
    Omit,
    At(i64, i64),
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Time::Now => write!(f, "UTIME_NOW"),
            Time::Omit => write!(f, "UTIME_OMIT"),
            Time::At(s, n) => write!(f, "{s}.{n:09}"),
        }
    }
}

impl Time {
    fn timespec(self) -> libc::timespec {
        match self {
            Time::Now => libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_NOW,
            },
            Time::Omit => libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
            Time::At(s, n) => libc::timespec {
                tv_sec: s,
                tv_nsec: n,
            },
        }
    }
}

/// One concrete operation. Paths are relative to the sequence's directory ("" is that
/// directory); `slot` names a descriptor slot, the same in both worlds.
#[derive(Clone, Debug)]
enum Op {
    Open {
        slot: usize,
        path: String,
        flags: i32,
        mode: u32,
    },
    Close {
        slot: usize,
    },
    Write {
        slot: usize,
        len: usize,
        data: u64,
    },
    Pwrite {
        slot: usize,
        offset: u64,
        len: usize,
        data: u64,
    },
    Read {
        slot: usize,
        len: usize,
    },
    Pread {
        slot: usize,
        offset: u64,
        len: usize,
    },
    Lseek {
        slot: usize,
        offset: i64,
        whence: i32,
    },
    Ftruncate {
        slot: usize,
        len: u64,
    },
    Truncate {
        path: String,
        len: u64,
    },
    Fsync {
        slot: usize,
    },
    Fstat {
        slot: usize,
    },
    Stat {
        path: String,
    },
    Mkdir {
        path: String,
        mode: u32,
    },
    Rmdir {
        path: String,
    },
    Unlink {
        path: String,
    },
    /// `flags` 0 is plain rename(2); otherwise renameat2 with these flags.
    Rename {
        from: String,
        to: String,
        flags: u32,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    Fchmod {
        slot: usize,
        mode: u32,
    },
    Utimens {
        path: String,
        atime: Time,
        mtime: Time,
    },
    Futimens {
        slot: usize,
        atime: Time,
        mtime: Time,
    },
    Readdir {
        path: String,
    },
    ReadFile {
        path: String,
    },
}

fn flags_str(flags: i32) -> String {
    let mut s = String::from(match flags & libc::O_ACCMODE {
        libc::O_RDONLY => "O_RDONLY",
        libc::O_WRONLY => "O_WRONLY",
        _ => "O_RDWR",
    });
    for (bit, name) in [
        (libc::O_CREAT, "O_CREAT"),
        (libc::O_EXCL, "O_EXCL"),
        (libc::O_TRUNC, "O_TRUNC"),
        (libc::O_APPEND, "O_APPEND"),
        (libc::O_DIRECTORY, "O_DIRECTORY"),
    ] {
        if flags & bit != 0 {
            s.push('|');
            s.push_str(name);
        }
    }
    s
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Open {
                slot,
                path,
                flags,
                mode,
            } => {
                write!(
                    f,
                    "#{slot} = open({path:?}, {}, {mode:#o})",
                    flags_str(*flags)
                )
            }
            Op::Close { slot } => write!(f, "close(#{slot})"),
            Op::Write { slot, len, data } => {
                write!(f, "write(#{slot}, {len} bytes of data {data:#x})")
            }
            Op::Pwrite {
                slot,
                offset,
                len,
                data,
            } => {
                write!(
                    f,
                    "pwrite(#{slot}, {len} bytes of data {data:#x}, offset {offset})"
                )
            }
            Op::Read { slot, len } => write!(f, "read(#{slot}, {len})"),
            Op::Pread { slot, offset, len } => write!(f, "pread(#{slot}, {len}, offset {offset})"),
            Op::Lseek {
                slot,
                offset,
                whence,
            } => {
                let w = match *whence {
                    libc::SEEK_SET => "SEEK_SET",
                    libc::SEEK_CUR => "SEEK_CUR",
                    _ => "SEEK_END",
                };
                write!(f, "lseek(#{slot}, {offset}, {w})")
            }
            Op::Ftruncate { slot, len } => write!(f, "ftruncate(#{slot}, {len})"),
            Op::Truncate { path, len } => write!(f, "truncate({path:?}, {len})"),
            Op::Fsync { slot } => write!(f, "fsync(#{slot})"),
            Op::Fstat { slot } => write!(f, "fstat(#{slot})"),
            Op::Stat { path } => write!(f, "lstat({path:?})"),
            Op::Mkdir { path, mode } => write!(f, "mkdir({path:?}, {mode:#o})"),
            Op::Rmdir { path } => write!(f, "rmdir({path:?})"),
            Op::Unlink { path } => write!(f, "unlink({path:?})"),
            Op::Rename { from, to, flags } => match *flags {
                0 => write!(f, "rename({from:?}, {to:?})"),
                libc::RENAME_NOREPLACE => {
                    write!(f, "renameat2({from:?}, {to:?}, RENAME_NOREPLACE)")
                }
                libc::RENAME_EXCHANGE => write!(f, "renameat2({from:?}, {to:?}, RENAME_EXCHANGE)"),
                other => write!(f, "renameat2({from:?}, {to:?}, {other:#x})"),
            },
            Op::Chmod { path, mode } => write!(f, "chmod({path:?}, {mode:#o})"),
            Op::Fchmod { slot, mode } => write!(f, "fchmod(#{slot}, {mode:#o})"),
            Op::Utimens { path, atime, mtime } => {
                write!(f, "utimensat({path:?}, atime {atime}, mtime {mtime})")
            }
            Op::Futimens { slot, atime, mtime } => {
                write!(f, "futimens(#{slot}, atime {atime}, mtime {mtime})")
            }
            Op::Readdir { path } => write!(f, "readdir({path:?})"),
            Op::ReadFile { path } => write!(f, "read whole file({path:?})"),
        }
    }
}

impl Op {
    /// A short name for coverage counts.
    fn kind(&self) -> &'static str {
        match self {
            Op::Open { .. } => "open",
            Op::Close { .. } => "close",
            Op::Write { .. } => "write",
            Op::Pwrite { .. } => "pwrite",
            Op::Read { .. } => "read",
            Op::Pread { .. } => "pread",
            Op::Lseek { .. } => "lseek",
            Op::Ftruncate { .. } => "ftruncate",
            Op::Truncate { .. } => "truncate",
            Op::Fsync { .. } => "fsync",
            Op::Fstat { .. } => "fstat",
            Op::Stat { .. } => "lstat",
            Op::Mkdir { .. } => "mkdir",
            Op::Rmdir { .. } => "rmdir",
            Op::Unlink { .. } => "unlink",
            Op::Rename { flags: 0, .. } => "rename",
            Op::Rename {
                flags: libc::RENAME_NOREPLACE,
                ..
            } => "rename_noreplace",
            Op::Rename { .. } => "rename_exchange",
            Op::Chmod { .. } => "chmod",
            Op::Fchmod { .. } => "fchmod",
            Op::Utimens { .. } => "utimensat",
            Op::Futimens { .. } => "futimens",
            Op::Readdir { .. } => "readdir",
            Op::ReadFile { .. } => "read_file",
        }
    }

    /// Whether the op may change some file's size (then every open descriptor is fstat-ed).
    fn changes_content(&self) -> bool {
        match self {
            Op::Write { .. } | Op::Pwrite { .. } | Op::Ftruncate { .. } | Op::Truncate { .. } => {
                true
            }
            Op::Open { flags, .. } => flags & (libc::O_TRUNC | libc::O_CREAT) != 0,
            _ => false,
        }
    }

    /// Whether the op may change the set of names.
    fn changes_names(&self) -> bool {
        matches!(
            self,
            Op::Open { .. }
                | Op::Mkdir { .. }
                | Op::Rmdir { .. }
                | Op::Unlink { .. }
                | Op::Rename { .. }
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Outcomes

/// The part of `struct stat` that is compared.
#[derive(Clone, PartialEq)]
struct StatView {
    kind: char,
    perm: u32,
    size: i64,
    nlink: u64,
    uid: u32,
    gid: u32,
    /// On the mount: whether `st_blocks` follows `st_size` (always true on the reference).
    blocks_follow_size: bool,
    /// Printed, never compared.
    blocks: Loose,
}

impl fmt::Debug for StatView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{{{} {:04o} size={} nlink={} uid={} gid={} blocks={}{}}}",
            self.kind,
            self.perm,
            self.size,
            self.nlink,
            self.uid,
            self.gid,
            self.blocks.0,
            if self.blocks_follow_size {
                ""
            } else {
                " (does not follow size!)"
            }
        )
    }
}

/// A value that is shown but compares equal to anything.
#[derive(Clone, Copy)]
struct Loose(i64);
impl PartialEq for Loose {
    fn eq(&self, _: &Loose) -> bool {
        true
    }
}

#[derive(Clone, Debug, PartialEq)]
enum MtimeView {
    /// After an explicit time: the stored mtime.
    Exact(i64, i64),
    /// After UTIME_OMIT: whether mtime kept its value.
    Unchanged(bool),
    /// After UTIME_NOW: whether mtime is within a few seconds of the call.
    Recent(bool),
}

#[derive(Clone, PartialEq)]
enum Outcome {
    Done,
    Value(i64),
    Bytes(Vec<u8>),
    Stat(StatView),
    Names(Vec<String>),
    Mtime(MtimeView),
    Err(i32),
}

fn errno_name(e: i32) -> String {
    format!("{:?} ({e})", nix::errno::Errno::from_raw(e))
}

impl fmt::Debug for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Done => write!(f, "ok"),
            Outcome::Value(v) => write!(f, "ok {v}"),
            Outcome::Bytes(b) => {
                let head: String = b.iter().take(16).map(|x| format!("{x:02x}")).collect();
                write!(
                    f,
                    "{} bytes (fnv {:016x}, head {head})",
                    b.len(),
                    common::fnv(b)
                )
            }
            Outcome::Stat(s) => write!(f, "{s:?}"),
            Outcome::Names(n) => write!(f, "{n:?}"),
            Outcome::Mtime(m) => write!(f, "mtime {m:?}"),
            Outcome::Err(e) => write!(f, "{}", errno_name(*e)),
        }
    }
}

/// Extra detail when two outcomes differ (first differing byte of two reads).
fn describe_difference(a: &Outcome, b: &Outcome) -> String {
    if let (Outcome::Bytes(x), Outcome::Bytes(y)) = (a, b) {
        let first = x.iter().zip(y.iter()).position(|(p, q)| p != q);
        match first {
            Some(i) => format!(
                "first differing byte at offset {i}: expected {:#04x}, got {:#04x}",
                x[i], y[i]
            ),
            None => format!("lengths differ: expected {}, got {}", x.len(), y.len()),
        }
    } else {
        String::new()
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn io_errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128
}

// ---------------------------------------------------------------------------------------------
// A world: a root directory and its open descriptors.

struct World {
    root: PathBuf,
    is_mount: bool,
    fds: [Option<i32>; SLOTS],
}

impl Drop for World {
    fn drop(&mut self) {
        for fd in self.fds.iter_mut() {
            if let Some(fd) = fd.take() {
                unsafe { libc::close(fd) };
            }
        }
    }
}

fn stat_view(st: &libc::stat, is_mount: bool) -> StatView {
    let fmt = st.st_mode & libc::S_IFMT;
    let kind = match fmt {
        libc::S_IFREG => 'f',
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        _ => '?',
    };
    let size = st.st_size;
    let blocks = st.st_blocks;
    // SEMANTICS.md: files report st_blocks = size / 512 rounded up.
    let follows = !is_mount || kind != 'f' || blocks == (size + 511) / 512;
    StatView {
        kind,
        perm: st.st_mode & 0o7777,
        size,
        nlink: st.st_nlink,
        uid: st.st_uid,
        gid: st.st_gid,
        blocks_follow_size: follows,
        blocks: Loose(blocks),
    }
}

impl World {
    fn new(root: PathBuf, is_mount: bool) -> World {
        World {
            root,
            is_mount,
            fds: [None; SLOTS],
        }
    }

    fn cpath(&self, rel: &str) -> CString {
        let p = if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        };
        CString::new(p.as_os_str().as_bytes()).unwrap()
    }

    fn fd(&self, slot: usize) -> i32 {
        self.fds[slot].unwrap_or_else(|| panic!("slot #{slot} is not open"))
    }

    fn fstat_raw(&self, fd: i32) -> Result<libc::stat, i32> {
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut st) } < 0 {
            Err(last_errno())
        } else {
            Ok(st)
        }
    }

    fn lstat_raw(&self, rel: &str) -> Result<libc::stat, i32> {
        let c = self.cpath(rel);
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::lstat(c.as_ptr(), &mut st) } < 0 {
            Err(last_errno())
        } else {
            Ok(st)
        }
    }

    fn fstat_view(&self, fd: i32) -> Outcome {
        match self.fstat_raw(fd) {
            Ok(st) => {
                let mut v = stat_view(&st, self.is_mount);
                if v.kind == 'd' && v.nlink == 0 {
                    // Removed directory: ext4 reports size 0, the daemon 4096 (see the header).
                    v.size = -1;
                }
                Outcome::Stat(v)
            }
            Err(e) => Outcome::Err(e),
        }
    }

    /// Size of the file behind a slot (for the generator; reference world only).
    fn slot_size(&self, slot: usize) -> u64 {
        self.fds[slot]
            .and_then(|fd| self.fstat_raw(fd).ok())
            .map(|st| st.st_size as u64)
            .unwrap_or(0)
    }

    /// `fstat` of every open slot: sizes must agree while other handles write.
    fn open_sizes(&self) -> Vec<(usize, Outcome)> {
        (0..SLOTS)
            .filter_map(|s| self.fds[s].map(|fd| (s, fd)))
            .map(|(s, fd)| (s, self.fstat_view(fd)))
            .collect()
    }

    fn ret(r: libc::c_int) -> Outcome {
        if r < 0 {
            Outcome::Err(last_errno())
        } else {
            Outcome::Done
        }
    }

    fn ret_value(r: isize) -> Outcome {
        if r < 0 {
            Outcome::Err(last_errno())
        } else {
            Outcome::Value(r as i64)
        }
    }

    fn mtime_of(st: &libc::stat) -> (i64, i64) {
        (st.st_mtime, st.st_mtime_nsec)
    }

    fn mtime_view(
        mtime: Time,
        before: Option<(i64, i64)>,
        after: (i64, i64),
        t0: i128,
        t1: i128,
    ) -> MtimeView {
        match mtime {
            Time::At(..) => MtimeView::Exact(after.0, after.1),
            Time::Omit => MtimeView::Unchanged(before == Some(after)),
            Time::Now => {
                let t = after.0 as i128 * 1_000_000_000 + after.1 as i128;
                let slack = 2_000_000_000;
                MtimeView::Recent(t >= t0 - slack && t <= t1 + slack)
            }
        }
    }

    fn apply(&mut self, op: &Op) -> Outcome {
        match op {
            Op::Open {
                slot,
                path,
                flags,
                mode,
            } => {
                assert!(self.fds[*slot].is_none(), "slot #{slot} already open");
                let c = self.cpath(path);
                let fd = unsafe {
                    libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, *mode as libc::c_uint)
                };
                if fd < 0 {
                    return Outcome::Err(last_errno());
                }
                self.fds[*slot] = Some(fd);
                self.fstat_view(fd)
            }
            Op::Close { slot } => {
                let fd = self.fds[*slot].take().expect("close of a closed slot");
                World::ret(unsafe { libc::close(fd) })
            }
            Op::Write {
                slot,
                len,
                data: seed,
            } => {
                let buf = data(*seed, *len);
                World::ret_value(unsafe {
                    libc::write(self.fd(*slot), buf.as_ptr().cast(), buf.len())
                })
            }
            Op::Pwrite {
                slot,
                offset,
                len,
                data: seed,
            } => {
                let buf = data(*seed, *len);
                World::ret_value(unsafe {
                    libc::pwrite(
                        self.fd(*slot),
                        buf.as_ptr().cast(),
                        buf.len(),
                        *offset as libc::off_t,
                    )
                })
            }
            Op::Read { slot, len } => {
                let mut buf = vec![0u8; *len];
                let r = unsafe { libc::read(self.fd(*slot), buf.as_mut_ptr().cast(), *len) };
                if r < 0 {
                    return Outcome::Err(last_errno());
                }
                buf.truncate(r as usize);
                Outcome::Bytes(buf)
            }
            Op::Pread { slot, offset, len } => {
                let mut buf = vec![0u8; *len];
                let r = unsafe {
                    libc::pread(
                        self.fd(*slot),
                        buf.as_mut_ptr().cast(),
                        *len,
                        *offset as libc::off_t,
                    )
                };
                if r < 0 {
                    return Outcome::Err(last_errno());
                }
                buf.truncate(r as usize);
                Outcome::Bytes(buf)
            }
            Op::Lseek {
                slot,
                offset,
                whence,
            } => {
                let r = unsafe { libc::lseek(self.fd(*slot), *offset as libc::off_t, *whence) };
                if r < 0 {
                    Outcome::Err(last_errno())
                } else {
                    Outcome::Value(r)
                }
            }
            Op::Ftruncate { slot, len } => {
                World::ret(unsafe { libc::ftruncate(self.fd(*slot), *len as libc::off_t) })
            }
            Op::Truncate { path, len } => {
                let c = self.cpath(path);
                World::ret(unsafe { libc::truncate(c.as_ptr(), *len as libc::off_t) })
            }
            Op::Fsync { slot } => World::ret(unsafe { libc::fsync(self.fd(*slot)) }),
            Op::Fstat { slot } => self.fstat_view(self.fd(*slot)),
            Op::Stat { path } => match self.lstat_raw(path) {
                Ok(st) => Outcome::Stat(stat_view(&st, self.is_mount)),
                Err(e) => Outcome::Err(e),
            },
            Op::Mkdir { path, mode } => {
                let c = self.cpath(path);
                World::ret(unsafe { libc::mkdir(c.as_ptr(), *mode as libc::mode_t) })
            }
            Op::Rmdir { path } => {
                let c = self.cpath(path);
                World::ret(unsafe { libc::rmdir(c.as_ptr()) })
            }
            Op::Unlink { path } => {
                let c = self.cpath(path);
                World::ret(unsafe { libc::unlink(c.as_ptr()) })
            }
            Op::Rename { from, to, flags } => {
                let a = self.cpath(from);
                let b = self.cpath(to);
                World::ret(unsafe {
                    if *flags == 0 {
                        libc::rename(a.as_ptr(), b.as_ptr())
                    } else {
                        libc::renameat2(
                            libc::AT_FDCWD,
                            a.as_ptr(),
                            libc::AT_FDCWD,
                            b.as_ptr(),
                            *flags,
                        )
                    }
                })
            }
            Op::Chmod { path, mode } => {
                let c = self.cpath(path);
                World::ret(unsafe { libc::chmod(c.as_ptr(), *mode as libc::mode_t) })
            }
            Op::Fchmod { slot, mode } => {
                World::ret(unsafe { libc::fchmod(self.fd(*slot), *mode as libc::mode_t) })
            }
            Op::Utimens { path, atime, mtime } => {
                let c = self.cpath(path);
                let before = self.lstat_raw(path).ok().map(|st| World::mtime_of(&st));
                let times = [atime.timespec(), mtime.timespec()];
                let t0 = now_ns();
                let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
                let t1 = now_ns();
                if r < 0 {
                    return Outcome::Err(last_errno());
                }
                match self.lstat_raw(path) {
                    Ok(st) => Outcome::Mtime(World::mtime_view(
                        *mtime,
                        before,
                        World::mtime_of(&st),
                        t0,
                        t1,
                    )),
                    Err(e) => Outcome::Err(e),
                }
            }
            Op::Futimens { slot, atime, mtime } => {
                let fd = self.fd(*slot);
                let before = self.fstat_raw(fd).ok().map(|st| World::mtime_of(&st));
                let times = [atime.timespec(), mtime.timespec()];
                let t0 = now_ns();
                let r = unsafe { libc::futimens(fd, times.as_ptr()) };
                let t1 = now_ns();
                if r < 0 {
                    return Outcome::Err(last_errno());
                }
                match self.fstat_raw(fd) {
                    Ok(st) => Outcome::Mtime(World::mtime_view(
                        *mtime,
                        before,
                        World::mtime_of(&st),
                        t0,
                        t1,
                    )),
                    Err(e) => Outcome::Err(e),
                }
            }
            Op::Readdir { path } => {
                let p = if path.is_empty() {
                    self.root.clone()
                } else {
                    self.root.join(path)
                };
                match std::fs::read_dir(&p) {
                    Err(e) => Outcome::Err(io_errno(&e)),
                    Ok(rd) => {
                        let mut names = Vec::new();
                        for ent in rd {
                            match ent {
                                Ok(ent) => {
                                    names.push(ent.file_name().to_string_lossy().into_owned())
                                }
                                Err(e) => return Outcome::Err(io_errno(&e)),
                            }
                        }
                        names.sort();
                        Outcome::Names(names)
                    }
                }
            }
            Op::ReadFile { path } => {
                let p = if path.is_empty() {
                    self.root.clone()
                } else {
                    self.root.join(path)
                };
                match std::fs::read(&p) {
                    Ok(b) => Outcome::Bytes(b),
                    Err(e) => Outcome::Err(io_errno(&e)),
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Trees

#[derive(Debug, PartialEq)]
struct TreeEntry {
    kind: char,
    perm: u32,
    size: u64,
    nlink: u64,
    /// Content of regular files (length and hash are printed on a difference).
    content: Option<Vec<u8>>,
}

fn walk(root: &Path) -> Result<BTreeMap<String, TreeEntry>, String> {
    Ok(common::walk_tree(root)?
        .into_iter()
        .map(|(rel, w)| {
            let kind = if w.meta.is_dir() {
                'd'
            } else if w.meta.is_file() {
                'f'
            } else {
                '?'
            };
            let entry = TreeEntry {
                kind,
                perm: w.meta.mode() & 0o7777,
                size: w.meta.size(),
                nlink: w.meta.nlink(),
                content: w.content,
            };
            (rel.to_string_lossy().into_owned(), entry)
        })
        .collect())
}

fn describe_entry(e: Option<&TreeEntry>) -> String {
    match e {
        None => "absent".to_string(),
        Some(e) => format!(
            "{} {:04o} size={} nlink={}{}",
            e.kind,
            e.perm,
            e.size,
            e.nlink,
            e.content
                .as_ref()
                .map(|c| format!(" content fnv {:016x}", common::fnv(c)))
                .unwrap_or_default()
        ),
    }
}

/// The first difference between two trees, if any.
fn compare_trees(reference: &Path, mount: &Path) -> Option<String> {
    let a = match walk(reference) {
        Ok(a) => a,
        Err(e) => return Some(format!("walking the reference failed: {e}")),
    };
    let b = match walk(mount) {
        Ok(b) => b,
        Err(e) => return Some(format!("walking the mount failed: {e}")),
    };
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for k in keys {
        let (x, y) = (a.get(k), b.get(k));
        if x != y {
            let mut msg = format!(
                "tree differs at {k:?}: expected {}, got {}",
                describe_entry(x),
                describe_entry(y)
            );
            if let (
                Some(TreeEntry {
                    content: Some(p), ..
                }),
                Some(TreeEntry {
                    content: Some(q), ..
                }),
            ) = (x, y)
            {
                msg.push_str("; ");
                msg.push_str(&describe_difference(
                    &Outcome::Bytes(p.clone()),
                    &Outcome::Bytes(q.clone()),
                ));
            }
            return Some(msg);
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// A sequence: generator + both worlds + comparison.

#[derive(Clone)]
struct SlotInfo {
    path: String,
    is_dir: bool,
    readable: bool,
    writable: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Want {
    Any,
    FileOnly,
    Writable,
    Readable,
}

struct Failure {
    seed: u64,
    index: usize,
    op: String,
    expected: String,
    got: String,
    note: String,
    history: Vec<String>,
    daemon_gone: bool,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "divergence: seed {:#x}, op index {}",
            self.seed, self.index
        )?;
        writeln!(f, "  op:       {}", self.op)?;
        writeln!(f, "  expected: {}   (local disk)", self.expected)?;
        writeln!(f, "  got:      {}   (mount)", self.got)?;
        if !self.note.is_empty() {
            writeln!(f, "  note:     {}", self.note)?;
        }
        if !self.history.is_empty() {
            writeln!(f, "  preceding ops (op -> local disk outcome):")?;
            for h in &self.history {
                writeln!(f, "    {h}")?;
            }
        }
        write!(
            f,
            "  replay:   REDBFS_SEED={:#x} cargo test --test differential -- differential_against_local_disk --nocapture",
            self.seed
        )
    }
}

#[derive(Default)]
struct Coverage {
    ops: u64,
    exchange_refused: u64,
    /// (op kind, outcome class) -> count
    classes: BTreeMap<(String, String), u64>,
}

impl Coverage {
    fn record(&mut self, op: &Op, out: &Outcome) {
        self.ops += 1;
        let class = match out {
            Outcome::Err(e) => format!("{:?}", nix::errno::Errno::from_raw(*e)),
            _ => "ok".to_string(),
        };
        *self
            .classes
            .entry((op.kind().to_string(), class))
            .or_default() += 1;
    }

    fn report(&self) -> String {
        let mut by_op: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for ((op, class), n) in &self.classes {
            by_op.entry(op).or_default().push(format!("{class} {n}"));
        }
        let mut s = format!(
            "{} ops, RENAME_EXCHANGE refused by the mount {} times\n",
            self.ops, self.exchange_refused
        );
        for (op, classes) in by_op {
            s.push_str(&format!("  {op:17} {}\n", classes.join(", ")));
        }
        s
    }
}

struct Sequence {
    seed: u64,
    rng: Rng,
    reference: World,
    mount: World,
    slots: [Option<SlotInfo>; SLOTS],
    files: Vec<String>,
    /// Directories below the sequence root (the root itself, "", is always there).
    dirs: Vec<String>,
    history: Vec<String>,
    verbose: bool,
}

fn depth(rel: &str) -> usize {
    if rel.is_empty() {
        0
    } else {
        rel.split('/').count()
    }
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

impl Sequence {
    fn new(
        seed: u64,
        reference_root: PathBuf,
        mount_root: PathBuf,
        mount_is_mount: bool,
        verbose: bool,
    ) -> Sequence {
        Sequence {
            seed,
            rng: Rng::new(seed),
            reference: World::new(reference_root, false),
            mount: World::new(mount_root, mount_is_mount),
            slots: Default::default(),
            files: Vec::new(),
            dirs: Vec::new(),
            history: Vec::new(),
            verbose,
        }
    }

    /// Re-reads the live set of names from the reference tree.
    fn refresh_names(&mut self) {
        let tree = walk(&self.reference.root).expect("walk the reference tree");
        self.files.clear();
        self.dirs.clear();
        for (path, e) in tree {
            if e.kind == 'd' {
                self.dirs.push(path);
            } else {
                self.files.push(path);
            }
        }
    }

    // ---- target choice (by index modulo the live set)

    fn new_path(&mut self) -> String {
        let parents: Vec<String> = std::iter::once(String::new())
            .chain(self.dirs.iter().filter(|d| depth(d) < MAX_DEPTH).cloned())
            .collect();
        let parent = parents[self.rng.index(parents.len())].clone();
        let name = NAMES[self.rng.index(NAMES.len())];
        join(&parent, name)
    }

    fn existing_file(&mut self) -> Option<String> {
        if self.files.is_empty() {
            None
        } else {
            Some(self.files[self.rng.index(self.files.len())].clone())
        }
    }

    fn existing_dir(&mut self) -> Option<String> {
        if self.dirs.is_empty() {
            None
        } else {
            Some(self.dirs[self.rng.index(self.dirs.len())].clone())
        }
    }

    /// A path that fails on lookup: through a file (ENOTDIR) or through a missing directory.
    fn bad_path(&mut self) -> String {
        match self.existing_file() {
            Some(f) if self.rng.chance(60) => join(&f, NAMES[self.rng.index(NAMES.len())]),
            _ => join("missing", NAMES[self.rng.index(NAMES.len())]),
        }
    }

    fn file_target(&mut self) -> String {
        self.target(false)
    }

    fn dir_target(&mut self) -> String {
        self.target(true)
    }

    /// Mostly an existing entry of the kind wanted, sometimes a new name, one of the other
    /// kind, or a path that cannot resolve.
    fn target(&mut self, dir: bool) -> String {
        let r = self.rng.below(100);
        let pick = if r < 65 {
            if dir {
                self.existing_dir()
            } else {
                self.existing_file()
            }
        } else if r < 80 {
            None
        } else if r < 93 {
            if dir {
                self.existing_file()
            } else {
                self.existing_dir()
            }
        } else {
            return self.bad_path();
        };
        pick.unwrap_or_else(|| self.new_path())
    }

    fn any_target(&mut self) -> String {
        if self.rng.chance(50) {
            self.file_target()
        } else {
            self.dir_target()
        }
    }

    fn open_slots(&self) -> Vec<usize> {
        (0..SLOTS).filter(|s| self.slots[*s].is_some()).collect()
    }

    /// An open slot: mostly one that suits `want` (a regular file; writable or readable), now
    /// and then any open slot, so that EBADF/EISDIR paths stay covered. `FileOnly` never
    /// returns a directory.
    fn pick_slot(&mut self, want: Want) -> Option<usize> {
        let open = self.open_slots();
        let suits = |s: &SlotInfo| match want {
            Want::Any | Want::FileOnly => !s.is_dir,
            Want::Writable => !s.is_dir && s.writable,
            Want::Readable => !s.is_dir && s.readable,
        };
        let good: Vec<usize> = open
            .iter()
            .copied()
            .filter(|s| suits(self.slots[*s].as_ref().unwrap()))
            .collect();
        if !good.is_empty() && (want == Want::FileOnly || self.rng.chance(85)) {
            return Some(good[self.rng.index(good.len())]);
        }
        if want == Want::FileOnly {
            let files: Vec<usize> = open
                .iter()
                .copied()
                .filter(|s| !self.slots[*s].as_ref().unwrap().is_dir)
                .collect();
            return if files.is_empty() {
                None
            } else {
                Some(files[self.rng.index(files.len())])
            };
        }
        if open.is_empty() {
            return None;
        }
        Some(open[self.rng.index(open.len())])
    }

    fn write_len(&mut self) -> usize {
        let r = self.rng.below(100);
        (if r < 5 {
            0
        } else if r < 45 {
            self.rng.range(1, 64)
        } else if r < 75 {
            self.rng.range(64, 4097)
        } else if r < 95 {
            self.rng.range(4097, 70_000)
        } else {
            self.rng.range(70_000, 200_000)
        }) as usize
    }

    /// An offset around the current size of the file behind `slot`.
    fn offset_near(&mut self, slot: usize) -> u64 {
        let size = self.reference.slot_size(slot);
        let r = self.rng.below(100);
        let off = if r < 40 {
            self.rng.below(size + 1)
        } else if r < 55 {
            size
        } else if r < 85 {
            size + self.rng.range(1, 5000)
        } else {
            size + self.rng.range(5000, 200_000)
        };
        off.min(MAX_FILE)
    }

    fn time(&mut self) -> Time {
        let r = self.rng.below(100);
        if r < 30 {
            Time::Now
        } else if r < 55 {
            Time::Omit
        } else {
            let sec = if self.rng.chance(10) {
                // Before 1970 (tar x of an old archive does this).
                -(self.rng.range(1, 2_000_000_000) as i64)
            } else {
                self.rng.below(4_000_000_000) as i64
            };
            let nsec = if self.rng.chance(20) {
                0
            } else {
                self.rng.below(1_000_000_000) as i64
            };
            Time::At(sec, nsec)
        }
    }

    fn gen_open(&mut self, slot: usize) -> Op {
        let acc = [libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR][self.rng.index(3)];
        let mut flags = acc;
        let r = self.rng.below(100);
        let path = if r < 35 {
            flags |= libc::O_CREAT;
            if self.rng.chance(40) {
                self.new_path()
            } else {
                self.file_target()
            }
        } else if r < 60 {
            self.file_target()
        } else if r < 75 {
            // A second descriptor on the file of an open slot.
            let open = self.open_slots();
            if open.is_empty() {
                self.file_target()
            } else {
                let s = open[self.rng.index(open.len())];
                self.slots[s].as_ref().unwrap().path.clone()
            }
        } else if r < 88 {
            flags = libc::O_RDONLY;
            if self.rng.chance(50) {
                flags |= libc::O_DIRECTORY;
            }
            let d = self.dir_target();
            if self.rng.chance(15) {
                String::new()
            } else {
                d
            }
        } else {
            self.any_target()
        };
        if self.rng.chance(40) {
            flags |= libc::O_CREAT;
        }
        if self.rng.chance(20) {
            flags |= libc::O_EXCL;
        }
        if self.rng.chance(15) {
            flags |= libc::O_TRUNC;
        }
        if self.rng.chance(15) {
            flags |= libc::O_APPEND;
        }
        if self.rng.chance(5) {
            flags |= libc::O_DIRECTORY;
        }
        let mode = [0o644, 0o600, 0o755, 0o444, 0o000, 0o777, 0o640][self.rng.index(7)];
        Op::Open {
            slot,
            path,
            flags,
            mode,
        }
    }

    fn gen_rename(&mut self) -> Op {
        let r = self.rng.below(100);
        let from = if r < 40 {
            self.existing_file()
        } else if r < 75 {
            self.existing_dir()
        } else if r < 85 {
            let open = self.open_slots();
            if open.is_empty() {
                None
            } else {
                Some(
                    self.slots[open[self.rng.index(open.len())]]
                        .as_ref()
                        .unwrap()
                        .path
                        .clone(),
                )
            }
        } else if r < 95 {
            None
        } else {
            Some(self.bad_path())
        };
        let from = from.unwrap_or_else(|| self.new_path());
        let r = self.rng.below(100);
        let to = if r < 25 {
            self.existing_file()
        } else if r < 50 {
            self.existing_dir()
        } else if r < 80 {
            None
        } else if r < 90 {
            // Into its own subtree (EINVAL when `from` is a directory).
            let below: Vec<String> = self
                .dirs
                .iter()
                .filter(|d| d.starts_with(&format!("{from}/")))
                .cloned()
                .collect();
            let base = if below.is_empty() || self.rng.chance(40) {
                from.clone()
            } else {
                below[self.rng.index(below.len())].clone()
            };
            Some(join(&base, NAMES[self.rng.index(NAMES.len())]))
        } else if r < 95 {
            Some(from.clone())
        } else {
            Some(self.bad_path())
        };
        let to = to.unwrap_or_else(|| self.new_path());
        let r = self.rng.below(100);
        let flags = if r < 70 {
            0
        } else if r < 85 {
            libc::RENAME_NOREPLACE
        } else {
            libc::RENAME_EXCHANGE
        };
        Op::Rename { from, to, flags }
    }

    fn next_op(&mut self) -> Op {
        let free: Vec<usize> = (0..SLOTS).filter(|s| self.slots[*s].is_none()).collect();
        let r = self.rng.below(1000);
        // Descriptor operations fall back to an open when no slot fits.
        macro_rules! with_slot {
            ($want:expr, |$s:ident| $body:expr) => {
                match self.pick_slot($want) {
                    Some($s) => $body,
                    None => return self.gen_open_or_close(&free),
                }
            };
        }
        match r {
            0..=139 => self.gen_open_or_close(&free),
            140..=189 => with_slot!(Want::Any, |slot| Op::Close { slot }),
            190..=279 => with_slot!(Want::Writable, |slot| {
                let len = self.write_len();
                Op::Write {
                    slot,
                    len,
                    data: self.rng.next_u64(),
                }
            }),
            280..=349 => with_slot!(Want::Writable, |slot| {
                let offset = self.offset_near(slot);
                let len = self.write_len();
                Op::Pwrite {
                    slot,
                    offset,
                    len,
                    data: self.rng.next_u64(),
                }
            }),
            350..=389 => with_slot!(Want::Readable, |slot| {
                let len = self.write_len().max(1);
                Op::Read { slot, len }
            }),
            390..=429 => with_slot!(Want::Readable, |slot| {
                let offset = self.offset_near(slot).saturating_sub(self.rng.below(3000));
                let len = self.write_len().max(1);
                Op::Pread { slot, offset, len }
            }),
            430..=449 => with_slot!(Want::FileOnly, |slot| {
                let size = self.reference.slot_size(slot) as i64;
                let (offset, whence) = match self.rng.below(3) {
                    0 => (
                        if self.rng.chance(5) {
                            -1
                        } else {
                            self.rng.below(size as u64 + 2000) as i64
                        },
                        libc::SEEK_SET,
                    ),
                    1 => (self.rng.below(400) as i64 - 200, libc::SEEK_CUR),
                    _ => (self.rng.below(3000) as i64 - 500, libc::SEEK_END),
                };
                Op::Lseek {
                    slot,
                    offset,
                    whence,
                }
            }),
            450..=489 => with_slot!(Want::Writable, |slot| {
                let size = self.reference.slot_size(slot);
                let len = match self.rng.below(5) {
                    0 => 0,
                    1 => size / 2,
                    2 => size.saturating_sub(self.rng.below(100)),
                    3 => size + self.rng.range(1, 5000),
                    _ => self.rng.below(300_000),
                };
                Op::Ftruncate {
                    slot,
                    len: len.min(MAX_FILE),
                }
            }),
            490..=519 => {
                let path = self.file_target();
                let len = match self.rng.below(3) {
                    0 => 0,
                    1 => self.rng.below(5000),
                    _ => self.rng.below(300_000),
                };
                Op::Truncate { path, len }
            }
            520..=549 => with_slot!(Want::Any, |slot| Op::Fsync { slot }),
            550..=589 => with_slot!(Want::Any, |slot| Op::Fstat { slot }),
            590..=639 => Op::Stat {
                path: self.any_target(),
            },
            640..=699 => {
                let path = if self.rng.chance(85) {
                    self.new_path()
                } else {
                    self.any_target()
                };
                let mode = [0o755, 0o700, 0o777, 0o750, 0o555][self.rng.index(5)];
                Op::Mkdir { path, mode }
            }
            700..=739 => Op::Rmdir {
                path: self.dir_target(),
            },
            740..=789 => {
                let open = self.open_slots();
                let path = if !open.is_empty() && self.rng.chance(25) {
                    self.slots[open[self.rng.index(open.len())]]
                        .as_ref()
                        .unwrap()
                        .path
                        .clone()
                } else {
                    self.file_target()
                };
                Op::Unlink { path }
            }
            790..=889 => self.gen_rename(),
            890..=909 => Op::Chmod {
                path: self.any_target(),
                mode: self.rng.below(0o1000) as u32,
            },
            910..=924 => with_slot!(Want::Any, |slot| Op::Fchmod {
                slot,
                mode: self.rng.below(0o1000) as u32
            }),
            925..=944 => {
                let path = self.any_target();
                Op::Utimens {
                    path,
                    atime: self.time(),
                    mtime: self.time(),
                }
            }
            945..=954 => with_slot!(Want::Any, |slot| Op::Futimens {
                slot,
                atime: self.time(),
                mtime: self.time()
            }),
            955..=979 => {
                let path = if self.rng.chance(15) {
                    String::new()
                } else {
                    self.dir_target()
                };
                Op::Readdir { path }
            }
            _ => Op::ReadFile {
                path: self.file_target(),
            },
        }
    }

    fn gen_open_or_close(&mut self, free: &[usize]) -> Op {
        if free.is_empty() {
            let open = self.open_slots();
            Op::Close {
                slot: open[self.rng.index(open.len())],
            }
        } else {
            let slot = free[self.rng.index(free.len())];
            self.gen_open(slot)
        }
    }

    fn fail(
        &self,
        index: usize,
        op: &Op,
        expected: &Outcome,
        got: &Outcome,
        note: &str,
    ) -> Box<Failure> {
        let mut note = note.to_string();
        let extra = describe_difference(expected, got);
        if !extra.is_empty() {
            if !note.is_empty() {
                note.push_str("; ");
            }
            note.push_str(&extra);
        }
        Box::new(Failure {
            seed: self.seed,
            index,
            op: op.to_string(),
            expected: format!("{expected:?}"),
            got: format!("{got:?}"),
            note,
            history: self.history.clone(),
            daemon_gone: matches!(got, Outcome::Err(e) if *e == libc::ENOTCONN),
        })
    }

    fn remember(&mut self, index: usize, op: &Op, out: &Outcome) {
        let line = format!("[{index}] {op} -> {out:?}");
        if self.verbose {
            eprintln!("{line}");
        }
        self.history.push(line);
        if self.history.len() > 25 {
            self.history.remove(0);
        }
    }

    /// Runs one operation on both worlds and compares.
    fn step(&mut self, index: usize, op: &Op, cov: &mut Coverage) -> Result<(), Box<Failure>> {
        let (expected, got) = if let Op::Rename {
            flags: libc::RENAME_EXCHANGE,
            ..
        } = op
        {
            // The mount may refuse an exchange with EINVAL: then nothing is applied anywhere.
            let got = self.mount.apply(op);
            if got == Outcome::Err(libc::EINVAL) {
                cov.exchange_refused += 1;
                self.remember(index, op, &Outcome::Err(libc::EINVAL));
                return Ok(());
            }
            (self.reference.apply(op), got)
        } else {
            let expected = self.reference.apply(op);
            (expected, self.mount.apply(op))
        };
        cov.record(op, &expected);
        if self.verbose && expected != got {
            eprintln!("[{index}] {op} -> expected {expected:?}, got {got:?}");
        }
        if expected != got {
            return Err(self.fail(index, op, &expected, &got, ""));
        }
        self.remember(index, op, &expected);

        // Keep the slot table in step with the worlds.
        match op {
            Op::Open {
                slot, path, flags, ..
            } if !matches!(expected, Outcome::Err(_)) => {
                let is_dir = matches!(&expected, Outcome::Stat(s) if s.kind == 'd');
                let acc = flags & libc::O_ACCMODE;
                self.slots[*slot] = Some(SlotInfo {
                    path: path.clone(),
                    is_dir,
                    readable: acc != libc::O_WRONLY,
                    writable: acc != libc::O_RDONLY,
                });
            }
            Op::Close { slot } => self.slots[*slot] = None,
            _ => {}
        }

        if op.changes_content() && !matches!(expected, Outcome::Err(_)) {
            let a = self.reference.open_sizes();
            let b = self.mount.open_sizes();
            for ((slot, x), (_, y)) in a.iter().zip(b.iter()) {
                if x != y {
                    return Err(self.fail(
                        index,
                        op,
                        x,
                        y,
                        &format!(
                            "fstat(#{slot}) after the op (another descriptor's view of st_size)"
                        ),
                    ));
                }
            }
        }
        if op.changes_names() {
            self.refresh_names();
        }
        Ok(())
    }

    /// Runs `ops` generated operations, closes every slot and compares the trees; removes the
    /// sequence's directories afterwards unless `keep`.
    fn run(&mut self, ops: usize, keep: bool, cov: &mut Coverage) -> Result<(), Box<Failure>> {
        let (r, m) = (self.reference.root.clone(), self.mount.root.clone());
        let made = (std::fs::create_dir(&r), std::fs::create_dir(&m));
        if made.0.is_err() || made.1.is_err() {
            return Err(Box::new(Failure {
                seed: self.seed,
                index: 0,
                op: "mkdir of the sequence directory".into(),
                expected: format!("{:?}", made.0),
                got: format!("{:?}", made.1),
                note: String::new(),
                history: Vec::new(),
                daemon_gone: matches!(&made.1, Err(e) if e.raw_os_error() == Some(libc::ENOTCONN)),
            }));
        }
        self.refresh_names();
        for i in 0..ops {
            let op = self.next_op();
            self.step(i, &op, cov)?;
        }
        // Close everything (close reports commit errors), then compare the trees.
        for slot in self.open_slots() {
            self.step(ops, &Op::Close { slot }, cov)?;
        }
        if let Some(diff) = compare_trees(&r, &m) {
            return Err(Box::new(Failure {
                seed: self.seed,
                index: ops,
                op: "final tree comparison".into(),
                expected: "identical trees".into(),
                got: diff,
                note: String::new(),
                history: self.history.clone(),
                daemon_gone: false,
            }));
        }
        if keep {
            return Ok(());
        }
        let removed = (std::fs::remove_dir_all(&r), std::fs::remove_dir_all(&m));
        if removed.0.is_err() || removed.1.is_err() {
            return Err(Box::new(Failure {
                seed: self.seed,
                index: ops,
                op: "remove_dir_all of the sequence directory".into(),
                expected: format!("{:?}", removed.0),
                got: format!("{:?}", removed.1),
                note: String::new(),
                history: Vec::new(),
                daemon_gone: false,
            }));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Entry points

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = if let Some(hex) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16)
    } else {
        v.parse()
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

/// Where the second world lives: a fresh mount, or a plain directory when asked for.
struct Target {
    mount: Option<common::TestMount>,
    root: PathBuf,
}

impl Target {
    fn new() -> Option<Target> {
        if let Ok(dir) = std::env::var("REDBFS_DIFF_AGAINST") {
            let root = PathBuf::from(dir);
            std::fs::create_dir_all(&root).unwrap();
            eprintln!(
                "REDBFS_DIFF_AGAINST: comparing against the plain directory {}",
                root.display()
            );
            return Some(Target { mount: None, root });
        }
        if !common::fuse_available() {
            return None;
        }
        let m = common::TestMount::new();
        let root = m.mountpoint.join("tenants").join("t1");
        std::fs::create_dir_all(&root).unwrap();
        let out = common::redbfs(&[
            "quota",
            m.store.to_str().unwrap(),
            "/tenants/t1",
            "--bytes",
            "1G",
            "--files",
            "1000000",
        ]);
        assert!(out.status.success(), "{out:?}");
        Some(Target {
            mount: Some(m),
            root,
        })
    }

    /// `redbfs check` of the mounted store finds nothing, and the quota root's usage is what
    /// a walk of it counts.
    fn check_store(&self) {
        let Some(m) = &self.mount else { return };
        let store = m.store.to_str().unwrap();
        let out = common::redbfs(&["check", store]);
        assert!(
            out.status.success(),
            "redbfs check: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let out = common::redbfs(&["quota", store, "--json"]);
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let (mut bytes, mut entries) = (0u64, 0u64);
        for e in walkdir_all(&self.root) {
            entries += 1;
            if e.is_file() {
                bytes += e.len();
            }
        }
        assert_eq!(listed[0]["path"], "/tenants/t1", "{listed}");
        assert_eq!(listed[0]["bytes"].as_u64(), Some(bytes), "{listed}");
        assert_eq!(listed[0]["files"].as_u64(), Some(entries), "{listed}");
    }

    fn log_tail(&self) -> String {
        match &self.mount {
            Some(m) => {
                let log = m.log_text();
                let lines: Vec<&str> = log.lines().collect();
                let from = lines.len().saturating_sub(30);
                lines[from..].join("\n")
            }
            None => String::new(),
        }
    }
}

/// The metadata of every entry below `root` (not following symlinks).
fn walkdir_all(root: &Path) -> Vec<std::fs::Metadata> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let md = std::fs::symlink_metadata(e.path()).unwrap();
            if md.is_dir() {
                stack.push(e.path());
            }
            out.push(md);
        }
    }
    out
}

fn reference_dir() -> tempfile::TempDir {
    // The cargo target dir is on the local disk (ext4 here), unlike a /tmp that may be tmpfs.
    tempfile::Builder::new()
        .prefix("redbfs-diff-ref-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("reference tempdir")
}

#[test]
fn differential_against_local_disk() {
    let Some(target) = Target::new() else { return };
    let reference = reference_dir();
    let verbose = std::env::var("REDBFS_DIFF_VERBOSE").as_deref() == Ok("1");
    let ops = env_u64("REDBFS_DIFF_OPS").unwrap_or(200) as usize;
    let seeds: Vec<u64> = match env_u64("REDBFS_SEED") {
        Some(seed) => vec![seed],
        None => {
            let n = env_u64("REDBFS_DIFF_SEQS").unwrap_or(500);
            let base = env_u64("REDBFS_DIFF_BASE").unwrap_or(0x7265_6462_6673); // "redbfs"
            (0..n).map(|i| mix(base ^ mix(i))).collect()
        }
    };
    let mut cov = Coverage::default();
    let mut failures: Vec<Failure> = Vec::new();
    // Every 25th sequence keeps its trees; after the run the store is remounted and those trees
    // are compared again: what the daemon acknowledged must survive an unmount.
    let mut kept: Vec<(u64, String)> = Vec::new();
    let mut daemon_gone = false;
    for (i, &seed) in seeds.iter().enumerate() {
        let keep = i % 25 == 0;
        let name = format!("seq-{seed:016x}");
        let mut seq = Sequence::new(
            seed,
            reference.path().join(&name),
            target.root.join(&name),
            target.mount.is_some(),
            verbose,
        );
        match seq.run(ops, keep, &mut cov) {
            Ok(()) if keep => kept.push((seed, name)),
            Ok(()) => {}
            Err(f) => {
                let gone = f.daemon_gone;
                eprintln!("{f}\n");
                failures.push(*f);
                if gone {
                    eprintln!("the mount answers ENOTCONN: the daemon is gone; stopping");
                    daemon_gone = true;
                    break;
                }
            }
        }
    }
    let mut target = target;
    if let Some(m) = target
        .mount
        .as_mut()
        .filter(|_| !daemon_gone && !kept.is_empty())
    {
        m.remount();
        for (seed, name) in &kept {
            if let Some(diff) = compare_trees(&reference.path().join(name), &target.root.join(name))
            {
                let f = Failure {
                    seed: *seed,
                    index: ops,
                    op: "tree comparison after unmount and mount".into(),
                    expected: "identical trees".into(),
                    got: diff,
                    note: String::new(),
                    history: Vec::new(),
                    daemon_gone: false,
                };
                eprintln!("{f}\n");
                failures.push(f);
            }
        }
        eprintln!("after remount: {} kept sequence trees compared", kept.len());
    }
    if !daemon_gone {
        target.check_store();
    }
    eprintln!(
        "{} sequences of up to {ops} ops: {} diverged\n{}",
        seeds.len(),
        failures.len(),
        cov.report()
    );
    if !failures.is_empty() {
        let mut msg = format!(
            "{} of {} sequences diverged from the local disk:\n\n",
            failures.len(),
            seeds.len()
        );
        for f in failures.iter().take(8) {
            msg.push_str(&format!("{f}\n\n"));
        }
        if failures.len() > 8 {
            msg.push_str(&format!("... and {} more (seeds:", failures.len() - 8));
            for f in &failures[8..] {
                msg.push_str(&format!(" {:#x}@{}", f.seed, f.index));
            }
            msg.push_str(")\n");
        }
        let tail = target.log_tail();
        if !tail.is_empty() {
            msg.push_str(&format!("daemon log (tail):\n{tail}\n"));
        }
        panic!("{msg}");
    }
}

// ---------------------------------------------------------------------------------------------
// Named regression tests: fixed op lists (easier to read than a seed) run on a fresh target.

/// Runs `ops` on both worlds in a fresh subdirectory and compares each outcome and the final
/// trees; panics with the first difference.
fn check_ops(name: &str, ops: &[Op]) {
    let Some(target) = Target::new() else { return };
    let reference = reference_dir();
    let mut seq = Sequence::new(
        0,
        reference.path().join(name),
        target.root.join(name),
        target.mount.is_some(),
        false,
    );
    std::fs::create_dir(&seq.reference.root).unwrap();
    std::fs::create_dir(&seq.mount.root).unwrap();
    let mut cov = Coverage::default();
    let mut result = Ok(());
    for (i, op) in ops.iter().enumerate() {
        result = seq.step(i, op, &mut cov);
        if result.is_err() {
            break;
        }
    }
    if result.is_ok() {
        for slot in seq.open_slots() {
            result = seq.step(ops.len(), &Op::Close { slot }, &mut cov);
            if result.is_err() {
                break;
            }
        }
    }
    if let Err(f) = result {
        panic!(
            "{name}: op {} diverged\n  op: {}\n  expected: {}\n  got: {}\n  {}\n{}",
            f.index,
            f.op,
            f.expected,
            f.got,
            f.note,
            target.log_tail()
        );
    }
    if let Some(diff) = compare_trees(&seq.reference.root, &seq.mount.root) {
        panic!("{name}: {diff}\n{}", target.log_tail());
    }
}

fn open(slot: usize, path: &str, flags: i32, mode: u32) -> Op {
    Op::Open {
        slot,
        path: path.into(),
        flags,
        mode,
    }
}

fn p(s: &str) -> String {
    s.to_string()
}

/// Two descriptors on one file: each must see the exact size the other's writes made, and
/// content written through one must be read through the other before any close.
#[test]
fn two_descriptors_see_each_others_size() {
    check_ops(
        "two_fds",
        &[
            open(0, "f", libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600),
            open(1, "f", libc::O_RDWR, 0),
            Op::Write {
                slot: 0,
                len: 5000,
                data: 1,
            },
            Op::Fstat { slot: 1 },
            Op::Pwrite {
                slot: 1,
                offset: 70_000,
                len: 10,
                data: 2,
            },
            Op::Fstat { slot: 0 },
            Op::Pread {
                slot: 0,
                offset: 0,
                len: 80_000,
            },
            Op::Ftruncate { slot: 0, len: 100 },
            Op::Stat { path: p("f") },
            Op::Pread {
                slot: 1,
                offset: 0,
                len: 4096,
            },
        ],
    );
}

/// A file unlinked (or replaced by rename) while open stays readable and writable through
/// its descriptor, and the name is free for a new file at once.
#[test]
fn unlinked_file_stays_usable_through_its_descriptor() {
    check_ops(
        "unlinked_open",
        &[
            open(0, "f", libc::O_RDWR | libc::O_CREAT, 0o644),
            Op::Write {
                slot: 0,
                len: 3000,
                data: 3,
            },
            Op::Unlink { path: p("f") },
            Op::Fstat { slot: 0 },
            Op::Pwrite {
                slot: 0,
                offset: 10_000,
                len: 20,
                data: 4,
            },
            Op::Pread {
                slot: 0,
                offset: 0,
                len: 20_000,
            },
            open(1, "f", libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600),
            Op::Write {
                slot: 1,
                len: 7,
                data: 5,
            },
            open(2, "g", libc::O_WRONLY | libc::O_CREAT, 0o644),
            Op::Write {
                slot: 2,
                len: 9,
                data: 6,
            },
            Op::Rename {
                from: p("g"),
                to: p("f"),
                flags: 0,
            },
            Op::Pread {
                slot: 1,
                offset: 0,
                len: 100,
            },
            Op::Fsync { slot: 1 },
            Op::Close { slot: 1 },
            Op::ReadFile { path: p("f") },
            Op::Fstat { slot: 0 },
        ],
    );
}

/// The errno of every refused rename shape.
#[test]
fn rename_refusals_have_the_expected_errno() {
    check_ops(
        "rename_refusals",
        &[
            Op::Mkdir {
                path: p("d"),
                mode: 0o755,
            },
            Op::Mkdir {
                path: p("d/e"),
                mode: 0o755,
            },
            Op::Mkdir {
                path: p("empty"),
                mode: 0o755,
            },
            open(0, "f", libc::O_WRONLY | libc::O_CREAT, 0o644),
            Op::Close { slot: 0 },
            open(0, "g", libc::O_WRONLY | libc::O_CREAT, 0o644),
            Op::Close { slot: 0 },
            Op::Rename {
                from: p("f"),
                to: p("d"),
                flags: 0,
            }, // EISDIR
            Op::Rename {
                from: p("d"),
                to: p("f"),
                flags: 0,
            }, // ENOTDIR
            Op::Rename {
                from: p("empty"),
                to: p("d"),
                flags: 0,
            }, // ENOTEMPTY
            Op::Rename {
                from: p("d"),
                to: p("d/e/x"),
                flags: 0,
            }, // EINVAL
            Op::Rename {
                from: p("f"),
                to: p("g"),
                flags: libc::RENAME_NOREPLACE,
            }, // EEXIST
            Op::Rename {
                from: p("missing"),
                to: p("x"),
                flags: 0,
            }, // ENOENT
            Op::Rename {
                from: p("f/x"),
                to: p("x"),
                flags: 0,
            }, // ENOTDIR
            Op::Rmdir { path: p("d") },  // ENOTEMPTY
            Op::Rmdir { path: p("f") },  // ENOTDIR
            Op::Unlink { path: p("d") }, // EISDIR
            Op::Mkdir {
                path: p("f"),
                mode: 0o755,
            }, // EEXIST
            open(0, "f", libc::O_RDONLY | libc::O_DIRECTORY, 0), // ENOTDIR
            open(0, "f", libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o644), // EEXIST
            open(0, "d", libc::O_WRONLY, 0), // EISDIR
            Op::Rename {
                from: p("empty"),
                to: p("d/e"),
                flags: 0,
            }, // replaces an empty dir
            Op::Rename {
                from: p("f"),
                to: p("g"),
                flags: 0,
            }, // replaces a file
            Op::Rename {
                from: p("d"),
                to: p("d2"),
                flags: 0,
            },
            Op::Stat { path: p("d2") },
            Op::Readdir { path: p("d2") },
        ],
    );
}

/// Explicit times are stored exactly (nanoseconds, before 1970 too); UTIME_OMIT keeps the
/// value; UTIME_NOW sets the present.
#[test]
fn utimensat_explicit_now_and_omit() {
    check_ops(
        "utimens",
        &[
            open(0, "f", libc::O_WRONLY | libc::O_CREAT, 0o644),
            Op::Utimens {
                path: p("f"),
                atime: Time::At(1, 2),
                mtime: Time::At(1_700_000_000, 123_456_789),
            },
            Op::Utimens {
                path: p("f"),
                atime: Time::Now,
                mtime: Time::Omit,
            },
            Op::Futimens {
                slot: 0,
                atime: Time::Omit,
                mtime: Time::At(1_000_000, 999_999_999),
            },
            Op::Utimens {
                path: p("f"),
                atime: Time::Omit,
                mtime: Time::Now,
            },
            Op::Utimens {
                path: p("f"),
                atime: Time::Omit,
                mtime: Time::At(-86_400, 0),
            },
            Op::Mkdir {
                path: p("d"),
                mode: 0o700,
            },
            Op::Utimens {
                path: p("d"),
                atime: Time::At(5, 0),
                mtime: Time::At(4_000_000_000, 1),
            },
            Op::Utimens {
                path: p("missing"),
                atime: Time::Now,
                mtime: Time::Now,
            },
        ],
    );
}

/// Times before 1970 with a fractional second: `tv_sec = -S, tv_nsec = N` means `-S + N/1e9`.
/// Found by the random run (seed 0x290e7fc770ed315a, op 163): the mount stored
/// `-S - 1 + (1e9 - N)/1e9`, i.e. `-S - N/1e9` (fuser 0.18 converts a setattr time with negative
/// seconds as `UNIX_EPOCH - Duration::new(S, N)`; see `system_time_from_time` in fuser's
/// `src/time.rs`, marked TODO there). `tar x` and `cp -a` of old files restore such times.
#[test]
fn times_before_1970_keep_their_nanoseconds() {
    check_ops(
        "pre_1970",
        &[
            open(0, "f", libc::O_WRONLY | libc::O_CREAT, 0o644),
            Op::Utimens {
                path: p("f"),
                atime: Time::Omit,
                mtime: Time::At(-1_256_036_612, 785_100_811),
            },
            Op::Futimens {
                slot: 0,
                atime: Time::Omit,
                mtime: Time::At(-1, 500_000_000),
            },
            Op::Mkdir {
                path: p("d"),
                mode: 0o755,
            },
            Op::Utimens {
                path: p("d"),
                atime: Time::At(-5, 1),
                mtime: Time::At(-118_614_362, 498_419_775),
            },
        ],
    );
}

/// `open(O_RDONLY | O_TRUNC)` truncates an existing regular file on Linux (ext4 does; the
/// kernel, with FUSE_ATOMIC_O_TRUNC, sets its cached size to 0 and leaves the truncation to the
/// daemon's open). Found by the random run (seed 0xd855e5cc0b8ed271, op 98): the mount kept the
/// old content, and the kernel's idea of the size and the store's disagreed.
#[test]
fn read_only_open_with_o_trunc_truncates() {
    check_ops(
        "rdonly_trunc",
        &[
            open(0, "f", libc::O_WRONLY | libc::O_CREAT, 0o644),
            Op::Write {
                slot: 0,
                len: 18_806,
                data: 7,
            },
            Op::Close { slot: 0 },
            open(1, "f", libc::O_RDONLY | libc::O_TRUNC, 0),
            Op::Fstat { slot: 1 },
            Op::Read { slot: 1, len: 4096 },
            Op::Stat { path: p("f") },
            Op::Close { slot: 1 },
            Op::ReadFile { path: p("f") },
            open(2, "g", libc::O_WRONLY | libc::O_CREAT, 0o644),
            Op::Write {
                slot: 2,
                len: 473,
                data: 8,
            },
            Op::Close { slot: 2 },
            open(
                3,
                "g",
                libc::O_RDONLY | libc::O_CREAT | libc::O_TRUNC,
                0o600,
            ),
            Op::Stat { path: p("g") },
        ],
    );
}

/// A directory removed while a descriptor is open on it stays an inode until the descriptor is
/// closed: fstat, fchmod and futimens through it work (ext4 reports nlink 0). Found by the
/// random run (seed 0xf32993ff7932b909, op 42; seed 0xf30a848c2ff714ac, op 166): the mount
/// answered ENOENT for fstat and fchmod.
#[test]
fn removed_directory_stays_usable_through_its_descriptor() {
    check_ops(
        "rmdir_open",
        &[
            Op::Mkdir {
                path: p("d"),
                mode: 0o755,
            },
            open(0, "d", libc::O_RDONLY | libc::O_DIRECTORY, 0),
            Op::Rmdir { path: p("d") },
            Op::Fstat { slot: 0 },
            Op::Fchmod {
                slot: 0,
                mode: 0o700,
            },
            Op::Futimens {
                slot: 0,
                atime: Time::Now,
                mtime: Time::At(1_600_000_000, 5),
            },
            Op::Fstat { slot: 0 },
            Op::Fsync { slot: 0 },
            Op::Close { slot: 0 },
            // The same through a rename that replaces an empty directory.
            Op::Mkdir {
                path: p("e"),
                mode: 0o755,
            },
            Op::Mkdir {
                path: p("f"),
                mode: 0o700,
            },
            open(1, "f", libc::O_RDONLY, 0),
            Op::Rename {
                from: p("e"),
                to: p("f"),
                flags: 0,
            },
            Op::Fstat { slot: 1 },
            Op::Stat { path: p("f") },
        ],
    );
}

//! The only module that names fuser: each kernel request becomes one call into `Fs`, and its
//! result becomes one reply or one errno. Refusals and failures are logged here, once each,
//! with the operation, the path or inode and the errno; with `-v` every request gets a debug
//! line.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, Session, SessionACL, TimeOrNow, WriteFlags,
};

use crate::fs::history::Invalidation;
use crate::fs::{BLOCK_SIZE, Caller, Error, Fs, OpenMode, SetAttr, TimeSet, is_dot, resume_at};
use crate::store::{Inode, Kind};

/// How long the kernel may cache entries and attributes. Every change to a mounted store goes
/// through this kernel mount, so the kernel's caches stay true on their own and a long TTL
/// saves a round trip per path component (the SDK's realpath walks every component on every
/// command). Tools that change a mounted store go through the daemon, which invalidates what
/// they touch. Not infinite, so a bug in that invalidation heals within a minute.
const TTL: Duration = Duration::from_secs(60);

/// The entry TTL for a name as the caller spelled it. A name that is not in NFC (a decomposed
/// "cafe\u{301}") reaches the same entry as its NFC spelling, but the kernel caches each
/// spelling separately and a change through one cannot invalidate the other; so a non-NFC
/// spelling is never cached (measured: otherwise it serves a replaced or deleted file for the
/// whole TTL).
fn entry_ttl(raw: &OsStr, i: &Inode) -> Duration {
    if raw.as_bytes() == i.name.as_bytes() {
        TTL
    } else {
        Duration::ZERO
    }
}

/// Largest write the kernel sends in one request. 1 MiB cuts round trips for large files
/// (the kernel default is 128 KiB).
const MAX_WRITE: u32 = 1024 * 1024;

/// Worker threads reading requests: one per core, two at least (a reader never waits behind
/// a writer's commit) and four at most. None of them waits for the disk (the syncer does), so
/// more threads than cores only trade places on them: on two cores, two threads gave four
/// processes creating with fsync 14% more throughput than four threads.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4))
}

pub struct FuseFs {
    fs: Arc<Fs>,
    syncer: Syncer,
}

/// Answers kept for the log's sync at most: past it, a request thread syncs and answers
/// itself (as every request did before the syncer), so waiting answers hold bounded memory.
const SYNC_QUEUE: usize = 1024;

/// An answer that waits for commit `upto` to be durable; `result` is what the operation
/// itself returned.
struct Waiting {
    upto: u64,
    result: std::result::Result<(), Errno>,
    reply: ReplyEmpty,
}

/// The thread that makes operations durable and answers them (`Fs::durable_later`): it
/// takes every answer waiting, runs one `Store::sync_to` for the highest commit among them,
/// and answers each. A request thread hands its answer over and goes back to the kernel's
/// queue instead of waiting for the disk.
struct Syncer {
    send: Option<std::sync::mpsc::SyncSender<Waiting>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Syncer {
    fn start(fs: &Arc<Fs>) -> Syncer {
        let (send, recv) = std::sync::mpsc::sync_channel::<Waiting>(SYNC_QUEUE);
        let fs = fs.clone();
        let thread = std::thread::Builder::new()
            .name("syncer".into())
            .spawn(move || {
                while let Ok(first) = recv.recv() {
                    let mut all = vec![first];
                    all.extend(recv.try_iter().take(SYNC_QUEUE));
                    sync_and_answer(&fs, all);
                }
            });
        match thread {
            Ok(t) => Syncer {
                send: Some(send),
                thread: Some(t),
            },
            Err(e) => {
                tracing::warn!(error = %e, "no thread for the log's sync: request threads sync themselves");
                Syncer {
                    send: None,
                    thread: None,
                }
            }
        }
    }

    /// Answers `reply` with `result` once commit `upto` is durable (at once when `upto` is 0):
    /// through the syncer, or on this thread when its queue is full or it is gone.
    fn answer(
        &self,
        fs: &Fs,
        upto: u64,
        result: std::result::Result<(), Errno>,
        reply: ReplyEmpty,
    ) {
        if upto == 0 {
            return answer(reply, result);
        }
        let w = Waiting {
            upto,
            result,
            reply,
        };
        let w = match &self.send {
            Some(send) => match send.try_send(w) {
                Ok(()) => return,
                Err(
                    std::sync::mpsc::TrySendError::Full(w)
                    | std::sync::mpsc::TrySendError::Disconnected(w),
                ) => w,
            },
            None => w,
        };
        sync_and_answer(fs, vec![w]);
    }

    /// Answers everything waiting, then ends the thread.
    fn stop(&mut self) {
        self.send = None;
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("the syncer thread panicked");
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Makes the highest commit among `all` durable (one `Store::sync_to`), then answers each
/// with its own result, or with the sync's error (logged once) if the sync failed.
fn sync_and_answer(fs: &Fs, all: Vec<Waiting>) {
    let upto = all.iter().map(|w| w.upto).max().unwrap_or(0);
    let synced = fs.store().sync_to(upto).map_err(Error::Store);
    if let Err(e) = &synced {
        crate::error_limited!(key: e.rule(); op = "sync", errno = e.errno(), "{e}");
    }
    let synced = synced.map_err(|e| Errno::from_i32(e.errno()));
    for w in all {
        answer(w.reply, synced.and(w.result));
    }
}

fn answer(reply: ReplyEmpty, result: std::result::Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl FuseFs {
    pub fn new(fs: Arc<Fs>) -> FuseFs {
        let syncer = Syncer::start(&fs);
        FuseFs { fs, syncer }
    }

    /// Runs `op` (`Fs::durable_later`) and answers `reply` once what it committed is durable;
    /// a failure is logged as `op_name` of `ino` (and `name`) by `fail`.
    fn answer_durable(
        &self,
        op_name: &str,
        ino: u64,
        name: Option<&OsStr>,
        reply: ReplyEmpty,
        op: impl FnOnce() -> Result<(), Error>,
    ) {
        let (r, upto) = self.fs.durable_later(op);
        let result = r.map_err(|e| self.fail(op_name, ino, name, &e));
        self.syncer.answer(&self.fs, upto, result, reply);
    }

    /// Logs a failed request once and answers it with its errno. Refusals and failures are
    /// rate-limited by the rule broken (`Error::rule`), never by their message, which names
    /// what the client chose; the path is walked only for a line that is logged.
    fn fail(&self, op: &str, ino: u64, name: Option<&OsStr>, e: &Error) -> Errno {
        let errno = e.errno();
        if e.is_expected() && !tracing::enabled!(tracing::Level::DEBUG) {
            // ENOENT on a lookup is an answer, not a refusal: no log line, no path walk.
            return Errno::from_i32(errno);
        }
        let path = || {
            let path = self.fs.path_of(ino);
            match name {
                Some(n) => format!("{}/{}", path.trim_end_matches('/'), n.to_string_lossy()),
                None => path,
            }
        };
        if e.is_expected() {
            tracing::debug!(op, path = path(), errno, "{e}");
        } else if matches!(e, Error::Store(_) | Error::Poisoned) {
            crate::error_limited!(key: e.rule(); op, path = path(), errno, "{e}");
        } else {
            crate::warn_limited!(key: e.rule(); op, path = path(), errno, "refused: {e}");
        }
        Errno::from_i32(errno)
    }
}

fn system_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
    }
}

fn attr(i: &Inode) -> FileAttr {
    FileAttr {
        ino: INodeNo(i.ino),
        // Directories report 4096, as ext4 does; the SDK prints it to the model.
        size: if i.kind == Kind::Dir {
            BLOCK_SIZE as u64
        } else {
            i.size
        },
        blocks: if i.kind == Kind::Dir {
            8
        } else {
            i.size.div_ceil(512)
        },
        atime: system_time(i.atime),
        mtime: system_time(i.mtime),
        ctime: system_time(i.ctime),
        crtime: system_time(i.crtime),
        kind: file_type(i.kind),
        perm: i.perm as u16,
        nlink: i.nlink,
        uid: i.uid,
        gid: i.gid,
        rdev: 0,
        blksize: BLOCK_SIZE,
        flags: 0,
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(kernel_time_ns(t)),
    }
}

/// A time the kernel sent, in ns since the epoch. fuser 0.18 turns the kernel's (seconds,
/// nanoseconds) of a time before 1970 into epoch - (|seconds| s + nanoseconds ns), where the
/// true time is epoch - |seconds| s + nanoseconds ns; this undoes that. A time a store cannot
/// hold (before 1677-09-21 or after 2262-04-11: 64-bit nanoseconds) is clamped to the nearest
/// it can, as the kernel clamps a time to a filesystem's range; it used to wrap (2300 was kept
/// as 1715).
fn kernel_time_ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => {
            let d = e.duration();
            i64::try_from(d.as_secs())
                .ok()
                .and_then(|s| s.checked_mul(-1_000_000_000))
                .and_then(|ns| ns.checked_add(i64::from(d.subsec_nanos())))
                .unwrap_or(i64::MIN)
        }
    }
}

const GEN: Generation = Generation(0);

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        for cap in [
            // ls -l and the SDK's stat-per-entry walk answered with the listing.
            InitFlags::FUSE_DO_READDIRPLUS,
            // O_TRUNC arrives with open, so it joins the handle's buffered content.
            InitFlags::FUSE_ATOMIC_O_TRUNC,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_MAX_PAGES,
        ] {
            if config.add_capabilities(cap).is_err() {
                tracing::info!(?cap, "kernel does not offer this FUSE capability");
            }
        }
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        Ok(())
    }

    fn destroy(&mut self) {
        self.syncer.stop();
        self.fs.flush_all();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        tracing::debug!(op = "lookup", parent = parent.0, ?name);
        match self.fs.lookup(parent.0, name.as_bytes()) {
            Ok(i) => reply.entry_with_ttls(&TTL, &entry_ttl(name, &i), &attr(&i), GEN),
            Err(e) => reply.error(self.fail("lookup", parent.0, Some(name), &e)),
        }
    }

    // BATCH_FORGET arrives here too: fuser's default splits it (its ForgetOne is private).
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        tracing::debug!(op = "forget", ino = ino.0, nlookup);
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        tracing::debug!(op = "getattr", ino = ino.0);
        match self.fs.getattr(ino.0) {
            Ok(i) => reply.attr(&TTL, &attr(&i)),
            Err(e) => reply.error(self.fail("getattr", ino.0, None, &e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        tracing::debug!(op = "setattr", ino = ino.0, ?mode, ?uid, ?gid, ?size);
        let a = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            fh: fh.map(|f| f.0),
        };
        match self.fs.setattr(caller(req), ino.0, a) {
            Ok(i) => reply.attr(&TTL, &attr(&i)),
            Err(e) => reply.error(self.fail("setattr", ino.0, None, &e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        tracing::debug!(op = "mknod", parent = parent.0, ?name, mode);
        match self
            .fs
            .mknod(caller(req), parent.0, name.as_bytes(), mode, umask)
        {
            Ok(i) => reply.entry_with_ttls(&TTL, &entry_ttl(name, &i), &attr(&i), GEN),
            Err(e) => reply.error(self.fail("mknod", parent.0, Some(name), &e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        tracing::debug!(op = "mkdir", parent = parent.0, ?name, mode);
        match self
            .fs
            .mkdir(caller(req), parent.0, name.as_bytes(), mode, umask)
        {
            Ok(i) => reply.entry_with_ttls(&TTL, &entry_ttl(name, &i), &attr(&i), GEN),
            Err(e) => reply.error(self.fail("mkdir", parent.0, Some(name), &e)),
        }
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        tracing::debug!(op = "unlink", parent = parent.0, ?name);
        self.answer_durable("unlink", parent.0, Some(name), reply, || {
            self.fs.unlink(caller(req), parent.0, name.as_bytes())
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        tracing::debug!(op = "rmdir", parent = parent.0, ?name);
        self.answer_durable("rmdir", parent.0, Some(name), reply, || {
            self.fs.rmdir(caller(req), parent.0, name.as_bytes())
        });
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        let e = Error::NotPermitted("symlink");
        reply.error(self.fail("symlink", parent.0, Some(link_name), &e));
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let e = Error::NotPermitted("hard link");
        reply.error(self.fail("link", newparent.0, Some(newname), &e));
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        tracing::debug!(
            op = "rename",
            parent = parent.0,
            ?name,
            newparent = newparent.0,
            ?newname,
            flags = flags.bits()
        );
        let (r, upto) = self.fs.durable_later(|| {
            self.fs.rename(
                caller(req),
                parent.0,
                name.as_bytes(),
                newparent.0,
                newname.as_bytes(),
                flags.bits(),
            )
        });
        let result = r.map_err(|e| {
            // A refused name or path limit names the target, unless the source is at fault.
            let target_at_fault =
                matches!(
                    e,
                    Error::Name(_) | Error::PathTooLong { .. } | Error::TooDeep { .. }
                ) && crate::fs::Name::parse(name.as_bytes(), self.fs.limits().names).is_ok();
            let (dir, n) = if target_at_fault {
                (newparent.0, newname)
            } else {
                (parent.0, name)
            };
            self.fail("rename", dir, Some(n), &e)
        });
        self.syncer.answer(&self.fs, upto, result, reply);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        tracing::debug!(op = "open", ino = ino.0, flags = flags.0);
        match self
            .fs
            .open(caller(req), ino.0, OpenMode::from_flags(flags.0))
        {
            // Every change goes through this mount, so the page cache stays true across opens;
            // a read-only handle has nothing to commit at close, so the kernel skips its FLUSH.
            Ok(fh) => {
                let mut open_flags = FopenFlags::FOPEN_KEEP_CACHE;
                if flags.0 & libc::O_ACCMODE == libc::O_RDONLY && flags.0 & libc::O_TRUNC == 0 {
                    open_flags |= FopenFlags::FOPEN_NOFLUSH;
                }
                reply.opened(FileHandle(fh), open_flags)
            }
            Err(e) => reply.error(self.fail("open", ino.0, None, &e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        tracing::debug!(op = "read", ino = ino.0, offset, size);
        match self.fs.read(fh.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(self.fail("read", ino.0, None, &e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        tracing::debug!(op = "write", ino = ino.0, offset, len = data.len());
        // A page of a shared mapping written back: it goes where the page is, even through a
        // handle opened O_APPEND (the kernel may write any mapping back through one).
        let written = if write_flags.contains(WriteFlags::FUSE_WRITE_CACHE) {
            self.fs.write_page(caller(req), fh.0, offset, data)
        } else {
            self.fs.write(caller(req), fh.0, offset, data)
        };
        match written {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(self.fail("write", ino.0, None, &e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        tracing::debug!(op = "flush", ino = ino.0);
        self.answer_durable("flush", ino.0, None, reply, || self.fs.flush(fh.0));
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        tracing::debug!(op = "release", ino = ino.0);
        match self.fs.release(fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.fail("release", ino.0, None, &e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        tracing::debug!(op = "fsync", ino = ino.0);
        self.answer_durable("fsync", ino.0, None, reply, || self.fs.fsync(fh.0));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        tracing::debug!(op = "opendir", ino = ino.0);
        match self.fs.opendir(ino.0) {
            // The kernel keeps the listing in its page cache across opens: a change through
            // this mount bumps the directory's version and drops it, and a change made by a
            // tool through the daemon (revert, rollback, import) sends an invalidation. The
            // SDK's view lists /memories and every directory under it on each call.
            Ok(fh) => reply.opened(
                FileHandle(fh),
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(self.fail("opendir", ino.0, None, &e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        tracing::debug!(op = "readdir", ino = ino.0, offset);
        let entries = match self.fs.readdir(fh.0, offset) {
            Ok(e) => e,
            Err(e) => return reply.error(self.fail("readdir", ino.0, None, &e)),
        };
        for e in &entries[resume_at(&entries, offset)..] {
            if reply.add(INodeNo(e.ino), e.off, file_type(e.kind), &e.name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        tracing::debug!(op = "readdirplus", ino = ino.0, offset);
        let entries = match self.fs.readdir(fh.0, offset) {
            Ok(e) => e,
            Err(e) => return reply.error(self.fail("readdirplus", ino.0, None, &e)),
        };
        // Attributes are fetched a batch at a time: the reply buffer holds a few dozen entries.
        const BATCH: usize = 64;
        let mut pos = resume_at(&entries, offset);
        let mut full = false;
        while pos < entries.len() && !full {
            let batch = &entries[pos..entries.len().min(pos + BATCH)];
            let attrs = match self.fs.attrs(batch) {
                Ok(a) => a,
                Err(e) => return reply.error(self.fail("readdirplus", ino.0, None, &e)),
            };
            for (e, a) in batch.iter().zip(attrs) {
                // An entry removed since the listing was taken is skipped.
                let Some(a) = a else {
                    pos += 1;
                    continue;
                };
                full = full || reply.add(INodeNo(e.ino), e.off, &e.name, &TTL, &attr(&a), GEN);
                if full {
                    // Not sent: the kernel takes no reference to it.
                    if !is_dot(&e.name) {
                        self.fs.forget(e.ino, 1);
                    }
                } else {
                    pos += 1;
                }
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        match self.fs.releasedir(fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.fail("releasedir", ino.0, None, &e)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.fs.fsyncdir() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.fail("fsyncdir", ino.0, None, &e)),
        }
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs_at(ino.0) {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_free,
                s.files,
                s.files_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(e) => reply.error(self.fail("statfs", ino.0, None, &e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        _v: &[u8],
        _f: i32,
        _p: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(self.fail("setxattr", ino.0, Some(name), &Error::XattrUnsupported));
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        // ENOSYS: the kernel then answers every later getxattr with EOPNOTSUPP itself. It
        // asks for security.capability before every write(2) of a file, so each would
        // otherwise cost a round trip; cp -a and ls --color ask too. No warn line.
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        // As getxattr: the kernel answers EOPNOTSUPP from then on.
        reply.error(Errno::ENOSYS);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply.error(self.fail("removexattr", ino.0, Some(name), &Error::XattrUnsupported));
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // With default_permissions the kernel checks access itself and never asks.
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        tracing::debug!(op = "create", parent = parent.0, ?name, mode, flags);
        match self
            .fs
            .create(caller(req), parent.0, name.as_bytes(), mode, umask, flags)
        {
            Ok((i, fh)) => reply.created(
                &entry_ttl(name, &i),
                &attr(&i),
                GEN,
                FileHandle(fh),
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(self.fail("create", parent.0, Some(name), &e)),
        }
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // isatty() on every buffered open (Python's open() asks): not a terminal, as on ext4.
        reply.error(Errno::from_i32(libc::ENOTTY));
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _o: u64,
        _l: u64,
        _m: i32,
        reply: ReplyEmpty,
    ) {
        // EOPNOTSUPP: posix_fallocate then falls back to writing zeros.
        reply.error(self.fail("fallocate", ino.0, None, &Error::Unsupported("fallocate")));
    }
}

/// Sends the kernel the invalidations of changes made outside kernel requests (rollback,
/// revert). A refusal (the kernel had nothing cached) is expected and ignored.
fn forward_invalidations(fs: &Arc<Fs>, session: &Session<FuseFs>) {
    let notifier = session.notifier();
    fs.set_invalidator(Box::new(move |inv| {
        let _ = match inv {
            Invalidation::Entry { parent, name } => {
                notifier.inval_entry(INodeNo(parent), OsStr::new(&name))
            }
            Invalidation::Inode(ino) => notifier.inval_inode(INodeNo(ino), 0, 0),
        };
    }));
}

/// Mount options shared by both ways of mounting.
fn config(allow_other: bool, threads: usize) -> Config {
    let mut c = Config::default();
    c.acl = if allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    c.n_threads = Some(threads.max(1));
    c
}

/// Serves a mount the caller made itself on an open `/dev/fuse` descriptor: answers the
/// kernel's INIT, calls `on_ready`, then serves until the filesystem is unmounted.
pub fn serve_fd(
    fs: Arc<Fs>,
    fd: OwnedFd,
    allow_other: bool,
    threads: usize,
    on_ready: impl FnOnce(),
) -> std::io::Result<()> {
    let c = config(allow_other, threads);
    let acl = c.acl;
    let session = Session::from_fd(FuseFs::new(fs.clone()), fd, acl, c)?;
    forward_invalidations(&fs, &session);
    on_ready();
    session.run()
}

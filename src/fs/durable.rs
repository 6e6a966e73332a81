//! Durability made by the caller: a request thread that does not wait for the disk.
//!
//! An operation whose answer promises durability (fsync, close, unlink, rmdir, rename) commits
//! and then waits for the log's sync. Run through `Fs::durable_later`, its durable commits do
//! not wait (`Sync::ByCaller`): it returns as soon as it has committed, with the number of the
//! last commit that must be durable before it is answered, and the FUSE layer answers it once
//! `Store::sync_to` of that number returns, on a thread of its own. The request thread goes
//! back to the kernel's queue meanwhile: with the sync off the request threads, two of them
//! keep two cores busy where four waited on the disk in turn.
//!
//! Nothing else changes: what a commit makes visible, and when, is the same; only who waits
//! for the sync does.

use std::cell::Cell;

use super::{Fs, Result};
use crate::store::Sync;

thread_local! {
    /// While an operation runs under `Fs::durable_later` on this thread: the highest commit
    /// number its durable commits left to sync (0: none yet).
    static LATER: Cell<Option<u64>> = const { Cell::new(None) };
}

/// How a commit asked to be `sync` goes on this thread: `Sync::ByCaller` in place of
/// `Sync::Durable` under `Fs::durable_later`.
pub(super) fn commit_sync(sync: Sync) -> Sync {
    if sync == Sync::Durable && LATER.with(|l| l.get().is_some()) {
        Sync::ByCaller
    } else {
        sync
    }
}

/// Under `Fs::durable_later`, notes that commit `seq` must be durable before the answer and
/// returns true; false otherwise (the caller syncs it itself).
pub(super) fn sync_later(seq: u64) -> bool {
    LATER.with(|l| match l.get() {
        Some(upto) => {
            l.set(Some(upto.max(seq)));
            true
        }
        None => false,
    })
}

impl Fs {
    /// Runs `op` with its durable commits left to sync: its result, and the number of the
    /// commit that must be durable before it is answered (0 when every commit it made is
    /// durable already, or it made none). The caller answers only once `Store::sync_to` of
    /// that number has returned, whatever `op` returned: a commit made before a failure is
    /// as durable as it would have been.
    pub fn durable_later<T>(&self, op: impl FnOnce() -> Result<T>) -> (Result<T>, u64) {
        let outer = LATER.with(|l| l.replace(Some(0)));
        let r = op();
        let upto = LATER.with(|l| l.replace(outer)).unwrap_or(0);
        if let Some(o) = outer {
            // Nested: the outer run answers for these commits too.
            LATER.with(|l| l.set(Some(o.max(upto))));
            return (r, 0);
        }
        let upto = if upto > 0 && !self.store.is_durable(upto) {
            upto
        } else {
            0
        };
        (r, upto)
    }
}

#[cfg(test)]
mod tests {
    use crate::fs::{Caller, Fs, Limits, OpenMode};
    use crate::store::{ROOT_INO, Store};

    const ME: Caller = Caller {
        uid: 0,
        gid: 0,
        pid: 1,
    };
    const OTHER: Caller = Caller {
        uid: 0,
        gid: 0,
        pid: 2,
    };

    /// A store with `/d/f.md` durable, open through two writable handles (`ME`'s, then
    /// `OTHER`'s): the store, the directory, and the two handles.
    fn two_handles(dir: &tempfile::TempDir) -> (Fs, u64, u64, u64) {
        let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
        let fs = Fs::new(store, Limits::default()).unwrap();
        let d = fs.mkdir(ME, ROOT_INO, b"d", 0o755, 0).unwrap().ino;
        let (f, mine) = fs.create(ME, d, b"f.md", 0o644, 0, libc::O_WRONLY).unwrap();
        fs.write(ME, mine, 0, b"old\n").unwrap();
        fs.fsync(mine).unwrap();
        let write = OpenMode {
            read: false,
            write: true,
            append: false,
            truncate: false,
        };
        let theirs = fs.open(OTHER, f.ino, write).unwrap();
        (fs, d, mine, theirs)
    }

    /// One handle's fsync commits what another handle wrote; until its sync has run, the
    /// other handle's close, which finds nothing left to commit, must wait for the same
    /// commit, not be answered at once.
    #[test]
    fn a_close_waits_for_the_sync_of_content_another_handles_fsync_committed() {
        let dir = tempfile::tempdir().unwrap();
        let (fs, _, mine, theirs) = two_handles(&dir);
        fs.write(OTHER, theirs, 0, b"theirs\n").unwrap();
        let (r, fsync_upto) = fs.durable_later(|| fs.fsync(mine));
        r.unwrap();
        assert!(fsync_upto > 0 && !fs.store().is_durable(fsync_upto));
        let (r, close_upto) = fs.durable_later(|| fs.flush(theirs));
        r.unwrap();
        assert!(
            close_upto >= fsync_upto,
            "the close waits for commit {close_upto}, its content is in {fsync_upto}"
        );
    }

    /// A file whose last name went (committed, not yet synced) while another handle had
    /// written to it: that handle's close returns only once the removal is durable.
    #[test]
    fn a_close_after_the_files_unlink_waits_for_the_unlinks_sync() {
        let dir = tempfile::tempdir().unwrap();
        let (fs, d, _, theirs) = two_handles(&dir);
        fs.write(OTHER, theirs, 0, b"theirs\n").unwrap();
        let (r, unlink_upto) = fs.durable_later(|| fs.unlink(ME, d, b"f.md"));
        r.unwrap();
        assert!(unlink_upto > 0 && !fs.store().is_durable(unlink_upto));
        let (r, close_upto) = fs.durable_later(|| fs.flush(theirs));
        r.unwrap();
        assert!(
            close_upto >= unlink_upto,
            "the close waits for commit {close_upto}, the unlink is {unlink_upto}"
        );
        // Once that sync has run, a close has nothing to wait for.
        fs.store().sync_to(unlink_upto).unwrap();
        assert_eq!(fs.durable_later(|| fs.flush(theirs)).1, 0);
    }

    /// Under `durable_later` a durable operation commits (others see it at once) without
    /// syncing: it names the commit its answer waits for, counted as durable, and that commit
    /// is durable only once the caller syncs it. Outside, the same operation syncs itself.
    #[test]
    fn an_operation_run_durable_later_commits_and_leaves_its_sync_to_the_caller() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
        let fs = Fs::new(store, Limits::default()).unwrap();
        // The log starts with the first commit.
        let d = fs.mkdir(ME, ROOT_INO, b"d", 0o755, 0).unwrap().ino;
        for name in [&b"a.md"[..], b"b.md"] {
            let (_, fh) = fs.create(ME, d, name, 0o644, 0, libc::O_WRONLY).unwrap();
            fs.write(ME, fh, 0, b"text").unwrap();
            fs.release(fh).unwrap();
        }
        let before = fs.store().commit_stats();

        let (r, upto) = fs.durable_later(|| fs.unlink(ME, d, b"a.md"));
        r.unwrap();
        assert!(upto > 0, "the unlink's commit waits for a sync");
        assert!(!fs.store().is_durable(upto));
        assert!(
            fs.lookup(d, b"a.md").is_err(),
            "visible before it is durable"
        );
        let after = fs.store().commit_stats();
        assert_eq!(after.durable_commits, before.durable_commits + 1);
        assert_eq!(after.log_syncs, before.log_syncs, "no sync yet");
        fs.store().sync_to(upto).unwrap();
        assert!(fs.store().is_durable(upto));
        assert_eq!(fs.store().commit_stats().log_syncs, before.log_syncs + 1);

        // Nothing left to sync: nothing to wait for.
        let (r, upto) = fs.durable_later(|| fs.unlink(ME, d, b"missing.md"));
        assert!(r.is_err());
        assert_eq!(upto, 0);

        // Outside `durable_later` the unlink waits for its own sync.
        let syncs = fs.store().commit_stats().log_syncs;
        fs.unlink(ME, d, b"b.md").unwrap();
        assert_eq!(fs.store().commit_stats().log_syncs, syncs + 1);
    }
}

//! How long an inode outlives its last name. The kernel holds an inode from the entry reply
//! that names it (lookup, create, mkdir, mknod, each readdirplus entry but `.` and `..`) until
//! FORGET returns those references, and may send any request for it meanwhile: an `open`
//! through a dentry resolved just before another process renamed a file over it must find
//! it. So an inode whose last name goes while the kernel still references it, or while a
//! handle holds it open, becomes an orphan (nlink 0, marked in the store) and keeps its last
//! committed content and attributes; it is deleted when the last reference and the last
//! handle are gone. libfuse keeps the same count per node (`nlookup`).
//!
//! Invariants kept here, all under one mutex:
//! - an inode is deleted only once `claim` or `start_reclaim` marked it `deleting`, which
//!   each does only with no kernel reference and no open handle;
//! - a reference is counted before the reply that carries it is sent (`pin`), and never on
//!   an inode marked `deleting`; a reference taken from a read that may predate a completed
//!   deletion is reported `Unsure`, and the caller checks the inode still exists.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Mutex;

use super::lock;

#[derive(Debug, Default)]
struct Refs {
    /// References the kernel holds: entry replies counted, FORGETs subtracted.
    lookups: u64,
    /// The inode has no name left (committed or being committed).
    orphan: bool,
    /// A transaction deleting the inode is staged; no new reference may be taken.
    deleting: bool,
}

impl Refs {
    fn idle(&self) -> bool {
        self.lookups == 0 && !self.orphan && !self.deleting
    }
}

#[derive(Debug, Default)]
struct Table {
    refs: HashMap<u64, Refs>,
    /// Deletions committed so far; a reader compares it across its read (see `pin`).
    deletions: u64,
}

/// What `pin` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Pin {
    /// Counted, and the inode cannot have been deleted since the read.
    Held,
    /// Counted, but a deletion completed since the read: the caller must check the inode
    /// still exists and `forget` it if not.
    Unsure,
    /// Being deleted right now: not counted; the caller reads again.
    Deleting,
}

/// What removing an inode's last name must do.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// Referenced or open: keep it as an orphan.
    Orphan,
    /// Unreferenced: delete it in the same transaction.
    Delete,
}

/// The kernel's references to inodes, and which nameless inodes they keep alive.
#[derive(Debug, Default)]
pub struct Lifetimes {
    table: Mutex<Table>,
}

impl Lifetimes {
    /// Taken before a read whose inodes will be pinned.
    pub fn epoch(&self) -> u64 {
        lock(&self.table).deletions
    }

    /// Counts one kernel reference to `ino`, found by a read begun at `epoch`.
    pub fn pin(&self, ino: u64, epoch: u64) -> Pin {
        let mut t = lock(&self.table);
        let stale = t.deletions != epoch;
        let r = t.refs.entry(ino).or_default();
        if r.deleting {
            return Pin::Deleting;
        }
        r.lookups += 1;
        if stale { Pin::Unsure } else { Pin::Held }
    }

    /// Counts one reference to an inode this transaction creates (no one else can see it yet).
    pub fn pin_new(&self, ino: u64) {
        lock(&self.table).refs.entry(ino).or_default().lookups += 1;
    }

    /// The kernel returned `n` references (FORGET). True when that leaves an orphan without
    /// references, which the caller then reclaims unless it is open.
    pub fn forget(&self, ino: u64, n: u64) -> bool {
        let mut t = lock(&self.table);
        let Entry::Occupied(mut e) = t.refs.entry(ino) else {
            return false;
        };
        let r = e.get_mut();
        r.lookups = r.lookups.saturating_sub(n);
        let reclaim = r.lookups == 0 && r.orphan && !r.deleting;
        if r.idle() {
            e.remove();
        }
        reclaim
    }

    /// Decides the fate of an inode losing its last name; `open` says whether a handle holds
    /// it. Called with the transaction that removes the name staged but not committed.
    pub fn claim(&self, ino: u64, open: bool) -> Claim {
        let mut t = lock(&self.table);
        let r = t.refs.entry(ino).or_default();
        if open || r.lookups > 0 {
            r.orphan = true;
            Claim::Orphan
        } else {
            r.deleting = true;
            Claim::Delete
        }
    }

    /// Undoes a `claim` whose transaction did not commit.
    pub fn unclaim(&self, ino: u64) {
        let mut t = lock(&self.table);
        if let Entry::Occupied(mut e) = t.refs.entry(ino) {
            e.get_mut().orphan = false;
            e.get_mut().deleting = false;
            if e.get().idle() {
                e.remove();
            }
        }
    }

    /// Marks an orphan for deletion if nothing references it and it is not `open`; true when
    /// the caller must now delete it and report with `deleted`.
    pub fn start_reclaim(&self, ino: u64, open: bool) -> bool {
        let mut t = lock(&self.table);
        match t.refs.get_mut(&ino) {
            Some(r) if r.orphan && r.lookups == 0 && !r.deleting && !open => {
                r.deleting = true;
                true
            }
            _ => false,
        }
    }

    /// The deletion marked by `claim` or `start_reclaim` is over: committed or abandoned.
    pub fn deleted(&self, ino: u64, committed: bool) {
        let mut t = lock(&self.table);
        if committed {
            t.deletions += 1;
        }
        if let Entry::Occupied(mut e) = t.refs.entry(ino) {
            e.get_mut().deleting = false;
            if committed {
                e.get_mut().orphan = false;
            }
            if e.get().idle() {
                e.remove();
            }
        }
    }

    /// Whether a transaction deleting `ino` is staged.
    pub fn is_deleting(&self, ino: u64) -> bool {
        lock(&self.table).refs.get(&ino).is_some_and(|r| r.deleting)
    }

    /// Inodes the kernel references, for status.
    pub fn referenced(&self) -> usize {
        lock(&self.table)
            .refs
            .values()
            .filter(|r| r.lookups > 0)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_referenced_inode_becomes_an_orphan_and_goes_at_its_last_forget() {
        let l = Lifetimes::default();
        let e = l.epoch();
        assert_eq!(l.pin(7, e), Pin::Held);
        assert_eq!(l.pin(7, e), Pin::Held);
        assert_eq!(l.claim(7, false), Claim::Orphan);
        assert!(!l.forget(7, 1));
        assert!(l.forget(7, 1));
        assert!(l.start_reclaim(7, false));
        assert_eq!(l.pin(7, e), Pin::Deleting);
        l.deleted(7, true);
        assert!(lock(&l.table).refs.is_empty());
    }

    #[test]
    fn an_open_orphan_waits_for_its_release() {
        let l = Lifetimes::default();
        assert_eq!(l.claim(3, true), Claim::Orphan);
        assert!(!l.start_reclaim(3, true));
        assert!(l.start_reclaim(3, false));
        l.deleted(3, true);
        assert!(lock(&l.table).refs.is_empty());
    }

    #[test]
    fn an_unreferenced_inode_is_deleted_at_once_and_refuses_pins_meanwhile() {
        let l = Lifetimes::default();
        let e = l.epoch();
        assert_eq!(l.claim(5, false), Claim::Delete);
        assert_eq!(l.pin(5, e), Pin::Deleting);
        l.deleted(5, true);
        // A read begun before the deletion committed may have seen the inode.
        assert_eq!(l.pin(5, e), Pin::Unsure);
        assert_eq!(l.pin(5, l.epoch()), Pin::Held);
    }

    #[test]
    fn a_failed_removal_leaves_no_mark() {
        let l = Lifetimes::default();
        assert_eq!(l.claim(9, false), Claim::Delete);
        l.deleted(9, false);
        assert_eq!(l.claim(9, true), Claim::Orphan);
        l.unclaim(9);
        assert!(lock(&l.table).refs.is_empty());
    }
}

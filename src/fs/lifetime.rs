//! How long an inode outlives its last name. The kernel holds an inode from the entry reply
//! that names it (lookup, create, mkdir, mknod, each readdirplus entry but `.` and `..`) until
//! FORGET returns those references, and may send any request for it meanwhile: an `open`
//! through a dentry resolved just before another process renamed a file over it must find
//! it. So an inode whose last name goes while the kernel still references it, or while a
//! handle holds it open, becomes an orphan (nlink 0, marked in the store) and keeps its last
//! committed content and attributes; it is deleted when the last reference and the last
//! handle are gone. libfuse keeps the same count per node (`nlookup`).
//!
//! Memory: an entry exists only for an inode the kernel references, an orphan, or one being
//! deleted, and is a key and one packed word; the table shrinks when the kernel lets go of
//! most of them, so a walk of a million files costs tens of megabytes only while the kernel
//! keeps their dentries.
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

/// One inode's state, packed in a word: the kernel can reference every inode of a store of
/// millions (its dentry cache is bounded only by memory), so an entry is a key and one `u64`
/// (16 bytes, plus the map's control byte), not a struct padded to 24.
///
/// The low 62 bits count the references the kernel holds (entry replies counted, FORGETs
/// subtracted); `ORPHAN` says the inode has no name left (committed or being committed);
/// `DELETING` that a transaction deleting it is staged, so no new reference may be taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Refs(u64);

impl Refs {
    const ORPHAN: u64 = 1 << 62;
    const DELETING: u64 = 1 << 63;
    const LOOKUPS: u64 = Self::ORPHAN - 1;

    fn lookups(self) -> u64 {
        self.0 & Self::LOOKUPS
    }

    fn orphan(self) -> bool {
        self.0 & Self::ORPHAN != 0
    }

    fn deleting(self) -> bool {
        self.0 & Self::DELETING != 0
    }

    /// Adds `n` references; a count that would reach 2^62 (never, at one reply per
    /// reference) stays at its maximum rather than spill into the flags.
    fn add(&mut self, n: u64) {
        let lookups = self.lookups().saturating_add(n).min(Self::LOOKUPS);
        self.0 = (self.0 & !Self::LOOKUPS) | lookups;
    }

    fn sub(&mut self, n: u64) {
        self.0 = (self.0 & !Self::LOOKUPS) | self.lookups().saturating_sub(n);
    }

    fn set(&mut self, flag: u64, on: bool) {
        if on {
            self.0 |= flag;
        } else {
            self.0 &= !flag;
        }
    }

    fn idle(self) -> bool {
        self.0 == 0
    }
}

/// Below this many slots the map is never shrunk: small maps cost nothing worth returning.
const MIN_SHRINK_CAPACITY: usize = 1024;

#[derive(Debug, Default)]
struct Table {
    /// Only inodes the kernel references, orphans and inodes being deleted have an entry.
    refs: HashMap<u64, Refs>,
    /// Deletions committed so far; a reader compares it across its read (see `pin`).
    deletions: u64,
}

impl Table {
    /// Removes `ino`'s entry once it holds nothing, and gives memory back when the kernel
    /// has let go of most inodes (a walk of a large store, then its dentries evicted):
    /// a hash map keeps its largest size otherwise. Shrinking to twice the entries at a
    /// quarter full keeps the work amortised constant per removal.
    fn drop_if_idle(&mut self, ino: u64) {
        if let Entry::Occupied(e) = self.refs.entry(ino)
            && e.get().idle()
        {
            e.remove();
            let cap = self.refs.capacity();
            if cap > MIN_SHRINK_CAPACITY && self.refs.len() < cap / 4 {
                self.refs.shrink_to(self.refs.len() * 2);
            }
        }
    }
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
        if r.deleting() {
            return Pin::Deleting;
        }
        r.add(1);
        if stale { Pin::Unsure } else { Pin::Held }
    }

    /// Counts one reference to an inode this transaction creates (no one else can see it yet).
    pub fn pin_new(&self, ino: u64) {
        lock(&self.table).refs.entry(ino).or_default().add(1);
    }

    /// The kernel returned `n` references (FORGET). True when that leaves an orphan without
    /// references, which the caller then reclaims unless it is open.
    pub fn forget(&self, ino: u64, n: u64) -> bool {
        let mut t = lock(&self.table);
        let Some(r) = t.refs.get_mut(&ino) else {
            return false;
        };
        r.sub(n);
        let reclaim = r.lookups() == 0 && r.orphan() && !r.deleting();
        t.drop_if_idle(ino);
        reclaim
    }

    /// Decides the fate of an inode losing its last name; `open` says whether a handle holds
    /// it. Called with the transaction that removes the name staged but not committed.
    pub fn claim(&self, ino: u64, open: bool) -> Claim {
        let mut t = lock(&self.table);
        let r = t.refs.entry(ino).or_default();
        if open || r.lookups() > 0 {
            r.set(Refs::ORPHAN, true);
            Claim::Orphan
        } else {
            r.set(Refs::DELETING, true);
            Claim::Delete
        }
    }

    /// Undoes a `claim` whose transaction did not commit.
    pub fn unclaim(&self, ino: u64) {
        let mut t = lock(&self.table);
        if let Some(r) = t.refs.get_mut(&ino) {
            r.set(Refs::ORPHAN, false);
            r.set(Refs::DELETING, false);
            t.drop_if_idle(ino);
        }
    }

    /// Marks an orphan for deletion if nothing references it and it is not `open`; true when
    /// the caller must now delete it and report with `deleted`.
    pub fn start_reclaim(&self, ino: u64, open: bool) -> bool {
        let mut t = lock(&self.table);
        match t.refs.get_mut(&ino) {
            Some(r) if r.orphan() && r.lookups() == 0 && !r.deleting() && !open => {
                r.set(Refs::DELETING, true);
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
        if let Some(r) = t.refs.get_mut(&ino) {
            r.set(Refs::DELETING, false);
            if committed {
                r.set(Refs::ORPHAN, false);
            }
            t.drop_if_idle(ino);
        }
    }

    /// Whether a transaction deleting `ino` is staged.
    pub fn is_deleting(&self, ino: u64) -> bool {
        lock(&self.table)
            .refs
            .get(&ino)
            .is_some_and(|r| r.deleting())
    }

    /// Inodes the kernel references, for status.
    pub fn referenced(&self) -> usize {
        lock(&self.table)
            .refs
            .values()
            .filter(|r| r.lookups() > 0)
            .count()
    }

    /// Bytes the table holds for its entries: slots times a slot's key, value and control
    /// byte (what a `HashMap` allocates, less its small constant group padding).
    pub fn table_bytes(&self) -> usize {
        lock(&self.table).refs.capacity() * (std::mem::size_of::<(u64, Refs)>() + 1)
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

    #[test]
    fn an_entry_is_a_key_and_one_word() {
        assert_eq!(std::mem::size_of::<(u64, Refs)>(), 16);
    }

    /// The kernel may reference every inode of a large store at once (a walk with a large
    /// dentry cache): the table must cost a bounded number of bytes per entry, and give the
    /// memory back once the kernel forgets them.
    #[test]
    fn the_table_stays_compact_and_shrinks_when_the_kernel_forgets() {
        const N: u64 = 200_000;
        let l = Lifetimes::default();
        let e = l.epoch();
        for ino in 2..2 + N {
            assert_eq!(l.pin(ino, e), Pin::Held);
        }
        assert_eq!(l.referenced(), N as usize);
        // hashbrown keeps at most 7/8 of its slots full and doubles: at worst ~2.3 slots per
        // entry, 17 bytes a slot.
        let per_entry = l.table_bytes() as f64 / N as f64;
        assert!(per_entry <= 40.0, "{per_entry} bytes per referenced inode");
        for ino in 2..2 + N {
            assert!(!l.forget(ino, 1));
        }
        assert_eq!(l.referenced(), 0);
        assert!(
            l.table_bytes() <= 2 * MIN_SHRINK_CAPACITY * 17,
            "{} bytes left after every forget",
            l.table_bytes()
        );
    }

    #[test]
    fn flags_and_counts_do_not_mix() {
        let mut r = Refs::default();
        r.add(u64::MAX);
        assert_eq!(r.lookups(), Refs::LOOKUPS);
        assert!(!r.orphan() && !r.deleting());
        r.set(Refs::ORPHAN, true);
        r.sub(Refs::LOOKUPS);
        assert_eq!(r.lookups(), 0);
        assert!(r.orphan() && !r.deleting() && !r.idle());
        r.set(Refs::ORPHAN, false);
        assert!(r.idle());
    }
}

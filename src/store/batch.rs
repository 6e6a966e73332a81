//! Several operations in one redb write transaction: a joined write (`Store::write_joined_by`)
//! that finds other joined writes queued behind it when it commits leaves its redb
//! transaction open for the next of them, and the last one commits redb once for all.
//!
//! Each operation keeps everything of its own: its commit number (taken in turn, so numbers
//! stay contiguous and in commit order), its write-ahead-log record, its history record and
//! its reply. Running one after another over one transaction, each sees what the earlier
//! ones wrote, exactly as if each had committed before the next began: a batch is the same
//! sequence of commits, with one redb commit (one copy of each page touched, each table
//! opened once) in place of many.
//!
//! Invariants kept here:
//! - The log holds no record of a change redb did not commit: an operation's record is
//!   appended only with the batch's redb commit, all of them in order under the log's
//!   pending lock, and taken back together if that commit fails.
//! - No operation's caller hears "done" before its batch's redb commit (and its log sync,
//!   when durable); other readers see only committed snapshots.
//! - An operation dropped without its commit (an error after it wrote, a refusal, a panic)
//!   cannot be taken out of the transaction alone: the whole batch is abandoned, its numbers
//!   given back (nobody else took one: the batch holds redb's write lock), and the earlier
//!   operations are told to run again (`StoreError::Retry`), exclusively this time.
//! - A batch never waits for a thread that has not queued to join it, so a writer that does
//!   not join simply waits for redb's write lock, which the batch holds until it commits.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex, MutexGuard};

use super::tables::Tx;
use super::{Store, StoreError, fault, wal};

/// The most operations in one batch: each waits for the batch's commit, so the bound keeps
/// the first one's latency bounded.
pub(super) const MAX_OPS: usize = 16;

/// The most log bytes one batch's records may take: past it, the batch commits.
const MAX_BYTES: usize = 256 * 1024;

/// The batch slot of a store: the open transaction between two operations of a batch, and
/// how the batches that ended ended.
#[derive(Default)]
pub(super) struct Slot {
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    /// An operation of the batch runs now (or the batch commits): the next joiner waits.
    running: bool,
    /// Threads waiting to join.
    queued: usize,
    /// The open batch, between two of its operations.
    open: Option<Open>,
    /// Ids for batches.
    next_id: u64,
    /// How each batch that ended with operations waiting on it ended, and how many of them
    /// have still to read it.
    ended: HashMap<u64, (Outcome, usize)>,
    /// Tests: a batch commits only once it has this many operations.
    hold: usize,
}

/// An open batch's redb transaction with what it carries.
struct Open {
    tx: Tx,
    batch: Batch,
}

/// What a batch carries from one operation to the next.
pub(super) struct Batch {
    id: u64,
    /// The store's commit number before the batch's first operation.
    base: u64,
    /// Each operation's number and log record (None: too large for one; the batch is then
    /// a checkpoint).
    ops: Vec<(u64, Option<Vec<u8>>)>,
    /// Log bytes of `ops`.
    bytes: usize,
    /// Operations waiting for the batch to end.
    waiting: usize,
}

#[derive(Clone, PartialEq)]
enum Outcome {
    Committed,
    Retry,
    Failed(String),
}

/// A write transaction's place in a batch. Dropped without `settled` (its operation left
/// without committing, or panicked), it abandons the batch: see the module comment.
pub(super) struct Joined<'s> {
    store: &'s Store,
    pub(super) batch: Option<Batch>,
    /// The operation took its number: a panic from here fails the log, as any panic inside
    /// a commit does.
    pub(super) numbered: bool,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Slot {
    fn wait<'a>(&self, g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.cv.wait(g).unwrap_or_else(|p| p.into_inner())
    }
}

thread_local! {
    /// This thread dropped a joined write that had earlier operations in its batch.
    static ABANDONED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Store {
    /// Tests: a batch commits only once it holds `n` operations (0: as usual), its last
    /// operation so far waiting for the next joiner meanwhile; until a batch is abandoned,
    /// whose operations then run again on their own (which a hold would stall).
    #[doc(hidden)]
    pub fn hold_batches(&self, n: usize) {
        lock(&self.batches.state).hold = n;
        self.batches.cv.notify_all();
    }

    /// Whether this thread, since the last call, dropped a joined write without its commit
    /// while earlier operations of other threads were in its batch: its operation saw
    /// their changes, which were then abandoned, so what it answered may rest on changes
    /// that were never committed, and it must run again with a write of its own.
    pub fn take_abandoned() -> bool {
        ABANDONED.with(|a| a.replace(false))
    }
}

impl Store {
    /// Joins the open batch, or begins one: the redb transaction and the batch it carries.
    pub(super) fn join(&self) -> Result<(Tx, Joined<'_>), StoreError> {
        let slot = &self.batches;
        let mut st = lock(&slot.state);
        st.queued += 1;
        if st.hold > 0 {
            slot.cv.notify_all();
        }
        while st.running {
            st = slot.wait(st);
        }
        st.queued -= 1;
        st.running = true;
        if let Some(open) = st.open.take() {
            drop(st);
            return Ok((
                open.tx,
                Joined {
                    store: self,
                    batch: Some(open.batch),
                    numbered: false,
                },
            ));
        }
        let id = st.next_id;
        st.next_id += 1;
        drop(st);
        match self.begin_tx() {
            Ok(tx) => Ok((
                tx,
                Joined {
                    store: self,
                    batch: Some(Batch {
                        id,
                        // Read under redb's write lock, which only numbered commits hold.
                        base: self.commits.load(Ordering::Acquire),
                        ops: Vec::new(),
                        bytes: 0,
                        waiting: 0,
                    }),
                    numbered: false,
                },
            )),
            Err(e) => {
                lock(&slot.state).running = false;
                slot.cv.notify_all();
                Err(e)
            }
        }
    }

    /// Ends batch `id` as `outcome` for the operations waiting on it; the next joiner runs.
    fn end_batch(&self, id: u64, waiting: usize, outcome: Outcome) {
        let slot = &self.batches;
        let mut st = lock(&slot.state);
        if outcome == Outcome::Retry {
            st.hold = 0;
        }
        if waiting > 0 {
            st.ended.insert(id, (outcome, waiting));
        }
        st.running = false;
        drop(st);
        slot.cv.notify_all();
    }
}

impl Drop for Joined<'_> {
    fn drop(&mut self) {
        let Some(batch) = self.batch.take() else {
            return;
        };
        let store = self.store;
        if self.numbered
            && std::thread::panicking()
            && let Some(Some(wal)) = store.wal.get()
        {
            wal.fail();
        }
        // Dropped before the transaction (see `WriteTxn`), so the numbers go back while the
        // batch still holds redb's write lock.
        store.commits.store(batch.base, Ordering::Release);
        // An earlier operation's expiry may have looked at records this abort brings back.
        store
            .history_oldest
            .store(i64::MIN, std::sync::atomic::Ordering::Relaxed);
        if !batch.ops.is_empty() {
            ABANDONED.with(|a| a.set(true));
            tracing::debug!(
                operations = batch.ops.len(),
                "a batched operation failed: the others of its batch run again"
            );
        }
        store.end_batch(batch.id, batch.waiting, Outcome::Retry);
    }
}

impl super::WriteTxn<'_> {
    /// The end of a joined operation's commit, numbered `seq` with log record `redo`: the
    /// record goes into the batch, which it either leaves open for a queued joiner (and
    /// waits for its end) or commits. An operation without a record (too large for one)
    /// commits the batch at once, as a checkpoint.
    pub(super) fn finish_joined(
        mut self,
        seq: u64,
        redo: Option<Vec<u8>>,
    ) -> Result<(), StoreError> {
        let store = self.store;
        let Some(mut batch) = self.joined.as_mut().and_then(|j| j.batch.take()) else {
            return Err(StoreError::Io("a batched commit outside a batch".into()));
        };
        self.joined = None;
        let force = redo.is_none();
        batch.bytes += redo.as_ref().map_or(0, |r| r.len() + wal::HEADER);
        batch.ops.push((seq, redo));
        let slot = &store.batches;
        let mut st = lock(&slot.state);
        while st.queued == 0 && batch.ops.len() < st.hold && !force {
            st = slot.wait(st);
        }
        if st.queued > 0 && !force && batch.ops.len() < MAX_OPS && batch.bytes < MAX_BYTES {
            let id = batch.id;
            batch.waiting += 1;
            st.open = Some(Open { tx: self.tx, batch });
            st.running = false;
            slot.cv.notify_all();
            let outcome = loop {
                if let Some((o, left)) = st.ended.get_mut(&id) {
                    let o = o.clone();
                    *left -= 1;
                    if *left == 0 {
                        st.ended.remove(&id);
                    }
                    break o;
                }
                st = slot.wait(st);
            };
            return match outcome {
                Outcome::Committed => Ok(()),
                Outcome::Retry => Err(StoreError::Retry),
                Outcome::Failed(m) => Err(StoreError::Io(m)),
            };
        }
        drop(st);
        store.commit_batch(self.tx, batch, force)
    }
}

/// Fails the log and ends the batch as failed when a batch's commit unwinds.
struct Committing<'a> {
    store: &'a Store,
    id: u64,
    waiting: usize,
    armed: bool,
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Some(Some(wal)) = self.store.wal.get() {
                wal.fail();
            }
            self.store.end_batch(
                self.id,
                self.waiting,
                Outcome::Failed("a batched commit panicked; restart the daemon".into()),
            );
        }
    }
}

impl Store {
    /// Commits a batch in redb once, its records appended to the log in order with it (or,
    /// when they do not all fit, or one had none, as a checkpoint).
    fn commit_batch(&self, tx: Tx, mut batch: Batch, force: bool) -> Result<(), StoreError> {
        let mut guard = Committing {
            store: self,
            id: batch.id,
            waiting: batch.waiting,
            armed: true,
        };
        let result = self.commit_batch_in(tx, &mut batch, force);
        guard.armed = false;
        let outcome = match &result {
            Ok(()) => Outcome::Committed,
            Err(e) => Outcome::Failed(e.to_string()),
        };
        if result.is_ok() {
            self.redb_commits.fetch_add(1, Ordering::Relaxed);
        }
        self.end_batch(batch.id, batch.waiting, outcome);
        result
    }

    fn commit_batch_in(&self, tx: Tx, batch: &mut Batch, force: bool) -> Result<(), StoreError> {
        let Some(Some(wal)) = self.wal.get() else {
            // A joined write begins only once the log runs.
            return Err(StoreError::Io("a batched commit without a log".into()));
        };
        let last = batch.ops.last().map_or(batch.base, |(s, _)| *s);
        let mut pending = match wal.pending() {
            Ok(p) => p,
            Err(e) => {
                wal.fail();
                return Err(e);
            }
        };
        let near_full = self.disk_free.load(Ordering::Relaxed) < super::commit::ROOM_CHECK_ABOVE;
        let quarter = |used: u64| used / (wal::LOG_BYTES / 4);
        let before = quarter(pending.used());
        let mut first_mark = None;
        let mut fits = !force && !near_full;
        if fits {
            for (seq, redo) in &batch.ops {
                match redo {
                    Some(r) if pending.fits(r.len()) => {
                        let mark = pending.push(*seq, r);
                        first_mark.get_or_insert(mark);
                    }
                    _ => {
                        fits = false;
                        break;
                    }
                }
            }
            if !fits && let Some(m) = first_mark.take() {
                pending.unpush(m);
            }
        }
        if !fits {
            self.injected_panic(fault::PanicAt::Checkpoint);
            let committed = tx.commit(redb::Durability::Immediate);
            if let Err(e) = committed {
                wal.fail();
                return Err(e);
            }
            pending.checkpointed(last);
            wal.covered(last);
            drop(pending);
            self.tap_batch(batch);
            return Ok(());
        }
        let crossed = quarter(pending.used()) != before;
        self.injected_panic(fault::PanicAt::Appended);
        let committed = tx.commit(redb::Durability::None);
        if let Err(e) = committed {
            if let Some(m) = first_mark {
                pending.unpush(m);
            }
            wal.fail();
            return Err(e);
        }
        drop(pending);
        self.tap_batch(batch);
        if crossed {
            self.preflush();
        }
        self.injected_panic(fault::PanicAt::Committed);
        Ok(())
    }

    /// Hands each operation's record of a committed batch to the replicas, in order.
    fn tap_batch(&self, batch: &mut Batch) {
        for (seq, redo) in batch.ops.drain(..) {
            self.tap(seq, redo);
        }
    }
}

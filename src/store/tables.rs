//! A write transaction's redb transaction with the tables it has opened, each opened once and
//! kept open until the transaction commits or is dropped.
//!
//! Opening a redb table looks its root up in the table tree and checks its types, records it as
//! open, and closing it stages its new root: about 5,000 instructions each time. A commit's
//! accessors open the same few tables over and over (some two dozen openings of eight or nine
//! tables for a create with its history record), so `Tx` opens each once and lends it out
//! (`open_table`) for as long as the caller holds it.
//!
//! Invariant kept here: every table this holds borrows the redb transaction, which stays at one
//! heap address and is neither moved, borrowed mutably nor dropped until every table has been
//! dropped (`into_inner`, `delete_table`, `Drop`).

use std::any::Any;
use std::cell::{OnceCell, RefCell, RefMut};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use redb::{Key, Table, TableDefinition, TableError, TableHandle, Value, WriteTransaction};

/// Tables one transaction can hold open at once (the store has 18).
const SLOTS: usize = 24;

/// A redb write transaction and the tables opened in it (see the module comment).
pub(super) struct Tx {
    /// The transaction, from `Box::leak`; made a Box again by `into_inner` or `drop`.
    tx: NonNull<WriteTransaction>,
    /// `into_inner` took the transaction back: `drop` leaves it alone.
    taken: bool,
    /// The name of the table each slot of `open` is for, given at its first use.
    names: [OnceCell<String>; SLOTS],
    /// The open tables: each a `Table<'static, K, V>` that in truth borrows `*tx`.
    open: [RefCell<Option<Box<dyn Any>>>; SLOTS],
    /// Counts the time redb's write lock is held, until this transaction commits or is
    /// dropped (`Store::commit_stats`).
    held: Option<Held>,
}

/// Adds the time from its making to its drop to a count of nanoseconds: how long redb's write
/// transaction was held (`CommitStats::writer_busy_ns`).
pub(super) struct Held {
    since: Instant,
    busy: Arc<AtomicU64>,
}

impl Held {
    pub(super) fn new(busy: Arc<AtomicU64>) -> Held {
        Held {
            since: Instant::now(),
            busy,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let ns = u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.busy.fetch_add(ns, Ordering::Relaxed);
    }
}

// SAFETY: a `Tx` moves between threads only whole, between two operations of a batch (see
// `batch`), with no table lent out (every `RefMut` borrows the `Tx`). What it owns is a redb
// write transaction and redb tables over it, all `Send` (checked below for the kinds of key
// and value the store's tables have), and a `Held` (an `Instant` and an `Arc<AtomicU64>`,
// `Send` too); the `RefCell`s and `OnceCell`s are only ever used by the thread that holds
// the `Tx`, and `Tx` is not `Sync`.
unsafe impl Send for Tx {}

const _: () = {
    const fn send<T: Send>() {}
    send::<WriteTransaction>();
    send::<Table<'static, u64, &'static [u8]>>();
    send::<Table<'static, (u64, &'static str), (u64, u8)>>();
    send::<Table<'static, &'static str, &'static [u8]>>();
    send::<Table<'static, (u64, u64), u64>>();
    send::<Table<'static, u64, ()>>();
    send::<Held>();
};

impl Tx {
    pub(super) fn new(tx: WriteTransaction) -> Tx {
        Tx {
            tx: NonNull::from(Box::leak(Box::new(tx))),
            taken: false,
            names: std::array::from_fn(|_| OnceCell::new()),
            open: std::array::from_fn(|_| RefCell::new(None)),
            held: None,
        }
    }

    /// `new` for a transaction just begun, whose time holding redb's write lock `held`
    /// counts until it commits (`commit`) or is dropped.
    pub(super) fn timed(tx: WriteTransaction, held: Held) -> Tx {
        let mut t = Tx::new(tx);
        t.held = Some(held);
        t
    }

    /// Commits with durability `d`; the write lock's time goes to the count `timed` gave.
    pub(super) fn commit(mut self, d: redb::Durability) -> Result<(), super::StoreError> {
        let _held = self.held.take();
        super::commit_as(self.into_inner(), d)
    }

    /// The transaction, for what reads or opens no table of `open` (stats, listing).
    pub(super) fn get(&self) -> &WriteTransaction {
        // SAFETY: `tx` came from `Box::leak` and is only made a Box again by `into_inner` or
        // `drop`, which take `self` whole or by `&mut`, so no shared borrow of `self` (this
        // one's lifetime) outlives it; nothing borrows it mutably meanwhile.
        unsafe { self.tx.as_ref() }
    }

    /// Opens table `def` (creating it if missing), once per transaction: the first call opens
    /// it and later ones lend the same table, for as long as the caller holds it. The table's
    /// lifetime says `'static`, but no table can be moved out of the slot that holds it.
    /// Opening a table that is lent out already is refused with redb's `TableAlreadyOpen`, as
    /// redb refuses a second opening.
    #[track_caller]
    pub(super) fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        def: TableDefinition<K, V>,
    ) -> Result<RefMut<'_, Table<'static, K, V>>, TableError> {
        let name = def.name();
        let Some(slot) = self.slot(name) else {
            return Err(TableError::Storage(redb::StorageError::Io(
                std::io::Error::other(format!(
                    "table {name}: more than {SLOTS} tables opened in one transaction"
                )),
            )));
        };
        let Ok(mut held) = self.open[slot].try_borrow_mut() else {
            return Err(TableError::TableAlreadyOpen(
                name.to_string(),
                std::panic::Location::caller(),
            ));
        };
        if held
            .as_ref()
            .is_some_and(|t| !t.is::<Table<'static, K, V>>())
        {
            // Opened under other types before: closed, and opened again under these.
            *held = None;
        }
        if held.is_none() {
            let t: Table<'_, K, V> = self.get().open_table(def)?;
            // SAFETY: the table borrows the transaction, which stays where it is until every
            // table in `open` has been dropped (`into_inner`, `delete_table`, `drop` empty
            // `open` first); the slot never lends it out for longer than `&self`.
            let t: Table<'static, K, V> = unsafe { std::mem::transmute(t) };
            *held = Some(Box::new(t));
        }
        RefMut::filter_map(held, |t| {
            t.as_mut()
                .and_then(|t| t.downcast_mut::<Table<'static, K, V>>())
        })
        .map_err(|_| unreachable!("the slot holds a table of these types"))
    }

    /// The slot for table `name`: the one given to it, or the first unused one.
    fn slot(&self, name: &str) -> Option<usize> {
        for (i, n) in self.names.iter().enumerate() {
            match n.get() {
                Some(n) if n == name => return Some(i),
                Some(_) => {}
                None => {
                    let _ = n.set(name.to_string());
                    return Some(i);
                }
            }
        }
        None
    }

    /// Drops every open table: each stages its new root in the transaction.
    fn close_all(&mut self) {
        for t in &mut self.open {
            *t.get_mut() = None;
        }
    }

    /// Deletes table `def`, closing it first if it is open.
    pub(super) fn delete_table<K: Key + 'static, V: Value + 'static>(
        &mut self,
        def: TableDefinition<K, V>,
    ) -> Result<bool, TableError> {
        self.close_all();
        self.get().delete_table(def)
    }

    /// The transaction itself, every table closed: for its commit.
    pub(super) fn into_inner(mut self) -> WriteTransaction {
        self.close_all();
        self.taken = true;
        // SAFETY: `tx` came from `Box::leak`; every table that borrowed it was just dropped,
        // `self` is consumed, and `taken` keeps `drop` from reaching it again.
        *unsafe { Box::from_raw(self.tx.as_ptr()) }
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        self.close_all();
        if !self.taken {
            // SAFETY: as in `into_inner`: the tables are gone and `tx` is not used again.
            drop(unsafe { Box::from_raw(self.tx.as_ptr()) });
        }
        // Untaken, the transaction aborted above and let go of the lock: its time ends here
        // (`commit` takes `held` first and ends it after redb's commit).
        drop(self.held.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata};

    const NUMS: TableDefinition<u64, u64> = TableDefinition::new("nums");
    const NAMES: TableDefinition<u64, &str> = TableDefinition::new("names");

    fn db(dir: &tempfile::TempDir) -> redb::Database {
        redb::Database::create(dir.path().join("t.redb")).unwrap()
    }

    #[test]
    fn a_table_is_opened_once_and_lent_out_again() {
        let dir = tempfile::tempdir().unwrap();
        let db = db(&dir);
        let tx = Tx::new(db.begin_write().unwrap());
        tx.open_table(NUMS).unwrap().insert(1, 10).unwrap();
        tx.open_table(NAMES).unwrap().insert(1, "one").unwrap();
        // The same table again, with what this transaction wrote to it.
        assert_eq!(
            tx.open_table(NUMS)
                .unwrap()
                .get(1)
                .unwrap()
                .unwrap()
                .value(),
            10
        );
        tx.open_table(NUMS).unwrap().insert(2, 20).unwrap();
        tx.into_inner().commit().unwrap();
        let r = db.begin_read().unwrap();
        let t = r.open_table(NUMS).unwrap();
        assert_eq!(t.len().unwrap(), 2);
        assert_eq!(
            r.open_table(NAMES)
                .unwrap()
                .get(1)
                .unwrap()
                .unwrap()
                .value(),
            "one"
        );
    }

    #[test]
    fn a_table_lent_out_is_refused_a_second_time_without_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let db = db(&dir);
        let tx = Tx::new(db.begin_write().unwrap());
        let held = tx.open_table(NUMS).unwrap();
        assert!(matches!(
            tx.open_table(NUMS),
            Err(TableError::TableAlreadyOpen(name, _)) if name == "nums"
        ));
        drop(held);
        assert!(tx.open_table(NUMS).is_ok());
    }

    #[test]
    fn dropping_the_transaction_with_tables_open_rolls_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let db = db(&dir);
        let tx = Tx::new(db.begin_write().unwrap());
        tx.open_table(NUMS).unwrap().insert(1, 10).unwrap();
        drop(tx);
        let tx = Tx::new(db.begin_write().unwrap());
        assert!(tx.open_table(NUMS).unwrap().get(1).unwrap().is_none());
    }
}

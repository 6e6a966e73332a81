//! History's byte budget (`--max-history-bytes`): what history keeps is measured, and when it
//! takes more than the budget its oldest records are shed, in the commit path, until it is
//! back under three quarters of it.
//!
//! How the size is known without a walk per commit: each commit that appends a record adds
//! an upper bound of what the record can keep alive (its encoded bytes three times over, for
//! the record, its index rows and their keys, and a whole chunk for every chunk it names) to
//! an estimate held in memory. Only when the estimate passes the budget is history measured
//! exactly (`ReadTxn::history_bytes`, from redb's own page counts of the tables), and the
//! estimate set to that. No store format change: nothing of this is written to the file, so
//! every release reads what this one writes, and a restart measures again at the first
//! commit that could be over.
//!
//! Invariant kept here: shedding drops whole records, oldest first, through the same removal
//! as expiry (`WriteTxn::drop_record`: parts, index entries and the blobs only they kept
//! alive go with each record), never the newest record, and never fails a commit: it runs
//! after the commit that crossed the budget, in transactions of its own.

use std::sync::atomic::Ordering;

use redb::{ReadableTable, ReadableTableMetadata};

use super::read::ReadTxn;
use super::schema::*;
use super::{Store, StoreError, Sync, map_err};

/// Shedding goes down to this share of the budget (numerator over 4), so that the commits
/// after it do not each measure and shed again.
const SHED_TO_QUARTERS: u64 = 3;
/// Records one shedding transaction drops at most: commits stay bounded; more rounds follow.
const SHED_BATCH: usize = 4096;
/// Rounds of shedding after one commit, each measured again.
const SHED_ROUNDS: usize = 8;

impl Store {
    /// Sets the bytes history may keep (0: no bound). The estimate starts at the file's size,
    /// an upper bound of what history holds, so a store already past the budget is measured
    /// (and shed) at the first commit and a small one is not measured at all.
    pub fn set_history_budget(&self, bytes: u64) {
        self.history_budget.store(bytes, Ordering::Relaxed);
        self.history_estimate
            .store(self.file_bytes(), Ordering::Relaxed);
        self.history_measure_above.store(bytes, Ordering::Relaxed);
    }

    /// The bytes history may keep (0: no bound).
    pub fn history_budget(&self) -> u64 {
        self.history_budget.load(Ordering::Relaxed)
    }

    /// What history keeps, as far as this daemon knows without measuring: exact right after a
    /// measurement, an upper bound since (every record since adds at most its bound).
    pub fn history_bytes_estimate(&self) -> u64 {
        self.history_estimate.load(Ordering::Relaxed)
    }

    /// Whether history may be over its budget, so the commit that asks should measure it.
    pub fn history_maybe_over_budget(&self) -> bool {
        let budget = self.history_budget();
        budget > 0
            && self.history_estimate.load(Ordering::Relaxed)
                > self.history_measure_above.load(Ordering::Relaxed)
    }

    /// Adds a new record's upper bound to the estimate (`WriteTxn::record_history`).
    pub(super) fn history_grew(&self, bytes: u64) {
        let _ = self
            .history_estimate
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_add(bytes))
            });
    }

    /// Measures history and, when it takes more than the budget, drops its oldest records
    /// (never the newest) until it is back under three quarters of the budget, in rounds of
    /// at most `SHED_BATCH` records. Returns how many records were dropped and the bytes
    /// history held before and after. Best effort: the caller's commit is already made.
    pub fn shed_history_to_budget(&self) -> Result<(usize, u64, u64), StoreError> {
        let budget = self.history_budget();
        let before = self.read()?.history_bytes()?;
        let mut now = before;
        let mut dropped = 0;
        if budget > 0 && now > budget {
            let target = budget / 4 * SHED_TO_QUARTERS;
            for _ in 0..SHED_ROUNDS {
                let mut w = self.write()?;
                w.without_history();
                let n = w.shed_oldest(now.saturating_sub(target))?;
                if n == 0 {
                    break;
                }
                w.commit(Sync::Durable)?;
                dropped += n;
                now = self.read()?.history_bytes()?;
                if now <= target {
                    break;
                }
            }
        }
        if dropped > 0 {
            // redb hands out again only pages freed before its last durable commit: one
            // now, so what was shed is reused instead of the file growing past it.
            self.checkpoint()?;
        }
        self.history_estimate.store(now, Ordering::Relaxed);
        // Still over (the newest record alone, or shared content, takes more): measure again
        // only once a quarter of the budget more could have been added.
        self.history_measure_above.store(
            budget.max(now.saturating_add(budget / 4)),
            Ordering::Relaxed,
        );
        Ok((dropped, before, now))
    }
}

impl ReadTxn {
    /// The bytes history keeps in the store: the pages of history's own tables (records,
    /// their parts, their indexes, delta blobs and their index), and the stored bytes of
    /// whole blobs beyond the current content (what only history keeps alive). redb's page
    /// counts: exact for the tables, a walk of their pages. Current content held inline in
    /// inode records or as holes counts against the blobs too, so this can fall short of
    /// the truth by at most the current content's size.
    pub fn history_bytes(&self) -> Result<u64, StoreError> {
        fn pages<K: redb::Key + 'static, V: redb::Value + 'static>(
            r: &ReadTxn,
            def: redb::TableDefinition<K, V>,
        ) -> Result<u64, StoreError> {
            match r.tx.open_table(def) {
                Ok(t) => {
                    let s = t.stats().map_err(map_err)?;
                    Ok(s.stored_bytes() + s.metadata_bytes() + s.fragmented_bytes())
                }
                Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
                Err(e) => Err(map_err(e)),
            }
        }
        let own = pages(self, HISTORY)?
            + pages(self, HISTORY_UNDO)?
            + pages(self, HISTORY_KEYS)?
            + pages(self, BLOB_DELTAS)?
            + pages(self, DELTAS)?;
        let blobs = pages(self, BLOBS)?;
        let content = self.usage()?.content_bytes;
        Ok(own + blobs.saturating_sub(content))
    }
}

impl super::write::WriteTxn<'_> {
    /// Drops the oldest records, never the newest, until about `bytes` are freed (as
    /// `drop_record` estimates them) or `SHED_BATCH` records are gone; how many were.
    fn shed_oldest(&mut self, bytes: u64) -> Result<usize, StoreError> {
        let newest = self.last_seq()?;
        let seqs: Vec<u64> = {
            let t = self.tx.open_table(HISTORY).map_err(map_err)?;
            let mut v = Vec::new();
            for item in t.range(..newest).map_err(map_err)?.take(SHED_BATCH) {
                v.push(item.map_err(map_err)?.0.value());
            }
            v
        };
        let mut freed = 0u64;
        let mut n = 0;
        for seq in seqs {
            if freed >= bytes {
                break;
            }
            freed = freed.saturating_add(self.drop_record(seq)?);
            n += 1;
        }
        Ok(n)
    }
}

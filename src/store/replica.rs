//! What the store gives replication (`crate::replica`): every commit's log record, handed over
//! as it commits, and the two things only this module can do with records: encode them into a
//! segment (the log's own record layout) and apply them to a store file at restore.
//!
//! A `Feed` is one replica's queue of committed records not yet shipped. The commit path puts
//! each record in every feed (`Store::tap`) after redb committed it, and never waits: the
//! shipper takes records from the feed on its own thread. A record is built once and shared
//! (`Record`, one allocation for every feed and the shipper). A feed keeps what it was given
//! until the shipper releases it, so the log's checkpoints (which start the log file again)
//! never take an unshipped record away. While feeds are attached a transaction's record may
//! grow past the log's `wal::MAX_RECORD` to `MAX_SHIPPED_RECORD` (the log checkpoints such a
//! transaction, and the replica still gets its record). A commit without a record (larger
//! still) or a feed that outgrew `FEED_BYTES` (a replica out of reach for long) breaks the
//! chain: the shipper then starts a new generation from a snapshot, which holds everything
//! the missing records held.
//!
//! Invariant kept here: a feed hands out only an unbroken run of commit numbers following what
//! the replica holds, so a replica is always a prefix of the store's commits.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use redb::Database;

use super::read::ReadTxn;
use super::redo::{commit_time, replay};
use super::schema::*;
use super::{Store, StoreError, map_err, now_ns, wal};

/// Records a feed holds before it gives up and asks for a new generation: a replica out of
/// reach costs the mount at most this much memory. Twice `MAX_SHIPPED_RECORD`, so one record
/// that size always fits beside others.
const FEED_BYTES: usize = 64 * 1024 * 1024;

/// How large a transaction's record may grow while replicas are attached. A record over the
/// log's `wal::MAX_RECORD` (a large file's content) would otherwise leave a gap that only a
/// new generation (a snapshot of the whole store) fills; up to this size shipping the record
/// costs less. Larger transactions still break the chain, so the record built in memory
/// beside the content redb commits stays bounded.
pub const MAX_SHIPPED_RECORD: usize = 32 * 1024 * 1024;

/// A commit's record, shared by every feed and the shipper without copying.
pub type Record = Arc<Vec<u8>>;

/// The feeds of a replicated mount, and where the store was when they started.
#[derive(Clone, Default)]
pub struct Attached {
    pub feeds: Vec<Arc<Feed>>,
    /// The commit they start after: every later one is handed to each.
    pub from: u64,
    /// When the last commit that records its time committed, as of `from` (ns since the
    /// epoch; 0 for none): a commit number alone can be taken again after a crash, this
    /// time cannot.
    pub from_time: i64,
}

/// What a feed has for its shipper.
#[derive(Debug, PartialEq, Eq)]
pub enum Batch {
    /// The records following the replica's last commit, in order (maybe none yet).
    Records(Vec<(u64, Record)>),
    /// A record is missing: only a new snapshot can carry on.
    Broken,
}

#[derive(Default)]
struct FeedState {
    /// Commit number -> (when the feed got it, ns; its record, or None for a commit without).
    records: BTreeMap<u64, (i64, Option<Record>)>,
    bytes: usize,
    broken: bool,
}

/// One replica's queue of committed records not yet shipped.
#[derive(Default)]
pub struct Feed {
    state: Mutex<FeedState>,
}

impl Feed {
    fn lock(&self) -> MutexGuard<'_, FeedState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes commit `seq`'s record (None: it has none), handed over at `now` (ns).
    fn push(&self, seq: u64, record: Option<Record>, now: i64) {
        let mut s = self.lock();
        if s.broken {
            return;
        }
        let len = record.as_ref().map_or(0, |r| r.len());
        if s.bytes + len > FEED_BYTES {
            // The replica has been out of reach for long: a snapshot will carry on from here.
            *s = FeedState {
                broken: true,
                ..FeedState::default()
            };
            return;
        }
        s.bytes += len;
        s.records.insert(seq, (now, record));
    }

    /// Forgets every record up to `upto` (shipped, or held by a snapshot).
    pub fn release(&self, upto: u64) {
        let mut s = self.lock();
        let keep = s.records.split_off(&(upto + 1));
        let gone: usize = s
            .records
            .values()
            .map(|r| r.1.as_ref().map_or(0, |r| r.len()))
            .sum();
        s.bytes -= gone;
        s.records = keep;
    }

    /// A new generation starts from a snapshot holding commit `upto`: the chain is whole again.
    pub fn restart(&self, upto: u64) {
        self.release(upto);
        self.lock().broken = false;
    }

    /// The unbroken run of records after commit `after`, up to about `max_bytes`; they stay
    /// in the feed until released.
    pub fn take(&self, after: u64, max_bytes: usize) -> Batch {
        let s = self.lock();
        if s.broken {
            return Batch::Broken;
        }
        let mut out = Vec::new();
        let mut size = 0usize;
        for (next, (&seq, (_, record))) in (after + 1..).zip(s.records.range(after + 1..)) {
            if seq != next || (size > 0 && size >= max_bytes) {
                break;
            }
            let Some(r) = record else {
                return if out.is_empty() {
                    Batch::Broken
                } else {
                    Batch::Records(out)
                };
            };
            size += r.len();
            out.push((seq, r.clone()));
        }
        Batch::Records(out)
    }

    /// When the oldest commit after `after` that the feed holds was handed over, ns.
    pub fn oldest_after(&self, after: u64) -> Option<i64> {
        self.lock()
            .records
            .range(after + 1..)
            .next()
            .map(|(_, r)| r.0)
    }

    /// Whether the chain is broken (a new generation is due).
    pub fn is_broken(&self) -> bool {
        self.lock().broken
    }
}

impl Store {
    /// Starts `n` feeds, and says where the store is: every commit after `from` is handed to
    /// each. The first call attaches them (best before the session's first commit, so this is
    /// where the store was when it opened); a later one returns the same feeds.
    pub fn attach_feeds(&self, n: usize) -> Result<Attached, StoreError> {
        if self.feeds.get().is_none() {
            // Under the write lock: a commit numbered after `from` begins after the feeds are
            // set.
            let w = self.write()?;
            let time = w.meta_bytes(META_LAST_COMMIT)?;
            let from_time = time
                .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
                .map_or(0, |b| u64::from_le_bytes(b) as i64);
            let _ = self.feeds.set(Attached {
                feeds: (0..n).map(|_| Arc::new(Feed::default())).collect(),
                from: self.commits.load(Ordering::Acquire),
                from_time,
            });
            drop(w);
        }
        Ok(self.feeds.get().cloned().unwrap_or_default())
    }

    /// How large a transaction's record may grow (see `MAX_SHIPPED_RECORD`).
    pub(super) fn record_limit(&self) -> usize {
        if self.feeds.get().is_some_and(|a| !a.feeds.is_empty()) {
            MAX_SHIPPED_RECORD
        } else {
            wal::MAX_RECORD
        }
    }

    /// Hands commit `seq`'s record to every feed (None: the commit has no record).
    pub(super) fn tap(&self, seq: u64, record: Option<Vec<u8>>) {
        if let Some(a) = self.feeds.get() {
            let (record, now) = (record.map(Arc::new), now_ns());
            for f in &a.feeds {
                f.push(seq, record.clone(), now);
            }
        }
    }
}

impl ReadTxn {
    /// The number of the last commit this snapshot holds.
    pub fn commit_number(&self) -> Result<u64, StoreError> {
        Ok(self.meta_u64(META_LOG_SEQ)?.unwrap_or(0))
    }
}

/// A segment: `records` in the log's record layout under log id `id`.
pub fn encode_segment<'a>(
    id: u64,
    records: impl Iterator<Item = (u64, &'a [u8])> + Clone,
) -> Vec<u8> {
    let mut buf = Vec::with_capacity(records.clone().map(|r| r.1.len() + 24).sum());
    for (seq, payload) in records {
        wal::encode(&mut buf, id, seq, payload);
    }
    buf
}

/// The records of a segment written under log id `id`: None unless every byte of it is whole
/// records that verify and follow each other.
pub fn decode_segment(id: u64, bytes: &[u8]) -> Option<Vec<(u64, Vec<u8>)>> {
    let records = wal::parse(bytes, id);
    let used: usize = records.iter().map(|r| r.1.len() + 24).sum();
    (used == bytes.len()).then_some(records)
}

/// When a record's transaction committed (ns since the epoch), if it says.
pub fn record_time(payload: &[u8]) -> Option<i64> {
    commit_time(payload)
}

/// Applies `records` (in order, following the commit the store file at `path` holds) to that
/// file, in one durable transaction; the file then holds the last one's commit number and no
/// log belongs to it. The file must not be open elsewhere.
pub fn apply_records(path: &Path, records: &[(u64, Vec<u8>)]) -> Result<(), StoreError> {
    let db = Database::builder().open(path).map_err(map_err)?;
    let mut tx = db.begin_write().map_err(map_err)?;
    let mut last = None;
    for (seq, payload) in records {
        replay(&tx, payload)?;
        last = Some(*seq);
    }
    {
        let mut meta = tx.open_table(META).map_err(map_err)?;
        if let Some(last) = last {
            meta.insert(META_LOG_SEQ, last.to_le_bytes().as_slice())
                .map_err(map_err)?;
        }
        meta.remove(META_LOG_ID).map_err(map_err)?;
    }
    tx.set_durability(redb::Durability::Immediate)
        .map_err(|e| StoreError::Io(e.to_string()))?;
    tx.commit().map_err(map_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_feed_hands_out_an_unbroken_run_and_keeps_it_until_released() {
        let f = Feed::default();
        let r = |b: &[u8]| Some(Arc::new(b.to_vec()));
        let got = |b: &[u8]| Arc::new(b.to_vec());
        f.push(3, r(b"c"), 0);
        f.push(2, r(b"b"), 0);
        f.push(5, r(b"e"), 0);
        assert_eq!(
            f.take(1, 1 << 20),
            Batch::Records(vec![(2, got(b"b")), (3, got(b"c"))])
        );
        assert_eq!(f.take(1, 1), Batch::Records(vec![(2, got(b"b"))]));
        f.release(3);
        assert_eq!(f.take(3, 1 << 20), Batch::Records(vec![]), "4 is missing");
        f.push(4, None, 0);
        assert_eq!(f.take(3, 1 << 20), Batch::Broken);
        f.restart(4);
        assert_eq!(f.take(4, 1 << 20), Batch::Records(vec![(5, got(b"e"))]));
    }

    /// A transaction over the log's record limit still gives the feeds its record (the log
    /// checkpoints it): one allocation shared by every feed.
    #[test]
    fn a_large_transaction_reaches_every_feed_as_one_shared_record() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
        let Attached { feeds, from, .. } = store.attach_feeds(2).unwrap();
        let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut w = store.write().unwrap();
        let chunk = crate::store::CHUNK_SIZE as usize;
        w.put_chunks(
            7,
            data.chunks(chunk).enumerate().map(|(i, c)| (i as u64, c)),
        )
        .unwrap();
        w.commit(super::super::Sync::Durable).unwrap();
        let take = |f: &Feed| match f.take(from, usize::MAX) {
            Batch::Records(r) => r,
            Batch::Broken => panic!("the chain broke"),
        };
        let (a, b) = (take(&feeds[0]), take(&feeds[1]));
        assert_eq!(a.len(), 1);
        assert!(a[0].1.len() > wal::MAX_RECORD, "{}", a[0].1.len());
        assert!(Arc::ptr_eq(&a[0].1, &b[0].1), "one record for both feeds");
    }

    #[test]
    fn a_segment_decodes_only_whole() {
        let recs = vec![(7, b"seven".to_vec()), (8, vec![1u8; 1000])];
        let seg = encode_segment(42, recs.iter().map(|r| (r.0, r.1.as_slice())));
        assert_eq!(decode_segment(42, &seg), Some(recs));
        assert_eq!(decode_segment(43, &seg), None, "another generation's id");
        assert_eq!(decode_segment(42, &seg[..seg.len() - 1]), None, "torn");
    }
}

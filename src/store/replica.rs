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
    /// The newest commit whose record the feed let go of unshipped (0: none): only a
    /// snapshot holding it makes the chain whole again.
    lost: u64,
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
    ///
    /// Once the feed outgrows `FEED_BYTES` it lets go of everything it holds and of this
    /// record, and is broken; it goes on taking the records after it, so that a snapshot
    /// taken from then on carries on with them (a broken feed that took nothing more would
    /// leave a gap after every snapshot taken while commits go on).
    fn push(&self, seq: u64, record: Option<Record>, now: i64) {
        let mut s = self.lock();
        let len = record.as_ref().map_or(0, |r| r.len());
        if s.bytes + len > FEED_BYTES {
            // The replica has been out of reach for long: a snapshot will carry on from here.
            let lost = s.records.keys().next_back().copied().unwrap_or(0);
            *s = FeedState {
                broken: true,
                lost: s.lost.max(lost).max(seq),
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

    /// A new generation starts from a snapshot holding commit `upto`: the chain is whole again,
    /// unless the feed let go of a later record meanwhile (then it stays broken, and another
    /// snapshot is due). Whether it is whole.
    pub fn restart(&self, upto: u64) -> bool {
        self.release(upto);
        let mut s = self.lock();
        s.broken = s.lost > upto;
        !s.broken
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
            // Headers count too: a segment of `max_bytes` stays within `MAX_SEGMENT_BYTES`.
            size += r.len() + wal::HEADER;
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

/// A shipper puts about this much in one segment: it stops adding records once a segment
/// holds this many bytes (headers included), so one more record may take it past.
pub const SEGMENT_BYTES: usize = 16 * 1024 * 1024;

/// The largest segment a shipper ever writes (`SEGMENT_BYTES` and one record of
/// `MAX_SHIPPED_RECORD`, with room for headers): a replica's listing saying more is refused
/// before anything is read.
pub const MAX_SEGMENT_BYTES: u64 = (SEGMENT_BYTES + MAX_SHIPPED_RECORD + 1024 * 1024) as u64;

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

/// A commit's record as read from a replica, verified: it came from a segment whose every
/// byte is whole records matching their checksums, numbered as the segment's name says, and
/// its entries passed `redo::check` (known tables, keys and values of their types' byte
/// form). Made only by `decode_segment`, so applying one never hands redb bytes it panics on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedRecord {
    seq: u64,
    payload: Vec<u8>,
}

impl VerifiedRecord {
    /// The commit number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// When the commit committed (ns since the epoch), if the record says (a checkpoint's
    /// does not).
    pub fn time(&self) -> Option<i64> {
        commit_time(&self.payload)
    }

    /// The record's changes (see `redo`), checked.
    pub(super) fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The payload's size in bytes.
    pub fn len(&self) -> usize {
        self.payload.len()
    }

    pub fn is_empty(&self) -> bool {
        self.payload.is_empty()
    }
}

/// Why a segment was refused: the byte offset in it where the fault is, and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentFault {
    pub offset: u64,
    pub reason: String,
}

impl std::fmt::Display for SegmentFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at byte {}: {}", self.offset, self.reason)
    }
}

/// Decodes and verifies the segment holding commits `first..=last` written under log id
/// `id`: every byte must be whole records that match their checksums, numbered `first` to
/// `last` without a gap, each of at most `MAX_SHIPPED_RECORD` bytes and passing
/// `redo::check`. The first fault refuses the whole segment.
pub fn decode_segment(
    id: u64,
    bytes: &[u8],
    first: u64,
    last: u64,
) -> Result<Vec<VerifiedRecord>, SegmentFault> {
    let fault = |offset: usize, reason: String| SegmentFault {
        offset: offset as u64,
        reason,
    };
    if (bytes.len() as u64) > MAX_SEGMENT_BYTES {
        return Err(fault(
            0,
            format!(
                "{} bytes, over the limit of {MAX_SEGMENT_BYTES}",
                bytes.len()
            ),
        ));
    }
    let mut out = Vec::new();
    let mut at = 0usize;
    let mut next = first;
    while at < bytes.len() {
        let (seq, payload, used) =
            wal::record_at(&bytes[at..], id, MAX_SHIPPED_RECORD).map_err(|e| fault(at, e))?;
        if seq != next || seq > last {
            return Err(fault(
                at,
                format!("record {seq} where record {next} belongs"),
            ));
        }
        super::redo::check(payload)
            .map_err(|(off, why)| fault(at + wal::HEADER + off, format!("record {seq}: {why}")))?;
        out.push(VerifiedRecord {
            seq,
            payload: payload.to_vec(),
        });
        at += used;
        next = seq.saturating_add(1);
    }
    match out.last() {
        Some(r) if r.seq == last => Ok(out),
        Some(r) => Err(fault(
            at,
            format!("ends at record {} where its name says {last}", r.seq),
        )),
        None => Err(fault(0, "holds no record".into())),
    }
}

/// When a record's transaction committed (ns since the epoch), if it says.
pub fn record_time(payload: &[u8]) -> Option<i64> {
    commit_time(payload)
}

/// Applies verified `records` (in order, following the commit `db` holds) in one write
/// transaction, durable if asked; `db` then holds the last one's commit number and no log
/// belongs to it. With no records the transaction still says so.
pub fn apply_verified(
    db: &Database,
    records: &[VerifiedRecord],
    durable: bool,
) -> Result<(), StoreError> {
    let mut tx = db.begin_write().map_err(map_err)?;
    for r in records {
        replay(&tx, &r.payload)?;
    }
    {
        let mut meta = tx.open_table(META).map_err(map_err)?;
        if let Some(last) = records.last() {
            meta.insert(META_LOG_SEQ, last.seq.to_le_bytes().as_slice())
                .map_err(map_err)?;
        }
        meta.remove(META_LOG_ID).map_err(map_err)?;
    }
    let durability = if durable {
        redb::Durability::Immediate
    } else {
        redb::Durability::None
    };
    tx.set_durability(durability)
        .map_err(|e| StoreError::Io(e.to_string()))?;
    tx.commit().map_err(map_err)?;
    Ok(())
}

/// A store file rebuilt from a replica: its snapshot, opened once, with verified records
/// applied batch after batch (each in a transaction of its own, not yet durable) and made
/// durable by `finish`. The file must not be open elsewhere.
pub struct Rebuild {
    db: Database,
}

impl Rebuild {
    pub fn open(path: &Path) -> Result<Rebuild, StoreError> {
        let mut builder = Database::builder();
        // As a store's own: the hot pages, not the whole file.
        builder.set_cache_size(super::CACHE_BYTES);
        Ok(Rebuild {
            db: builder.open(path).map_err(map_err)?,
        })
    }

    /// Applies the next batch, following the last.
    pub fn apply(&mut self, records: &[VerifiedRecord]) -> Result<(), StoreError> {
        apply_verified(&self.db, records, false)
    }

    /// One durable commit over everything applied; the file is closed.
    pub fn finish(self) -> Result<(), StoreError> {
        apply_verified(&self.db, &[], true)
    }
}

/// Applies verified `records` to the store file at `path` in one durable transaction (see
/// `apply_verified`). The file must not be open elsewhere.
pub fn apply_records(path: &Path, records: &[VerifiedRecord]) -> Result<(), StoreError> {
    let mut r = Rebuild::open(path)?;
    r.apply(records)?;
    r.finish()
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

    /// A feed that outgrew its bound goes on taking the records after the break, so a
    /// snapshot taken after it carries on with the commits made while the snapshot uploaded;
    /// a record let go of after the snapshot's commit keeps the chain broken. (A broken feed
    /// used to drop every record until the snapshot was in place: the commits made while it
    /// uploaded were never shipped, and the shipper said it had caught up.)
    #[test]
    fn a_broken_feed_keeps_the_records_after_the_break_for_the_next_snapshot() {
        let f = Feed::default();
        let big = || Some(Arc::new(vec![7u8; FEED_BYTES / 2 - 1]));
        let small = |b: &[u8]| Some(Arc::new(b.to_vec()));
        f.push(1, big(), 0);
        f.push(2, big(), 0);
        f.push(3, big(), 0); // over the bound: 1 to 3 are let go of
        assert_eq!(f.take(0, 1 << 20), Batch::Broken);
        f.push(4, small(b"d"), 0); // the snapshot is taken at 4
        f.push(5, small(b"e"), 0); // while it uploads
        assert!(f.restart(4), "nothing after 4 was let go of");
        assert_eq!(
            f.take(4, 1 << 20),
            Batch::Records(vec![(5, Arc::new(b"e".to_vec()))])
        );

        let g = Feed::default();
        g.push(1, big(), 0);
        g.push(2, big(), 0);
        g.push(3, big(), 0);
        g.push(4, small(b"d"), 0); // the snapshot is taken at 4, then the feed overflows
        g.push(5, big(), 0);
        g.push(6, big(), 0);
        g.push(7, big(), 0);
        assert!(
            !g.restart(4),
            "5 to 7 were let go of after the snapshot's commit"
        );
        assert_eq!(g.take(4, 1 << 20), Batch::Broken);
        g.push(8, small(b"h"), 0);
        assert!(g.restart(7));
        assert_eq!(
            g.take(7, 1 << 20),
            Batch::Records(vec![(8, Arc::new(b"h".to_vec()))])
        );
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

    /// A redo entry putting `value` under `key` in `table`.
    fn put(table: &str, key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut e = vec![1, table.len() as u8];
        e.extend_from_slice(table.as_bytes());
        e.extend_from_slice(&(key.len() as u32).to_le_bytes());
        e.extend_from_slice(key);
        e.extend_from_slice(&(value.len() as u32).to_le_bytes());
        e.extend_from_slice(value);
        e
    }

    #[test]
    fn a_segment_decodes_only_whole() {
        let recs = vec![
            (7, put("blobs", &7u64.to_le_bytes(), b"seven")),
            (8, put("inodes", &8u64.to_le_bytes(), &[1u8; 1000])),
        ];
        let seg = encode_segment(42, recs.iter().map(|r| (r.0, r.1.as_slice())));
        let got = decode_segment(42, &seg, 7, 8).unwrap();
        assert_eq!(
            got.iter()
                .map(|r| (r.seq, r.payload.clone()))
                .collect::<Vec<_>>(),
            recs
        );
        let fault = decode_segment(43, &seg, 7, 8).unwrap_err();
        assert!(
            fault.reason.contains("checksum"),
            "another generation's id: {fault}"
        );
        let fault = decode_segment(42, &seg[..seg.len() - 1], 7, 8).unwrap_err();
        assert_eq!(
            fault.offset,
            (seg.len() - 1024 - 24) as u64,
            "torn: {fault}"
        );
        assert!(
            decode_segment(42, &seg, 7, 9).is_err(),
            "the name says more"
        );
        assert!(
            decode_segment(42, &seg, 6, 8).is_err(),
            "the name says less"
        );
        assert!(decode_segment(42, &[], 7, 7).is_err(), "empty");
    }

    /// Entries redb would panic on (a key of the wrong width, a name that is not UTF-8, an
    /// unknown table) are refused with where they are.
    #[test]
    fn a_record_redb_cannot_take_is_refused_with_its_offset() {
        let good = put("inodes", &1u64.to_le_bytes(), b"x");
        for (bad, why) in [
            (put("inodes", &[1, 2, 3], b"x"), "does not fit table inodes"),
            (put("meta", &[0xff, 0xfe], b"x"), "does not fit table meta"),
            (
                put("dirents", &[0; 7], &[0; 9]),
                "does not fit table dirents",
            ),
            (
                put("dirents", &[0; 8], &[0; 8]),
                "does not fit table dirents",
            ),
            (put("nope", &[0; 8], b""), "unknown table"),
            (
                put(
                    "meta",
                    b"format",
                    &(u64::from(FORMAT_VERSION) + 1).to_le_bytes(),
                ),
                "its records come from a later release",
            ),
            (vec![9, 0], "unknown operation"),
            (good[..good.len() - 1].to_vec(), "cut short"),
        ] {
            let payload = [good.clone(), bad].concat();
            let seg = encode_segment(5, [(3, payload.as_slice())].into_iter());
            let fault = decode_segment(5, &seg, 3, 3).unwrap_err();
            assert!(fault.reason.contains(why), "{fault}");
            assert_eq!(fault.offset, (24 + good.len()) as u64, "{fault}");
        }
    }

    /// The forms `redo::check` admits are the byte forms of the tables' types in redb.
    #[test]
    fn the_checked_forms_are_redbs_encodings() {
        use redb::{Key, Value};
        type Dirent<'a> = <(u64, &'a str) as Value>::SelfType<'a>;
        let key: Dirent = (7, "name");
        let bytes = <(u64, &str)>::as_bytes(&key);
        assert_eq!(bytes.as_ref(), [&7u64.to_le_bytes()[..], b"name"].concat());
        assert_eq!(<(u64, u8)>::fixed_width(), Some(9));
        assert_eq!(<(u64, u64)>::fixed_width(), Some(16));
        assert_eq!(<()>::fixed_width(), Some(0));
        assert_eq!(<(i64, u64)>::fixed_width(), Some(16));
        // The history indexes' keys: a length-prefixed first element, then the u64; every
        // length of prefix is admitted exactly as redb writes it, and nothing else.
        for n in [0usize, 3, 253, 254, 300, 70_000] {
            let name = "n".repeat(n);
            let k = <(&[u8], u64)>::as_bytes(&(name.as_bytes(), 9));
            assert!(
                super::super::redo::check(&put("history_keys", &k, b"v")).is_ok(),
                "{n}"
            );
            let k = <(&str, u64)>::as_bytes(&(name.as_str(), 9));
            assert!(
                super::super::redo::check(&put("history_paths", &k, b"")).is_ok(),
                "{n}"
            );
            let mut cut = k.clone();
            cut.pop();
            assert!(super::super::redo::check(&put("history_paths", &cut, b"")).is_err());
        }
        let _ = <u64 as Key>::compare;
    }

    /// Records applied to a store file land in one transaction with the last commit number.
    #[test]
    fn verified_records_apply_to_a_store_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        drop(Store::open_or_create(&path, (0, 0)).unwrap());
        // A record of a build that keeps the per-directory counts marks them kept.
        let payload = [
            put("meta", b"note", b"hello"),
            put("meta", b"subtree_seq", &1_000u64.to_le_bytes()),
        ]
        .concat();
        let seg = encode_segment(9, [(1_000, payload.as_slice())].into_iter());
        let recs = decode_segment(9, &seg, 1_000, 1_000).unwrap();
        apply_records(&path, &recs).unwrap();
        let s = Store::open_existing(&path).unwrap();
        let r = s.read().unwrap();
        assert_eq!(
            r.meta_bytes("note").unwrap().as_deref(),
            Some(&b"hello"[..])
        );
        assert_eq!(r.commit_number().unwrap(), 1_000);
    }
}

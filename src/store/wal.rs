//! The store's write-ahead log (`STORE.wal`): what makes a commit durable without redb
//! writing its B-tree pages to disk first.
//!
//! A durable redb commit writes every page it touched (an unlink touches 15, a create's
//! content commit 20 to 28) and then fsyncs; on a disk where an fsync costs 180 µs plus 19 µs
//! per page, the pages cost more than the fsync. So each transaction commits in redb without
//! an fsync (`Durability::None`: visible at once, and redb keeps the file consistent at its
//! last durable commit), and its changes (the key/value pairs it put and the keys it removed)
//! are appended to this log as one record. A durable commit waits for one `fdatasync` of the
//! log: one or two pages, shared by every commit that queued meanwhile (group commit).
//!
//! Group commit: one caller at a time is the leader, which takes every record appended so
//! far, writes and fdatasyncs them holding no lock, then wakes every waiter; a waiter whose
//! record that sync covered returns, and one of the others leads the next sync for all of
//! them. A caller whose record is already durable returns at once, without waiting for a sync
//! in flight (a close after an fsync, which has nothing left to sync, never waits behind
//! another process's fsync).
//!
//! A checkpoint is a durable redb commit; it covers every record before it, and the log then
//! starts again at offset 0. A record too large for the log (a big file's content) is
//! committed as a checkpoint itself, so its bytes are written once.
//!
//! Recovery, when the store opens: redb rolls back to its last durable commit, whose `meta`
//! holds the sequence number of the last record it covers and the log's id. The records after
//! it are applied, in order, in one transaction, made durable, and the log starts afresh
//! under a new id.
//!
//! Record: magic `RWAL` (4 bytes), payload length (u32), sequence number (u64), FNV-1a hash
//! of the log id, sequence number, length and payload (u64), payload. Little endian. The file
//! is preallocated with zeros, so an fdatasync never has to write a new file size (on a
//! journaled filesystem that would be a journal commit). A scan stops at the first record
//! whose magic or hash does not match or whose number does not follow its predecessor:
//! a torn tail, stale bytes of an earlier pass, or a log left by another session of the store
//! (another id) all end the log there.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::StoreError;
use super::disk::{Disk, LogFile};
use super::fault::{FaultOn, FaultPlan};

/// Size of the preallocated log file.
pub(super) const LOG_BYTES: u64 = 4 * 1024 * 1024;
/// A transaction whose record would be larger commits as a checkpoint instead.
pub(super) const MAX_RECORD: usize = 512 * 1024;
const MAGIC: &[u8; 4] = b"RWAL";
pub(super) const HEADER: usize = 24;

/// The log file next to the store file `store`.
pub fn path_of(store: &Path) -> PathBuf {
    let mut p = store.as_os_str().to_owned();
    p.push(".wal");
    PathBuf::from(p)
}

fn hash(id: u64, seq: u64, payload: &[u8]) -> u64 {
    let h = fnv1a(0xcbf2_9ce4_8422_2325, &id.to_le_bytes());
    let h = fnv1a(h, &seq.to_le_bytes());
    let h = fnv1a(h, &(payload.len() as u32).to_le_bytes());
    fnv1a(h, payload)
}

/// FNV-1a over `bytes`, continuing from `h`: a byte at a time, as FNV-1a is, but over a plain
/// slice, eight bytes to each load, rather than through a chain of iterators.
fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let mut w = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        for _ in 0..8 {
            h = (h ^ (w & 0xff)).wrapping_mul(PRIME);
            w >>= 8;
        }
    }
    for &b in words.remainder() {
        h = (h ^ b as u64).wrapping_mul(PRIME);
    }
    h
}

fn io(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) {
        return StoreError::Full;
    }
    if e.raw_os_error() == Some(libc::ELOOP) {
        return StoreError::Refused(crate::private::describe(path, e));
    }
    StoreError::Io(format!("{what} {}: {e}", path.display()))
}

/// The records of log `id` in the file at `path`, in order: (sequence number, payload).
/// A missing file is an empty log.
pub(super) fn read(disk: &Disk, path: &Path, id: u64) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
    let bytes = match disk.read_all(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("reading", path, e)),
    };
    Ok(parse(&bytes, id))
}

/// The records of log `id` that `bytes` holds from its start, in order, up to the first that
/// does not verify or does not follow its predecessor (see the module comment).
pub(super) fn parse(bytes: &[u8], id: u64) -> Vec<(u64, Vec<u8>)> {
    let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut at = 0usize;
    while at + HEADER <= bytes.len() {
        let h = &bytes[at..at + HEADER];
        if &h[0..4] != MAGIC {
            break;
        }
        let len = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
        let seq = u64::from_le_bytes(h[8..16].try_into().unwrap());
        let sum = u64::from_le_bytes(h[16..24].try_into().unwrap());
        let Some(payload) = bytes.get(at + HEADER..at + HEADER + len) else {
            break;
        };
        if hash(id, seq, payload) != sum {
            break;
        }
        if let Some((prev, _)) = out.last()
            && seq != prev + 1
        {
            break;
        }
        out.push((seq, payload.to_vec()));
        at += HEADER + len;
    }
    out
}

/// The record at the start of `bytes`, written under log `id` with a payload of at most
/// `max_len` bytes: its number, its payload and the bytes it takes; why not otherwise. The
/// length is checked against `max_len` before it is used.
pub(super) fn record_at(
    bytes: &[u8],
    id: u64,
    max_len: usize,
) -> Result<(u64, &[u8], usize), String> {
    let Some(h) = bytes.get(..HEADER) else {
        return Err(format!(
            "a record header is cut short ({} bytes)",
            bytes.len()
        ));
    };
    if &h[0..4] != MAGIC {
        return Err("not a record header".into());
    }
    let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
    let seq = u64::from_le_bytes(h[8..16].try_into().unwrap_or_default());
    let sum = u64::from_le_bytes(h[16..24].try_into().unwrap_or_default());
    if len > max_len {
        return Err(format!(
            "a record of {len} bytes, over the limit of {max_len}"
        ));
    }
    let Some(payload) = bytes.get(HEADER..HEADER + len) else {
        return Err(format!("record {seq} is cut short"));
    };
    if hash(id, seq, payload) != sum {
        return Err(format!("record {seq} does not match its checksum"));
    }
    Ok((seq, payload, HEADER + len))
}

/// Appends one record to `buf`.
pub(super) fn encode(buf: &mut Vec<u8>, id: u64, seq: u64, payload: &[u8]) {
    buf.extend_from_slice(MAGIC);
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(&hash(id, seq, payload).to_le_bytes());
    buf.extend_from_slice(payload);
}

/// Records appended but not yet written, and where they go.
pub(super) struct Pending {
    id: u64,
    /// Encoded records not yet written to the file.
    buf: Vec<u8>,
    /// File offset where `buf` goes.
    offset: u64,
    /// Sequence number of the last record appended.
    last: u64,
    /// Sequence number of the last checkpoint: everything up to it is durable in redb.
    checkpointed: u64,
}

impl Pending {
    /// Whether a record with a payload of `len` bytes fits in the log.
    pub(super) fn fits(&self, len: usize) -> bool {
        len <= MAX_RECORD && self.offset + (self.buf.len() + HEADER + len) as u64 <= LOG_BYTES
    }

    /// Appends record `seq`; returns a mark that `unpush` takes back to.
    pub(super) fn push(&mut self, seq: u64, payload: &[u8]) -> (usize, u64) {
        let mark = (self.buf.len(), self.last);
        encode(&mut self.buf, self.id, seq, payload);
        self.last = seq;
        mark
    }

    /// Takes back a record whose redb commit failed.
    pub(super) fn unpush(&mut self, (len, last): (usize, u64)) {
        self.buf.truncate(len);
        self.last = last;
    }

    /// Bytes of records since the last checkpoint, written or waiting to be.
    pub(super) fn used(&self) -> u64 {
        self.offset + self.buf.len() as u64
    }

    /// Commit `seq` was a checkpoint: the log starts again at offset 0.
    pub(super) fn checkpointed(&mut self, seq: u64) {
        self.buf.clear();
        self.offset = 0;
        self.last = seq;
        self.checkpointed = seq;
    }
}

/// The open log of a store.
pub(super) struct Wal {
    file: LogFile,
    path: PathBuf,
    faults: Option<Arc<FaultPlan>>,
    pending: Mutex<Pending>,
    /// Whether a leader is writing and syncing now; never held across the sync itself.
    syncing: Mutex<bool>,
    /// Signalled when a sync ends (or fails), for the callers waiting on `syncing`.
    synced_cv: Condvar,
    /// The last sequence number written and fdatasynced (or covered by a checkpoint): read
    /// without a lock, raised only once the sync that covers it has returned.
    synced: AtomicU64,
    /// A write or fdatasync of the log failed: what the page cache holds is unknown, so every
    /// later commit is refused until the store is opened again.
    failed: AtomicBool,
    /// fdatasyncs of the log since it started (see `Store::commit_stats`).
    syncs: AtomicU64,
}

/// The leader of a sync: gives the lead back and wakes every waiter when dropped.
struct Leading<'a>(&'a Wal);

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        *lock(&self.0.syncing) = false;
        self.0.synced_cv.notify_all();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Wal {
    /// Creates (or reuses) the log file for a fresh log with id `id`, whose first record will
    /// follow `last`. Records of earlier ids in the file no longer verify.
    pub(super) fn start(
        disk: &Disk,
        store: &Path,
        id: u64,
        last: u64,
        faults: Option<Arc<FaultPlan>>,
    ) -> Result<Wal, StoreError> {
        let path = path_of(store);
        let existed = disk.exists(&path);
        // Private from the first byte, and never a symlink planted beside the store.
        let file = disk.open_log(&path).map_err(|e| io("creating", &path, e))?;
        let len = file.len().map_err(|e| io("reading", &path, e))?;
        if len < LOG_BYTES {
            // Real zeros, not a sparse or fallocated range: writing into either later makes
            // the filesystem record new blocks, and every fdatasync would wait for that.
            let zeros = vec![0u8; (LOG_BYTES - len) as usize];
            file.write_all_at(&zeros, len)
                .map_err(|e| io("preallocating", &path, e))?;
        }
        file.sync_all().map_err(|e| io("syncing", &path, e))?;
        if !existed && let Some(dir) = path.parent() {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            disk.sync_dir(dir)
                .map_err(|e| io("syncing the directory of", &path, e))?;
        }
        Ok(Wal {
            file,
            path,
            faults,
            pending: Mutex::new(Pending {
                id,
                buf: Vec::new(),
                offset: 0,
                last,
                checkpointed: last,
            }),
            syncing: Mutex::new(false),
            synced_cv: Condvar::new(),
            synced: AtomicU64::new(last),
            failed: AtomicBool::new(false),
            syncs: AtomicU64::new(0),
        })
    }

    /// Refuses work once a write or sync of the log has failed.
    pub(super) fn check(&self) -> Result<(), StoreError> {
        if self.failed.load(Ordering::Acquire) {
            return Err(StoreError::Io(format!(
                "an earlier write to {} failed; restart the daemon",
                self.path.display()
            )));
        }
        Ok(())
    }

    /// The records waiting to be written, for a commit that appends one. Checked after the
    /// lock is taken: a commit that failed while holding it failed the log before letting
    /// go, so no record can follow its spent number. A lock poisoned by a panic in a commit
    /// counts as failed.
    pub(super) fn pending(&self) -> Result<MutexGuard<'_, Pending>, StoreError> {
        let guard = self.pending.lock().map_err(|_| {
            self.fail();
            StoreError::Io(format!(
                "a commit panicked while appending to {}; restart the daemon",
                self.path.display()
            ))
        })?;
        self.check()?;
        Ok(guard)
    }

    /// Makes record `seq` and every record before it durable. A caller that arrives while a
    /// sync runs waits for it; if that sync did not cover its record, the next one, which one
    /// of the waiters leads for all of them, does: one fdatasync for many commits. A record
    /// already durable returns at once.
    pub(super) fn sync_to(&self, seq: u64) -> Result<(), StoreError> {
        if self.synced.load(Ordering::Acquire) >= seq {
            return Ok(());
        }
        let mut syncing = lock(&self.syncing);
        loop {
            // The log's state is read again after every wait: the sync may have failed.
            self.check()?;
            if self.synced.load(Ordering::Acquire) >= seq {
                return Ok(());
            }
            if !*syncing {
                break;
            }
            syncing = self
                .synced_cv
                .wait(syncing)
                .unwrap_or_else(|p| p.into_inner());
        }
        // The leader: every record appended so far goes in this one sync. The guard hands
        // the lead back and wakes the waiters however `lead` ends.
        *syncing = true;
        drop(syncing);
        let _handback = Leading(self);
        self.lead(seq)
    }

    /// Writes every record appended so far and fdatasyncs them, as the one leader; raises
    /// `synced` once they are on disk.
    fn lead(&self, seq: u64) -> Result<(), StoreError> {
        let (buf, offset, upto) = {
            let mut p = self.pending()?;
            if p.checkpointed >= seq {
                // A checkpoint (a durable redb commit) covered it.
                return Ok(());
            }
            let buf = std::mem::take(&mut p.buf);
            let offset = p.offset;
            p.offset += buf.len() as u64;
            (buf, offset, p.last)
        };
        let result = self.write_at(&buf, offset).and_then(|()| self.sync_data());
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = result {
            self.fail();
            return Err(io("writing the log", &self.path, e));
        }
        self.synced.fetch_max(upto, Ordering::AcqRel);
        Ok(())
    }

    /// Whether record `seq` is durable already.
    pub(super) fn is_synced(&self, seq: u64) -> bool {
        self.synced.load(Ordering::Acquire) >= seq
    }

    /// fdatasyncs of the log since it started.
    pub(super) fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Commit `seq` was a checkpoint, durable in the store file: it and every record before
    /// it need no sync of the log. Called under the pending lock, after `Pending::checkpointed`.
    pub(super) fn covered(&self, seq: u64) {
        self.synced.fetch_max(seq, Ordering::AcqRel);
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if let Some(plan) = &self.faults
            && plan.hit(FaultOn::Write)
        {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        self.file.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> std::io::Result<()> {
        if let Some(plan) = &self.faults
            && plan.hit(FaultOn::Sync)
        {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        self.file.sync_data()
    }

    /// A commit failed after taking its number: the log must take no record after the gap.
    pub(super) fn fail(&self) {
        self.failed.store(true, Ordering::Release);
    }

    /// Bytes of records since the last checkpoint, written or waiting to be.
    pub(super) fn used(&self) -> u64 {
        lock(&self.pending).used()
    }

    /// The number of the last checkpoint: every commit up to it is durable in the store file.
    pub(super) fn checkpointed(&self) -> u64 {
        lock(&self.pending).checkpointed
    }

    /// Whether the log can be removed at close: nothing failed, so a final checkpoint covers
    /// every record.
    pub(super) fn healthy(&self) -> bool {
        !self.failed.load(Ordering::Acquire)
    }

    /// Removes the log file, only if the file at its path is still the one this session
    /// opened: one moved there since (a restore setting the store aside, a planted file) is
    /// left alone.
    pub(super) fn remove(&self, disk: &Disk) -> Result<(), StoreError> {
        match self.file.is_at(&self.path) {
            Ok(true) => disk
                .remove(&self.path)
                .map_err(|e| io("removing", &self.path, e)),
            Ok(false) => {
                tracing::warn!(path = %self.path.display(), "the write-ahead log was replaced by another file; leaving that file alone");
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("checking", &self.path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_in(dir: &tempfile::TempDir, id: u64, last: u64) -> Wal {
        Wal::start(&Disk::Host, &dir.path().join("s.redb"), id, last, None).unwrap()
    }

    fn append(wal: &Wal, seq: u64, payload: &[u8]) {
        wal.pending().unwrap().push(seq, payload);
        wal.sync_to(seq).unwrap();
    }

    /// The checksum is FNV-1a over the log id, the number, the length and the payload, as
    /// every log written so far has it.
    #[test]
    fn checksum_is_fnv1a_of_id_number_length_and_payload() {
        let payload: Vec<u8> = (0..1000u32).map(|i| ((i * 7 + 3) % 256) as u8).collect();
        assert_eq!(
            hash(0x1234_5678_9abc_def0, 42, &payload),
            0xb4d1_d0c0_ce4a_428a
        );
        assert_eq!(hash(1, 1, &[]), 0x019c_c2bb_67e1_c915);
        for len in 0..20 {
            let p = &payload[..len];
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            let mut bytes = Vec::new();
            bytes.extend_from_slice(&9u64.to_le_bytes());
            bytes.extend_from_slice(&3u64.to_le_bytes());
            bytes.extend_from_slice(&(len as u32).to_le_bytes());
            bytes.extend_from_slice(p);
            for b in bytes {
                h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
            }
            assert_eq!(hash(9, 3, p), h, "payload of {len} bytes");
        }
    }

    #[test]
    fn records_read_back_in_order_and_only_under_their_id() {
        let dir = tempfile::tempdir().unwrap();
        let wal = log_in(&dir, 7, 10);
        for seq in 11..=20 {
            append(&wal, seq, &vec![seq as u8; seq as usize * 100]);
        }
        let got = read(&Disk::Host, &wal.path, 7).unwrap();
        assert_eq!(got.len(), 10);
        for (i, (seq, payload)) in got.iter().enumerate() {
            assert_eq!(*seq, 11 + i as u64);
            assert_eq!(payload, &vec![*seq as u8; *seq as usize * 100]);
        }
        assert!(
            read(&Disk::Host, &wal.path, 8).unwrap().is_empty(),
            "another log's id"
        );
        assert_eq!(std::fs::metadata(&wal.path).unwrap().len(), LOG_BYTES);
    }

    #[test]
    fn after_a_checkpoint_the_older_pass_is_not_read_on() {
        let dir = tempfile::tempdir().unwrap();
        let wal = log_in(&dir, 7, 0);
        for seq in 1..=5 {
            append(&wal, seq, &[1u8; 300]);
        }
        wal.pending().unwrap().checkpointed(6);
        // Shorter records over the start of the old pass: the scan meets old bytes mid-record.
        append(&wal, 7, &[2u8; 10]);
        let got = read(&Disk::Host, &wal.path, 7).unwrap();
        assert_eq!(got, vec![(7, vec![2u8; 10])]);
        // Ending where an old record begins (34 + 24 + 590 = 2 * 324): the scan meets a
        // record of the same log whose number does not follow.
        append(&wal, 8, &[3u8; 590]);
        let got = read(&Disk::Host, &wal.path, 7).unwrap();
        assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), vec![7, 8]);
    }

    #[test]
    fn a_record_that_does_not_fit_is_refused_and_a_failed_sync_poisons() {
        let dir = tempfile::tempdir().unwrap();
        let plan = Arc::new(FaultPlan::default());
        let wal = Wal::start(
            &Disk::Host,
            &dir.path().join("s.redb"),
            1,
            0,
            Some(plan.clone()),
        )
        .unwrap();
        assert!(!wal.pending().unwrap().fits(MAX_RECORD + 1));
        assert!(wal.pending().unwrap().fits(MAX_RECORD));
        wal.pending().unwrap().push(1, b"one");
        plan.arm(FaultOn::Sync, 1);
        assert!(wal.sync_to(1).is_err());
        assert!(
            wal.check().is_err(),
            "refuses everything after a failed sync"
        );
        assert!(wal.sync_to(1).is_err());
    }
}

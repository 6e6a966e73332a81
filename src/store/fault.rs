//! Fault injection for the I/O-error tests: a `StorageBackend` over redb's `FileBackend` that
//! fails the N-th write or sync once with EIO, armed through the daemon's control socket. Only
//! used when the daemon runs with `REDBFS_FAULT_INJECTION=1`; never in normal operation.

use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{BackendError, StorageBackend, backends::FileBackend};

/// Which backend call an armed fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOn {
    Write,
    Sync,
}

/// Points of a commit where an armed panic fires (the tests of the log's gap guard).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PanicAt {
    /// The commit has its number; nothing is appended yet.
    Numbered = 1,
    /// Its record is appended to the log's buffer; redb has not committed.
    Appended = 2,
    /// redb has committed; the log is not synced.
    Committed = 3,
    /// A durable redb commit (a checkpoint) is about to run.
    Checkpoint = 4,
}

/// Countdowns to the next failing write and sync (0 = disarmed), and the armed panic point.
#[derive(Debug, Default)]
pub struct FaultPlan {
    write_in: AtomicU64,
    sync_in: AtomicU64,
    panic_at: AtomicU64,
}

impl FaultPlan {
    /// Makes the `nth` next call (1 = the very next) of that kind fail once.
    pub fn arm(&self, on: FaultOn, nth: u64) {
        let counter = match on {
            FaultOn::Write => &self.write_in,
            FaultOn::Sync => &self.sync_in,
        };
        counter.store(nth.max(1), Ordering::SeqCst);
    }

    /// Makes the next commit that reaches `at` panic there, once.
    pub fn arm_panic(&self, at: PanicAt) {
        self.panic_at.store(at as u64, Ordering::SeqCst);
    }

    /// True, once, when a panic is armed at `at`.
    pub(super) fn take_panic(&self, at: PanicAt) -> bool {
        self.panic_at
            .compare_exchange(at as u64, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Counts one call of kind `on` (the store's log counts with redb's file); true when
    /// this one must fail.
    pub(super) fn hit(&self, on: FaultOn) -> bool {
        FaultPlan::hit_counter(match on {
            FaultOn::Write => &self.write_in,
            FaultOn::Sync => &self.sync_in,
        })
    }

    /// Counts one call; true when this one must fail.
    fn hit_counter(counter: &AtomicU64) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n > 0).then(|| n - 1)
            })
            .is_ok_and(|before| before == 1)
    }
}

#[derive(Debug)]
pub(super) struct FaultyBackend {
    pub(super) inner: FileBackend,
    pub(super) plan: Arc<FaultPlan>,
}

fn injected() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::EIO)
}

impl StorageBackend for FaultyBackend {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        if self.plan.hit(FaultOn::Sync) {
            return Err(injected());
        }
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        if self.plan.hit(FaultOn::Write) {
            return Err(injected());
        }
        self.inner.write(offset, data)
    }

    fn close(&self) -> Result<(), std::io::Error> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

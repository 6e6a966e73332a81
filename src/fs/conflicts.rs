//! Lost updates between processes. The memory tools edit a file by reading it, writing a
//! temporary file and renaming it over the original; two agents doing that at once silently
//! drop one edit. The daemon sees every open and every replace with the caller's thread id,
//! so it remembers, per process and name, the content version that process last read or
//! wrote, and calls a replace a conflict when the name's current content was made by another
//! process after that.
//!
//! A process is its pid and its start time (`crate::process::ProcessId`), and so is a thread:
//! a pid or tid handed to a new process names a process that has read nothing, never the
//! old one. The thread-to-process cache is checked against the thread's start time at every
//! use, and a sweep drops what processes that are gone (by pid and start time) saw.
//!
//! Versions are daemon-local (a counter from mount), kept per inode for the process that made
//! its content last; what a process saw is kept per (process, parent directory, name), since
//! a replace puts a new inode under the same name. Both tables are bounded: entries of exited
//! processes go at each sweep, and past `CAP` the least recently used half goes. Forgetting
//! only ever hides a conflict, it never invents one: an unknown version is never newer, and a
//! process with no record for a name is not checked.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::lock;
use crate::process::{self, ProcessId};

/// What a replace that would lose another process's edit does (`--lost-updates`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LostUpdates {
    /// Goes through as on a local disk; logged, counted and recorded in the history.
    #[default]
    Record,
    /// Fails with EAGAIN; nothing changes; logged, counted and recorded.
    Refuse,
    /// Not tracked.
    Off,
}

/// A replace that would overwrite a version the replacing process never saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The replacing process.
    pub replacer: ProcessId,
    /// The process that made the current content; `None` when it could not be told (it had
    /// exited, or /proc hides it).
    pub maker: Option<ProcessId>,
}

impl Conflict {
    /// One line for the log and the history record.
    pub fn describe(&self) -> String {
        let maker = match self.maker {
            Some(m) => format!("pid {}", m.pid),
            None => "a process that could not be identified".into(),
        };
        let me = self.replacer.pid;
        format!("pid {me} replaced what {maker} wrote after pid {me} last read the file")
    }

    /// The maker's pid for the error message (0 when unknown).
    pub fn maker_pid(&self) -> u32 {
        self.maker.map_or(0, |m| m.pid)
    }
}

/// Entries per table before a sweep drops the least recently used half.
const CAP: usize = 16_384;
/// Inserts between sweeps of exited processes.
const SWEEP_EVERY: u32 = 4_096;

#[derive(Clone, Copy, Debug)]
struct Made {
    version: u64,
    by: Option<ProcessId>,
    used: u64,
}

#[derive(Clone, Copy, Debug)]
struct Seen {
    version: u64,
    used: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Version counter and LRU clock.
    clock: u64,
    made: HashMap<u64, Made>,
    seen: HashMap<(ProcessId, u64, String), Seen>,
    /// Thread id -> (the thread's start time, its process); FUSE reports the calling thread.
    /// An entry counts only while the tid is held by a thread of that start time, which every
    /// use checks, so a stale one is harmless; past `CAP` entries the cache starts over.
    threads: HashMap<u32, (u64, ProcessId)>,
    inserts: u32,
}

/// Per-process record of what each process saw; see the module comment.
#[derive(Debug)]
pub struct Tracker {
    mode: LostUpdates,
    state: Mutex<State>,
    conflicts: AtomicU64,
}

impl State {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Drops what exited processes saw, then, past the cap, the least recently used half.
    fn sweep(&mut self) {
        self.inserts = 0;
        let mut live: HashMap<ProcessId, bool> = HashMap::new();
        self.seen
            .retain(|(p, _, _), _| *live.entry(*p).or_insert_with(|| p.alive()));
        if self.seen.len() > CAP {
            let mut used: Vec<u64> = self.seen.values().map(|s| s.used).collect();
            let (_, median, _) = used.select_nth_unstable(CAP / 2);
            let cut = *median;
            self.seen.retain(|_, s| s.used > cut);
        }
        if self.made.len() > CAP {
            let mut used: Vec<u64> = self.made.values().map(|m| m.used).collect();
            let (_, median, _) = used.select_nth_unstable(CAP / 2);
            let cut = *median;
            self.made.retain(|_, m| m.used > cut);
        }
    }

    fn inserted(&mut self) {
        self.inserts += 1;
        if self.inserts >= SWEEP_EVERY || self.seen.len() > CAP || self.made.len() > CAP {
            self.sweep();
        }
    }

    fn set_seen(&mut self, p: ProcessId, parent: u64, name: &str, version: u64) {
        let used = self.tick();
        let fresh = self
            .seen
            .insert((p, parent, name.to_string()), Seen { version, used })
            .is_none();
        if fresh {
            self.inserted();
        }
    }
}

impl Tracker {
    pub fn new(mode: LostUpdates) -> Tracker {
        Tracker {
            mode,
            state: Mutex::new(State::default()),
            conflicts: AtomicU64::new(0),
        }
    }

    pub fn mode(&self) -> LostUpdates {
        self.mode
    }

    /// The process of the calling thread `tid`, or `None` when nothing is tracked, for the
    /// kernel's own requests (tid 0), or when /proc no longer (or never) shows the thread.
    /// One read of `/proc/TID/stat` tells whether the cached thread is still the one holding
    /// the tid; a new thread is looked up outside the lock.
    pub fn identify(&self, tid: u32) -> Option<ProcessId> {
        if self.mode == LostUpdates::Off || tid == 0 {
            return None;
        }
        // The start time alone: the name would be copied for nothing.
        self.identify_started(tid, process::start(tid)?)
    }

    /// `identify`, with the thread's name (`comm`) from the same read of /proc.
    pub fn identify_named(&self, tid: u32) -> Option<(ProcessId, String)> {
        if self.mode == LostUpdates::Off || tid == 0 {
            return None;
        }
        let stat = process::stat(tid)?;
        Some((self.identify_started(tid, stat.start)?, stat.name))
    }

    /// The process of thread `tid`, which /proc says started at `now`.
    fn identify_started(&self, tid: u32, now: u64) -> Option<ProcessId> {
        if let Some((start, p)) = lock(&self.state).threads.get(&tid)
            && *start == now
        {
            return Some(*p);
        }
        let p = process::of_thread(tid, now)?;
        let mut s = lock(&self.state);
        if s.threads.len() >= CAP {
            s.threads.clear();
        }
        s.threads.insert(tid, (now, p));
        Some(p)
    }

    /// Thread `tid` opened inode `ino`, named `name` in `parent`, for reading.
    pub fn read(&self, tid: u32, ino: u64, parent: u64, name: &str) {
        if let Some(p) = self.identify(tid) {
            self.read_by(p, ino, parent, name);
        }
    }

    fn read_by(&self, p: ProcessId, ino: u64, parent: u64, name: &str) {
        let mut s = lock(&self.state);
        let version = match s.made.get(&ino) {
            Some(m) => m.version,
            None => 0,
        };
        s.set_seen(p, parent, name, version);
    }

    /// Process `by` (as `identify` told it when it wrote; `None` for one it could not tell)
    /// committed new content to `ino`, named `name` in `parent`.
    pub fn wrote(&self, by: Option<ProcessId>, ino: u64, parent: u64, name: &str) {
        if self.mode == LostUpdates::Off {
            return;
        }
        let mut s = lock(&self.state);
        let version = s.tick();
        let fresh = s
            .made
            .insert(
                ino,
                Made {
                    version,
                    by,
                    used: version,
                },
            )
            .is_none();
        if fresh {
            s.inserted();
        }
        if let Some(p) = by {
            s.set_seen(p, parent, name, version);
        }
    }

    /// Whether thread `tid` replacing `current` (named `name` in `parent`) would lose an edit:
    /// its content was made by another process after this one last read or wrote the name.
    pub fn check(&self, tid: u32, current: u64, parent: u64, name: &str) -> Option<Conflict> {
        self.check_by(self.identify(tid)?, current, parent, name)
    }

    fn check_by(&self, p: ProcessId, current: u64, parent: u64, name: &str) -> Option<Conflict> {
        let mut s = lock(&self.state);
        let now = s.tick();
        let made = s.made.get_mut(&current)?;
        made.used = now;
        let made = *made;
        let seen = s.seen.get(&(p, parent, name.to_string()))?;
        (made.by != Some(p) && made.version > seen.version).then_some(Conflict {
            replacer: p,
            maker: made.by,
        })
    }

    /// Counts a conflict (recorded or refused).
    pub fn counted(&self) {
        self.conflicts.fetch_add(1, Ordering::Relaxed);
    }

    /// Conflicts since mount.
    pub fn conflicts(&self) -> u64 {
        self.conflicts.load(Ordering::Relaxed)
    }

    /// Thread `tid` renamed `ino` to `name` in `parent`: it now knows that name's content.
    pub fn renamed(&self, tid: u32, ino: u64, parent: u64, name: &str) {
        if let Some(p) = self.identify(tid) {
            self.renamed_by(p, ino, parent, name);
        }
    }

    fn renamed_by(&self, p: ProcessId, ino: u64, parent: u64, name: &str) {
        let mut s = lock(&self.state);
        let version = s.made.get(&ino).map_or(0, |m| m.version);
        s.set_seen(p, parent, name, version);
    }

    /// `ino` is gone for good.
    pub fn deleted(&self, ino: u64) {
        if self.mode != LostUpdates::Off {
            lock(&self.state).made.remove(&ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Processes by pid and start time: `A2` was handed `A`'s pid after `A` exited.
    const A: ProcessId = ProcessId { pid: 100, start: 7 };
    const A2: ProcessId = ProcessId { pid: 100, start: 9 };
    const B: ProcessId = ProcessId { pid: 200, start: 8 };

    #[test]
    fn a_replace_of_content_made_after_my_read_is_a_conflict() {
        let t = Tracker::new(LostUpdates::Record);
        t.read_by(A, 10, 1, "t.md");
        t.read_by(B, 10, 1, "t.md");
        // B replaces t.md with inode 11 it wrote.
        t.wrote(Some(B), 11, 1, ".tmp-b");
        assert_eq!(t.check_by(B, 10, 1, "t.md"), None);
        t.renamed_by(B, 11, 1, "t.md");
        // Now A replaces it without having read inode 11's content.
        t.wrote(Some(A), 12, 1, ".tmp-a");
        let c = t.check_by(A, 11, 1, "t.md").expect("a conflict");
        assert_eq!((c.replacer, c.maker), (A, Some(B)));
        assert_eq!(
            c.describe(),
            "pid 100 replaced what pid 200 wrote after pid 100 last read the file"
        );
        // After reading the current version, the same replace is fine.
        t.read_by(A, 11, 1, "t.md");
        assert_eq!(t.check_by(A, 11, 1, "t.md"), None);
    }

    #[test]
    fn a_new_process_with_an_old_pid_has_read_nothing() {
        let t = Tracker::new(LostUpdates::Refuse);
        t.read_by(A, 10, 1, "t.md");
        t.wrote(Some(B), 11, 1, "t.md");
        // A itself would lose B's edit; the process later given A's pid never read the file.
        assert!(t.check_by(A, 11, 1, "t.md").is_some());
        assert_eq!(t.check_by(A2, 11, 1, "t.md"), None);
        // Nor is A2 the maker of what A wrote.
        t.read_by(A2, 11, 1, "t.md");
        t.wrote(Some(A), 12, 1, "t.md");
        let c = t
            .check_by(A2, 12, 1, "t.md")
            .expect("A's edit is another process's");
        assert_eq!(c.maker, Some(A));
    }

    #[test]
    fn content_of_an_unknown_maker_is_newer_than_what_i_read() {
        let t = Tracker::new(LostUpdates::Record);
        t.read_by(A, 10, 1, "t.md");
        t.wrote(None, 10, 1, "t.md");
        let c = t.check_by(A, 10, 1, "t.md").expect("a conflict");
        assert_eq!(c.maker, None);
        assert!(
            c.describe()
                .contains("a process that could not be identified")
        );
    }

    #[test]
    fn a_lone_process_and_a_process_that_never_read_are_never_refused() {
        let t = Tracker::new(LostUpdates::Refuse);
        for i in 0..5 {
            t.read_by(A, 100 + i, 1, "t.md");
            t.wrote(Some(A), 200 + i, 1, ".tmp");
            assert_eq!(t.check_by(A, 100 + i, 1, "t.md"), None);
            t.renamed_by(A, 200 + i, 1, "t.md");
        }
        t.wrote(Some(A), 300, 1, "other.md");
        assert_eq!(t.check_by(B, 300, 1, "other.md"), None);
    }

    #[test]
    fn this_thread_is_told_as_this_process() {
        let t = Tracker::new(LostUpdates::Record);
        let me = std::process::id();
        let start = process::stat(me).unwrap().start;
        let tid = nix::unistd::gettid().as_raw() as u32;
        let p = ProcessId { pid: me, start };
        assert_eq!(t.identify(tid), Some(p));
        // From the cache, checked against the thread's start time.
        assert_eq!(t.identify(tid), Some(p));
        assert_eq!(t.identify(0), None);
        assert_eq!(Tracker::new(LostUpdates::Off).identify(tid), None);
    }

    #[test]
    fn off_tracks_nothing() {
        let t = Tracker::new(LostUpdates::Off);
        t.read(std::process::id(), 10, 1, "t.md");
        t.wrote(Some(B), 10, 1, "t.md");
        assert_eq!(t.check(std::process::id(), 10, 1, "t.md"), None);
        assert!(lock(&t.state).made.is_empty());
    }

    #[test]
    fn the_tables_stay_bounded() {
        let t = Tracker::new(LostUpdates::Record);
        for i in 0..(3 * CAP as u64) {
            t.wrote(Some(A), i, 1, &format!("f{i}"));
        }
        let s = lock(&t.state);
        assert!(s.made.len() <= CAP + 1 && s.seen.len() <= CAP + 1);
    }
}

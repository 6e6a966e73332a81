//! Lost updates between processes. The memory tools edit a file by reading it, writing a
//! temporary file and renaming it over the original; two agents doing that at once silently
//! drop one edit. The daemon sees every open and every replace with the caller's pid, so it
//! remembers, per process (thread group) and name, the content version that process last
//! read or wrote, and calls a replace a conflict when the name's current content was made by
//! another process after that.
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
    /// The replacing process (thread group id).
    pub replacer: u32,
    /// The process that made the current content.
    pub maker: u32,
}

impl Conflict {
    /// One line for the log and the history record.
    pub fn describe(&self) -> String {
        format!(
            "pid {} replaced what pid {} wrote after pid {} last read the file",
            self.replacer, self.maker, self.replacer
        )
    }
}

/// Entries per table before a sweep drops the least recently used half.
const CAP: usize = 16_384;
/// Inserts between sweeps of exited processes.
const SWEEP_EVERY: u32 = 4_096;

#[derive(Clone, Copy, Debug)]
struct Made {
    version: u64,
    by: u32,
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
    seen: HashMap<(u32, u64, String), Seen>,
    /// Thread id -> thread group id (FUSE reports the calling thread).
    tgids: HashMap<u32, u32>,
    inserts: u32,
}

/// Per-process record of what each process saw; see the module comment.
#[derive(Debug)]
pub struct Tracker {
    mode: LostUpdates,
    state: Mutex<State>,
    conflicts: AtomicU64,
}

/// The thread group of thread `tid`, from /proc; the tid itself when it is gone.
fn read_tgid(tid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(tid)
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

impl State {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Drops what exited processes saw, then, past the cap, the least recently used half.
    fn sweep(&mut self) {
        self.inserts = 0;
        let mut live: HashMap<u32, bool> = HashMap::new();
        self.seen
            .retain(|(p, _, _), _| *live.entry(*p).or_insert_with(|| alive(*p)));
        self.tgids.retain(|tid, _| alive(*tid));
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

    fn set_seen(&mut self, tgid: u32, parent: u64, name: &str, version: u64) {
        let used = self.tick();
        let fresh = self
            .seen
            .insert((tgid, parent, name.to_string()), Seen { version, used })
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

    fn on(&self, tid: u32) -> bool {
        self.mode != LostUpdates::Off && tid != 0
    }

    /// The thread group of the calling thread; /proc is read outside the lock, once per
    /// thread.
    fn tgid(&self, tid: u32) -> u32 {
        if let Some(t) = lock(&self.state).tgids.get(&tid) {
            return *t;
        }
        let tgid = read_tgid(tid);
        let mut s = lock(&self.state);
        if s.tgids.len() >= CAP {
            s.tgids.clear();
        }
        s.tgids.insert(tid, tgid);
        tgid
    }

    /// Thread `tid` opened inode `ino`, named `name` in `parent`, for reading.
    pub fn read(&self, tid: u32, ino: u64, parent: u64, name: &str) {
        if !self.on(tid) {
            return;
        }
        let tgid = self.tgid(tid);
        let mut s = lock(&self.state);
        let version = match s.made.get(&ino) {
            Some(m) => m.version,
            None => 0,
        };
        s.set_seen(tgid, parent, name, version);
    }

    /// Thread `tid` committed new content to `ino`, named `name` in `parent`.
    pub fn wrote(&self, tid: u32, ino: u64, parent: u64, name: &str) {
        if !self.on(tid) {
            return;
        }
        let tgid = self.tgid(tid);
        let mut s = lock(&self.state);
        let version = s.tick();
        let fresh = s
            .made
            .insert(
                ino,
                Made {
                    version,
                    by: tgid,
                    used: version,
                },
            )
            .is_none();
        if fresh {
            s.inserted();
        }
        s.set_seen(tgid, parent, name, version);
    }

    /// Whether thread `tid` replacing `current` (named `name` in `parent`) would lose an edit:
    /// its content was made by another process after this one last read or wrote the name.
    pub fn check(&self, tid: u32, current: u64, parent: u64, name: &str) -> Option<Conflict> {
        if !self.on(tid) {
            return None;
        }
        let tgid = self.tgid(tid);
        let mut s = lock(&self.state);
        let now = s.tick();
        let made = s.made.get_mut(&current)?;
        made.used = now;
        let made = *made;
        let seen = s.seen.get(&(tgid, parent, name.to_string()))?;
        (made.by != tgid && made.version > seen.version).then_some(Conflict {
            replacer: tgid,
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
        if !self.on(tid) {
            return;
        }
        let tgid = self.tgid(tid);
        let mut s = lock(&self.state);
        let version = s.made.get(&ino).map_or(0, |m| m.version);
        s.set_seen(tgid, parent, name, version);
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

    // The test process's own pid stands for one process; a pid of a process that does not
    // exist (the tid itself is taken as its group) for the other.
    fn me() -> u32 {
        std::process::id()
    }
    const OTHER: u32 = 0x7fff_fff0;

    #[test]
    fn a_replace_of_content_made_after_my_read_is_a_conflict() {
        let t = Tracker::new(LostUpdates::Record);
        t.read(me(), 10, 1, "t.md");
        t.read(OTHER, 10, 1, "t.md");
        // The other process replaces t.md with inode 11 it wrote.
        t.wrote(OTHER, 11, 1, ".tmp-b");
        assert_eq!(t.check(OTHER, 10, 1, "t.md"), None);
        t.renamed(OTHER, 11, 1, "t.md");
        // Now I replace it without having read inode 11's content.
        t.wrote(me(), 12, 1, ".tmp-a");
        let c = t.check(me(), 11, 1, "t.md").expect("a conflict");
        assert_eq!((c.replacer, c.maker), (me(), OTHER));
        // After reading the current version, the same replace is fine.
        t.read(me(), 11, 1, "t.md");
        assert_eq!(t.check(me(), 11, 1, "t.md"), None);
    }

    #[test]
    fn a_lone_process_and_a_process_that_never_read_are_never_refused() {
        let t = Tracker::new(LostUpdates::Refuse);
        for i in 0..5 {
            t.read(me(), 100 + i, 1, "t.md");
            t.wrote(me(), 200 + i, 1, ".tmp");
            assert_eq!(t.check(me(), 100 + i, 1, "t.md"), None);
            t.renamed(me(), 200 + i, 1, "t.md");
        }
        t.wrote(me(), 300, 1, "other.md");
        assert_eq!(t.check(OTHER, 300, 1, "other.md"), None);
    }

    #[test]
    fn off_tracks_nothing() {
        let t = Tracker::new(LostUpdates::Off);
        t.read(me(), 10, 1, "t.md");
        t.wrote(OTHER, 10, 1, "t.md");
        assert_eq!(t.check(me(), 10, 1, "t.md"), None);
        assert!(lock(&t.state).made.is_empty());
    }

    #[test]
    fn the_tables_stay_bounded() {
        let t = Tracker::new(LostUpdates::Record);
        for i in 0..(3 * CAP as u64) {
            t.wrote(me(), i, 1, &format!("f{i}"));
        }
        let s = lock(&t.state);
        assert!(s.made.len() <= CAP + 1 && s.seen.len() <= CAP + 1);
    }
}

//! Processes as the daemon tells them apart. A pid (or a thread's tid) names a process only
//! together with its start time: pids come back (pid_max is often 32,768), and a process
//! that is handed an old number is a new process that has read and written nothing. Both
//! come from `/proc/PID/stat`, read in one go; its second field, the process name, may hold
//! anything up to 15 bytes (spaces, parentheses, terminal escapes), so the fields after it are
//! found from its last `)`.

use std::io::Read;

/// A process as the kernel started it: its pid (thread group id) and its start time, in clock
/// ticks since boot (field 22 of `/proc/PID/stat`). Two processes that held the same pid
/// differ in their start times, unless the pid came back within one tick (10 ms): only a
/// deliberate `clone3` with `set_tid` (root) does that, since a pid otherwise returns only
/// after the whole pid space has been handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessId {
    pub pid: u32,
    pub start: u64,
}

impl ProcessId {
    /// Whether this process (not merely its pid) still exists; a zombie counts until reaped.
    pub fn alive(&self) -> bool {
        stat(self.pid).is_some_and(|s| s.start == self.start)
    }
}

/// What `/proc/PID/stat` says of one task (a process, or a thread by its tid).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// The task's name (`comm`), as the task set it: raw, to be escaped before printing.
    pub name: String,
    /// Start time in clock ticks since boot.
    pub start: u64,
}

/// Task `pid`'s stat, or `None` when there is no such task (or /proc hides it).
pub fn stat(pid: u32) -> Option<Stat> {
    if pid == 0 {
        return None;
    }
    let mut f = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    // About 300 bytes; one read in the usual case.
    let mut raw = Vec::with_capacity(512);
    f.read_to_end(&mut raw).ok()?;
    parse_stat(&raw)
}

/// Parses the text of `/proc/PID/stat`: `pid (name) state ppid ... starttime ...`.
pub fn parse_stat(raw: &[u8]) -> Option<Stat> {
    let open = raw.iter().position(|&b| b == b'(')?;
    let close = raw.iter().rposition(|&b| b == b')')?;
    if close < open {
        return None;
    }
    let name = String::from_utf8_lossy(&raw[open + 1..close]).into_owned();
    let rest = std::str::from_utf8(&raw[close + 1..]).ok()?;
    // The fields after the name are numbered from 3 (state); the start time is field 22.
    let start = rest.split_ascii_whitespace().nth(22 - 3)?.parse().ok()?;
    Some(Stat { name, start })
}

/// The process (thread group) of thread `tid`, from `/proc/TID/status`.
pub fn thread_group(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The process thread `tid` belongs to, given the thread's own start time (`tid_start`, as
/// `stat(tid)` read it).
pub fn of_thread(tid: u32, tid_start: u64) -> Option<ProcessId> {
    let tgid = thread_group(tid)?;
    if tgid == tid {
        return Some(ProcessId {
            pid: tid,
            start: tid_start,
        });
    }
    let start = stat(tgid)?.start;
    // The thread must still be the one asked about: its group read above is then its own.
    (stat(tid)?.start == tid_start).then_some(ProcessId { pid: tgid, start })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_may_hold_spaces_parentheses_and_escapes() {
        let mut line = b"4242 (a) b) (c\x1b[2K\x07) S 1 4242 4242 0 -1 4194560 ".to_vec();
        // Fields 10 to 21, then the start time (22) and a few more.
        line.extend_from_slice(b"100 0 0 0 5 3 0 0 20 0 1 0 987654 12345 678 ...\n");
        let s = parse_stat(&line).expect("parsed");
        assert_eq!(s.name, "a) b) (c\x1b[2K\x07");
        assert_eq!(s.start, 987654);
        assert_eq!(parse_stat(b"4242 (no close S 1"), None);
        assert_eq!(parse_stat(b"4242 (short) S 1 2 3"), None);
    }

    #[test]
    fn this_process_is_itself_and_not_a_later_one_with_its_pid() {
        let me = std::process::id();
        let s = stat(me).expect("our own stat");
        let p = of_thread(me, s.start).expect("our process");
        assert_eq!(
            p,
            ProcessId {
                pid: me,
                start: s.start
            }
        );
        assert!(p.alive());
        let reused = ProcessId {
            pid: me,
            start: s.start + 1,
        };
        assert!(!reused.alive());
        // A thread of ours belongs to this process.
        let tid = std::thread::spawn(|| {
            let tid = nix::unistd::gettid().as_raw() as u32;
            let start = stat(tid).expect("the thread's stat").start;
            (tid, of_thread(tid, start))
        })
        .join()
        .unwrap();
        assert_ne!(tid.0, me);
        assert_eq!(tid.1, Some(p));
    }
}

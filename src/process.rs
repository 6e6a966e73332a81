//! Processes as the daemon tells them apart. A pid (or a thread's tid) names a process only
//! together with its start time: pids come back (pid_max is often 32,768), and a process
//! that is handed an old number is a new process that has read and written nothing. Both
//! come from `/proc/PID/stat`, read in one go; its second field, the process name, may hold
//! anything up to 15 bytes (spaces, parentheses, terminal escapes), so the fields after it are
//! found from its last `)`.
//!
//! Every durable operation asks /proc at least once (the lost-update tracker and the history
//! record name the caller), so each question is one `open`, as few `read`s as it takes (one
//! in practice) and a `close`, into a buffer on the stack: no size query, no seek, no heap.

use std::cell::Cell;
use std::io::Read;

thread_local! {
    /// Files of /proc this thread has read (see `reads_on_this_thread`).
    static READS: Cell<u64> = const { Cell::new(0) };
}

/// How many files of /proc this thread has read so far: tests count what an operation asks.
pub fn reads_on_this_thread() -> u64 {
    READS.with(Cell::get)
}

/// Reads `/proc/{pid}/{file}` into `buf` until `enough` says the text so far holds what the
/// caller needs, the file ends or `buf` is full; `None` if it cannot be opened or read.
fn read_proc<'a>(
    pid: u32,
    file: &str,
    buf: &'a mut [u8],
    enough: impl Fn(&[u8]) -> bool,
) -> Option<&'a [u8]> {
    READS.with(|r| r.set(r.get() + 1));
    let mut f = std::fs::File::open(format!("/proc/{pid}/{file}")).ok()?;
    let mut len = 0;
    while len < buf.len() {
        match f.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if enough(&buf[..len]) {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(&buf[..len])
}

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
    read_stat(pid, "stat", stat_of)
}

/// Task `tid`'s start time alone (as `stat` gives it), with no copy of its name.
pub fn start(tid: u32) -> Option<u64> {
    if tid == 0 {
        return None;
    }
    read_stat(tid, "stat", |_, (_, _, start)| start)
}

/// Reads `/proc/{pid}/{file}`, a stat line, and gives `take` its text and its fields (see
/// `stat_span`). About 300 bytes, and the start time comes within the first 450 whatever
/// the fields hold; a read that ends inside the start time's digits is not enough. The
/// fields found when the text was enough are kept: the line is parsed once.
fn read_stat<T>(
    pid: u32,
    file: &str,
    take: impl FnOnce(&[u8], (usize, usize, u64)) -> T,
) -> Option<T> {
    let mut buf = [0u8; 1024];
    let found = Cell::new(None);
    let raw = read_proc(pid, file, &mut buf, |r| {
        found.set(stat_span(r));
        found.get().is_some()
    })?;
    Some(take(raw, found.get()?))
}

/// Task `pid`'s name (`comm`, as `stat` gives it), from `/proc/PID/comm`: a smaller read for
/// the kernel than the whole stat line. `None` when there is no such task.
pub fn name(pid: u32) -> Option<String> {
    if pid == 0 {
        return None;
    }
    // At most 63 bytes (a kernel thread's name) and a newline.
    let mut buf = [0u8; 128];
    let raw = read_proc(pid, "comm", &mut buf, |r| r.ends_with(b"\n"))?;
    let raw = raw.strip_suffix(b"\n")?;
    Some(String::from_utf8_lossy(raw).into_owned())
}

/// Parses the text of `/proc/PID/stat`: `pid (name) state ppid ... starttime ...`.
pub fn parse_stat(raw: &[u8]) -> Option<Stat> {
    Some(stat_of(raw, stat_span(raw)?))
}

/// The stat of a stat line `raw` whose fields `stat_span` found.
fn stat_of(raw: &[u8], (open, close, start): (usize, usize, u64)) -> Stat {
    Stat {
        name: String::from_utf8_lossy(&raw[open..close]).into_owned(),
        start,
    }
}

/// Where the name lies in the text of `/proc/PID/stat` (from, to) and the start time. One
/// pass over the bytes after the name: every open for reading and every durable operation
/// asks.
fn stat_span(raw: &[u8]) -> Option<(usize, usize, u64)> {
    let open = raw.iter().position(|&b| b == b'(')?;
    let close = raw.iter().rposition(|&b| b == b')')?;
    if close < open {
        return None;
    }
    // The fields after the name are numbered from 3 (state); the start time is field 22,
    // taken only when a field follows it, so a text cut short inside its digits is refused.
    let mut fields = raw[close + 1..]
        .split(u8::is_ascii_whitespace)
        .filter(|f| !f.is_empty())
        .skip(22 - 3);
    let start = decimal(fields.next()?)?;
    fields.next()?;
    Some((open + 1, close, start))
}

/// A field of ASCII digits as a number; `None` for anything else or an overflow.
fn decimal(field: &[u8]) -> Option<u64> {
    if field.is_empty() {
        return None;
    }
    field.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// Thread `tid`'s stat, read as a thread of process `tgid` (`/proc/TGID/task/TID/stat`):
/// `None` when `tid` is not a thread of `tgid` now. One read tells both that the thread
/// belongs to the process and when it started.
pub fn task_stat(tgid: u32, tid: u32) -> Option<Stat> {
    if tgid == 0 || tid == 0 {
        return None;
    }
    read_stat(tgid, &format!("task/{tid}/stat"), stat_of)
}

/// Whether a task whose start time is `start` (clock ticks since boot, as `Stat::start`)
/// surely started before wall-clock time `wall_ns` (ns since the epoch): the task that holds
/// a tid now is the one that held it then only if it already ran then, since a tid is handed
/// out again once its thread has exited. The wall time is turned into time since boot
/// (`CLOCK_BOOTTIME` now minus the wall time elapsed since), the clock /proc counts start
/// times in. A start time says only which tick the task started in, so it must end a whole
/// tick before `wall_ns`: a task that started within a tick of it is not taken as earlier.
/// That tick also covers the conversion's error over a short span: the wall clock slewed by
/// NTP drifts at most 0.5 ms a second from the boot clock (5 ms over history's 10 s fold
/// window); a wall clock stepped in between is not told apart. False when a clock cannot
/// be read.
pub fn started_before(start: u64, wall_ns: i64) -> bool {
    let (Some(real), Some(boot)) = (
        clock_ns(libc::CLOCK_REALTIME),
        clock_ns(libc::CLOCK_BOOTTIME),
    ) else {
        return false;
    };
    let at = i128::from(boot) - (i128::from(real) - i128::from(wall_ns));
    (i128::from(start) + 2) * i128::from(tick_ns()) <= at
}

/// Nanoseconds in a clock tick, the unit of start times (`sysconf(_SC_CLK_TCK)`, 100 per
/// second on Linux).
fn tick_ns() -> i64 {
    static TICK: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *TICK.get_or_init(|| {
        // SAFETY: sysconf reads a constant of the system; it takes no pointer.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if hz > 0 {
            1_000_000_000 / hz
        } else {
            10_000_000
        }
    })
}

/// Clock `clock` now, in ns.
fn clock_ns(clock: libc::clockid_t) -> Option<i64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call to fill.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(ts.tv_sec * 1_000_000_000 + ts.tv_nsec)
}

/// The process (thread group) of thread `tid`, from `/proc/TID/status`.
pub fn thread_group(tid: u32) -> Option<u32> {
    // The Tgid line comes fourth, within the first 100 bytes or so of about 1,500.
    fn tgid(raw: &[u8]) -> Option<u32> {
        let at = raw.windows(6).position(|w| w == b"\nTgid:")? + 6;
        let line = &raw[at..];
        let end = line.iter().position(|&b| b == b'\n')?;
        std::str::from_utf8(&line[..end]).ok()?.trim().parse().ok()
    }
    let mut buf = [0u8; 2048];
    tgid(read_proc(tid, "status", &mut buf, |r| tgid(r).is_some())?)
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
    fn a_start_time_is_plain_digits_that_fit() {
        let line = |start: &str| {
            format!("7 (x y) S 1 7 7 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 {start} 12345 678\n")
        };
        assert_eq!(
            parse_stat(line("987654").as_bytes()).map(|s| s.start),
            Some(987654)
        );
        // Runs of whitespace separate fields as single spaces do.
        let spaced = line("42").replace(" 0 0 0 5 ", "  0\t0 0 5 ");
        assert_eq!(parse_stat(spaced.as_bytes()).map(|s| s.start), Some(42));
        for bad in ["12a", "-1", "+1", "18446744073709551616"] {
            assert_eq!(parse_stat(line(bad).as_bytes()), None, "{bad}");
        }
        assert_eq!(
            parse_stat(line("18446744073709551615").as_bytes()).map(|s| s.start),
            Some(u64::MAX)
        );
    }

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
        // A read that stopped inside the start time's digits is not a start time.
        let cut = line.len() - b" 12345 678 ...\n".len();
        assert_eq!(parse_stat(&line[..cut]), None);
        assert_eq!(parse_stat(&line[..cut + 1]), None);
        assert_eq!(parse_stat(&line[..cut + 2]).map(|s| s.start), Some(987654));
    }

    #[test]
    fn a_name_and_a_thread_group_each_take_one_file() {
        let me = std::process::id();
        let before = reads_on_this_thread();
        assert_eq!(name(me), Some(stat(me).expect("our stat").name));
        assert_eq!(thread_group(me), Some(me));
        assert_eq!(reads_on_this_thread() - before, 3);
        assert_eq!(name(0), None);
        assert_eq!(name(u32::MAX), None);
    }

    fn wall_ns() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after the epoch")
            .as_nanos() as i64
    }

    #[test]
    fn a_thread_started_after_a_time_is_not_the_one_that_held_its_tid_then() {
        let before = wall_ns();
        let (tx, rx) = std::sync::mpsc::channel();
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(nix::unistd::gettid().as_raw() as u32).unwrap();
            wait.recv().ok();
        });
        let tid = rx.recv().unwrap();
        let me = std::process::id();
        let s = task_stat(me, tid).expect("the thread's stat, as ours");
        assert_eq!(Some(s.clone()), stat(tid));
        assert_eq!(Some(s.start), start(tid));
        // A time before the thread was spawned: it did not hold its tid then.
        assert!(!started_before(s.start, before));
        // A time three ticks after it was spawned: it did.
        std::thread::sleep(std::time::Duration::from_nanos(3 * tick_ns() as u64));
        let after = wall_ns();
        assert!(started_before(s.start, after));
        // Within a tick after the tick it started in is too close to tell; a tick later is not.
        let tick = tick_ns();
        let boot_to_wall = |boot: i64| {
            let real = clock_ns(libc::CLOCK_REALTIME).unwrap();
            real - (clock_ns(libc::CLOCK_BOOTTIME).unwrap() - boot)
        };
        let started = s.start as i64 * tick;
        assert!(!started_before(
            s.start,
            boot_to_wall(started + tick + tick / 2)
        ));
        assert!(started_before(
            s.start,
            boot_to_wall(started + 2 * tick + tick / 2)
        ));
        // Not a thread of another process.
        assert_eq!(task_stat(1, tid), None);
        assert_eq!(task_stat(me, 0), None);
        done.send(()).unwrap();
        t.join().unwrap();
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

//! The daemon's log file, bounded whatever writes to it. Any process that uses the mount
//! (another user's too, with `--allow-other`) makes the daemon log: refusals are limited to
//! one line per rule and interval (`ratelimit`), but a log that only grows still fills, in
//! the end, the disk the store lives on. Past `MAX_BYTES` the file is renamed `LOG.1`
//! (replacing the one before) and a new one is started at its name, so the log takes at most
//! about twice `MAX_BYTES`.
//!
//! Every line is written whole under one lock (the `fmt` layer writes an event in one
//! `write_all` through one `LogWriter`), and a new file is started only between lines, so no
//! line is split or interleaved, whichever threads log at once. The new file is made as
//! every file beside a store is (`private`): mode 0600 from its first byte, with `O_EXCL`
//! and `O_NOFOLLOW`; and only the file this daemon writes is ever renamed.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The size past which the log starts a new file. A refusal's line is about 500 bytes (one
/// naming a long path, a few KB), and each rule logs one line per 10 s at most, so this
/// holds days of an ordinary daemon's lines; with the file before it, 32 MiB at most.
pub const MAX_BYTES: u64 = 16 * 1024 * 1024;

/// Where the previous file of the log at `log` is kept: `LOG.1` (`STORE.log.1`).
pub fn rotated(log: &Path) -> PathBuf {
    let mut p = log.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

/// The daemon's log file: a `MakeWriter` for the `fmt` layer.
pub struct LogFile {
    inner: Mutex<Inner>,
}

struct Inner {
    path: PathBuf,
    file: File,
    /// The bytes in `file` as far as this process knows; its real size is read again
    /// before a new file is started.
    size: u64,
    max: u64,
    /// Whether the last write ended a line: a new file starts only between lines.
    line_start: bool,
}

impl LogFile {
    /// Opens the log at `path` for appending (created mode 0600 when missing; a symlink
    /// there is refused; an existing file keeps its mode).
    pub fn open(path: &Path) -> io::Result<LogFile> {
        LogFile::open_with_max(path, MAX_BYTES)
    }

    /// `open`, starting a new file past `max` bytes instead of `MAX_BYTES`.
    pub fn open_with_max(path: &Path, max: u64) -> io::Result<LogFile> {
        let file = crate::private::open_append(path)?;
        let size = file.metadata()?.len();
        Ok(LogFile {
            inner: Mutex::new(Inner {
                path: path.to_path_buf(),
                file,
                size,
                max,
                line_start: true,
            }),
        })
    }
}

/// One event's writer: holds the log's lock until the event is written.
pub struct LogWriter<'a>(MutexGuard<'a, Inner>);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogFile {
    type Writer = LogWriter<'a>;

    fn make_writer(&'a self) -> LogWriter<'a> {
        // A panic while logging must not silence the log for good.
        LogWriter(self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Write for LogWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.file.flush()
    }
}

impl Inner {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.size >= self.max && self.line_start {
            self.start_new_file();
        }
        let n = self.file.write(buf)?;
        self.size += n as u64;
        if n > 0 {
            self.line_start = buf[n - 1] == b'\n';
        }
        Ok(n)
    }

    /// Moves the full log to `LOG.1` and goes on in a new file at its name. Where no new file
    /// can be made, the one held is emptied instead and says why: the bound holds either way.
    fn start_new_file(&mut self) {
        // Another program may have emptied the file (logrotate's copytruncate): its own size
        // decides.
        match self.file.metadata() {
            Ok(m) if m.len() < self.max => {
                self.size = m.len();
                return;
            }
            _ => {}
        }
        let previous = self.size;
        match self.rotate() {
            Ok(file) => {
                self.file = file;
                self.size = 0;
                let line = format!(
                    "{}  INFO log file {} started anew; its previous {previous} bytes are in {}\n",
                    now(),
                    self.path.display(),
                    rotated(&self.path).display()
                );
                self.write_note(&line);
            }
            Err(e) => {
                let _ = self.file.set_len(0);
                self.size = 0;
                let line = format!(
                    "{}  WARN log file {}: no new file could be started ({e}); this one was \
                     emptied to keep the log under {} bytes\n",
                    now(),
                    self.path.display(),
                    self.max
                );
                self.write_note(&line);
            }
        }
    }

    /// A line of the log's own, written as it is (the lock held here is the one a tracing
    /// event would wait for), in the `fmt` layer's form: the time, the level padded to five.
    fn write_note(&mut self, line: &str) {
        if self.file.write_all(line.as_bytes()).is_ok() {
            self.size += line.len() as u64;
        }
    }

    /// Renames the file held (only if it is still the one at the log's name: what another
    /// program put there is left alone) to `LOG.1`, then creates the new file: `O_EXCL`, so
    /// a file or symlink put at the name meanwhile refuses it. A log given with `--log-file`
    /// keeps the mode its user gave it; the new file has it from after its first byte, and
    /// 0600 before.
    fn rotate(&self) -> io::Result<File> {
        let held = self.file.metadata()?;
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.dev() == held.dev() && m.ino() == held.ino());
        if ours {
            std::fs::rename(&self.path, rotated(&self.path))?;
        }
        let file = crate::private::create_new_append(&self.path)?;
        let mode = held.mode() & 0o666;
        if mode != crate::private::PRIVATE_MODE {
            // The file is new and ours either way; it only stays 0600.
            let _ = file.set_permissions(std::fs::Permissions::from_mode(mode));
        }
        Ok(file)
    }
}

/// The time as the log's lines give it.
fn now() -> String {
    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
    let mut s = String::new();
    let _ = SystemTime.format_time(&mut Writer::new(&mut s));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::fmt::MakeWriter;

    fn line(i: usize) -> String {
        format!("line {i:06} {}\n", "x".repeat(80))
    }

    /// Regression: the daemon's log had no bound: any process using the mount could grow it
    /// until the disk under the store filled (9.4 MB in 0.7 s through refusals alone). Past
    /// its size the log moves to `LOG.1` and a new file starts; the two together stay about
    /// twice that, and no line is lost or split but those in the file replaced.
    #[test]
    fn a_full_log_moves_to_dot_one_and_a_new_file_starts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb.log");
        let max = 10_000;
        let log = LogFile::open_with_max(&path, max).unwrap();
        let n = 2_000; // about 180 KB: eighteen times the bound
        for i in 0..n {
            // Written in two pieces, as a short write would leave it: never split apart.
            let l = line(i);
            let mut w = log.make_writer();
            w.write_all(&l.as_bytes()[..10]).unwrap();
            w.write_all(&l.as_bytes()[10..]).unwrap();
        }
        let size = |p: &Path| std::fs::metadata(p).unwrap().len();
        let one = rotated(&path);
        assert!(size(&path) <= max + 200, "log: {} bytes", size(&path));
        assert!(one.exists(), "no {}", one.display());
        assert!(
            size(&one) <= max + 200,
            "{}: {} bytes",
            one.display(),
            size(&one)
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "only the log and LOG.1: {names:?}");
        // The newest lines are in the log, those just before in LOG.1, each line whole.
        let text =
            std::fs::read_to_string(&one).unwrap() + &std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("line ")).collect();
        assert!(lines.len() > 100, "{} lines kept", lines.len());
        assert!(
            lines.iter().all(|l| l.len() == line(0).len() - 1),
            "a line was split"
        );
        assert_eq!(*lines.last().unwrap(), line(n - 1).trim_end());
        let first: usize = lines[0][5..11].parse().unwrap();
        for (k, l) in lines.iter().enumerate() {
            assert_eq!(
                *l,
                line(first + k).trim_end(),
                "lines in order, none missing"
            );
        }
        assert!(
            text.contains("started anew"),
            "the new file says why it starts there"
        );
        // Made private, as every file beside a store.
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    /// A new file is never made through what someone put at the log's name: that is left
    /// alone, and the file the daemon holds is emptied instead, so the bound still holds.
    #[test]
    fn what_took_the_log_s_name_is_left_alone_and_the_bound_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb.log");
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "not a log\n").unwrap();
        let log = LogFile::open_with_max(&path, 1_000).unwrap();
        std::fs::rename(&path, dir.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        for i in 0..200 {
            log.make_writer().write_all(line(i).as_bytes()).unwrap();
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "not a log\n");
        assert!(std::fs::symlink_metadata(&path).unwrap().is_symlink());
        assert!(!rotated(&path).exists(), "nothing of another's was renamed");
        let held = dir.path().join("moved");
        assert!(std::fs::metadata(&held).unwrap().len() <= 1_300);
        assert!(
            std::fs::read_to_string(&held)
                .unwrap()
                .contains("no new file could be started")
        );
    }
}

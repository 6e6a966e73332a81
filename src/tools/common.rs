//! What every family of tools shares: the error type, an entry as the tools report it, the
//! walk of a tree (`tree`), a file's content, and the parsing of durations and dates.

use serde::Serialize;

use crate::store::{CHUNK_SIZE, Inode, Kind, ROOT_INO, TreeView};

pub(super) type Result<T> = std::result::Result<T, String>;

pub(super) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// One entry as the inspection commands report it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct EntryInfo {
    pub path: String,
    pub name: String,
    pub kind: &'static str,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ns: i64,
    pub atime_ns: i64,
    pub ino: u64,
}

fn kind_str(k: Kind) -> &'static str {
    match k {
        Kind::File => "file",
        Kind::Dir => "dir",
    }
}

/// `parent` and `name` joined into a store path.
pub(super) fn join(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// The entry of `i`, found at `path`.
pub(super) fn info(path: String, i: &Inode) -> EntryInfo {
    EntryInfo {
        name: if i.ino == ROOT_INO {
            "/".into()
        } else {
            i.name.clone()
        },
        path,
        kind: kind_str(i.kind),
        size: i.size,
        mode: i.perm,
        uid: i.uid,
        gid: i.gid,
        mtime_ns: i.mtime,
        atime_ns: i.atime,
        ino: i.ino,
    }
}

pub use crate::fs::resolve_path as lookup_path;

/// Chunks read at once while a file's content streams (about 1 MiB): what a reader holds of
/// a file at a time, whatever its size (a whole 256 MiB file took the daemon to six times its
/// size when `cat` answered in one line).
pub const STREAM_CHUNKS: u64 = 16;

/// Where a file's content goes as it is read: its size once the file is found, then its bytes
/// in order, a chunk at a time. An error from either ends the read.
pub trait ContentSink {
    /// The file was found and is `size` bytes; nothing of it has been read yet.
    fn start(&mut self, size: u64) -> Result<()> {
        let _ = size;
        Ok(())
    }
    /// The next bytes of the file.
    fn piece(&mut self, bytes: &[u8]) -> Result<()>;
}

impl<F: FnMut(&[u8]) -> Result<()>> ContentSink for F {
    fn piece(&mut self, bytes: &[u8]) -> Result<()> {
        self(bytes)
    }
}

/// Content gathered whole, for those who need it so (export, tar, diff, tests).
impl ContentSink for Vec<u8> {
    fn start(&mut self, size: u64) -> Result<()> {
        self.reserve_exact(size as usize);
        Ok(())
    }
    fn piece(&mut self, bytes: &[u8]) -> Result<()> {
        self.extend_from_slice(bytes);
        Ok(())
    }
}

/// A file's content, whole.
pub fn read_content(r: &impl TreeView, inode: &Inode) -> Result<Vec<u8>> {
    let mut whole = Vec::new();
    whole.start(inode.size)?;
    stream_content(r, inode, &mut whole)?;
    Ok(whole)
}

/// A file's content handed to `sink` one chunk at a time, `STREAM_CHUNKS` read at once: a hole
/// reads as zeros, and every piece but the last is `CHUNK_SIZE` bytes. `sink.start` is not
/// called here (the caller knows the size first).
pub fn stream_content(r: &impl TreeView, inode: &Inode, sink: &mut dyn ContentSink) -> Result<()> {
    let count = inode.size.div_ceil(CHUNK_SIZE);
    let mut piece = Vec::with_capacity(CHUNK_SIZE.min(inode.size) as usize);
    let mut first = 0;
    while first < count {
        let batch = STREAM_CHUNKS.min(count - first);
        let chunks = r.chunks(inode.ino, first, batch).map_err(err)?;
        for (idx, c) in (first..).zip(chunks) {
            let start = idx * CHUNK_SIZE;
            let len = CHUNK_SIZE.min(inode.size - start) as usize;
            piece.clear();
            piece.resize(len, 0);
            if let Some(c) = c {
                let n = c.len().min(len);
                piece[..n].copy_from_slice(&c[..n]);
            }
            sink.piece(&piece)?;
        }
        first += batch;
    }
    Ok(())
}

/// `tree`: every entry below `path`, depth first in name order, with its depth. Export and
/// expiry walk a tree through it too; a listing that streams walks with `Walk` itself.
pub fn tree(r: &impl TreeView, path: &str) -> Result<Vec<(usize, EntryInfo)>> {
    Walk::tree(r, path)?.collect()
}

/// Directory entries read at once by a walk: what it holds of a directory, whatever its size.
pub const WALK_BATCH: usize = 256;

/// A walk of a tree (`Walk::tree`) or of one directory (`Walk::dir`), an entry at a time, from
/// a bounded state: a stack of cursors (a directory and the last name taken from it, its path
/// and depth), and at most `WALK_BATCH` entries read ahead, of the deepest directory only (a
/// directory's read-ahead is dropped on the way down and read again from its cursor). So a
/// directory of a million entries, or a tree of them, costs what a page of it does.
pub struct Walk<'r, R: TreeView> {
    r: &'r R,
    /// The entry at `path` itself, yet to be given.
    first: Option<(usize, EntryInfo)>,
    stack: Vec<Level>,
    /// Whether to go down into the directories found (a tree), or not (a listing).
    recurse: bool,
}

/// One directory of a walk's stack: where it is, and where the walk is in it.
struct Level {
    path: String,
    depth: usize,
    ino: u64,
    /// The last name taken from it (the cursor); None before the first.
    after: Option<String>,
    /// Entries read ahead, after `after`.
    ahead: std::collections::VecDeque<crate::store::DirEntry>,
    /// The last read found its end: nothing after `ahead`.
    end: bool,
}

impl Level {
    fn new(path: String, depth: usize, ino: u64) -> Level {
        Level {
            path,
            depth,
            ino,
            after: None,
            ahead: Default::default(),
            end: false,
        }
    }
}

impl<'r, R: TreeView> Walk<'r, R> {
    /// Every entry at and below `path`, depth first in name order, with its depth (`path`'s
    /// own is 0).
    pub fn tree(r: &'r R, path: &str) -> Result<Self> {
        let (inode, canon) = lookup_path(r, path)?;
        let stack = match inode.kind {
            Kind::Dir => vec![Level::new(canon.clone(), 1, inode.ino)],
            Kind::File => Vec::new(),
        };
        Ok(Walk {
            r,
            first: Some((0, info(canon, &inode))),
            stack,
            recurse: true,
        })
    }

    /// `ls`: the entries of the directory at `path` in name order, or the file itself.
    pub fn dir(r: &'r R, path: &str) -> Result<Self> {
        let (inode, canon) = lookup_path(r, path)?;
        let (first, stack) = match inode.kind {
            Kind::Dir => (None, vec![Level::new(canon, 1, inode.ino)]),
            Kind::File => (Some((0, info(canon, &inode))), Vec::new()),
        };
        Ok(Walk {
            r,
            first,
            stack,
            recurse: false,
        })
    }

    fn step(&mut self) -> Result<Option<(usize, EntryInfo)>> {
        if let Some(first) = self.first.take() {
            return Ok(Some(first));
        }
        // Iterative: a store's depth is bounded by its limits, not by this thread's stack.
        loop {
            let Some(level) = self.stack.last_mut() else {
                return Ok(None);
            };
            if level.ahead.is_empty() && !level.end {
                let read = self
                    .r
                    .list_after(level.ino, level.after.as_deref(), WALK_BATCH)
                    .map_err(err)?;
                level.end = read.len() < WALK_BATCH;
                level.ahead = read.into();
            }
            let Some(e) = level.ahead.pop_front() else {
                self.stack.pop();
                continue;
            };
            let i = self
                .r
                .inode(e.ino)
                .map_err(err)?
                .ok_or_else(|| format!("missing inode {}", e.ino))?;
            let (p, depth) = (join(&level.path, &e.name), level.depth);
            level.after = Some(e.name);
            if self.recurse && i.kind == Kind::Dir {
                // Only the deepest directory keeps entries read ahead.
                level.ahead.clear();
                level.end = false;
                self.stack.push(Level::new(p.clone(), depth + 1, i.ino));
            }
            return Ok(Some((depth, info(p, &i))));
        }
    }
}

impl<R: TreeView> Iterator for Walk<'_, R> {
    type Item = Result<(usize, EntryInfo)>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.step() {
            Ok(item) => item.map(Ok),
            Err(e) => {
                // An error ends the walk.
                self.first = None;
                self.stack.clear();
                Some(Err(e))
            }
        }
    }
}

/// Parses `30d`, `12h`, `90m`, `45s` or `2w` into nanoseconds.
pub fn parse_duration(s: &str) -> Result<i64> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (examples: 30d, 12h, 90m)"))?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" | "" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(format!("{s:?}: unknown unit (use s, m, h, d or w)")),
    };
    Ok(n.saturating_mul(secs).saturating_mul(1_000_000_000))
}

/// Parses `YYYY-MM-DD` or `YYYY-MM-DDTHH:MM[:SS][Z]` (UTC) into ns since the epoch.
pub fn parse_date(s: &str) -> Result<i64> {
    let bad = || format!("{s:?} is not a date (examples: 2026-01-31, 2026-01-31T08:00:00Z)");
    let s2 = s.trim().trim_end_matches('Z');
    let (date, time) = s2.split_once(['T', ' ']).unwrap_or((s2, "00:00:00"));
    let d: Vec<i64> = date
        .split('-')
        .map(|x| x.parse().map_err(|_| bad()))
        .collect::<Result<_>>()?;
    let t: Vec<i64> = time
        .split(':')
        .map(|x| x.parse().map_err(|_| bad()))
        .collect::<Result<_>>()?;
    if d.len() != 3
        || t.len() < 2
        || t.len() > 3
        || !(1..=12).contains(&d[1])
        || !(1..=31).contains(&d[2])
    {
        return Err(bad());
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, m, day) = (if d[1] <= 2 { d[0] - 1 } else { d[0] }, d[1], d[2]);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + t[0] * 3600 + t[1] * 60 + t.get(2).copied().unwrap_or(0);
    Ok(secs * 1_000_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_dates() {
        assert_eq!(parse_duration("30d").unwrap(), 30 * 86_400 * 1_000_000_000);
        assert_eq!(parse_duration("90m").unwrap(), 90 * 60 * 1_000_000_000);
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_date("1970-01-01").unwrap(), 0);
        assert_eq!(
            parse_date("2000-03-01T00:00:00Z").unwrap(),
            951_868_800 * 1_000_000_000
        );
        assert_eq!(
            parse_date("2026-11-29T12:30").unwrap(),
            1_795_955_400 * 1_000_000_000
        );
        assert!(parse_date("2026-13-01").is_err());
    }
}

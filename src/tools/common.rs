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
/// expiry walk a tree through it too.
pub fn tree(r: &impl TreeView, path: &str) -> Result<Vec<(usize, EntryInfo)>> {
    let (inode, canon) = lookup_path(r, path)?;
    let mut out = vec![(0, info(canon.clone(), &inode))];
    if inode.kind != Kind::Dir {
        return Ok(out);
    }
    // Iterative: a store's depth is bounded by its limits, not by this thread's stack.
    let mut stack = vec![(canon, 1usize, r.list(inode.ino).map_err(err)?.into_iter())];
    while let Some((path, depth, entries)) = stack.last_mut() {
        let Some(e) = entries.next() else {
            stack.pop();
            continue;
        };
        let i = r
            .inode(e.ino)
            .map_err(err)?
            .ok_or_else(|| format!("missing inode {}", e.ino))?;
        let (p, depth) = (join(path, &e.name), *depth);
        out.push((depth, info(p.clone(), &i)));
        if i.kind == Kind::Dir {
            stack.push((p, depth + 1, r.list(i.ino).map_err(err)?.into_iter()));
        }
    }
    Ok(out)
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

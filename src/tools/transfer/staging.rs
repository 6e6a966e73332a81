//! The half of an import a directory and a tar archive share: the name rules and path limits
//! an entry passes to be staged, the staged entries with their content (an anonymous
//! temporary file), and the one write transaction that adds them to the store.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;

use serde::Serialize;

use super::super::common::{Result, err, lookup_path};
use crate::fs::name::fold_case;
use crate::fs::{Limits, Name, NameError, NameRules};
use crate::store::{Inode, Kind, OpInfo, Store, Sync, WriteTxn, now_ns};

/// What `import` did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ImportReport {
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
    /// (path, reason) of what was left out: the first `SKIP_LIST_MAX` entries.
    pub skipped: Vec<(String, String)>,
    /// How many more were left out, counted but not listed.
    pub skipped_unlisted: u64,
    /// (directory, name) of each entry made in a directory that was there before: what a
    /// kernel that cached those directories must be told of (`Fs::invalidate`).
    #[serde(skip)]
    pub made_in_existing: Vec<(u64, String)>,
}

/// The most skipped entries an import lists by path; the rest are counted, so that a source
/// of millions of symlinks or bad names costs no memory for each.
pub(crate) const SKIP_LIST_MAX: usize = 10_000;

impl ImportReport {
    pub(super) fn skip(&mut self, path: String, why: impl Into<String>) {
        if self.skipped.len() < SKIP_LIST_MAX {
            self.skipped.push((path, why.into()));
        } else {
            self.skipped_unlisted += 1;
        }
    }

    /// Every entry left out, listed or not.
    pub fn skipped_count(&self) -> u64 {
        self.skipped.len() as u64 + self.skipped_unlisted
    }
}

pub(super) const SYMLINK: &str = "symlink: only regular files and directories exist in a store";
pub(super) const SPECIAL: &str =
    "special file: only regular files and directories exist in a store";

pub(super) fn time_ns(secs: i64, nsec: i64) -> i64 {
    secs.saturating_mul(1_000_000_000).saturating_add(nsec)
}

/// One entry read from the source, waiting for the commit.
pub(super) struct Staged {
    /// Its parent among the staged entries; None: the import's target directory.
    pub parent: Option<usize>,
    pub name: String,
    /// Shown in the skip list.
    pub path: String,
    pub kind: Kind,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: i64,
    pub mtime: i64,
    /// Where its content lies in the staging file, and how long it is.
    pub content: (u64, u64),
}

/// The content of staged files: an anonymous temporary file, gone when dropped.
#[derive(Default)]
pub(super) struct Staging {
    file: Option<std::fs::File>,
    len: u64,
}

impl Staging {
    /// Why staging would not take an entry of `size` content bytes that makes `entries`
    /// entries staged (or remembered), if it would not. A store never holds more entries than
    /// `--max-files` nor more content than `--quota`, so staging holds no more of either,
    /// whatever the source offers: its memory and its file are bounded by the limits, not by
    /// the source. The commit, counting what the store holds, may skip more.
    pub fn refuse(&self, limits: &Limits, entries: usize, size: u64) -> Option<String> {
        if entries as u64 > limits.max_files {
            return Some(max_files_refusal(limits));
        }
        self.over_quota(limits, size)
    }

    /// Why `size` more content bytes would take staging over `--quota`, if they would.
    pub fn over_quota(&self, limits: &Limits, size: u64) -> Option<String> {
        let q = limits.quota_bytes;
        (q > 0 && self.len.saturating_add(size) > q).then(|| quota_refusal(limits))
    }

    pub fn put(&mut self, data: &[u8]) -> Result<(u64, u64)> {
        if self.file.is_none() {
            self.file = Some(tempfile::tempfile().map_err(|e| format!("staging file: {e}"))?);
        }
        let f = self.file.as_mut().expect("just made");
        f.write_all(data)
            .map_err(|e| format!("staging file: {e}"))?;
        let at = self.len;
        self.len += data.len() as u64;
        Ok((at, data.len() as u64))
    }

    fn get(&self, (at, len): (u64, u64)) -> Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut data = vec![0u8; len as usize];
        if len > 0 {
            self.file
                .as_ref()
                .ok_or("staging file missing")?
                .read_exact_at(&mut data, at)
                .map_err(|e| format!("staging file: {e}"))?;
        }
        Ok(data)
    }
}

/// Where an import goes: the target directory's inode, and its depth and path bytes in the
/// store (what the limits count from).
pub(super) struct Target {
    pub ino: u64,
    /// Its path in the store, as its history record names it.
    pub path: String,
    pub depth: usize,
    pub bytes: usize,
}

/// The directory `into` of the store, which an import goes below.
pub(super) fn target(store: &Store, into: &str) -> Result<Target> {
    let (target, canon) = lookup_path(&store.read().map_err(err)?, into)?;
    if target.kind != Kind::Dir {
        return Err(format!("{into}: not a directory in the store"));
    }
    let (depth, bytes) = if canon == "/" {
        (0, 0)
    } else {
        (canon.matches('/').count(), canon.len())
    };
    Ok(Target {
        ino: target.ino,
        path: canon.clone(),
        depth,
        bytes,
    })
}

/// Who runs an import, which decides the owner and mode of what it makes: run as root, an
/// entry keeps the owner and mode its source records; run by another user, that user owns it
/// and setuid and setgid bits are dropped, as `tar -x` and `cp` do. The same for a directory
/// and an archive, and through the daemon (whose user is the mount's).
#[derive(Clone, Copy)]
pub(super) struct Importer {
    root: bool,
    me: (u32, u32),
}

impl Importer {
    /// This process's effective user and group (read once).
    pub(super) fn current() -> Importer {
        static ME: std::sync::OnceLock<Importer> = std::sync::OnceLock::new();
        *ME.get_or_init(|| {
            let uid = nix::unistd::geteuid();
            Importer {
                root: uid.is_root(),
                me: (uid.as_raw(), nix::unistd::getegid().as_raw()),
            }
        })
    }

    /// The importing user and group: the owner of a directory an archive implies.
    pub(super) fn me(&self) -> (u32, u32) {
        self.me
    }

    /// (perm, uid, gid) of an entry whose source records `perm` and the owner `owner()`
    /// gives (asked only when it is kept).
    pub(super) fn owns(
        &self,
        perm: u32,
        owner: impl FnOnce() -> Result<(u32, u32)>,
    ) -> Result<(u32, u32, u32)> {
        if self.root {
            let (uid, gid) = owner()?;
            Ok((perm & 0o7777, uid, gid))
        } else {
            Ok((perm & 0o1777, self.me.0, self.me.1))
        }
    }
}

/// The most bytes an imported file may hold, and why a larger one is skipped: its
/// `--max-file-bytes`, or the whole `--quota` when that is lower (a file larger than the quota
/// can never fit), so no such file is read or staged.
pub(super) fn file_cap(limits: &Limits) -> (u64, String) {
    let q = limits.quota_bytes;
    if q > 0 && q < limits.max_file_bytes {
        (q, quota_refusal(limits))
    } else {
        let max = limits.max_file_bytes;
        (max, format!("over --max-file-bytes {max}"))
    }
}

/// Why an entry that would take the store past `--max-files` is skipped.
fn max_files_refusal(limits: &Limits) -> String {
    format!("over --max-files {}", limits.max_files)
}

/// Why an entry that would take the store over `--quota` is skipped.
fn quota_refusal(limits: &Limits) -> String {
    format!("over --quota {} content bytes", limits.quota_bytes)
}

/// The name `raw` takes in the store, as an entry at `depth` below a directory whose path has
/// `parent_bytes` bytes: the same rules and limits as an entry made through the mount, never
/// deeper, never longer. Err: why it has no place, for the skip list.
pub(super) fn admit(
    limits: &Limits,
    raw: &[u8],
    depth: usize,
    parent_bytes: usize,
) -> std::result::Result<Name, String> {
    let name = Name::parse(raw, limits.names).map_err(|e| e.to_string())?;
    if depth > limits.max_depth {
        return Err(format!(
            "would be {depth} levels deep, over --max-depth {}",
            limits.max_depth
        ));
    }
    let bytes = parent_bytes + 1 + name.as_str().len();
    if bytes > limits.max_path_bytes {
        return Err(format!(
            "path would be {bytes} bytes, over --max-path-bytes {}",
            limits.max_path_bytes
        ));
    }
    Ok(name)
}

/// Ends an import: with `strict`, anything skipped refuses it; otherwise the staged entries
/// go below `target` in one durable write transaction that reads nothing but the staged copy.
pub(super) fn commit(
    store: &Store,
    limits: &Limits,
    staged: &(Vec<Staged>, Staging),
    target: &Target,
    strict: bool,
    report: &mut ImportReport,
) -> Result<()> {
    if strict && !report.skipped.is_empty() {
        return Err(strict_error(report));
    }
    // The files' bytes are promised against the quota while the import commits, as an open
    // file's buffered bytes are: a write on the mount that races the import counts them, and
    // the import counts what open files hold (the mount's writers add theirs first, too).
    let own = if limits.quota_bytes > 0 {
        staged.0.iter().map(|e| e.content.1).sum()
    } else {
        0
    };
    store.hold_quota(own);
    let _held = Held(store, own);
    let mut w = store.write().map_err(err)?;
    // Its history record names the directory it went below, so `log PATH` of any path it
    // made finds it (as a record naming a directory above the path).
    w.describe(OpInfo {
        op: "import",
        paths: vec![target.path.clone()],
        ino: target.ino,
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
        pid: std::process::id(),
        ..OpInfo::default()
    });
    let held = store.quota_held().saturating_sub(own);
    commit_staged(&mut w, limits, staged, target.ino, held, report)?;
    if strict && !report.skipped.is_empty() {
        return Err(strict_error(report));
    }
    w.commit(Sync::Durable).map_err(|e| match e {
        // Refused whole: name the directory whose quota it would pass.
        crate::store::StoreError::DirQuota { dir, files, limit } => {
            let root = store
                .read()
                .map(|r| crate::fs::path_of_inode(&r, dir))
                .unwrap_or_else(|_| format!("<inode {dir}>"));
            let what = if files {
                "files and directories"
            } else {
                "content bytes"
            };
            format!("nothing imported: {root} would exceed its quota of {limit} {what} (EDQUOT)")
        }
        e => err(e),
    })
}

/// Bytes of the quota an import holds while it commits, given back however it ends.
struct Held<'a>(&'a Store, u64);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.release_quota(self.1);
    }
}

/// Why `--strict` refuses an import that skipped something.
fn strict_error(report: &ImportReport) -> String {
    let (p, why) = &report.skipped[0];
    format!(
        "--strict: {p}: {why} ({} entries would be skipped)",
        report.skipped_count()
    )
}

/// Writes the staged entries below `target` in `w`. A directory that already exists takes the
/// staged one's entries; any other name that exists is skipped with what was staged below it.
///
/// `--max-files` and `--quota` hold here, counting what the store holds already: an entry that
/// would take the store past either is skipped and listed (a directory with all below it).
///
/// The inode records go first, in the order their numbers are handed out, then every new
/// directory entry in key order: each table then grows at its end only, and redb leaves the
/// leaves it has moved past full (entries put in the staging's depth-first order land among
/// the keys of the directories staged before, and split leaves in half).
fn commit_staged(
    w: &mut WriteTxn<'_>,
    limits: &Limits,
    (staged, staging): &(Vec<Staged>, Staging),
    target: u64,
    held: u64,
    report: &mut ImportReport,
) -> Result<()> {
    // The inode each staged directory became (None: skipped, and so is everything below it).
    let mut made: Vec<Option<u64>> = Vec::with_capacity(staged.len());
    // The entries made, written after the loop in key order.
    let mut entries_made: BTreeMap<(u64, &str), (u64, Kind)> = BTreeMap::new();
    let now = now_ns();
    let usage = w.usage().map_err(err)?;
    let mut entries = usage.files + usage.dirs;
    // What open files have buffered beyond their committed size counts as content.
    let mut content = usage.content_bytes.saturating_add(held);
    // Under `--names portable`: each directory's names, case folded (read from the store the
    // first time the directory is met, then each name made), so that no two differ only in
    // case, as the mount refuses (`PortableCaseClash`).
    let mut folded: HashMap<u64, HashSet<String>> = HashMap::new();
    // The directories this import made.
    let mut new_dirs: HashSet<u64> = HashSet::new();
    for e in staged {
        let parent = match e.parent {
            None => Some(target),
            Some(i) => made[i],
        };
        let Some(parent) = parent else {
            made.push(None);
            continue;
        };
        let made_here = entries_made.get(&(parent, e.name.as_str())).copied();
        let found = match made_here {
            Some(m) => Some(m),
            None => w.lookup(parent, &e.name).map_err(err)?,
        };
        match found {
            Some((ino, Kind::Dir)) if e.kind == Kind::Dir => {
                made.push(Some(ino));
                continue;
            }
            Some(_) => {
                report.skip(e.path.clone(), "already exists in the store");
                made.push(None);
                continue;
            }
            None => {}
        }
        let names = match (limits.names, folded.entry(parent)) {
            (NameRules::Portable, Entry::Occupied(o)) => Some(o.into_mut()),
            (NameRules::Portable, Entry::Vacant(v)) => {
                let there = w.list(parent, usize::MAX).map_err(err)?;
                Some(v.insert(there.iter().map(|d| fold_case(&d.name)).collect()))
            }
            _ => None,
        };
        let key = names.as_ref().map(|_| fold_case(&e.name));
        if let (Some(names), Some(key)) = (&names, &key)
            && names.contains(key)
        {
            report.skip(e.path.clone(), NameError::PortableCaseClash.to_string());
            made.push(None);
            continue;
        }
        // A staged file's content is (offset, length) in the staging file.
        let size = if e.kind == Kind::File { e.content.1 } else { 0 };
        if entries >= limits.max_files {
            report.skip(e.path.clone(), max_files_refusal(limits));
        } else if limits.quota_bytes > 0 && content + size > limits.quota_bytes {
            report.skip(e.path.clone(), quota_refusal(limits));
        } else {
            entries += 1;
            content += size;
            if let (Some(names), Some(key)) = (names, key) {
                names.insert(key);
            }
            let (ino, kind) = add_entry(w, e, (parent, now), staging, report)?;
            entries_made.insert((parent, e.name.as_str()), (ino, kind));
            if !new_dirs.contains(&parent) {
                report.made_in_existing.push((parent, e.name.clone()));
            }
            if kind == Kind::Dir {
                new_dirs.insert(ino);
            }
            made.push((kind == Kind::Dir).then_some(ino));
            continue;
        }
        made.push(None);
    }
    for ((parent, name), (ino, kind)) in &entries_made {
        w.put_dirent(*parent, name, *ino, *kind).map_err(err)?;
    }
    Ok(())
}

/// Adds one staged entry's inode below `parent`, made at `now` (its directory entry is the
/// caller's to write); its inode and kind.
fn add_entry(
    w: &mut WriteTxn<'_>,
    e: &Staged,
    (parent, now): (u64, i64),
    staging: &Staging,
    report: &mut ImportReport,
) -> Result<(u64, Kind)> {
    let is_dir = e.kind == Kind::Dir;
    let mut inode = Inode {
        ino: w.alloc_ino().map_err(err)?,
        kind: e.kind,
        perm: e.perm,
        uid: e.uid,
        gid: e.gid,
        size: 0,
        nlink: if is_dir { 2 } else { 1 },
        parent,
        atime: e.atime,
        mtime: e.mtime,
        ctime: now,
        crtime: now,
        name: e.name.clone(),
    };
    if is_dir {
        w.put_inode(&inode).map_err(err)?;
        let mut p = w.inode(parent).map_err(err)?.ok_or("parent vanished")?;
        p.nlink += 1;
        w.put_inode(&p).map_err(err)?;
        report.dirs += 1;
        return Ok((inode.ino, e.kind));
    }
    let data = staging.get(e.content)?;
    inode.size = data.len() as u64;
    w.put_file(&inode, &data).map_err(err)?;
    report.files += 1;
    report.bytes += inode.size;
    Ok((inode.ino, e.kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file larger than the whole quota is never read: its cap is the quota when that is
    /// lower than `--max-file-bytes`, with the reason the commit would give.
    #[test]
    fn a_file_is_capped_by_the_lower_of_max_file_bytes_and_the_quota() {
        let mut limits = Limits::default();
        let max = limits.max_file_bytes;
        assert_eq!(
            file_cap(&limits),
            (max, format!("over --max-file-bytes {max}"))
        );
        limits.quota_bytes = 1000;
        assert_eq!(file_cap(&limits), (1000, quota_refusal(&limits)));
        assert_eq!(quota_refusal(&limits), "over --quota 1000 content bytes");
        limits.quota_bytes = max + 1;
        assert_eq!(file_cap(&limits).0, max);
    }
}

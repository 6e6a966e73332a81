//! `redbfs check`: redb's integrity check plus the filesystem invariants, on a store file.
//!
//! Invariant kept here: the check reads each table in its own key order, once (history's
//! records more than once: for its indexes, on a second thread while the rest is checked,
//! and for the content it keeps and references), and holds per inode only what the
//! directory entries are checked against: its number, a 32-bit CRC of its (parent, name),
//! a kind and a link count, 14 bytes (14 MB at a million files). Directories, blobs and
//! the findings themselves are held whole; an inode's full record is read again only to
//! word a finding.

use std::collections::{HashMap, HashSet};

use crate::fs::{Limits, Name, NameRules};
use crate::store::{
    CHUNK_SIZE, INLINE_MAX, Inode, Kind, ROOT_INO, ReadTxn, StoreError, SubtreeRecord, TableSums,
};

/// Flags kept per inode.
const IS_DIR: u8 = 1;
const HAS_INLINE: u8 = 2;

/// What the check keeps of every inode while it scans the directory entries, in inode
/// order (the inodes table's), found by binary search.
#[derive(Default)]
struct InodeIndex {
    inos: Vec<u64>,
    /// `place_of(parent, name)` of the inode's own record.
    place: Vec<u32>,
    flags: Vec<u8>,
    /// Directory entries that name the inode, counted up to 255.
    links: Vec<u8>,
}

impl InodeIndex {
    fn with_capacity(n: u64) -> InodeIndex {
        let n = usize::try_from(n).unwrap_or(0);
        InodeIndex {
            inos: Vec::with_capacity(n),
            place: Vec::with_capacity(n),
            flags: Vec::with_capacity(n),
            links: Vec::with_capacity(n),
        }
    }

    fn find(&self, ino: u64) -> Option<usize> {
        self.inos.binary_search(&ino).ok()
    }
}

/// The longest name `place_of` takes its CRC of in one call.
const PLACE_NAME_BYTES: usize = 56;

/// Where an entry or a record puts an inode, as a CRC-32C: a record and an entry that
/// disagree by a few bytes always differ, others differ but for one chance in 2^32.
fn place_of(parent: u64, name: &str) -> u32 {
    // One CRC call over the parent and the name side by side, for a name of up to
    // `PLACE_NAME_BYTES` (most are): a buffer for the longest name cost a memset per call
    // larger than the CRC.
    let mut buf = [0u8; 8 + PLACE_NAME_BYTES];
    match buf.get_mut(8..8 + name.len()) {
        Some(at) => {
            at.copy_from_slice(name.as_bytes());
            buf[..8].copy_from_slice(&parent.to_le_bytes());
            crc32c::crc32c(&buf[..8 + name.len()])
        }
        None => crc32c::crc32c_append(crc32c::crc32c(&parent.to_le_bytes()), name.as_bytes()),
    }
}

/// A directory, as its record says; with what the walk up its parents found.
struct Dir {
    ino: u64,
    parent: u64,
    nlink: u32,
    name_len: u32,
    orphan: bool,
    /// Its entries' subdirectories were counted against `nlink`.
    counted: bool,
    up: Up,
}

/// Where a directory's chain of parents leads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Up {
    Unknown,
    /// On the chain being walked.
    Busy,
    /// It never ends.
    Cycle,
    /// It ends after `steps` directories, at the root (with the directory's depth below
    /// it and the bytes of its path, "/a/b" being 4) or at an inode that is not a directory.
    Ends {
        steps: u32,
        root: Option<(u32, u32)>,
    },
}

struct Dirs(Vec<Dir>);

impl Dirs {
    fn find(&self, ino: u64) -> Option<usize> {
        self.0.binary_search_by_key(&ino, |d| d.ino).ok()
    }

    /// Walks up from every directory, each step taken once over all of them.
    fn walk_up(&mut self) {
        let mut chain = Vec::new();
        for start in 0..self.0.len() {
            let mut at = start;
            let end = loop {
                let d = &self.0[at];
                match d.up {
                    Up::Unknown => {}
                    Up::Busy => break Up::Cycle,
                    done => break done,
                }
                if d.ino == ROOT_INO {
                    self.0[at].up = Up::Ends {
                        steps: 0,
                        root: Some((0, 0)),
                    };
                    break self.0[at].up;
                }
                match self.find(d.parent) {
                    Some(p) => {
                        self.0[at].up = Up::Busy;
                        chain.push(at);
                        at = p;
                    }
                    None => {
                        self.0[at].up = Up::Ends {
                            steps: 0,
                            root: None,
                        };
                        break self.0[at].up;
                    }
                }
            };
            let mut up = end;
            while let Some(i) = chain.pop() {
                up = match up {
                    Up::Ends { steps, root } => Up::Ends {
                        steps: steps + 1,
                        root: root.map(|(depth, bytes)| {
                            (depth + 1, bytes.saturating_add(1 + self.0[i].name_len))
                        }),
                    },
                    _ => Up::Cycle,
                };
                self.0[i].up = up;
            }
        }
    }

    /// The depth and path bytes of the directory `ino`, when it reaches the root.
    fn below_root(&self, ino: u64) -> Option<(u32, u32)> {
        match self.0[self.find(ino)?].up {
            Up::Ends { root, .. } => root,
            _ => None,
        }
    }
}

/// The directory whose entries `entries` is reading.
struct Group {
    ino: u64,
    /// Its inode is a directory.
    is_dir: bool,
    /// Its place in `Dirs`.
    dir: Option<usize>,
    /// Its depth and path bytes from the root, when it reaches the root.
    from_root: Option<(u32, u32)>,
    /// Subdirectories among its entries so far.
    subdirs: u32,
}

/// The path of a directory entry, for a finding.
fn entry_path(r: &ReadTxn, parent: u64, name: &str) -> String {
    if parent == ROOT_INO {
        format!("/{name}")
    } else {
        format!("{}/{name}", crate::fs::path_of_inode(r, parent))
    }
}

/// Every broken invariant found, one line each; empty when the store is clean.
pub fn invariants(r: &ReadTxn) -> Result<Vec<String>, StoreError> {
    invariants_with(r, true, None)
}

/// `invariants` of a copy whose every table was found equal, byte for byte, to the snapshot
/// it was copied from (`TableDigest`): all but the re-derivation of history's indexes
/// (`history_keys`, which holds its path and time indexes too) from its records. Those indexes are
/// written in the same transactions as the records, are found by nothing but history's
/// queries, and are the copy's source's own, byte for byte; `check` of the store (and
/// `restore` of the copy, which checks everything before it puts a store in place)
/// re-derives them.
///
/// The scans that read a table whole in key order (the inodes, the directory entries, the
/// orphans, the chunk map, the blobs' reference counts, the subtree records) take its sum
/// into `sums` as they go, so the check of the copy need not read those tables again
/// (`ReadTxn::table_digests`).
pub fn invariants_of_copy(r: &ReadTxn, sums: &mut TableSums) -> Result<Vec<String>, StoreError> {
    invariants_with(r, false, Some(sums))
}

fn invariants_with(
    r: &ReadTxn,
    history_indexes: bool,
    sums: Option<&mut TableSums>,
) -> Result<Vec<String>, StoreError> {
    if !history_indexes {
        return Ok(tables(r, false, sums)?.0);
    }
    // History's indexes are re-derived from its records on a thread of their own (the
    // longest pass of a long history, reading only history's tables), from the start, while
    // this one checks everything else: two passes at once, one extra thread per check,
    // joined before it returns. Without a thread, one after the other.
    std::thread::scope(|s| {
        let indexes = std::thread::Builder::new()
            .name("check-index".into())
            .spawn_scoped(s, || r.history_index_findings());
        let checked = tables(r, true, sums);
        // Joined whatever the other checks found, so its fault is never the scope's.
        let found = match indexes {
            Ok(t) => t.join().unwrap_or_else(|_| {
                // Its panic was logged where it happened.
                Err(StoreError::Io(
                    "the check of history's indexes stopped on a fault of its own".into(),
                ))
            }),
            Err(_) => match &checked {
                Ok((_, Some(_))) => r.history_index_findings(),
                _ => Ok(Vec::new()),
            },
        };
        let (mut findings, at) = checked?;
        // Taken only when history's undo parts are whole: otherwise what it read says nothing.
        if let Some(at) = at {
            findings.splice(at..at, found?);
        }
        Ok(findings)
    })
}

/// Everything `invariants_with` checks but history's indexes, and with `history` the
/// content history keeps as later versions: the findings, and where those of history's
/// indexes go among them (after the content's, where a reader expects them; None when
/// they are not to be taken, history's undo parts not being whole).
fn tables(
    r: &ReadTxn,
    history: bool,
    mut sums: Option<&mut TableSums>,
) -> Result<(Vec<String>, Option<usize>), StoreError> {
    let mut findings = Vec::new();
    let orphans = r.orphans_summed(sums.as_deref_mut())?;
    let is_orphan = |ino: u64| orphans.binary_search(&ino).is_ok();
    let next_ino = r.meta_u64("next_ino")?.unwrap_or(0);
    let limits = r
        .meta_bytes(crate::store::schema::META_LIMITS)?
        .and_then(|b| serde_json::from_slice::<Limits>(&b).ok());
    let keeps_subtrees = r.subtree_current()?;

    // The inodes, in one scan.
    // Sized once from the table's count (redb keeps it): grown by doubling, the index held
    // up to twice its size while the last growth copied it.
    let mut index = InodeIndex::with_capacity(r.inode_count()?);
    let mut dirs = Vec::new();
    let (mut files, mut dir_count, mut bytes) = (0u64, 0u64, 0u64);
    let mut root_ok = false;
    let mut big_files = Vec::new();
    // Per directory, what its own entries add to its subtree record.
    let mut below: HashMap<u64, SubtreeRecord> = HashMap::new();
    r.for_each_inode(sums.as_deref_mut(), |i, name, inline| {
        let ino = i.ino;
        if ino == ROOT_INO {
            root_ok = i.kind == Kind::Dir;
        }
        if ino >= next_ino {
            findings.push(format!(
                "inode {ino} is at or above the inode counter {next_ino}"
            ));
        }
        let mut flags = 0;
        match i.kind {
            Kind::File => {
                files += 1;
                if limits.as_ref().is_some_and(|l| i.size > l.max_file_bytes) {
                    big_files.push((ino, i.parent, i.size));
                }
            }
            Kind::Dir => {
                dir_count += 1;
                flags |= IS_DIR;
                dirs.push(Dir {
                    ino,
                    parent: i.parent,
                    nlink: i.nlink,
                    name_len: name.len() as u32,
                    orphan: is_orphan(ino),
                    counted: false,
                    up: Up::Unknown,
                });
            }
        }
        bytes += i.size;
        if let Some(len) = inline {
            flags |= HAS_INLINE;
            inline_findings(r, &i, len, &mut findings);
        }
        if keeps_subtrees && ino != ROOT_INO && i.nlink > 0 {
            let w = below.entry(i.parent).or_default();
            match i.kind {
                Kind::File => {
                    w.files += 1;
                    w.bytes += i.size;
                }
                Kind::Dir => w.dirs += 1,
            }
            w.depth = w.depth.max(1);
            w.path_bytes = w.path_bytes.max(name.len() as u32 + 1);
        }
        index.inos.push(ino);
        index.place.push(place_of(i.parent, name));
        index.flags.push(flags);
        index.links.push(0);
        Ok(())
    })?;
    if !root_ok {
        findings.push("the root directory (inode 1) is missing or not a directory".to_string());
    }
    let mut dirs = Dirs(dirs);
    dirs.walk_up();

    entries(
        r,
        &mut index,
        &mut dirs,
        limits.as_ref(),
        &mut findings,
        sums.as_deref_mut(),
    )?;
    for (k, &ino) in index.inos.iter().enumerate() {
        if ino == ROOT_INO {
            continue;
        }
        match (index.links[k], is_orphan(ino)) {
            (0, false) => findings.push(format!("inode {ino} is unreachable and not an orphan")),
            (1, true) => findings.push(format!("inode {ino} is reachable but marked orphan")),
            (n, _) if n > 1 => findings.push(format!("inode {ino} has {n} entries")),
            _ => {}
        }
    }
    for d in &dirs.0 {
        if !d.orphan && !d.counted && d.nlink != 2 {
            findings.push(format!(
                "directory {} has nlink {} but 2 expected",
                d.ino, d.nlink
            ));
        }
        if !d.orphan && d.up == Up::Cycle {
            findings.push(format!("directory {} is in a cycle", d.ino));
        }
    }
    for &o in &orphans {
        if index.find(o).is_none() {
            findings.push(format!("orphan {o} has no inode"));
        }
    }
    if let Some(limits) = &limits {
        for (ino, parent, size) in big_files {
            let linked = index.find(ino).is_some_and(|k| index.links[k] > 0);
            if linked && dirs.below_root(parent).is_some() {
                findings.push(format!(
                    "{:?} is {size} bytes, over the store's --max-file-bytes {}",
                    crate::fs::path_of_inode(r, ino),
                    limits.max_file_bytes
                ));
            }
        }
        if limits.quota_bytes > 0 && bytes > limits.quota_bytes {
            findings.push(format!(
                "the store holds {bytes} content bytes, over its --quota {}",
                limits.quota_bytes
            ));
        }
        let count = index.inos.len() as u64;
        if count > limits.max_files {
            findings.push(format!(
                "the store holds {count} files and directories, over its --max-files {}",
                limits.max_files
            ));
        }
    }
    // What reads history's undo entries needs whole parts: with a part missing or damaged,
    // those checks are left for after it is dealt with.
    let parts = r.undo_part_findings()?;
    let parts_whole = parts.is_empty();
    findings.extend(parts);
    content(r, &index, parts_whole, &mut findings, sums.as_deref_mut())?;
    let indexes_at = (history && parts_whole).then_some(findings.len());
    if indexes_at.is_some() {
        findings.extend(r.kept_content_findings()?);
    }
    if keeps_subtrees {
        subtrees(r, &dirs, below, &mut findings, sums)?;
    }
    let usage = r.usage()?;
    if usage.files != files || usage.dirs != dir_count || usage.content_bytes != bytes {
        findings.push(format!(
            "usage counters say {} files, {} dirs, {} bytes; the records say {files}, {dir_count}, {bytes}",
            usage.files, usage.dirs, usage.content_bytes
        ));
    }
    Ok((findings, indexes_at))
}

/// A chunk 0 held in an inode record: only files hold one, within their size and
/// `INLINE_MAX`, matching its checksum (`len` is None when it does not).
fn inline_findings(r: &ReadTxn, i: &Inode, len: Option<u64>, findings: &mut Vec<String>) {
    let ino = i.ino;
    if len.is_none() {
        let path = crate::fs::path_of_inode(r, ino);
        findings.push(format!(
            "{path}: chunk 0 (held in its inode record) does not match its checksum"
        ));
    }
    if i.kind != Kind::File {
        findings.push(format!("directory {ino} holds content in its record"));
        return;
    }
    let len = len.unwrap_or(0);
    if len > i.size {
        findings.push(format!(
            "chunk 0 of inode {ino}, held in its record, lies beyond its size {}",
            i.size
        ));
    }
    if len > INLINE_MAX as u64 {
        findings.push(format!(
            "chunk 0 of inode {ino}, held in its record, is {len} bytes, over {INLINE_MAX}"
        ));
    }
}

/// The directory entries, in one scan (grouped by parent, as the table is): each names an
/// inode of its kind whose record names it back, in a directory, with a valid NFC name
/// within the store's limits; each directory's link count is 2 plus its subdirectories.
fn entries(
    r: &ReadTxn,
    index: &mut InodeIndex,
    dirs: &mut Dirs,
    limits: Option<&Limits>,
    findings: &mut Vec<String>,
    sums: Option<&mut TableSums>,
) -> Result<(), StoreError> {
    let mut group: Option<Group> = None;
    let mut folded: HashMap<String, String> = HashMap::new();
    let portable = limits.is_some_and(|l| l.names == NameRules::Portable);
    let close = |group: Option<Group>, dirs: &mut Dirs, findings: &mut Vec<String>| {
        if let Some(Group {
            ino,
            dir: Some(d),
            subdirs,
            ..
        }) = group
        {
            let d = &mut dirs.0[d];
            d.counted = true;
            let want = 2 + subdirs;
            if !d.orphan && d.nlink != want {
                findings.push(format!(
                    "directory {ino} has nlink {} but {want} expected",
                    d.nlink
                ));
            }
        }
    };
    r.for_each_dirent(sums, |parent, name, ino, kind| {
        if group.as_ref().is_none_or(|g| g.ino != parent) {
            close(group.take(), dirs, findings);
            group = Some(Group {
                ino: parent,
                is_dir: index
                    .find(parent)
                    .is_some_and(|k| index.flags[k] & IS_DIR != 0),
                dir: dirs.find(parent),
                from_root: dirs.below_root(parent),
                subdirs: 0,
            });
            folded.clear();
        }
        let Some(Group {
            is_dir,
            from_root,
            subdirs,
            ..
        }) = &mut group
        else {
            unreachable!("a group was just opened");
        };
        if !*is_dir {
            findings.push(format!(
                "entry {name:?} lives in {parent}, which is not a directory"
            ));
        }
        match index.find(ino) {
            None => findings.push(format!(
                "entry {name:?} in {parent} points to missing inode {ino}"
            )),
            Some(k) => {
                if (index.flags[k] & IS_DIR != 0) != (kind == Kind::Dir) {
                    findings.push(format!(
                        "entry {name:?} in {parent} has the wrong kind for inode {ino}"
                    ));
                }
                if index.place[k] != place_of(parent, name)
                    && let Some(i) = r.inode(ino)?
                    && (i.parent != parent || i.name != name)
                {
                    findings.push(format!(
                        "inode {ino} records parent {} name {:?}, but its entry is {name:?} in {parent}",
                        i.parent, i.name
                    ));
                }
                index.links[k] = index.links[k].saturating_add(1);
            }
        }
        if kind == Kind::Dir {
            *subdirs += 1;
        }
        findings.extend(entry_name_finding(parent, name));
        if let (Some(l), Some((depth, bytes))) = (limits, *from_root) {
            let (depth, bytes) = (depth as usize + 1, bytes as usize + 1 + name.len());
            if depth > l.max_depth {
                findings.push(format!(
                    "{:?} is {depth} levels deep, over the store's --max-depth {}",
                    entry_path(r, parent, name),
                    l.max_depth
                ));
            }
            if bytes > l.max_path_bytes {
                findings.push(format!(
                    "{:?} is {bytes} bytes, over the store's --max-path-bytes {}",
                    entry_path(r, parent, name),
                    l.max_path_bytes
                ));
            }
            if portable {
                if let Err(err) = Name::parse(name.as_bytes(), NameRules::Portable) {
                    findings.push(format!("{:?}: {err}", entry_path(r, parent, name)));
                }
                if let Some(other) =
                    folded.insert(crate::fs::name::fold_case(name), name.to_string())
                {
                    findings.push(format!(
                        "{:?} and {other:?} differ only in case, under the store's --names portable",
                        entry_path(r, parent, name)
                    ));
                }
            }
        }
        Ok(())
    })?;
    close(group, dirs, findings);
    Ok(())
}

/// What is wrong with `name` as the name of an entry of directory `parent`, worded as a
/// finding, or None: every name passes the normaliser the mount uses (`Name::parse`, Linux
/// rules) and is stored as it spells it (NFC). A follower applies each name of a batch
/// through this too.
pub fn entry_name_finding(parent: u64, name: &str) -> Option<String> {
    // Plain ASCII is decided from its bytes; anything else goes through the parser, which
    // also words the finding.
    if Name::plain_ascii_is_valid(name.as_bytes()) == Some(true) {
        return None;
    }
    match Name::parse(name.as_bytes(), NameRules::Linux) {
        Ok(n) if n.as_str() == name => None,
        Ok(_) => Some(format!("entry {name:?} in {parent} is not in NFC")),
        Err(err) => Some(format!("entry {name:?} in {parent}: {err}")),
    }
}

/// File content: chunks belong to files and lie within their sizes, chunk 0 is held in
/// the record or in a blob but not both; blobs match their checksums, and each is
/// counted once per chunk-map entry and once per history before-image that keeps it,
/// nothing else exists and nothing is missing; a delta blob counts once for its base, and
/// its runs are checked by `delta_runs`. One scan of the chunk map, one of the blobs, one
/// of history's undo entries (when every part of them is whole: else references are left
/// for after the parts are dealt with).
fn content(
    r: &ReadTxn,
    index: &InodeIndex,
    parts_whole: bool,
    findings: &mut Vec<String>,
    mut sums: Option<&mut TableSums>,
) -> Result<(), StoreError> {
    let (counts, blob_ids, damaged) = r.blob_census(sums.as_deref_mut())?;
    let damaged: HashSet<u64> = damaged.into_iter().collect();
    let mut named = HashSet::new();
    let mut want: HashMap<u64, u64> = HashMap::new();
    // The size of the inode whose chunks are being read.
    let mut size_of: Option<(u64, u64)> = None;
    r.for_each_chunk(sums, |ino, idx, b, len| {
        *want.entry(b).or_default() += 1;
        if damaged.contains(&b) {
            named.insert(b);
            let path = crate::fs::path_of_inode(r, ino);
            findings.push(format!(
                "{path}: chunk {idx} (blob {b}) does not match its checksum"
            ));
        }
        let Some(k) = index.find(ino) else {
            findings.push(format!("chunk {idx} belongs to missing inode {ino}"));
            return Ok(());
        };
        if index.flags[k] & IS_DIR != 0 {
            findings.push(format!("directory {ino} has content chunk {idx}"));
        }
        if idx == 0 && index.flags[k] & HAS_INLINE != 0 {
            findings.push(format!(
                "chunk 0 of inode {ino} is held both in its record and in a blob"
            ));
        }
        // A missing blob is reported with the references below.
        let Some(len) = len else { return Ok(()) };
        let size = match size_of {
            Some((i, size)) if i == ino => size,
            _ => {
                let size = r.inode(ino)?.map_or(0, |i| i.size);
                size_of = Some((ino, size));
                size
            }
        };
        if idx * CHUNK_SIZE + len > size {
            findings.push(format!(
                "chunk {idx} of inode {ino} lies beyond its size {size}"
            ));
        }
        if len > CHUNK_SIZE {
            findings.push(format!(
                "chunk {idx} of inode {ino} is {len} bytes, over the chunk size"
            ));
        }
        Ok(())
    })?;
    let (deltas, rows) = r.delta_survey()?;
    for (_, base) in &deltas {
        *want.entry(*base).or_default() += 1;
    }
    let mut damaged_images = std::collections::BTreeSet::new();
    let next_ino = r.meta_u64("next_ino")?.unwrap_or(0);
    if parts_whole {
        r.for_each_undo(|seq, u| {
            match u {
                // Inodes a record created: handed out by then, never the root.
                crate::store::Undo::Created { from, to }
                    if *from <= ROOT_INO || from >= to || *to > next_ino =>
                {
                    findings.push(format!(
                        "history record {seq} says it created inodes {from}..{to}, which the inode counter {next_ino} cannot have handed out"
                    ));
                }
                crate::store::Undo::Filemap { old: Some(b), .. } => {
                    *want.entry(*b).or_default() += 1
                }
                crate::store::Undo::Inode { ino, old: Some(b) }
                    if crate::store::inline_is_damaged(b) =>
                {
                    damaged_images.insert(*ino);
                }
                _ => {}
            }
            Ok(())
        })?;
    }
    for ino in damaged_images {
        findings.push(format!(
            "an earlier version of inode {ino} kept by the history does not match its checksum"
        ));
    }
    for b in damaged.difference(&named) {
        findings.push(format!(
            "blob {b} (an earlier version kept by the history) does not match its checksum"
        ));
    }
    // A blob without a blobrefs entry has exactly one reference; entries hold counts of 2+.
    let live: HashSet<u64> = blob_ids.iter().copied().collect();
    delta_runs(&deltas, &rows, &live, findings);
    if !parts_whole {
        return Ok(());
    }
    for (b, n) in &want {
        let recorded = counts
            .get(b)
            .copied()
            .or_else(|| live.contains(b).then_some(1));
        if recorded != Some(*n) {
            findings.push(format!(
                "blob {b} has {recorded:?} references recorded but {n} exist"
            ));
        }
    }
    for (b, n) in &counts {
        if !want.contains_key(b) {
            findings.push(format!(
                "blob {b} records {n} references but nothing refers to it"
            ));
        } else if *n < 2 {
            findings.push(format!(
                "blob {b} has a reference count entry of {n} (only counts of 2 or more are kept)"
            ));
        }
    }
    for b in want.keys() {
        if !live.contains(b) {
            findings.push(format!("blob {b} is referred to but missing"));
        }
    }
    for b in &blob_ids {
        if !want.contains_key(b) {
            findings.push(format!("blob {b} is stored but nothing refers to it"));
        }
    }
    Ok(())
}

/// Delta blobs: each one's base exists and indexes it, the index names only deltas, and no
/// run of deltas is longer than `MAX_DELTA_RUN` (the content they rebuild is checked with
/// every other blob's, in `damaged_chunks`).
fn delta_runs(
    deltas: &[(u64, u64)],
    rows: &[(u64, u64)],
    live: &HashSet<u64>,
    findings: &mut Vec<String>,
) {
    let base_of: HashMap<u64, u64> = deltas.iter().copied().collect();
    let indexed: HashSet<(u64, u64)> = rows.iter().copied().collect();
    for (blob, base) in deltas {
        if !live.contains(base) {
            findings.push(format!(
                "blob {blob} is a delta against blob {base}, which is missing"
            ));
        }
        if !indexed.contains(&(*base, *blob)) {
            findings.push(format!(
                "blob {blob} is a delta against blob {base} but the delta index lacks it"
            ));
        }
    }
    for (base, blob) in rows {
        if base_of.get(blob) != Some(base) {
            findings.push(format!(
                "the delta index names blob {blob} as a delta against blob {base}, which it is not"
            ));
        }
    }
    let max = crate::store::schema::MAX_DELTA_RUN as usize;
    // The deltas a blob is read through: 0 for a full one, 1 more than its base's for a
    // delta; memoised along each walk.
    let mut run_of: HashMap<u64, usize> = HashMap::new();
    for (blob, _) in deltas {
        let mut path = Vec::new();
        let mut at = *blob;
        let below = loop {
            if let Some(n) = run_of.get(&at) {
                break Some(*n);
            }
            match base_of.get(&at) {
                None => break Some(0),
                Some(base) => {
                    path.push(at);
                    if path.len() > base_of.len() {
                        break None;
                    }
                    at = *base;
                }
            }
        };
        let Some(below) = below else {
            findings.push(format!("blob {blob} is in a loop of deltas"));
            for b in path {
                run_of.insert(b, 0);
            }
            continue;
        };
        for (i, b) in path.iter().rev().enumerate() {
            run_of.insert(*b, below + i + 1);
        }
        let n = run_of[blob];
        if n > max {
            findings.push(format!(
                "blob {blob} is read through {n} deltas, more than the {max} allowed"
            ));
        }
    }
}

/// The per-directory aggregates (when the store keeps them): every directory's counts equal
/// what lies below it, its path bounds are at least the deepest and longest path below it,
/// and a row without a directory holds only a quota. `below` holds what each directory's
/// own entries add; each directory's total is added to its parent's, deepest first.
fn subtrees(
    r: &ReadTxn,
    dirs: &Dirs,
    below: HashMap<u64, SubtreeRecord>,
    findings: &mut Vec<String>,
    sums: Option<&mut TableSums>,
) -> Result<(), StoreError> {
    let mut want = below;
    let mut order: Vec<(u32, usize)> = dirs
        .0
        .iter()
        .enumerate()
        .filter_map(|(k, d)| match d.up {
            // A broken chain is reported by the checks above.
            Up::Ends { steps, .. } if d.ino != ROOT_INO && d.nlink > 0 => Some((steps, k)),
            _ => None,
        })
        .collect();
    order.sort_unstable_by(|a, b| b.cmp(a));
    for (_, k) in order {
        let d = &dirs.0[k];
        let Some(t) = want.get(&d.ino).copied() else {
            continue;
        };
        let w = want.entry(d.parent).or_default();
        w.files += t.files;
        w.dirs += t.dirs;
        w.bytes += t.bytes;
        w.depth = w.depth.max(t.depth + 1);
        w.path_bytes = w.path_bytes.max(t.path_bytes + d.name_len + 1);
    }
    let stored: HashMap<u64, SubtreeRecord> = r.all_subtrees(sums)?.into_iter().collect();
    for (ino, w) in &want {
        let s = stored.get(ino).copied().unwrap_or_default();
        if (s.files, s.dirs, s.bytes) != (w.files, w.dirs, w.bytes) {
            findings.push(format!(
                "directory {ino} records {} files, {} dirs, {} bytes below it; the records say {}, {}, {}",
                s.files, s.dirs, s.bytes, w.files, w.dirs, w.bytes
            ));
        }
        if s.depth < w.depth || s.path_bytes < w.path_bytes {
            findings.push(format!(
                "directory {ino} bounds its paths at {} levels and {} bytes, but one below it is {} levels and {} bytes",
                s.depth, s.path_bytes, w.depth, w.path_bytes
            ));
        }
    }
    let indexed: HashSet<u64> = r.quota_rows()?.into_iter().map(|(d, _)| d).collect();
    for (ino, s) in &stored {
        if s.has_quota() != indexed.contains(ino) {
            findings.push(format!(
                "the quota of directory {ino} and the index of quotas disagree"
            ));
        }
    }
    for ino in &indexed {
        if !stored.contains_key(ino) {
            findings.push(format!(
                "the index of quotas names directory {ino}, which has no subtree record"
            ));
        }
    }
    for (ino, s) in &stored {
        let is_dir = dirs.find(*ino).is_some();
        if !is_dir && (s.files, s.dirs, s.bytes) != (0, 0, 0) {
            findings.push(format!(
                "a subtree record with counts exists for {ino}, which is not a directory"
            ));
        } else if !want.contains_key(ino) && s.entries() + s.bytes != 0 {
            findings.push(format!(
                "directory {ino} records {} files, {} dirs, {} bytes below it, but it is empty",
                s.files, s.dirs, s.bytes
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `place_of` is the CRC-32C of the parent's 8 bytes then the name, taken in one call for
    /// a short name and in two for a longer one.
    #[test]
    fn a_place_is_one_crc_of_parent_and_name() {
        for name in [
            "",
            "a",
            "notes.md",
            &"s".repeat(PLACE_NAME_BYTES),
            &"t".repeat(PLACE_NAME_BYTES + 1),
            &"n".repeat(255),
            &"l".repeat(700),
        ] {
            let parent = 0x0102_0304_0506_0708u64;
            let apart =
                crc32c::crc32c_append(crc32c::crc32c(&parent.to_le_bytes()), name.as_bytes());
            assert_eq!(place_of(parent, name), apart, "{} bytes", name.len());
        }
    }
}

//! What a follower (`crate::replica::follow`) does to its private store: apply a batch of
//! shipped records, or become a new generation's snapshot, each in one durable transaction,
//! and say which directory entries and inodes it changed so the kernel's caches can be told.
//! And the freeze: a follower's store, or a writer fenced by a newer one, refuses every change
//! through `Store::write` while the follower goes on applying here.
//!
//! Invariant kept here: a reader sees the store before a batch or after it, never between
//! (one redb transaction each), and the store's commit number is the last record applied, so
//! the store is exactly the replica's state at that commit (but for the follower's own
//! `meta` keys, written in the same transaction).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::redo::replay_noting;
use super::schema::*;
use super::{ReadTxn, Store, StoreError, VerifiedRecord, map_err};

/// What a transaction applied from a replica changed: the entries (parent, name) added,
/// removed or replaced, and the inodes whose attributes or content changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changed {
    pub dirents: Vec<(u64, String)>,
    pub inodes: Vec<u64>,
}

/// What a change to a key of a table touches, as a batch's check and the kernel's caches
/// see it.
enum Touch {
    /// An inode's record or content.
    Inode(u64),
    /// A directory entry (parent, name).
    Dirent(u64, String),
    /// An inode's row in `orphans`.
    Orphan(u64),
}

/// What a change to `key` of `table` (in redb's byte encoding of the table's key) touches.
fn touch_of(table: &str, key: &[u8]) -> Option<Touch> {
    let u64_at = |at: usize| {
        key.get(at..at + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
    };
    match table {
        "inodes" if key.len() == 8 => u64_at(0).map(Touch::Inode),
        // (ino, chunk index): the file's content.
        "filemap" if key.len() == 16 => u64_at(0).map(Touch::Inode),
        "orphans" if key.len() == 8 => u64_at(0).map(Touch::Orphan),
        // (parent, name): a fixed-width u64, then the name's bytes.
        "dirents" => {
            let name = key.get(8..).and_then(|n| std::str::from_utf8(n).ok())?;
            Some(Touch::Dirent(u64_at(0)?, name.to_string()))
        }
        _ => None,
    }
}

impl Changed {
    /// Notes a change to `key` of `table` (in redb's byte encoding of the table's key).
    fn note(&mut self, table: &str, key: &[u8]) {
        match touch_of(table, key) {
            Some(Touch::Inode(ino)) => self.inodes.push(ino),
            Some(Touch::Dirent(parent, name)) => self.dirents.push((parent, name)),
            Some(Touch::Orphan(_)) | None => {}
        }
    }

    fn finish(mut self) -> Changed {
        self.inodes.sort_unstable();
        self.inodes.dedup();
        self.dirents.sort_unstable();
        self.dirents.dedup();
        self
    }
}

impl Store {
    /// From now on `write` refuses (`StoreError::ReadOnly`, EROFS at the mount) for the reason
    /// given; reads carry on, and so does a follower's `apply_shipped`.
    pub fn freeze(&self, why: String) {
        *self.frozen.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }

    /// Takes a freeze back: a promoted follower's store takes changes again.
    pub fn unfreeze(&self) {
        *self.frozen.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Puts `key` in `meta` in a durable transaction of its own that takes no commit number
    /// and reaches no replica: a note about this copy of the store (a fenced writer's), on a
    /// frozen store too.
    pub fn note_locally(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let tx = self.writable_db()?.begin_write().map_err(map_err)?;
        tx.open_table(META)
            .map_err(map_err)?
            .insert(key, value)
            .map_err(map_err)?;
        super::commit_as(tx, redb::Durability::Immediate)
    }

    /// Why the store was frozen, if it was.
    pub fn frozen(&self) -> Option<String> {
        self.frozen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A follower's store as it stood before its last batch (until the next one): the version
    /// a name pointed to when the kernel looked it up just before that batch replaced or
    /// removed it, so an `open` through that lookup reads what it found, as a local disk keeps
    /// a replaced inode for whoever holds it. At most one extra version is pinned.
    pub fn before_last_batch(&self) -> Option<Arc<ReadTxn>> {
        self.before_batch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A read transaction, the number of the batch it sees at least (batches applied since the
    /// store opened), and whether it sees exactly that one (no batch committed meanwhile).
    /// What an open handle on a follower pins, with what the applier needs to tell whether
    /// the batches since changed its file (see `Fs::settle_pins`).
    pub fn read_batch(&self) -> Result<(ReadTxn, u64, bool), StoreError> {
        let at = self.batch_seq.load(Ordering::SeqCst);
        let r = self.read()?;
        let exact = at.is_multiple_of(2) && self.batch_seq.load(Ordering::SeqCst) == at;
        Ok((r, at / 2, exact))
    }

    /// The number of the last batch applied since the store opened (see `read_batch`).
    pub fn batches_applied(&self) -> u64 {
        self.batch_seq.load(Ordering::SeqCst) / 2
    }

    /// Commits a batch's transaction, keeping `before` as the version before it: the batch
    /// count is odd while the commit runs, so `read_batch` never calls a transaction begun
    /// meanwhile exact. A failed commit counts as a batch (one that changed nothing).
    fn commit_shipped(
        &self,
        tx: redb::WriteTransaction,
        last: u64,
        before: Option<ReadTxn>,
    ) -> Result<(), StoreError> {
        self.batch_seq.fetch_add(1, Ordering::SeqCst);
        let r = super::commit_as(tx, redb::Durability::Immediate);
        if r.is_ok() {
            self.commits.store(last, Ordering::Release);
            self.keep_before(before);
        }
        self.batch_seq.fetch_add(1, Ordering::SeqCst);
        r
    }

    /// Keeps `before` (read before a batch that changed something) as the version before the
    /// last batch, once the batch committed.
    fn keep_before(&self, before: Option<ReadTxn>) {
        if let Some(before) = before {
            *self.before_batch.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(before));
        }
    }

    /// Applies verified `records` (in order, the first following this store's last commit)
    /// in one durable transaction, with the follower's own `meta` keys `local` put in it too; the
    /// store then holds the last record's commit number. What the batch changed.
    ///
    /// Before it commits, every entry and inode the batch touched is checked as `check`
    /// checks the whole store (`check_batch`), each name through `names`; a batch that fails
    /// is refused (`StoreError::Refused`, naming the commit and the rule), nothing of it
    /// applied.
    pub fn apply_shipped(
        &self,
        records: &[VerifiedRecord],
        local: &[(&str, Vec<u8>)],
        names: NameRule<'_>,
    ) -> Result<Changed, StoreError> {
        let at = self.commits.load(Ordering::Acquire);
        if let Some(first) = records.first().map(VerifiedRecord::seq)
            && first != at + 1
        {
            return Err(StoreError::Corrupt(format!(
                "a batch starting at commit {first} does not follow commit {at}"
            )));
        }
        let before = (!records.is_empty()).then(|| self.read()).transpose()?;
        let tx = self.writable_db()?.begin_write().map_err(map_err)?;
        let _held = self.writer_held();
        let mut changed = Changed::default();
        let mut touched = Touched::default();
        let mut last = at;
        for r in records {
            let seq = r.seq();
            if seq != last + 1 {
                return Err(StoreError::Corrupt(format!(
                    "commit {seq} does not follow commit {last}"
                )));
            }
            replay_noting(&tx, r.payload(), &mut |t, k| {
                changed.note(t, k);
                touched.note(t, k, seq);
            })?;
            last = seq;
        }
        if let Some(before) = &before {
            check_batch(&tx, before, &touched, names)?;
        }
        keep_own_format(&tx)?;
        finish_meta(&tx, last, local)?;
        self.commit_shipped(tx, last, before)?;
        Ok(changed.finish())
    }

    /// Makes this store hold exactly what the store file `snapshot` holds (a new generation's
    /// snapshot, at its commit `commit`), in one durable transaction that changes only the keys
    /// that differ, with `local` put in `meta` as in `apply_shipped`. What it changed.
    pub fn become_snapshot(
        &self,
        snapshot: &Path,
        commit: u64,
        local: &[(&str, Vec<u8>)],
    ) -> Result<Changed, StoreError> {
        let src = Database::builder().open(snapshot).map_err(map_err)?;
        let src = src.begin_read().map_err(map_err)?;
        // A snapshot of a later format may hold records this build cannot read, and one of
        // format 3 or before lacks history's indexes (`followable`); one of format 4 to 8
        // holds only records it reads, and the store keeps its own number, so that once
        // promoted (writing records of this format) earlier releases refuse it.
        let theirs = src
            .open_table(META)
            .map_err(map_err)?
            .get(META_FORMAT)
            .map_err(map_err)?
            .and_then(|v| <[u8; 8]>::try_from(v.value()).ok())
            .map(u64::from_le_bytes);
        followable(theirs, "the writer's snapshot", snapshot)?;
        // Before format 9 a store kept history's path and time indexes in tables of their
        // own: their rows are put where this format keeps them.
        let separate_indexes = theirs.is_some_and(|v| v < u64::from(FORMAT_VERSION));
        let before = self.read()?;
        let tx = self.writable_db()?.begin_write().map_err(map_err)?;
        let _held = self.writer_held();
        let mut changed = Changed::default();
        let keep: Vec<&str> = local
            .iter()
            .map(|(k, _)| *k)
            .chain([META_LOG_SEQ, META_LOG_ID, META_FORMAT])
            .collect();
        sync_table(&src, &tx, META, &mut |k| {
            std::str::from_utf8(k).is_ok_and(|k| keep.contains(&k))
        })?;
        let note = |table: &str| {
            let table = table.to_string();
            move |changed: &mut Changed, k: &[u8]| changed.note(&table, k)
        };
        for (def, name) in [(INODES, "inodes"), (BLOBS, "blobs"), (HISTORY, "history")] {
            let n = note(name);
            sync_noting(&src, &tx, def, &mut changed, &n)?;
        }
        let n = note("dirents");
        sync_noting(&src, &tx, DIRENTS, &mut changed, &n)?;
        let n = note("filemap");
        sync_noting(&src, &tx, FILEMAP, &mut changed, &n)?;
        sync_table(&src, &tx, ORPHANS, &mut |_| false)?;
        sync_table(&src, &tx, BLOBREFS, &mut |_| false)?;
        sync_table(&src, &tx, HISTORY_UNDO, &mut |_| false)?;
        sync_table(&src, &tx, MARKS, &mut |_| false)?;
        sync_table(&src, &tx, REDACTED, &mut |_| false)?;
        sync_table(&src, &tx, DELTAS, &mut |_| false)?;
        sync_table(&src, &tx, BLOB_DELTAS, &mut |_| false)?;
        if separate_indexes {
            sync_table(&src, &tx, HISTORY_KEYS, &mut |k| {
                let (key, _) = <(&[u8], u64) as redb::Value>::from_bytes(k);
                key.first().is_some_and(|&tag| tag >= PATH_INDEX_TAG)
            })?;
            put_separate_indexes(&src, &tx)?;
        } else {
            sync_table(&src, &tx, HISTORY_KEYS, &mut |_| false)?;
        }
        sync_table(&src, &tx, SUBTREE, &mut |_| false)?;
        sync_table(&src, &tx, QUOTAS, &mut |_| false)?;
        finish_meta(&tx, commit, local)?;
        self.commit_shipped(tx, commit, Some(before))?;
        Ok(changed.finish())
    }
}

/// The rule every name a follower applies must pass, worded as `check` words a finding
/// (`crate::check::entry_name_finding`: the normaliser the mount uses, which `store` does not
/// import), given the entry's parent and name; None when it passes.
pub type NameRule<'a> = &'a dyn Fn(u64, &str) -> Option<String>;

/// The keys a batch touched, each with the last commit of the batch that touched it.
#[derive(Default)]
struct Touched {
    dirents: BTreeMap<(u64, String), u64>,
    /// Inodes whose record, content or orphan row changed.
    inodes: BTreeMap<u64, u64>,
}

impl Touched {
    fn note(&mut self, table: &str, key: &[u8], seq: u64) {
        match touch_of(table, key) {
            Some(Touch::Inode(ino) | Touch::Orphan(ino)) => {
                self.inodes.insert(ino, seq);
            }
            Some(Touch::Dirent(parent, name)) => {
                self.dirents.insert((parent, name), seq);
            }
            None => {}
        }
    }
}

/// How many directories up from an entry the cycle check walks before it calls the chain a
/// cycle: far beyond any `--max-depth` a store allows, so only a loop reaches it.
const MAX_WALK_UP: usize = 4096;

/// Checks what a batch applied in `tx` (the store before it: `before`) left of the keys it
/// touched, as `check` checks the whole store: each entry it put has a valid name (`names`),
/// lives in a directory, and names an inode of its kind whose record names it back, and a
/// directory moved is not put below itself; each inode it touched (and each an entry it
/// changed pointed to before) is below the inode counter, reachable through the entry its
/// record names or an orphan (not both), and one removed leaves no entry pointing to it and,
/// for a directory, no entry in it. Only those keys and their neighbours are read, never the
/// whole store. The first fault refuses the batch, naming the commit that last touched the key.
fn check_batch(
    tx: &redb::WriteTransaction,
    before: &ReadTxn,
    touched: &Touched,
    names: NameRule<'_>,
) -> Result<(), StoreError> {
    use super::read::{get_inode_in, lookup_in, meta_u64_in};
    let refuse = |seq: u64, finding: String| -> Result<(), StoreError> {
        Err(StoreError::Refused(format!("commit {seq}: {finding}")))
    };
    let next_ino = meta_u64_in(&tx.open_table(META).map_err(map_err)?, META_NEXT_INO)?.unwrap_or(0);
    let inodes = tx.open_table(INODES).map_err(map_err)?;
    let dirents = tx.open_table(DIRENTS).map_err(map_err)?;
    let orphans = tx.open_table(ORPHANS).map_err(map_err)?;
    let is_dir = |ino: u64| -> Result<bool, StoreError> {
        Ok(get_inode_in(&inodes, ino)?.is_some_and(|i| i.kind == Kind::Dir))
    };
    let mut inos = touched.inodes.clone();
    for ((parent, name), &seq) in &touched.dirents {
        let (parent, name) = (*parent, name.as_str());
        if let Some((was, _)) = before.lookup(parent, name)? {
            inos.entry(was).or_insert(seq);
        }
        let Some((ino, kind)) = lookup_in(&dirents, parent, name)? else {
            continue;
        };
        inos.entry(ino).or_insert(seq);
        if let Some(finding) = names(parent, name) {
            return refuse(seq, finding);
        }
        if !is_dir(parent)? {
            return refuse(
                seq,
                format!("entry {name:?} lives in {parent}, which is not a directory"),
            );
        }
        let Some(i) = get_inode_in(&inodes, ino)? else {
            return refuse(
                seq,
                format!("entry {name:?} in {parent} points to missing inode {ino}"),
            );
        };
        if i.kind != kind {
            return refuse(
                seq,
                format!("entry {name:?} in {parent} has the wrong kind for inode {ino}"),
            );
        }
        if i.parent != parent || i.name != name {
            return refuse(
                seq,
                format!(
                    "inode {ino} records parent {} name {:?}, but its entry is {name:?} in {parent}",
                    i.parent, i.name
                ),
            );
        }
        if kind == Kind::Dir {
            // Up from the entry's directory to the root: never through the directory itself.
            let mut up = parent;
            for _ in 0..MAX_WALK_UP {
                if up == ino {
                    break;
                }
                if up == ROOT_INO {
                    up = 0;
                    break;
                }
                up = get_inode_in(&inodes, up)?.map_or(ROOT_INO, |d| d.parent);
            }
            if up != 0 {
                return refuse(seq, format!("directory {ino} is in a cycle"));
            }
        }
    }
    for (&ino, &seq) in &inos {
        let orphan = orphans.get(ino).map_err(map_err)?.is_some();
        let Some(i) = get_inode_in(&inodes, ino)? else {
            if ino == ROOT_INO {
                return refuse(
                    seq,
                    "the root directory (inode 1) is missing or not a directory".into(),
                );
            }
            if orphan {
                return refuse(seq, format!("orphan {ino} has no inode"));
            }
            let Some(old) = before.inode(ino)? else {
                continue;
            };
            if lookup_in(&dirents, old.parent, &old.name)?.is_some_and(|(x, _)| x == ino) {
                let (parent, name) = (old.parent, &old.name);
                return refuse(
                    seq,
                    format!("entry {name:?} in {parent} points to missing inode {ino}"),
                );
            }
            let lo = (ino, "");
            if let Some(e) = dirents.range(lo..).map_err(map_err)?.next() {
                let (k, _) = e.map_err(map_err)?;
                let (parent, name) = k.value();
                if parent == ino {
                    return refuse(
                        seq,
                        format!("entry {name:?} lives in {ino}, which is not a directory"),
                    );
                }
            }
            continue;
        };
        if ino >= next_ino {
            return refuse(
                seq,
                format!("inode {ino} is at or above the inode counter {next_ino}"),
            );
        }
        if ino == ROOT_INO {
            if i.kind != Kind::Dir {
                return refuse(
                    seq,
                    "the root directory (inode 1) is missing or not a directory".into(),
                );
            }
            continue;
        }
        let entry = lookup_in(&dirents, i.parent, &i.name)?.filter(|(x, _)| *x == ino);
        match (entry, orphan) {
            (None, false) => {
                return refuse(seq, format!("inode {ino} is unreachable and not an orphan"));
            }
            (Some(_), true) => {
                return refuse(seq, format!("inode {ino} is reachable but marked orphan"));
            }
            (Some((_, kind)), false) if kind != i.kind => {
                let (parent, name) = (i.parent, &i.name);
                return refuse(
                    seq,
                    format!("entry {name:?} in {parent} has the wrong kind for inode {ino}"),
                );
            }
            _ => {}
        }
    }
    Ok(())
}

/// The oldest store format whose writer a follower follows: a store of format 4 to 8 holds
/// only records this build reads (format 4's small files outside their records, no tables
/// of delta blobs and undo parts, no `marked` key: each valid as it is; history's path and
/// time indexes in tables of their own, whose rows are put where this format keeps them),
/// so the follower's store takes their content and keeps its own number, and once promoted
/// writes this build's records into a store an earlier release refuses by that number. A store of
/// format 3 or before lacks history's indexes (and format 2 chunk checksums), which only
/// the migration a mount runs builds.
const OLDEST_FOLLOWED: u32 = FORMAT_WITHOUT_INLINE;

/// Whether a writer's store of format `theirs` (what `what` holds: its snapshot at `from`,
/// or the `meta` its records stamp) can be followed: later formats than this build reads
/// are refused, and so are formats before `OLDEST_FOLLOWED` (or none), the rule named.
fn followable(theirs: Option<u64>, what: &str, from: &Path) -> Result<(), StoreError> {
    match theirs {
        Some(v) if v > u64::from(FORMAT_VERSION) => Err(StoreError::UnknownFormat {
            path: from.to_path_buf(),
            found: u32::try_from(v).unwrap_or(u32::MAX),
        }),
        Some(v) if v >= u64::from(OLDEST_FOLLOWED) => Ok(()),
        theirs => {
            let found = theirs.map_or("no store format".to_string(), |v| {
                format!("store format {v}")
            });
            Err(StoreError::Refused(format!(
                "{what} holds {found}, but a follower takes only formats {OLDEST_FOLLOWED} to \
                 {FORMAT_VERSION} (an earlier one needs the migration a mount runs): upgrade \
                 the writer, or `redbfs restore --from` the replica and mount that"
            )))
        }
    }
}

/// After a batch of a writer's records in `tx`: a record stamping an earlier format this
/// build follows (a writer of an earlier release migrating its own store) leaves the
/// follower's store its own number; one stamping a format it does not follow fails the
/// batch, nothing applied.
fn keep_own_format(tx: &redb::WriteTransaction) -> Result<(), StoreError> {
    let mut meta = tx.open_table(META).map_err(map_err)?;
    let now = meta
        .get(META_FORMAT)
        .map_err(map_err)?
        .and_then(|v| <[u8; 8]>::try_from(v.value()).ok())
        .map(u64::from_le_bytes);
    if now == Some(u64::from(FORMAT_VERSION)) {
        return Ok(());
    }
    followable(
        now,
        "a record of the writer",
        Path::new("a replica's record"),
    )?;
    meta.insert(
        META_FORMAT,
        u64::from(FORMAT_VERSION).to_le_bytes().as_slice(),
    )
    .map_err(map_err)?;
    Ok(())
}

/// Makes the path and time rows of `tx`'s `history_keys` those of the separate
/// `history_paths` and `history_times` tables of `src` (a snapshot of format 8 or before):
/// every such row removed, then each of theirs put.
fn put_separate_indexes(
    src: &redb::ReadTransaction,
    tx: &redb::WriteTransaction,
) -> Result<(), StoreError> {
    let mut dst = tx.open_table(HISTORY_KEYS).map_err(map_err)?;
    let lo = [PATH_INDEX_TAG];
    dst.retain_in((lo.as_slice(), 0).., |_, _| false)
        .map_err(map_err)?;
    fn exists<T>(r: Result<T, redb::TableError>) -> Result<Option<T>, StoreError> {
        match r {
            Ok(t) => Ok(Some(t)),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(map_err(e)),
        }
    }
    let paths = exists(src.open_table(HISTORY_PATHS))?;
    let times = exists(src.open_table(HISTORY_TIMES))?;
    super::history::put_path_and_time_rows(&mut dst, paths.as_ref(), times.as_ref())?;
    Ok(())
}

/// The store's commit number, the follower's own keys, and no log (none belongs to a
/// follower's store, which never commits through one).
fn finish_meta(
    tx: &redb::WriteTransaction,
    commit: u64,
    local: &[(&str, Vec<u8>)],
) -> Result<(), StoreError> {
    let mut meta = tx.open_table(META).map_err(map_err)?;
    meta.insert(META_LOG_SEQ, commit.to_le_bytes().as_slice())
        .map_err(map_err)?;
    meta.remove(META_LOG_ID).map_err(map_err)?;
    for (k, v) in local {
        meta.insert(*k, v.as_slice()).map_err(map_err)?;
    }
    Ok(())
}

/// `sync_table`, telling `note` every key it changed.
fn sync_noting<K: redb::Key + 'static, V: redb::Value + 'static>(
    src: &redb::ReadTransaction,
    tx: &redb::WriteTransaction,
    def: TableDefinition<K, V>,
    changed: &mut Changed,
    note: &dyn Fn(&mut Changed, &[u8]),
) -> Result<(), StoreError> {
    let mut keys = Vec::new();
    sync_table_keys(src, tx, def, &mut |_| false, &mut |k| keys.push(k.to_vec()))?;
    for k in keys {
        note(changed, &k);
    }
    Ok(())
}

fn sync_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    src: &redb::ReadTransaction,
    tx: &redb::WriteTransaction,
    def: TableDefinition<K, V>,
    skip: &mut dyn FnMut(&[u8]) -> bool,
) -> Result<(), StoreError> {
    sync_table_keys(src, tx, def, skip, &mut |_| {})
}

/// Makes table `def` of `tx` hold what it holds in `src`, keys for which `skip` says so left
/// as they are: removes the keys `src` lacks, puts those whose value differs, and tells
/// `changed` each key it removed or put. Memory: the keys removed, and one value at a time.
fn sync_table_keys<K: redb::Key + 'static, V: redb::Value + 'static>(
    src: &redb::ReadTransaction,
    tx: &redb::WriteTransaction,
    def: TableDefinition<K, V>,
    skip: &mut dyn FnMut(&[u8]) -> bool,
    changed: &mut dyn FnMut(&[u8]),
) -> Result<(), StoreError> {
    let mut dst = tx.open_table(def).map_err(map_err)?;
    let from = match src.open_table(def) {
        Ok(t) => Some(t),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(map_err(e)),
    };
    let mut gone = Vec::new();
    for item in dst.iter().map_err(map_err)? {
        let (k, _) = item.map_err(map_err)?;
        let key = K::as_bytes(&k.value()).as_ref().to_vec();
        if skip(&key) {
            continue;
        }
        let kept = match &from {
            Some(t) => t.get(K::from_bytes(&key)).map_err(map_err)?.is_some(),
            None => false,
        };
        if !kept {
            gone.push(key);
        }
    }
    for key in gone {
        dst.remove(K::from_bytes(&key)).map_err(map_err)?;
        changed(&key);
    }
    let Some(from) = from else {
        return Ok(());
    };
    for item in from.iter().map_err(map_err)? {
        let (k, v) = item.map_err(map_err)?;
        let key = K::as_bytes(&k.value()).as_ref().to_vec();
        if skip(&key) {
            continue;
        }
        let value = V::as_bytes(&v.value()).as_ref().to_vec();
        let same = dst
            .get(K::from_bytes(&key))
            .map_err(map_err)?
            .is_some_and(|old| V::as_bytes(&old.value()).as_ref() == value.as_slice());
        if !same {
            dst.insert(K::from_bytes(&key), V::from_bytes(&value))
                .map_err(map_err)?;
            changed(&key);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Inode, Kind, ROOT_INO, Sync};

    /// The key layouts `Changed::note` reads are redb's own encodings of the tables' keys.
    #[test]
    fn changed_reads_redbs_key_encodings() {
        let mut c = Changed::default();
        let d = <(u64, &str) as redb::Value>::as_bytes(&(7, "notes.md"));
        c.note("dirents", d.as_ref());
        let f = <(u64, u64) as redb::Value>::as_bytes(&(9, 3));
        c.note("filemap", f.as_ref());
        c.note("inodes", &5u64.to_le_bytes());
        c.note("blobs", &1u64.to_le_bytes());
        let c = c.finish();
        assert_eq!(c.dirents, vec![(7, "notes.md".to_string())]);
        assert_eq!(c.inodes, vec![5, 9]);
    }

    /// A store made to become another's snapshot holds exactly its files, keeps its own keys,
    /// and reports the entries and inodes that differed.
    #[test]
    fn a_store_becomes_a_snapshot_and_says_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let make = |name: &str, files: &[(&str, &[u8])]| {
            let s = Store::open_or_create(&dir.path().join(name), (0, 0)).unwrap();
            for (n, content) in files {
                let mut w = s.write().unwrap();
                let ino = w.alloc_ino().unwrap();
                let i = Inode {
                    ino,
                    kind: Kind::File,
                    perm: 0o644,
                    uid: 0,
                    gid: 0,
                    size: content.len() as u64,
                    nlink: 1,
                    parent: ROOT_INO,
                    atime: 1,
                    mtime: 1,
                    ctime: 1,
                    crtime: 1,
                    name: n.to_string(),
                };
                w.set_inode(ino, Some(&i)).unwrap();
                w.set_dirent(ROOT_INO, n, Some((ino, Kind::File))).unwrap();
                w.put_chunks(ino, [(0, *content)]).unwrap();
                w.commit(Sync::Durable).unwrap();
            }
            s
        };
        let a = make("a.redb", &[("same", b"1"), ("gone", b"2")]);
        let b = make("b.redb", &[("same", b"1"), ("new", b"3"), ("more", b"4")]);
        let r = b.read().unwrap();
        let commit = r.commit_number().unwrap();
        r.copy_to(&dir.path().join("snap.redb"), &mut |_| {})
            .unwrap();
        drop(r);
        drop(b);
        let changed = a
            .become_snapshot(&dir.path().join("snap.redb"), commit, &[("mine", vec![1])])
            .unwrap();
        let names: Vec<&str> = changed.dirents.iter().map(|d| d.1.as_str()).collect();
        assert_eq!(names, vec!["gone", "more", "new"], "{changed:?}");
        let r = a.read().unwrap();
        assert!(r.lookup(ROOT_INO, "new").unwrap().is_some());
        assert!(r.lookup(ROOT_INO, "gone").unwrap().is_none());
        assert_eq!(r.commit_number().unwrap(), commit);
        assert_eq!(r.meta_bytes("mine").unwrap(), Some(vec![1]));
        // Every table came across: history's indexes, the directories' aggregates and the
        // quotas agree with what the store now holds.
        assert_eq!(crate::check::invariants(&r).unwrap(), Vec::<String>::new());
        assert_eq!(r.history_index_findings().unwrap(), Vec::<String>::new());
    }

    /// A snapshot of an earlier format this build follows (4 to 7: a writer of an earlier
    /// release) leaves the follower's store its own number, which this build's records need
    /// once it is promoted; one of an earlier format (or none), or of a later format than
    /// this build reads, is refused with the rule named, the store left as it was.
    #[test]
    fn a_snapshot_keeps_the_store_s_format_or_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = Store::open_or_create(&dir.path().join("a.redb"), (0, 0)).unwrap();
        let b = Store::open_or_create(&dir.path().join("b.redb"), (0, 0)).unwrap();
        let r = b.read().unwrap();
        let commit = r.commit_number().unwrap();
        let snap = dir.path().join("snap.redb");
        r.copy_to(&snap, &mut |_| {}).unwrap();
        drop(r);
        drop(b);
        let stamp = |v: Option<u64>| {
            let db = Database::builder().open(&snap).unwrap();
            let tx = db.begin_write().unwrap();
            let mut meta = tx.open_table(META).unwrap();
            match v {
                Some(v) => meta
                    .insert(META_FORMAT, v.to_le_bytes().as_slice())
                    .unwrap(),
                None => meta.remove(META_FORMAT).unwrap(),
            };
            drop(meta);
            tx.commit().unwrap();
        };
        let format = |s: &Store| s.read().unwrap().meta_u64(META_FORMAT).unwrap();
        for v in OLDEST_FOLLOWED..=FORMAT_VERSION {
            stamp(Some(u64::from(v)));
            a.become_snapshot(&snap, commit, &[]).unwrap();
            assert_eq!(format(&a), Some(u64::from(FORMAT_VERSION)), "format {v}");
        }
        let ours = format!("formats {OLDEST_FOLLOWED} to {FORMAT_VERSION}");
        for (v, named) in [
            (
                Some(u64::from(OLDEST_FOLLOWED) - 1),
                "holds store format 3,",
            ),
            (
                Some(u64::from(FORMAT_WITHOUT_CHECKSUMS)),
                "holds store format 2,",
            ),
            (None, "holds no store format,"),
        ] {
            stamp(v);
            let e = a
                .become_snapshot(&snap, commit + 1, &[("mine", vec![1])])
                .unwrap_err();
            assert!(matches!(e, StoreError::Refused(_)), "{e}");
            assert!(e.to_string().contains(named), "{e}");
            assert!(e.to_string().contains(&ours), "{e}");
            let r = a.read().unwrap();
            assert_eq!(r.commit_number().unwrap(), commit, "{v:?}");
            assert_eq!(r.meta_bytes("mine").unwrap(), None, "{v:?}");
            assert_eq!(format(&a), Some(u64::from(FORMAT_VERSION)));
        }
        stamp(Some(u64::from(FORMAT_VERSION) + 1));
        let e = a.become_snapshot(&snap, commit, &[]).unwrap_err();
        assert!(matches!(e, StoreError::UnknownFormat { .. }), "{e}");
        let later = format!("store format version {}", FORMAT_VERSION + 1);
        assert!(e.to_string().contains(&later), "{e}");
        assert_eq!(format(&a), Some(u64::from(FORMAT_VERSION)));
    }

    /// A writer's record stamping an earlier format this build follows (an earlier release
    /// migrating its store) is applied with the follower's store keeping its own number; one
    /// stamping a format it does not follow fails the batch, nothing of it applied.
    #[test]
    fn a_record_stamping_an_earlier_format_keeps_the_store_s_own() {
        use crate::store::{decode_segment, encode_segment};
        let dir = tempfile::tempdir().unwrap();
        let a = Store::open_or_create(&dir.path().join("a.redb"), (0, 0)).unwrap();
        let at = a.read().unwrap().commit_number().unwrap();
        let put = |key: &str, value: &[u8]| {
            let mut e = vec![1, 4];
            e.extend_from_slice(b"meta");
            e.extend_from_slice(&(key.len() as u32).to_le_bytes());
            e.extend_from_slice(key.as_bytes());
            e.extend_from_slice(&(value.len() as u32).to_le_bytes());
            e.extend_from_slice(value);
            e
        };
        let batch = |seq: u64, v: u32| {
            let payload = [
                put(META_FORMAT, &u64::from(v).to_le_bytes()),
                put("theirs", &[v as u8]),
            ]
            .concat();
            let seg = encode_segment(1, [(seq, payload.as_slice())].into_iter());
            decode_segment(1, &seg, seq, seq).unwrap()
        };
        let format = |s: &Store| s.read().unwrap().meta_u64(META_FORMAT).unwrap();
        a.apply_shipped(&batch(at + 1, FORMAT_6), &[], &|_, _| None)
            .unwrap();
        assert_eq!(format(&a), Some(u64::from(FORMAT_VERSION)));
        let r = a.read().unwrap();
        assert_eq!(r.commit_number().unwrap(), at + 1);
        assert_eq!(r.meta_bytes("theirs").unwrap(), Some(vec![6]));
        drop(r);
        let e = a
            .apply_shipped(&batch(at + 2, OLDEST_FOLLOWED - 1), &[], &|_, _| None)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("a record of the writer holds store format 3"),
            "{e}"
        );
        let r = a.read().unwrap();
        assert_eq!(r.commit_number().unwrap(), at + 1);
        assert_eq!(r.meta_bytes("theirs").unwrap(), Some(vec![6]));
        assert_eq!(format(&a), Some(u64::from(FORMAT_VERSION)));
    }

    /// A follower's batches used to reach redb with only their byte layout checked: a
    /// forged record putting the entry `(1, "x/y")` made the root directory list EIO. Every
    /// entry and inode a batch touches is now checked as `check` checks a store: a name the
    /// normaliser refuses, an entry naming an inode that records another place or does not
    /// exist, an inode left unreachable; each refused with the commit and the rule, nothing
    /// of the batch applied.
    #[test]
    fn a_batch_that_breaks_the_store_s_rules_is_refused_whole() {
        use crate::store::{decode_segment, encode_segment};
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open_or_create(&dir.path().join("f.redb"), (0, 0)).unwrap();
        let ino = {
            let mut w = s.write().unwrap();
            let root = w.inode(ROOT_INO).unwrap().unwrap();
            let f = Inode {
                ino: w.alloc_ino().unwrap(),
                kind: Kind::File,
                perm: 0o644,
                nlink: 1,
                size: 2,
                parent: ROOT_INO,
                name: "a.md".into(),
                ..root
            };
            w.put_file(&f, b"hi").unwrap();
            w.put_dirent(ROOT_INO, "a.md", f.ino, Kind::File).unwrap();
            w.commit(Sync::Durable).unwrap();
            f.ino
        };
        let at = s.read().unwrap().commit_number().unwrap();
        let entry = |op: u8, table: &str, key: &[u8], value: Option<&[u8]>| {
            let mut e = vec![op, table.len() as u8];
            e.extend_from_slice(table.as_bytes());
            e.extend_from_slice(&(key.len() as u32).to_le_bytes());
            e.extend_from_slice(key);
            if let Some(v) = value {
                e.extend_from_slice(&(v.len() as u32).to_le_bytes());
                e.extend_from_slice(v);
            }
            e
        };
        let dirent = |parent: u64, name: &str, to: u64| {
            let key = <(u64, &str) as redb::Value>::as_bytes(&(parent, name));
            let value = <(u64, u8) as redb::Value>::as_bytes(&(to, Kind::File.to_byte()));
            entry(1, "dirents", key.as_ref(), Some(value.as_ref()))
        };
        let batch = |payload: Vec<u8>| {
            let seg = encode_segment(1, [(at + 1, payload.as_slice())].into_iter());
            decode_segment(1, &seg, at + 1, at + 1).unwrap()
        };
        let names: NameRule<'_> = &crate::check::entry_name_finding;
        let refused = |payload: Vec<u8>, rule: &str| {
            let e = s.apply_shipped(&batch(payload), &[], names).unwrap_err();
            assert!(matches!(e, StoreError::Refused(_)), "{e}");
            let said = e.to_string();
            assert!(said.contains(&format!("commit {}", at + 1)), "{said}");
            assert!(said.contains(rule), "{rule}: {said}");
            let r = s.read().unwrap();
            assert_eq!(r.commit_number().unwrap(), at);
            assert_eq!(r.list(ROOT_INO).unwrap().len(), 1);
            assert_eq!(crate::check::invariants(&r).unwrap(), Vec::<String>::new());
        };
        refused(dirent(ROOT_INO, "x/y", ino), "name contains '/'");
        refused(dirent(ROOT_INO, "..", ino), "name is '.' or '..'");
        refused(dirent(ROOT_INO, "", ino), "name is empty");
        refused(dirent(ROOT_INO, "x\0y", ino), "");
        refused(
            dirent(ROOT_INO, "xy", ino),
            &format!("inode {ino} records parent 1 name \"a.md\""),
        );
        refused(dirent(ROOT_INO, "xy", 999), "points to missing inode 999");
        refused(dirent(ino, "xy", ino), "which is not a directory");
        // The entry removed, its inode kept: unreachable.
        let key = <(u64, &str) as redb::Value>::as_bytes(&(ROOT_INO, "a.md"));
        refused(
            entry(2, "dirents", key.as_ref(), None),
            &format!("inode {ino} is unreachable and not an orphan"),
        );
        // The inode removed, its entry kept.
        refused(
            entry(2, "inodes", &ino.to_le_bytes(), None),
            &format!("points to missing inode {ino}"),
        );
        // What passes is applied.
        let gone = [
            entry(2, "dirents", key.as_ref(), None),
            entry(2, "inodes", &ino.to_le_bytes(), None),
        ]
        .concat();
        s.apply_shipped(&batch(gone), &[], names).unwrap();
        assert_eq!(s.read().unwrap().commit_number().unwrap(), at + 1);
    }

    /// A snapshot of format 8 (history's path and time indexes in tables of their own) leaves
    /// the follower's store of this format, its path and time rows taken from those tables:
    /// the indexes agree with the records, and history answers as the writer's does.
    #[test]
    fn a_format_8_snapshot_s_history_indexes_are_put_where_this_format_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let a = Store::open_or_create(&dir.path().join("a.redb"), (0, 0)).unwrap();
        let b = Store::open_or_create(&dir.path().join("b.redb"), (0, 0)).unwrap();
        for s in [&a, &b] {
            s.set_keep_history(86_400 * 1_000_000_000).unwrap();
        }
        let create = |s: &Store, name: &str| {
            let mut w = s.write().unwrap();
            let root = w.inode(ROOT_INO).unwrap().unwrap();
            let f = Inode {
                ino: w.alloc_ino().unwrap(),
                kind: Kind::File,
                perm: 0o644,
                nlink: 1,
                size: 2,
                parent: ROOT_INO,
                name: name.into(),
                ..root
            };
            w.put_file(&f, b"hi").unwrap();
            w.put_dirent(ROOT_INO, name, f.ino, Kind::File).unwrap();
            w.describe(crate::store::OpInfo {
                op: "create",
                paths: vec![format!("/{name}")],
                ..Default::default()
            });
            w.commit(Sync::Durable).unwrap();
        };
        create(&a, "only-here");
        for i in 0..5 {
            create(&b, &format!("f{i}"));
        }
        let r = b.read().unwrap();
        let commit = r.commit_number().unwrap();
        let want = r.history_of(None, None, usize::MAX).unwrap();
        let want_path = r.history_of(Some("/f3"), None, usize::MAX).unwrap();
        let snap = dir.path().join("snap.redb");
        r.copy_to(&snap, &mut |_| {}).unwrap();
        drop(r);
        {
            // The snapshot as a format-8 writer holds it.
            let db = Database::builder().open(&snap).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let mut keys = tx.open_table(HISTORY_KEYS).unwrap();
                let mut paths = tx.open_table(HISTORY_PATHS).unwrap();
                let mut times = tx.open_table(HISTORY_TIMES).unwrap();
                let rows: Vec<(Vec<u8>, u64)> = keys
                    .range((&[PATH_INDEX_TAG][..], 0)..)
                    .unwrap()
                    .map(|i| {
                        let (k, _) = i.unwrap();
                        let (k, seq) = k.value();
                        (k.to_vec(), seq)
                    })
                    .collect();
                assert_eq!(rows.len(), 10);
                for (k, seq) in rows {
                    keys.remove((k.as_slice(), seq)).unwrap();
                    match time_of_index_key(&k) {
                        Some(t) => drop(times.insert((t, seq), ()).unwrap()),
                        None => {
                            let p = std::str::from_utf8(&k[1..]).unwrap();
                            drop(paths.insert((p, seq), ()).unwrap());
                        }
                    }
                }
                tx.open_table(META)
                    .unwrap()
                    .insert(META_FORMAT, 8u64.to_le_bytes().as_slice())
                    .unwrap();
            }
            tx.commit().unwrap();
        }
        a.become_snapshot(&snap, commit, &[]).unwrap();
        let r = a.read().unwrap();
        assert_eq!(
            r.meta_u64(META_FORMAT).unwrap(),
            Some(u64::from(FORMAT_VERSION))
        );
        assert_eq!(r.history_index_findings().unwrap(), Vec::<String>::new());
        assert_eq!(r.history_of(None, None, usize::MAX).unwrap(), want);
        assert_eq!(
            r.history_of(Some("/f3"), None, usize::MAX).unwrap(),
            want_path
        );
        assert!(
            r.history_of(Some("/only-here"), None, 10)
                .unwrap()
                .is_empty()
        );
        let since = want[1].time;
        let got = r.history_of(None, Some(since), usize::MAX).unwrap();
        let recent: Vec<_> = want.iter().filter(|h| h.time >= since).cloned().collect();
        assert!(recent.len() >= 2);
        assert_eq!(got, recent);
    }

    /// A record of a format-8 writer (or a log an earlier release left) puts and removes
    /// rows of `history_paths` and `history_times`: applied here, they are put in and
    /// removed from `history_keys`, where this format keeps them.
    #[test]
    fn a_format_8_record_s_path_and_time_rows_go_to_the_key_index() {
        let dir = tempfile::tempdir().unwrap();
        let a = Store::open_or_create(&dir.path().join("a.redb"), (0, 0)).unwrap();
        let entry = |op: u8, table: &str, key: &[u8]| {
            let mut e = vec![op, table.len() as u8];
            e.extend_from_slice(table.as_bytes());
            e.extend_from_slice(&(key.len() as u32).to_le_bytes());
            e.extend_from_slice(key);
            if op == 1 {
                e.extend_from_slice(&0u32.to_le_bytes());
            }
            e
        };
        let path = <(&str, u64) as redb::Value>::as_bytes(&("/x", 7));
        let time = <(i64, u64) as redb::Value>::as_bytes(&(-5, 7));
        let apply = |op: u8| {
            let payload = [
                entry(op, "history_paths", &path),
                entry(op, "history_times", &time),
            ]
            .concat();
            crate::store::redo::check(&payload).unwrap();
            let tx = a.writable_db().unwrap().begin_write().unwrap();
            replay_noting(&tx, &payload, &mut |_, _| {}).unwrap();
            tx.commit().unwrap();
        };
        let rows = || {
            let r = a.read().unwrap();
            let keys = r.tx.open_table(HISTORY_KEYS).unwrap();
            let v: Vec<(Vec<u8>, u64)> = keys
                .iter()
                .unwrap()
                .map(|i| {
                    let (k, _) = i.unwrap();
                    let (k, seq) = k.value();
                    (k.to_vec(), seq)
                })
                .collect();
            v
        };
        apply(1);
        assert_eq!(
            rows(),
            vec![(path_index_key("/x"), 7), (time_index_key(-5).to_vec(), 7)]
        );
        assert_eq!(a.read().unwrap().seq_at_time(-5).unwrap(), 7);
        assert_eq!(a.read().unwrap().seq_at_time(-6).unwrap(), 0);
        apply(2);
        assert_eq!(rows(), vec![]);
    }
}

//! A simulated disk for the power-cut tests (`tests/powercut.rs`); never used by the daemon
//! or the tools, which run on the host's filesystem (`disk::Disk::Host`).
//!
//! Each file is an inode with a durable image (what the platter holds) and the writes and
//! length changes made since its last sync, in order; reads see all of them, as the page
//! cache does. Names are kept per directory the same way: the entries as of the directory's
//! last fsync, and the creations, removals, renames and links made since. A sync of a file
//! makes its data durable, never its name; a sync of a directory makes its entries durable.
//!
//! Every write, length change, sync and name change counts as one call. When the call
//! numbered `crash_at` comes, the power is cut during it: the disk keeps a random subset of
//! the unsynced writes (that call's too), each possibly torn at 512-byte boundaries, each
//! length change or not, and of each directory's unsynced name changes a random prefix (a
//! journaling filesystem commits them in order; a rename is one change). That image is frozen,
//! and every later call fails with EIO, as a dead machine's would. A test then opens the
//! store again over a fresh disk holding the image (`SimDisk::from_image`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Sectors a write may be torn at.
const SECTOR: u64 = 512;

#[derive(Clone, Debug)]
enum Change {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

#[derive(Clone, Debug, Default)]
struct Inode {
    durable: Vec<u8>,
    current: Vec<u8>,
    unsynced: Vec<Change>,
}

fn apply(data: &mut Vec<u8>, change: &Change) {
    match change {
        Change::Write(offset, bytes) => {
            let end = *offset as usize + bytes.len();
            resize(data, end.max(data.len()));
            data[*offset as usize..end].copy_from_slice(bytes);
        }
        Change::SetLen(len) => resize(data, *len as usize),
    }
}

/// `Vec::resize` with zeros, at memcpy speed in a debug build (the log is 4 MiB).
fn resize(data: &mut Vec<u8>, len: usize) {
    if len <= data.len() {
        data.truncate(len);
    } else {
        data.extend_from_slice(&vec![0u8; len - data.len()]);
    }
}

#[derive(Clone, Debug)]
enum NameOp {
    Create(PathBuf, usize),
    Remove(PathBuf),
    Rename(PathBuf, PathBuf),
    Link(PathBuf, PathBuf),
}

fn apply_name(names: &mut BTreeMap<PathBuf, usize>, op: &NameOp) {
    match op {
        NameOp::Create(p, id) => {
            names.insert(p.clone(), *id);
        }
        NameOp::Remove(p) => {
            names.remove(p);
        }
        NameOp::Rename(from, to) => {
            if let Some(id) = names.remove(from) {
                names.insert(to.clone(), id);
            }
        }
        NameOp::Link(from, to) => {
            if let Some(id) = names.get(from).copied() {
                names.insert(to.clone(), id);
            }
        }
    }
}

/// What a disk holds after a power cut: every name and its file's bytes (hard links share).
#[derive(Clone, Debug, Default)]
pub struct Image {
    files: Vec<Vec<u8>>,
    names: BTreeMap<PathBuf, usize>,
}

impl Image {
    /// The bytes of the file at `path`, if it survived.
    pub fn file(&self, path: &Path) -> Option<&[u8]> {
        self.names.get(path).map(|id| self.files[*id].as_slice())
    }
}

#[derive(Debug, Default)]
struct State {
    inodes: Vec<Inode>,
    names: BTreeMap<PathBuf, usize>,
    durable_names: BTreeMap<PathBuf, usize>,
    /// Name changes since their directory's last sync: (directory, change).
    pending: Vec<(PathBuf, NameOp)>,
    calls: u64,
    /// The file (or directory) each call was on, by call number - 1.
    trace: Vec<String>,
    crash_at: Option<u64>,
    frozen: Option<Image>,
    /// The phase the test named and the call the power was cut during.
    site: Option<String>,
    phase: &'static str,
    rng: u64,
    free: u64,
}

impl State {
    fn next(&mut self) -> u64 {
        // xorshift64*: small, seeded, enough to choose what survives.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// A power cut now: what survives of the unsynced state.
    fn cut(&mut self) -> Image {
        let mut names = self.durable_names.clone();
        let mut dirs: BTreeMap<PathBuf, Vec<NameOp>> = BTreeMap::new();
        for (dir, op) in &self.pending {
            dirs.entry(dir.clone()).or_default().push(op.clone());
        }
        for ops in dirs.values() {
            let keep = self.below(ops.len() as u64 + 1) as usize;
            for op in &ops[..keep] {
                apply_name(&mut names, op);
            }
        }
        let mut files = Vec::with_capacity(self.inodes.len());
        for id in 0..self.inodes.len() {
            if !names.values().any(|v| *v == id) {
                files.push(Vec::new());
                continue;
            }
            let mut data = self.inodes[id].durable.clone();
            let changes = self.inodes[id].unsynced.clone();
            for change in &changes {
                match self.below(4) {
                    0 => {}
                    1 | 2 => apply(&mut data, change),
                    _ => match change {
                        // Torn: some of its sectors reached the disk, not the others.
                        Change::Write(offset, bytes) => {
                            let end = offset + bytes.len() as u64;
                            let mut at = *offset;
                            while at < end {
                                let next = ((at / SECTOR + 1) * SECTOR).min(end);
                                if self.below(2) == 0 {
                                    let piece =
                                        &bytes[(at - offset) as usize..(next - offset) as usize];
                                    apply(&mut data, &Change::Write(at, piece.to_vec()));
                                }
                                at = next;
                            }
                        }
                        Change::SetLen(_) => {}
                    },
                }
            }
            files.push(data);
        }
        Image { files, names }
    }
}

fn eio() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::EIO)
}

fn enoent() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::ENOENT)
}

fn dir_of(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// A simulated disk: see the module comment.
#[derive(Debug, Default)]
pub struct SimDisk {
    state: Mutex<State>,
    /// While true, a sync of the write-ahead log waits (see `hold_log_syncs`).
    log_syncs_held: Mutex<bool>,
    log_syncs_released: Condvar,
}

impl SimDisk {
    /// An empty disk; `seed` chooses what survives a power cut.
    pub fn new(seed: u64) -> Arc<SimDisk> {
        SimDisk::from_image(&Image::default(), seed)
    }

    /// A disk holding `image`, all of it durable (the machine came back up).
    pub fn from_image(image: &Image, seed: u64) -> Arc<SimDisk> {
        let inodes = image
            .files
            .iter()
            .map(|f| Inode {
                durable: f.clone(),
                current: f.clone(),
                unsynced: Vec::new(),
            })
            .collect();
        Arc::new(SimDisk {
            state: Mutex::new(State {
                inodes,
                names: image.names.clone(),
                durable_names: image.names.clone(),
                rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
                free: u64::MAX / 4,
                phase: "",
                ..State::default()
            }),
            ..SimDisk::default()
        })
    }

    /// Holds every sync of the write-ahead log (`*.wal`) at its start until called again with
    /// false: the group-commit tests queue writers behind a sync in flight this way, without
    /// depending on how fast anything runs.
    pub fn hold_log_syncs(&self, hold: bool) {
        *self
            .log_syncs_held
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = hold;
        self.log_syncs_released.notify_all();
    }

    fn wait_if_held(&self, name: &str) {
        if !name.ends_with(".wal") {
            return;
        }
        let mut held = self
            .log_syncs_held
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        while *held {
            held = self
                .log_syncs_released
                .wait(held)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cuts the power during the `n`-th call from now on (1 = the next).
    pub fn crash_at(&self, n: u64) {
        let mut s = self.lock();
        s.crash_at = Some(s.calls + n);
    }

    /// Calls (writes, length changes, syncs, name changes) so far.
    pub fn calls(&self) -> u64 {
        self.lock().calls
    }

    /// The numbers of the calls so far on files whose name ends with `suffix`.
    pub fn calls_on(&self, suffix: &str) -> Vec<u64> {
        let s = self.lock();
        (1..=s.calls)
            .filter(|n| s.trace[*n as usize - 1].ends_with(suffix))
            .collect()
    }

    /// Whether the power was cut.
    pub fn crashed(&self) -> bool {
        self.lock().frozen.is_some()
    }

    /// The phase and the call the power was cut during.
    pub fn crash_site(&self) -> Option<String> {
        self.lock().site.clone()
    }

    /// Names what the test is doing, for `crash_site`.
    pub fn set_phase(&self, phase: &'static str) {
        self.lock().phase = phase;
    }

    /// Free bytes the disk reports (a low figure makes every commit a checkpoint).
    pub fn set_free(&self, bytes: u64) {
        self.lock().free = bytes;
    }

    pub(super) fn free(&self) -> u64 {
        self.lock().free
    }

    /// What the disk holds after the power cut, or after one cut now if none came yet.
    pub fn image(&self) -> Image {
        let mut s = self.lock();
        match &s.frozen {
            Some(image) => image.clone(),
            None => s.cut(),
        }
    }

    /// What the disk holds once everything reached it (a clean shutdown of the machine).
    pub fn settled(&self) -> Image {
        let s = self.lock();
        Image {
            files: s.inodes.iter().map(|i| i.current.clone()).collect(),
            names: s.names.clone(),
        }
    }

    /// Counts one call, named `what`; cuts the power during it when its number comes.
    /// `change` makes the call's effect (volatile until synced); it runs before the cut, so
    /// the cut may keep any part of it.
    fn call<T>(
        &self,
        on: &str,
        what: impl FnOnce() -> String,
        change: impl FnOnce(&mut State) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        let mut s = self.lock();
        if s.frozen.is_some() {
            return Err(eio());
        }
        s.calls += 1;
        s.trace.push(on.to_string());
        let result = change(&mut s);
        if s.crash_at == Some(s.calls) {
            let image = s.cut();
            s.frozen = Some(image);
            s.site = Some(format!("{}: {}", s.phase, what()));
            return Err(eio());
        }
        result
    }

    pub(super) fn exists(&self, path: &Path) -> bool {
        self.lock().names.contains_key(path)
    }

    fn id(&self, path: &Path) -> std::io::Result<usize> {
        self.lock().names.get(path).copied().ok_or_else(enoent)
    }

    /// Opens the file at `path`, creating it (empty) when `create` and it is missing.
    pub(super) fn open(self: &Arc<Self>, path: &Path, create: bool) -> std::io::Result<SimFile> {
        if let Ok(id) = self.id(path) {
            return Ok(SimFile {
                disk: self.clone(),
                id,
                name: label(path),
            });
        }
        if !create {
            return Err(enoent());
        }
        let id = self.call(
            &label(path),
            || format!("create {}", label(path)),
            |s| {
                let id = s.inodes.len();
                s.inodes.push(Inode::default());
                s.names.insert(path.to_path_buf(), id);
                s.pending
                    .push((dir_of(path), NameOp::Create(path.to_path_buf(), id)));
                Ok(id)
            },
        )?;
        Ok(SimFile {
            disk: self.clone(),
            id,
            name: label(path),
        })
    }

    pub(super) fn read_all(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        let id = self.id(path)?;
        Ok(self.lock().inodes[id].current.clone())
    }

    pub(super) fn len_of(&self, path: &Path) -> std::io::Result<u64> {
        let id = self.id(path)?;
        Ok(self.lock().inodes[id].current.len() as u64)
    }

    pub(super) fn remove(&self, path: &Path) -> std::io::Result<()> {
        self.id(path)?;
        self.call(
            &label(path),
            || format!("remove {}", label(path)),
            |s| {
                s.names.remove(path);
                s.pending
                    .push((dir_of(path), NameOp::Remove(path.to_path_buf())));
                Ok(())
            },
        )
    }

    pub(super) fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.id(from)?;
        self.call(
            &label(to),
            || format!("rename {} to {}", label(from), label(to)),
            |s| {
                let id = s.names.remove(from).ok_or_else(enoent)?;
                s.names.insert(to.to_path_buf(), id);
                let op = NameOp::Rename(from.to_path_buf(), to.to_path_buf());
                s.pending.push((dir_of(to), op));
                Ok(())
            },
        )
    }

    pub(super) fn hard_link(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        let id = self.id(from)?;
        if self.exists(to) {
            return Err(std::io::Error::from_raw_os_error(libc::EEXIST));
        }
        self.call(
            &label(to),
            || format!("link {} to {}", label(from), label(to)),
            |s| {
                s.names.insert(to.to_path_buf(), id);
                let op = NameOp::Link(from.to_path_buf(), to.to_path_buf());
                s.pending.push((dir_of(to), op));
                Ok(())
            },
        )
    }

    pub(super) fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        self.call(
            "",
            || "sync_dir directory".to_string(),
            |s| {
                let (done, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut s.pending)
                    .into_iter()
                    .partition(|(d, _)| d == dir);
                for (_, op) in &done {
                    apply_name(&mut s.durable_names, op);
                }
                s.pending = rest;
                Ok(())
            },
        )
    }
}

/// A file's name without its directory, for crash sites ("s.redb.wal").
fn label(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// An open file of a `SimDisk`.
#[derive(Debug)]
pub struct SimFile {
    disk: Arc<SimDisk>,
    id: usize,
    name: String,
}

impl SimFile {
    pub fn len(&self) -> std::io::Result<u64> {
        Ok(self.disk.lock().inodes[self.id].current.len() as u64)
    }

    pub fn is_empty(&self) -> std::io::Result<bool> {
        self.len().map(|n| n == 0)
    }

    pub fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let s = self.disk.lock();
        let data = &s.inodes[self.id].current;
        let end = offset as usize + out.len();
        if end > data.len() {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        out.copy_from_slice(&data[offset as usize..end]);
        Ok(())
    }

    pub fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let id = self.id;
        self.disk.call(
            &self.name,
            || format!("write {}: {} bytes at {offset}", self.name, data.len()),
            |s| {
                let change = Change::Write(offset, data.to_vec());
                let f = &mut s.inodes[id];
                apply(&mut f.current, &change);
                f.unsynced.push(change);
                Ok(())
            },
        )
    }

    pub fn set_len(&self, len: u64) -> std::io::Result<()> {
        let id = self.id;
        self.disk.call(
            &self.name,
            || format!("set_len {}: {len}", self.name),
            |s| {
                let f = &mut s.inodes[id];
                apply(&mut f.current, &Change::SetLen(len));
                f.unsynced.push(Change::SetLen(len));
                Ok(())
            },
        )
    }

    pub fn sync(&self) -> std::io::Result<()> {
        self.disk.wait_if_held(&self.name);
        let id = self.id;
        self.disk.call(
            &self.name,
            || format!("sync {}", self.name),
            |s| {
                // The cut happens during the sync: it may have written any part of this.
                if s.crash_at == Some(s.calls) {
                    return Ok(());
                }
                let f = &mut s.inodes[id];
                for change in std::mem::take(&mut f.unsynced) {
                    apply(&mut f.durable, &change);
                }
                Ok(())
            },
        )
    }
}

/// redb's view of a `SimFile`.
#[derive(Debug)]
pub(super) struct SimBackend(pub(super) SimFile);

impl redb::StorageBackend for SimBackend {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.0.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.0.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.0.set_len(len)
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.0.sync()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.0.write(offset, data)
    }
}

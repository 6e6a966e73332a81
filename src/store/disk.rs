//! Where a store's files live: the host's filesystem (always, outside the power-cut tests)
//! or a simulated disk (`sim`) that can lose what was not synced. Every file call the store,
//! its write-ahead log and `restore` make goes through here, so the tests cut the power in
//! the very code the daemon runs. `Host` does exactly what the calls did before: private
//! files, never through a symlink.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::sim::{SimDisk, SimFile};

#[doc(hidden)]
#[derive(Clone, Debug, Default)]
pub enum Disk {
    #[default]
    Host,
    /// Tests only.
    Sim(Arc<SimDisk>),
}

/// The write-ahead log's file.
#[derive(Debug)]
pub(super) enum LogFile {
    Host(File),
    Sim(SimFile),
}

impl LogFile {
    pub(super) fn len(&self) -> std::io::Result<u64> {
        match self {
            LogFile::Host(f) => f.metadata().map(|m| m.len()),
            LogFile::Sim(f) => f.len(),
        }
    }

    pub(super) fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        match self {
            LogFile::Host(f) => f.write_all_at(buf, offset),
            LogFile::Sim(f) => f.write(offset, buf),
        }
    }

    pub(super) fn sync_data(&self) -> std::io::Result<()> {
        match self {
            LogFile::Host(f) => f.sync_data(),
            LogFile::Sim(f) => f.sync(),
        }
    }

    /// Whether the file at `path` is this very file (same device and inode), not one put
    /// there since. The simulated disk has no other files to swap in.
    pub(super) fn is_at(&self, path: &Path) -> std::io::Result<bool> {
        use std::os::unix::fs::MetadataExt;
        match self {
            LogFile::Host(f) => {
                let mine = f.metadata()?;
                let there = std::fs::symlink_metadata(path)?;
                Ok(there.dev() == mine.dev() && there.ino() == mine.ino())
            }
            LogFile::Sim(_) => Ok(true),
        }
    }

    pub(super) fn sync_all(&self) -> std::io::Result<()> {
        match self {
            LogFile::Host(f) => f.sync_all(),
            LogFile::Sim(f) => f.sync(),
        }
    }
}

impl Disk {
    /// Whether something is at `path` (a symlink counts: callers refuse it).
    pub fn exists(&self, path: &Path) -> bool {
        match self {
            Disk::Host => std::fs::symlink_metadata(path).is_ok(),
            Disk::Sim(d) => d.exists(path),
        }
    }

    /// Opens the log file at `path`, creating it (mode 0600) when missing.
    pub(super) fn open_log(&self, path: &Path) -> std::io::Result<LogFile> {
        match self {
            Disk::Host => crate::private::open_or_create(path).map(LogFile::Host),
            Disk::Sim(d) => d.open(path, true).map(LogFile::Sim),
        }
    }

    /// The whole file at `path`.
    pub(super) fn read_all(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        match self {
            Disk::Host => {
                let mut bytes = Vec::new();
                let mut f = crate::private::open_read(path)?;
                std::io::Read::read_to_end(&mut f, &mut bytes)?;
                Ok(bytes)
            }
            Disk::Sim(d) => d.read_all(path),
        }
    }

    pub fn remove(&self, path: &Path) -> std::io::Result<()> {
        match self {
            Disk::Host => std::fs::remove_file(path),
            Disk::Sim(d) => d.remove(path),
        }
    }

    pub fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        match self {
            Disk::Host => std::fs::rename(from, to),
            Disk::Sim(d) => d.rename(from, to),
        }
    }

    pub fn hard_link(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        match self {
            Disk::Host => std::fs::hard_link(from, to),
            Disk::Sim(d) => d.hard_link(from, to),
        }
    }

    /// fsyncs directory `dir`, so the names created, removed or renamed in it are durable.
    pub fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        match self {
            Disk::Host => File::open(dir).and_then(|d| d.sync_all()),
            Disk::Sim(d) => d.sync_dir(dir),
        }
    }

    /// Copies `from` to a new private file `to` (never through a symlink). On the host the
    /// copy is handed back unsynced: the caller syncs it before anything relies on it (a
    /// restore does while it checks the copy). On a simulated disk it is synced here and
    /// nothing is handed back.
    pub fn copy_new_unsynced(&self, from: &Path, to: &Path) -> Result<Option<File>, String> {
        match self {
            Disk::Host => {
                let mut out =
                    crate::private::create_new(to).map_err(|e| crate::private::describe(to, e))?;
                let mut src = File::open(from).map_err(|e| format!("{}: {e}", from.display()))?;
                std::io::copy(&mut src, &mut out)
                    .map_err(|e| format!("copying {}: {e}", from.display()))?;
                Ok(Some(out))
            }
            Disk::Sim(d) => {
                if d.exists(to) {
                    return Err(format!("{}: already exists", to.display()));
                }
                let bytes = d
                    .read_all(from)
                    .map_err(|e| format!("{}: {e}", from.display()))?;
                let out = d
                    .open(to, true)
                    .map_err(|e| format!("{}: {e}", to.display()))?;
                let e = |e: std::io::Error| format!("{}: {e}", to.display());
                out.write(0, &bytes).map_err(e)?;
                out.sync().map_err(e)?;
                Ok(None)
            }
        }
    }

    /// Bytes the file at `path` holds (0 when missing).
    pub fn len(&self, path: &Path) -> u64 {
        match self {
            Disk::Host => std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
            Disk::Sim(d) => d.len_of(path).unwrap_or(0),
        }
    }

    /// Bytes available on the disk under `path`.
    pub(super) fn available(&self, path: &Path) -> u64 {
        match self {
            Disk::Host => super::disk_available(path),
            Disk::Sim(d) => d.free(),
        }
    }
}

//! What a mount attempt created on the host, each with its identity, so that an attempt that
//! fails before the mount answers removes exactly those and never what took their place.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Files and directories a mount attempt created on the host, each with its identity (device
/// and inode), so that an attempt that fails before the mount answers removes exactly those,
/// newest first, and never something that took their place (a directory only when empty).
#[derive(Clone, Debug, Default)]
pub struct Created {
    items: Vec<(PathBuf, u64, u64, bool)>,
}

impl Created {
    /// Records what is at `path` now, which this attempt has just created.
    pub fn record(&mut self, path: &Path) {
        if let Ok(m) = std::fs::symlink_metadata(path) {
            self.items
                .push((path.to_path_buf(), m.dev(), m.ino(), m.is_dir()));
        }
    }

    /// `create_dir_all`, recording each directory it creates.
    pub fn create_dir_all(&mut self, path: &Path) -> std::io::Result<()> {
        let mut missing = Vec::new();
        let mut p = path;
        loop {
            match std::fs::symlink_metadata(p) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    missing.push(p.to_path_buf());
                    match p.parent() {
                        Some(q) if !q.as_os_str().is_empty() => p = q,
                        _ => break,
                    }
                }
                Err(e) => return Err(e),
            }
        }
        for d in missing.iter().rev() {
            match std::fs::create_dir(d) {
                Ok(()) => self.record(d),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Removes what was recorded, newest first, each only if it is still the same file.
    pub fn remove_all(&mut self) {
        for (path, dev, ino, dir) in self.items.drain(..).rev() {
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.dev() == dev && m.ino() == ino => {
                    let _ = if dir {
                        std::fs::remove_dir(&path)
                    } else {
                        std::fs::remove_file(&path)
                    };
                }
                _ => {}
            }
        }
    }
}

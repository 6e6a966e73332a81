//! The one rule by which every command reaches a store: a mounted store through its daemon's
//! control socket (the daemon owns the file), an unmounted one by opening the file here.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::control;
use crate::mount;
use crate::store::{ReadOnlyStore, ReadTxn, Store};
use crate::tools;

/// A store named on the command line, and where it is mounted if it is.
pub(super) struct Target {
    pub store: PathBuf,
    pub mountpoint: Option<PathBuf>,
}

impl Target {
    /// A mountpoint of redbfs, or a store file (mounted or not).
    pub fn resolve(target: &Path) -> Result<Target, String> {
        let abs = mount::absolute(target)?;
        if let Some(store) = mount::redbfs_mount_at(&abs) {
            return Ok(Target {
                store,
                mountpoint: Some(abs),
            });
        }
        if abs.is_file() {
            let mountpoint = mount::mountpoint_of_store(&abs);
            return Ok(Target {
                store: abs,
                mountpoint,
            });
        }
        Err(format!(
            "{}: neither a store file nor a redbfs mountpoint",
            target.display()
        ))
    }

    /// As `resolve`, but a path that is neither is a store file yet to be made.
    pub fn resolve_or_new(target: &Path) -> Result<Target, String> {
        let abs = mount::absolute(target)?;
        Ok(Target::resolve(&abs).unwrap_or(Target {
            store: abs,
            mountpoint: None,
        }))
    }

    pub fn is_mounted(&self) -> bool {
        self.mountpoint.is_some()
    }

    /// The absolute path of a store file that may not exist yet, refused when it is mounted
    /// (the same file, however it is spelled), for commands that replace it.
    pub fn unmounted(store: &Path, what: &str) -> Result<PathBuf, String> {
        let store = mount::absolute(store)?;
        let t = Target {
            mountpoint: mount::mountpoint_of_store(&store),
            store,
        };
        t.refuse_mounted(what)?;
        Ok(t.store)
    }

    pub fn refuse_mounted(&self, what: &str) -> Result<(), String> {
        match &self.mountpoint {
            Some(mp) => Err(format!(
                "{} is mounted at {}; unmount it before {what}",
                self.store.display(),
                mp.display()
            )),
            None => Ok(()),
        }
    }

    /// The rule itself: `req` goes to the daemon when the store is mounted; otherwise
    /// `on_file` answers it from the store file, with an answer of the same shape.
    pub fn run(
        &self,
        req: Value,
        on_file: impl FnOnce(&Value) -> Result<Value, String>,
    ) -> Result<Value, String> {
        if self.is_mounted() {
            return self.daemon()?.call(&req);
        }
        on_file(&req)
    }

    /// A connection to the daemon of this mounted store.
    fn daemon(&self) -> Result<control::Client, String> {
        control::Client::connect(&self.store)
            .map_err(|e| format!("{}: the daemon does not answer: {e}", self.store.display()))
    }

    /// A read-only query (the store tools' `query`): the daemon's answer, or the same answer
    /// from the file opened read-only.
    pub fn ask(&self, req: Value) -> Result<Value, String> {
        self.run(req, |req| {
            self.read(|s, r| tools::query(r, s.file_bytes(), req))
        })
    }

    /// `log`: `on_page` hears each page in turn, newest records first, and says whether to go
    /// on; streamed by the daemon when mounted, else read from the file in one transaction.
    pub fn log(
        &self,
        q: &tools::LogQuery,
        on_page: &mut dyn FnMut(&tools::LogPage) -> Result<bool, String>,
    ) -> Result<(), String> {
        if self.is_mounted() {
            return self.daemon()?.log(q, on_page);
        }
        self.read(|_, r| tools::log_pages(q, |q| tools::log_page(r, q), |page, _| on_page(page)))
    }

    /// `cat` or `show` (`req`): the file's bytes handed to `piece` as they are read, all of one
    /// version of it; streamed by the daemon when mounted, else read from the file in one
    /// transaction, a chunk at a time either way.
    pub fn content(
        &self,
        req: Value,
        piece: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<(), String> {
        if self.is_mounted() {
            return self.daemon()?.content(&req, piece);
        }
        let mut counted = Counted {
            piece,
            size: 0,
            given: 0,
        };
        let read = self.read(|_, r| tools::content(r, &req, &mut counted));
        match read {
            Err(e) if counted.given > 0 && counted.given < counted.size => {
                Err(control::not_whole(&e, counted.given, counted.size))
            }
            read => read,
        }
    }

    /// `ls`, `tree` or `unused` (`req`): each entry of the listing handed to `item` as it is
    /// read, as the one-line answer's array held it; streamed by the daemon when mounted,
    /// else read from the file in one transaction, a directory's page at a time either way.
    pub fn listing(
        &self,
        req: Value,
        item: &mut dyn FnMut(Value) -> Result<(), String>,
    ) -> Result<(), String> {
        if self.is_mounted() {
            return self.daemon()?.listing(&req, item);
        }
        let mut given = 0u64;
        let read = self.read(|_, r| {
            tools::listing(r, &req, &mut |json| {
                item(serde_json::from_slice(json).map_err(|e| e.to_string())?)?;
                given += 1;
                Ok(())
            })
        });
        match read {
            Err(e) if given > 0 => Err(control::not_listed(&e, given)),
            read => read,
        }
    }

    /// A history change, made as the calling user and process.
    pub fn change(&self, mut req: Value) -> Result<Value, String> {
        req["uid"] = json!(nix::unistd::getuid().as_raw());
        req["gid"] = json!(nix::unistd::getgid().as_raw());
        req["pid"] = json!(std::process::id());
        self.run(req, |req| {
            let s = self.open_existing()?;
            let limits = crate::fs::Limits::stored(&s);
            let fs = crate::fs::Fs::new(s, limits).map_err(|e| e.to_string())?;
            tools::history_change(&fs, req)
        })
    }

    /// Runs `f` on the unmounted store file opened read-only (a private copy if it needs
    /// recovery, so no byte of it is written).
    pub fn read<T>(
        &self,
        f: impl FnOnce(&ReadOnlyStore, &ReadTxn) -> Result<T, String>,
    ) -> Result<T, String> {
        read_file(&self.store, f)
    }

    /// The unmounted store file opened for writing.
    pub fn open_existing(&self) -> Result<Store, String> {
        Store::open_existing(&self.store).map_err(|e| e.to_string())
    }

    /// Runs `f` on a consistent view: a snapshot taken through the daemon when mounted.
    pub fn with_snapshot<T>(
        &self,
        f: impl FnOnce(&ReadTxn) -> Result<T, String>,
    ) -> Result<T, String> {
        if !self.is_mounted() {
            return self.read(|_, r| f(r));
        }
        let dir = tempfile::Builder::new()
            .prefix("redbfs-export-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()
            .map_err(|e| e.to_string())?;
        let snap = dir.path().join("snapshot.redb");
        self.ask(json!({"op": "snapshot", "out": snap}))?;
        read_file(&snap, |_, r| f(r))
    }
}

/// A file's bytes on their way to `piece`, counted, so that a read failing after some of them
/// went out says the output is not the whole file (as the daemon's stream does).
struct Counted<'a> {
    piece: &'a mut dyn FnMut(&[u8]) -> Result<(), String>,
    size: u64,
    given: u64,
}

impl tools::ContentSink for Counted<'_> {
    fn start(&mut self, size: u64) -> Result<(), String> {
        self.size = size;
        Ok(())
    }

    fn piece(&mut self, bytes: &[u8]) -> Result<(), String> {
        (self.piece)(bytes)?;
        self.given += bytes.len() as u64;
        Ok(())
    }
}

fn read_file<T>(
    path: &Path,
    f: impl FnOnce(&ReadOnlyStore, &ReadTxn) -> Result<T, String>,
) -> Result<T, String> {
    let s = ReadOnlyStore::open(path).map_err(|e| e.to_string())?;
    let r = s.read().map_err(|e| e.to_string())?;
    f(&s, &r)
}

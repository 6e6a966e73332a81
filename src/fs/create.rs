//! Creating: mkdir, mknod and create, each one transaction; the entry reply counts as a
//! kernel reference from the moment the transaction commits.

use super::*;

impl Fs {
    pub(super) fn parent_dir(w: &WriteTxn<'_>, parent: u64) -> Result<Inode> {
        let p = w.inode(parent)?.ok_or(Error::NotFound)?;
        if p.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        Ok(p)
    }

    pub(super) fn new_inode(
        &self,
        w: &mut WriteTxn<'_>,
        caller: Caller,
        parent: &mut Inode,
        name: &Name,
        kind: Kind,
        perm: u32,
    ) -> Result<Inode> {
        if w.lookup(parent.ino, name.as_str())?.is_some() {
            return Err(Error::Exists);
        }
        self.check_new_entry(w, parent.ino, name, None)?;
        let now = now_ns();
        let setgid_parent = parent.perm & libc::S_ISGID != 0;
        let mut perm = perm & 0o7777;
        if setgid_parent && kind == Kind::Dir {
            perm |= libc::S_ISGID;
        }
        let inode = Inode {
            ino: w.alloc_ino()?,
            kind,
            perm,
            uid: caller.uid,
            gid: if setgid_parent {
                parent.gid
            } else {
                caller.gid
            },
            size: 0,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            parent: parent.ino,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            name: name.as_str().to_string(),
        };
        w.put_inode(&inode)?;
        w.put_dirent(parent.ino, name.as_str(), inode.ino, kind)?;
        if kind == Kind::Dir {
            parent.nlink += 1;
        }
        parent.mtime = now;
        parent.ctime = now;
        w.put_inode(parent)?;
        Ok(inode)
    }

    pub fn mkdir(
        &self,
        caller: Caller,
        parent: u64,
        raw_name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Inode> {
        Ok(self
            .make_entry(
                caller,
                parent,
                raw_name,
                Kind::Dir,
                mode & !umask,
                Sync::Durable,
            )?
            .0)
    }

    /// Creates a regular file (mknod of S_IFREG), durably: nothing closes or fsyncs it later.
    pub fn mknod(
        &self,
        caller: Caller,
        parent: u64,
        raw_name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Inode> {
        Ok(self
            .new_file(caller, parent, raw_name, mode, umask, Sync::Durable)?
            .0)
    }

    /// A new regular file; returns it and the number of the commit that made it.
    pub(super) fn new_file(
        &self,
        caller: Caller,
        parent: u64,
        raw_name: &[u8],
        mode: u32,
        umask: u32,
        sync: Sync,
    ) -> Result<(Inode, u64)> {
        if mode & libc::S_IFMT != libc::S_IFREG && mode & libc::S_IFMT != 0 {
            return Err(Error::NotPermitted(match mode & libc::S_IFMT {
                libc::S_IFIFO => "mknod of a FIFO",
                libc::S_IFSOCK => "mknod of a socket",
                libc::S_IFCHR | libc::S_IFBLK => "mknod of a device",
                _ => "mknod of a special file",
            }));
        }
        self.make_entry(caller, parent, raw_name, Kind::File, mode & !umask, sync)
    }

    /// mkdir, mknod and create: a new entry in one transaction; returns it and the commit's
    /// number.
    pub(super) fn make_entry(
        &self,
        caller: Caller,
        parent: u64,
        raw_name: &[u8],
        kind: Kind,
        perm: u32,
        sync: Sync,
    ) -> Result<(Inode, u64)> {
        self.writable()?;
        let name = self.parse_name(raw_name)?;
        self.joinable(|join| {
            let mut w = self.write_for(join, caller.pid, None)?;
            let mut p = Self::parent_dir(&w, parent)?;
            let inode = self.new_inode(&mut w, caller, &mut p, &name, kind, perm)?;
            let op = match kind {
                Kind::Dir => "mkdir",
                Kind::File => "create",
            };
            self.describe(
                &mut w,
                caller,
                op,
                inode.ino,
                |w| vec![self.path_in(w, parent, name.as_str())],
                0,
                0,
            );
            // The reply names the inode: counted before anyone else can see it.
            self.lifetimes.pin_new(inode.ino);
            match self.commit_numbered(w, sync) {
                Ok(seq) => Ok((inode, seq)),
                Err(e) => {
                    self.lifetimes.forget(inode.ino, 1);
                    Err(e)
                }
            }
        })
    }

    /// Creates and opens a regular file.
    pub fn create(
        &self,
        caller: Caller,
        parent: u64,
        raw_name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Inode, u64)> {
        // Durable with this file's close or fsync, which follow.
        let (inode, seq) = self.new_file(
            caller,
            parent,
            raw_name,
            (mode & 0o7777) | libc::S_IFREG,
            umask,
            Sync::Deferred,
        )?;
        let mut open_mode = OpenMode::from_flags(flags);
        open_mode.truncate = false;
        let fh = match self.open(caller, inode.ino, open_mode) {
            Ok(fh) => fh,
            Err(e) => {
                // The kernel gets no entry, so it will never forget this reference.
                self.forget(inode.ino, 1);
                return Err(e);
            }
        };
        if let Ok((f, _)) = self.handle(fh) {
            f.durable_with.fetch_max(seq, Ordering::AcqRel);
        }
        Ok((inode, fh))
    }
}
